"""Batches for the offline preference stage.

Paired (DPO family): PreferenceDataset items (better / worse token ids sharing the prompt) collated into
[2b, s] rows, chosen first, with a response mask that is 1 on the answer tokens.
Unpaired (KTO): UnpairedDataset items (prompt ids, completion ids, desirable) collated into [b, s] rows plus
[b, s'] mismatched rows (the prompt with another item's completion, fixed per item) for KTO's reference point.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from alignment.data.raw import samples_with
from alignment.data.tokenized import (IGNORE_INDEX, TokenizedDataset, answer_messages, attention_mask_for,
                                      pad_sequences, tokenize_conversation)


def answer_start(labels: List[int]) -> int:
    """Index of the first answer token (labels are IGNORE_INDEX on the prompt)."""
    return next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)


def response_masks(sequences: List[List[int]], starts: List[int]) -> np.ndarray:
    """[n, max_len] right-padded: 1 from each row's answer start to its end."""
    return pad_sequences([[0] * start + [1] * (len(seq) - start) for seq, start in zip(sequences, starts)], 0)


def collate_pairs(items, pad_token_id: int) -> Dict[str, np.ndarray]:
    """Chosen rows, then rejected rows: input_ids, attention_mask, response_mask [2b, s] (+ cached reference
    log-probs [2b] when the items carry them)."""
    ids = [item["better_input_ids"] for item in items] + [item["worse_input_ids"] for item in items]
    starts = [item["better_prompt_len"] for item in items] + [item["worse_prompt_len"] for item in items]
    batch = {"input_ids": pad_sequences(ids, pad_token_id), "attention_mask": attention_mask_for(ids),
             "response_mask": response_masks(ids, starts)}
    if "ref_logps" in items[0]:
        batch["ref_logps"] = np.array([item["ref_logps"][0] for item in items] +
                                      [item["ref_logps"][1] for item in items], dtype=np.float32)
    return batch


def unpaired_fields(sample) -> tuple:
    """The fields a KTO sample needs: a row of feedback's, else a preference pair's (a row with neither is told
    it lacks `desirable`)."""
    pair = "other_answer" in sample and "desirable" not in sample
    return ("input", "answer", "other_answer") if pair else ("input", "answer", "desirable")


class UnpairedDataset(TokenizedDataset):
    """KTO items: prompt_ids, completion_ids, desirable. Rows with `desirable` are used as they are; preference
    pairs are unpaired into a desirable (better) and an undesirable (worse) row, as TRL's unpair does."""

    def __init__(self, raw, tokenizer, max_length: int, seed: int = 0):
        self.items, self.stats = [], {"truncated": 0, "dropped_prompt_too_long": 0, "unpaired_pairs": 0}
        advice = ("KTO data needs rows with 'input', 'answer' and 'desirable' (e.g. the 'kto' dataset) or "
                  "preference pairs ('input', 'answer', 'other_answer')")
        for sample in samples_with(raw, unpaired_fields, advice):
            if "desirable" in sample:
                rows = [(sample["answer"], bool(sample["desirable"]))]
            else:
                better = sample.get("better", True)
                rows = [(sample["answer"], better), (sample["other_answer"], not better)]
                self.stats["unpaired_pairs"] += 1
            for answer, desirable in rows:
                ids, labels = tokenize_conversation(tokenizer, answer_messages(tokenizer, sample, answer))
                start = answer_start(labels)
                if start >= max_length:
                    self.stats["dropped_prompt_too_long"] += 1
                    continue
                if len(ids) > max_length:
                    self.stats["truncated"] += 1
                self.items.append({"prompt_ids": ids[:start], "completion_ids": ids[start:max_length],
                                   "desirable": desirable})
        # each item's mismatched completion: the next item's in a seeded cycle, fixed so that cached reference
        # log-probs (precompute_ref_log_probs) stay valid whatever the batching
        order = np.random.default_rng(seed).permutation(len(self.items))
        for k, index in enumerate(order):
            item, other = self.items[index], self.items[order[(k + 1) % len(order)]]
            item["kl_completion_ids"] = other["completion_ids"][: max_length - len(item["prompt_ids"])]


def collate_unpaired(items, pad_token_id: int) -> Dict[str, np.ndarray]:
    """input_ids/attention_mask/response_mask [b, s], desirable [b], and kl_* [b, s']: each prompt followed by its
    item's mismatched completion, the pairs KTO's reference point uses."""
    ids = [item["prompt_ids"] + item["completion_ids"] for item in items]
    starts = [len(item["prompt_ids"]) for item in items]
    kl_ids = [item["prompt_ids"] + item["kl_completion_ids"] for item in items]
    batch = {"input_ids": pad_sequences(ids, pad_token_id), "attention_mask": attention_mask_for(ids),
             "response_mask": response_masks(ids, starts),
             "desirable": np.array([item["desirable"] for item in items], dtype=bool),
             "kl_input_ids": pad_sequences(kl_ids, pad_token_id), "kl_attention_mask": attention_mask_for(kl_ids),
             "kl_response_mask": response_masks(kl_ids, starts)}
    if "ref_logps" in items[0]:
        batch["ref_logps"] = np.array([item["ref_logps"][0] for item in items], dtype=np.float32)
        batch["kl_ref_logps"] = np.array([item["ref_logps"][1] for item in items], dtype=np.float32)
    return batch
