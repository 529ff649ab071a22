"""Tokenized datasets built from raw samples with the tokenizer's chat template.

SupervisedDataset: prompt + answer, loss only on answer tokens (prompt labels = IGNORE_INDEX); or a `dialogue` /
`messages` conversation (roles system/user/assistant/tool), loss on every assistant turn.
PreferenceDataset: (better, worse) token sequences sharing a prompt, for reward models and DPO.
PromptOnlyDataset: chat-formatted prompts, deduplicated, for rollouts.
Samples longer than `max_length` are truncated (supervised / preference, from the right) or dropped (prompts);
the counts are kept in `.stats` and printed by the entry points.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from alignment.data.raw import samples_with

IGNORE_INDEX = -100


def conversation_messages(tokenizer, sample) -> List[Dict[str, str]]:
    """A raw sample's prompt (str or list of turns) as chat messages, user first."""
    turns = sample.get("dialogue") or sample["input"]
    return tokenizer.chat_messages(turns)


def format_prompt(tokenizer, sample) -> str:
    return tokenizer.apply_chat_template(conversation_messages(tokenizer, sample), add_generation_prompt=True)


def tokenize_conversation(tokenizer, messages) -> tuple:
    """(input_ids, labels) with labels on assistant turns only. Templates must render turns as a growing prefix."""
    input_ids, labels, rendered = [], [], ""
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:k], add_generation_prompt=True)
        through = tokenizer.apply_chat_template(messages[: k + 1], add_generation_prompt=False)
        if not (before.startswith(rendered) and through.startswith(before)):
            raise ValueError(f"{tokenizer.name_or_path}: the chat template does not render a conversation as a "
                             "growing prefix; multi-turn supervised data needs one that does")
        prompt_ids = tokenizer.encode(before[len(rendered):], add_special_tokens=not rendered)
        answer_ids = tokenizer.encode(through[len(before):])
        eos = tokenizer.eos_token_id
        if eos is not None and eos not in answer_ids:
            answer_ids.append(eos)  # templates without an end-of-turn token still stop
        elif eos is not None and k == len(messages) - 1:
            # the final answer ends at its end-of-turn token, as a sampled response does (generation stops there),
            # so reward models score training pairs and rollouts at the same token
            answer_ids = answer_ids[: len(answer_ids) - answer_ids[::-1].index(eos)]
        input_ids += prompt_ids + answer_ids
        labels += [IGNORE_INDEX] * len(prompt_ids) + answer_ids
        rendered = through
    return input_ids, labels


def answer_messages(tokenizer, sample, answer: str) -> List[Dict[str, str]]:
    return conversation_messages(tokenizer, sample) + [{"role": "assistant", "content": answer}]


class TokenizedDataset:
    """A list of tokenized items plus `stats`: how many samples were truncated, dropped, deduplicated."""

    items: List[dict]
    stats: Dict[str, int]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def _sft_fields(sample) -> tuple:
    """The fields an SFT sample needs: none for a whole conversation, else its prompt and answer."""
    return () if sample.get("dialogue") or sample.get("messages") else ("input", "answer")


class SupervisedDataset(TokenizedDataset):
    def __init__(self, raw, tokenizer, max_length: int):
        self.items, self.stats = [], {"truncated": 0, "dropped_prompt_too_long": 0}
        for sample in samples_with(raw, _sft_fields, "SFT needs 'input' and 'answer', or 'dialogue', or 'messages'"):
            if sample.get("messages"):
                messages = [dict(message) for message in sample["messages"]]
            elif sample.get("dialogue"):
                messages = tokenizer.chat_messages(sample["dialogue"])
            else:
                messages = answer_messages(tokenizer, sample, sample["answer"])
            input_ids, labels = tokenize_conversation(tokenizer, messages)
            if len(input_ids) > max_length:
                self.stats["truncated"] += 1
                input_ids, labels = input_ids[:max_length], labels[:max_length]
            if all(label == IGNORE_INDEX for label in labels[1:]):
                self.stats["dropped_prompt_too_long"] += 1
                continue
            self.items.append({"input_ids": input_ids, "labels": labels})


class PreferenceDataset(TokenizedDataset):
    """Each item: better_input_ids, worse_input_ids (prompt + answer + end-of-turn), sharing the prompt tokens, and
    better_prompt_len, worse_prompt_len (where each answer starts)."""

    def __init__(self, raw, tokenizer, max_length: int, hint: str = ""):
        self.items, self.stats = [], {"truncated": 0, "dropped_prompt_too_long": 0, "identical_after_truncation": 0}
        advice = ("preference datasets need samples with 'answer', 'other_answer' and 'better'; check the dataset "
                  f"names in train_datasets / eval_datasets{hint}")
        for sample in samples_with(raw, lambda sample: ("input", "answer", "other_answer"), advice):
            better, worse = sample["answer"], sample["other_answer"]
            if not sample.get("better", True):
                better, worse = worse, better
            pair = {}
            for key, answer in (("better_input_ids", better), ("worse_input_ids", worse)):
                ids, labels = tokenize_conversation(tokenizer, answer_messages(tokenizer, sample, answer))
                pair[key] = ids
                pair[key.replace("input_ids", "prompt_len")] = next(
                    i for i, label in enumerate(labels) if label != IGNORE_INDEX)
            if max(pair["better_prompt_len"], pair["worse_prompt_len"]) >= max_length:
                self.stats["dropped_prompt_too_long"] += 1
                continue
            better_ids, worse_ids = pair["better_input_ids"][:max_length], pair["worse_input_ids"][:max_length]
            if better_ids == worse_ids:  # the answers differ only past max_length: nothing to learn from
                self.stats["identical_after_truncation"] += 1
                continue
            if max(len(pair["better_input_ids"]), len(pair["worse_input_ids"])) > max_length:
                self.stats["truncated"] += 1
            self.items.append({"better_input_ids": better_ids, "worse_input_ids": worse_ids,
                               "better_prompt_len": pair["better_prompt_len"],
                               "worse_prompt_len": pair["worse_prompt_len"]})


def preference_datasets(train_raw, eval_raw, tokenizer, max_length: int, hint: str = ""):
    """(train, eval or None) PreferenceDatasets; samples that are not pairs raise a DataFormatError naming the
    sample and the field."""
    train = PreferenceDataset(train_raw, tokenizer, max_length, hint)
    evaluation = PreferenceDataset(eval_raw, tokenizer, max_length, hint) if eval_raw is not None else None
    return train, evaluation


class PromptOnlyDataset(TokenizedDataset):
    """Items: input_ids (chat-formatted prompt), prompt (the raw input), answer (label or None).

    too_long="drop" counts and skips prompts of max_length tokens or more; "error" raises naming the prompt
    (RL needs room for a response after every prompt).
    """

    def __init__(self, raw, tokenizer, max_length: int, too_long: str = "drop"):
        self.items, self.stats, seen = [], {"duplicates": 0, "dropped_prompt_too_long": 0}, set()
        for index, sample in enumerate(samples_with(raw, lambda sample: ("input",), "RL prompts need 'input'")):
            text = format_prompt(tokenizer, sample)
            if text in seen:
                self.stats["duplicates"] += 1
                continue
            seen.add(text)
            ids = tokenizer.encode(text, add_special_tokens=True)
            if len(ids) >= max_length:
                if too_long == "error":
                    raise ValueError(f"prompt {index} ({len(ids)} tokens, {str(sample['input'])[:60]!r}...) leaves "
                                     f"no room for a response within key 'max_length' = {max_length}")
                self.stats["dropped_prompt_too_long"] += 1
                continue
            self.items.append({"input_ids": ids, "prompt": sample["input"], "answer": sample.get("answer"),
                               "row": dict(sample)})  # the whole row, for a multi-turn environment's reset


def pad_sequences(sequences: Sequence[Sequence[int]], pad_value: int, left: bool = False) -> np.ndarray:
    """Pad to the longest sequence: right padding for training, left padding for generation. -> [b, max_len]."""
    width = max(len(s) for s in sequences)
    out = np.full((len(sequences), width), pad_value, dtype=np.int64)
    for row, seq in enumerate(sequences):
        if len(seq):
            if left:
                out[row, width - len(seq):] = seq
            else:
                out[row, : len(seq)] = seq
    return out


def attention_mask_for(sequences: Sequence[Sequence[int]], left: bool = False) -> np.ndarray:
    return pad_sequences([[1] * len(s) for s in sequences], 0, left)


def collate_supervised(items, pad_token_id: int) -> Dict[str, np.ndarray]:
    ids = [item["input_ids"] for item in items]
    return {"input_ids": pad_sequences(ids, pad_token_id), "attention_mask": attention_mask_for(ids),
            "labels": pad_sequences([item["labels"] for item in items], IGNORE_INDEX)}


def collate_preference(items, pad_token_id: int) -> Dict[str, np.ndarray]:
    """Better rows first, then worse rows: [2b, max_len], right-padded."""
    ids = [item["better_input_ids"] for item in items] + [item["worse_input_ids"] for item in items]
    return {"input_ids": pad_sequences(ids, pad_token_id), "attention_mask": attention_mask_for(ids)}


def collate_prompts(items, pad_token_id: int) -> Dict[str, np.ndarray]:
    """Left-padded prompts for generation."""
    ids = [item["input_ids"] for item in items]
    return {"input_ids": pad_sequences(ids, pad_token_id, left=True), "attention_mask": attention_mask_for(ids, True)}
