"""examples/guess_number_env.py's game as an agent program: an ordinary client of the gateway, trained through it.

    agent: "examples/openai_agent/guess_number_agent.py:play"

The gateway samples each call with the policy being trained; this function only plays the game and returns the
episode's reward (1 for a right guess, minus 0.1 for each wrong one), as the environment scores it. The same game
is written against every route of the gateway, each training to the same bits:

    play, play_streamed                     OpenAI chat completions (client.chat.completions.create)
    play_responses, play_responses_streamed OpenAI Responses (client.responses.create)
    play_messages, play_messages_streamed   Anthropic Messages (the anthropic client; its base URL without /v1)
"""
import re

import openai

NUMBER = re.compile(r"-?\d+")
ASK = "I am thinking of a number from 1 to 100. Guess it: answer with a number, and I will say higher or lower."
TURNS = 3
MAX_TOKENS = 1024  # Anthropic's max_tokens is required; the training run's max_new_tokens caps a turn below it


def game(answer, row):
    """The game, whatever the protocol: answer(messages) -> the assistant's text."""
    secret, reward = int(row["answer"]), 0.0
    messages = [{"role": "user", "content": ASK}]
    for _ in range(TURNS):
        text = answer(messages)
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


def play(base_url, api_key, row, stream=False):
    client = openai.OpenAI(base_url=base_url, api_key=api_key)

    def answer(messages):
        if stream:
            chunks = client.chat.completions.create(model="policy", messages=messages, stream=True)
            return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        return client.chat.completions.create(model="policy", messages=messages).choices[0].message.content or ""
    return game(answer, row)


def play_responses(base_url, api_key, row, stream=False):
    client = openai.OpenAI(base_url=base_url, api_key=api_key)

    def answer(messages):
        if stream:
            events = client.responses.create(model="policy", input=messages, stream=True)
            return "".join(event.delta for event in events if event.type == "response.output_text.delta")
        return client.responses.create(model="policy", input=messages).output_text
    return game(answer, row)


def play_messages(base_url, api_key, row, stream=False):
    import anthropic

    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key=api_key)

    def answer(messages):
        if stream:
            with client.messages.stream(model="policy", max_tokens=MAX_TOKENS, messages=messages) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(model="policy", max_tokens=MAX_TOKENS, messages=messages)
        return "".join(block.text for block in reply.content if block.type == "text")
    return game(answer, row)


def play_streamed(base_url, api_key, row):
    return play(base_url, api_key, row, stream=True)


def play_responses_streamed(base_url, api_key, row):
    return play_responses(base_url, api_key, row, stream=True)


def play_messages_streamed(base_url, api_key, row):
    return play_messages(base_url, api_key, row, stream=True)
