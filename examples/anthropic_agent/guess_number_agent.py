"""examples/guess_number_env.py's game as an agent program written against Anthropic's Messages API (the
`anthropic` client), trained through the gateway.

    agent: "examples/anthropic_agent/guess_number_agent.py:play"   # or :play_streamed (messages.stream)

The gateway's base URL for the session ends in /v1, which the Anthropic client adds itself. The same game as
examples/openai_agent/guess_number_agent.py (chat completions): the same prompts, the same tokens, the same training.
"""
import re

import anthropic

NUMBER = re.compile(r"-?\d+")
ASK = "I am thinking of a number from 1 to 100. Guess it: answer with a number, and I will say higher or lower."
TURNS = 3
MAX_TOKENS = 1024  # required by the API; the training run's max_new_tokens caps a turn below it


def answer(client, messages, stream):
    if not stream:
        reply = client.messages.create(model="policy", max_tokens=MAX_TOKENS, messages=messages)
    else:
        with client.messages.stream(model="policy", max_tokens=MAX_TOKENS, messages=messages) as events:
            reply = events.get_final_message()
    return "".join(block.text for block in reply.content if block.type == "text")


def play(base_url, api_key, row, stream=False):
    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key=api_key)
    secret, reward = int(row["answer"]), 0.0
    messages = [{"role": "user", "content": ASK}]
    for _ in range(TURNS):
        text = answer(client, messages, stream)
        messages.append({"role": "assistant", "content": text})
        found = NUMBER.search(text)
        if found is None:
            hint = "Please answer with a number."
        elif int(found.group()) == secret:
            return reward + 1.0
        else:
            hint, reward = ("Higher." if int(found.group()) < secret else "Lower."), reward - 0.1
        messages.append({"role": "user", "content": hint})
    return reward


def play_streamed(base_url, api_key, row):
    return play(base_url, api_key, row, stream=True)
