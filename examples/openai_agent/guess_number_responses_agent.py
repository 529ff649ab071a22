"""examples/guess_number_env.py's game as an agent program written against OpenAI's Responses API
(`client.responses.create`), trained through the gateway.

    agent: "examples/openai_agent/guess_number_responses_agent.py:play"   # or :play_streamed (stream=True)

The same game as guess_number_agent.py (chat completions): the same prompts, the same tokens, the same training.
"""
import re

import openai

NUMBER = re.compile(r"-?\d+")
ASK = "I am thinking of a number from 1 to 100. Guess it: answer with a number, and I will say higher or lower."
TURNS = 3


def answer(client, conversation, stream):
    if not stream:
        return client.responses.create(model="policy", input=conversation).output_text
    events = client.responses.create(model="policy", input=conversation, stream=True)
    return "".join(event.delta for event in events if event.type == "response.output_text.delta")


def play(base_url, api_key, row, stream=False):
    client = openai.OpenAI(base_url=base_url, api_key=api_key)
    secret, reward = int(row["answer"]), 0.0
    conversation = [{"role": "user", "content": ASK}]
    for _ in range(TURNS):
        text = answer(client, conversation, stream)
        conversation.append({"role": "assistant", "content": text})
        found = NUMBER.search(text)
        if found is None:
            hint = "Please answer with a number."
        elif int(found.group()) == secret:
            return reward + 1.0
        else:
            hint, reward = ("Higher." if int(found.group()) < secret else "Lower."), reward - 0.1
        conversation.append({"role": "user", "content": hint})
    return reward


def play_streamed(base_url, api_key, row):
    return play(base_url, api_key, row, stream=True)
