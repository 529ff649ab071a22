"""Scripted episodes: supervised traces that an environment renders exactly as a rollout presents them.

`scripted_episode(env, row, turns)` plays given assistant turns through an environment (its real reset, tool
results and feedback) and returns the conversation as chat messages, the rows of an SFT `messages` dataset.
`rollout_layout(tokenizer, messages, stop_strings)` gives the token ids a multi-turn rollout holds after a policy
wrote those turns (alignment/envs/multiturn.py: the prompt, each turn's own tokens, and between turns the chat
template's continuation), and `check_trace` requires SFT's tokenisation of the messages to be the same ids, with
every token the policy samples in a rollout trained on. Pure Python (no paddle).
"""
from __future__ import annotations

from typing import Any, List, Mapping, Sequence, Tuple

from alignment.data.tokenized import IGNORE_INDEX, tokenize_conversation
from alignment.envs.base import Environment, Message, checked_reset, checked_step
from alignment.envs.chat import continuation_ids, prompt_text


def scripted_episode(env: Environment, row: Mapping[str, Any], turns: Sequence[str]) -> List[Message]:
    """The conversation of `env` reset with `row` when the assistant says `turns`; ValueError unless the episode
    ends exactly at the last turn."""
    messages = checked_reset(env, row)
    for k, text in enumerate(turns):
        result = checked_step(env, text)
        messages += [{"role": "assistant", "content": text}] + list(result.observation)
        if result.done != (k == len(turns) - 1):
            state = "ended" if result.done else "did not end"
            raise ValueError(f"environment {env.env_name!r}: the episode {state} at scripted turn {k + 1} of "
                             f"{len(turns)} ({text[:60]!r})")
    return messages


def rollout_layout(tokenizer, messages: Sequence[Message], stop_strings: Sequence[str]) -> Tuple[List[int], List[int]]:
    """(ids, action_mask) of a rollout in which the policy wrote the assistant messages of `messages` in their
    canonical tokenisation: a turn that ends with one of `stop_strings` stops there, any other turn ends with the
    eos token it sampled."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = tokenizer.encode(prompt_text(tokenizer, messages[:first]), add_special_tokens=True)
    mask = [0] * len(ids)
    eos = tokenizer.eos_token_id
    k = first
    while k < len(messages):
        content = messages[k]["content"]
        stopped = any(content.endswith(stop) for stop in stop_strings)
        turn = tokenizer.encode(content) + ([] if stopped else [eos])
        ids, mask = ids + turn, mask + [1] * len(turn)
        nxt = next((j for j in range(k + 1, len(messages)) if messages[j]["role"] == "assistant"), len(messages))
        if nxt < len(messages):
            close = "" if stopped else tokenizer.decode([eos], skip_special_tokens=False)
            between = continuation_ids(tokenizer, messages[: k + 1], messages[k + 1: nxt], close)
            ids, mask = ids + between, mask + [0] * len(between)
        k = nxt
    return ids, mask


def check_trace(tokenizer, messages: Sequence[Message], stop_strings: Sequence[str]) -> None:
    """ValueError unless SFT's ids for `messages` equal the rollout's, and every token the policy would sample is
    a training target (SFT also trains on the template's end of a turn cut at a stop string)."""
    sft_ids, labels = tokenize_conversation(tokenizer, list(messages))
    ids, mask = rollout_layout(tokenizer, messages, stop_strings)
    if sft_ids != ids:
        at = next((i for i, (a, b) in enumerate(zip(sft_ids, ids)) if a != b), min(len(ids), len(sft_ids)))
        raise ValueError(f"the trace tokenises differently for SFT and in a rollout from token {at}: SFT "
                         f"{tokenizer.decode(sft_ids[at:at + 8], skip_special_tokens=False)!r}, rollout "
                         f"{tokenizer.decode(ids[at:at + 8], skip_special_tokens=False)!r}")
    untrained = [i for i, (m, label) in enumerate(zip(mask, labels)) if m and label == IGNORE_INDEX]
    if untrained:
        raise ValueError(f"token {untrained[0]} is sampled in a rollout but not a target in SFT")
