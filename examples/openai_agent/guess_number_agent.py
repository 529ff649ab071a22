"""examples/guess_number_env.py's game as an agent program: an ordinary OpenAI client, trained through the gateway.

    agent: "examples/openai_agent/guess_number_agent.py:play"            # or :play_streamed (stream=True)

The gateway samples each call with the policy being trained; this function only plays the game and returns the
episode's reward (1 for a right guess, minus 0.1 for each wrong one), as the environment scores it.
"""
import re

import openai

NUMBER = re.compile(r"-?\d+")
ASK = "I am thinking of a number from 1 to 100. Guess it: answer with a number, and I will say higher or lower."
TURNS = 3


def play(base_url, api_key, row, stream=False):
    client = openai.OpenAI(base_url=base_url, api_key=api_key)
    secret, reward = int(row["answer"]), 0.0
    messages = [{"role": "user", "content": ASK}]
    for _ in range(TURNS):
        if stream:
            chunks = client.chat.completions.create(model="policy", messages=messages, stream=True)
            text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        else:
            text = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content or ""
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
