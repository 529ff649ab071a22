"""Token ids of the text a chat template puts between turns, without re-encoding what the policy generated.

After an assistant turn, the conversation continues with the template's text that closes the assistant message,
the new messages (tool results, feedback) and the next generation prompt. That text is cut from a rendering of
the whole conversation in which the current assistant message's content is a sentinel: everything after the
sentinel is the continuation, whatever the template does with earlier messages (system prompts, grouping of tool
messages). The policy's own tokens are never decoded and re-encoded into the sequence.
"""
from __future__ import annotations

from typing import List, Sequence

from alignment.envs.base import Message

# U+2063 (invisible separator) around a name: text no model or template writes
SENTINEL = "\u2063alignment-assistant-turn\u2063"


def prompt_text(tokenizer, messages: Sequence[Message]) -> str:
    """The first messages rendered, with the generation prompt for the first assistant turn."""
    return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)


def continuation_text(tokenizer, history: Sequence[Message], observation: Sequence[Message],
                      sampled_close: str = "") -> str:
    """The text after the last assistant message of `history` (its content as generated): the template's close of
    that message, `observation` rendered, and the next generation prompt. `sampled_close`: the text of the eos token
    the policy ended its turn with, which the template's close starts with and is therefore not repeated."""
    if not history or history[-1].get("role") != "assistant":
        raise ValueError("continuation_text: history must end with the assistant's turn")
    messages = list(history[:-1]) + [{"role": "assistant", "content": SENTINEL}] + list(observation)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    if text.count(SENTINEL) != 1:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r}: its chat template does not render "
                         f"an assistant message's content verbatim once, so turns cannot be continued")
    tail = text.split(SENTINEL, 1)[1]
    if sampled_close and tail.startswith(sampled_close):
        tail = tail[len(sampled_close):]
    return tail


def continuation_ids(tokenizer, history: Sequence[Message], observation: Sequence[Message],
                     sampled_close: str = "") -> List[int]:
    """Token ids of `continuation_text`, encoded on their own and appended to the ids as sampled."""
    return tokenizer.encode(continuation_text(tokenizer, history, observation, sampled_close))
