"""Rollouts: sample responses, then the per-token quantities PPO needs from the four models.

Layout of one rollout batch (N = prompts x num_return_sequences, P = padded prompt width, R = response width):
    input_ids      [N, P + R]  left-padded prompt, then the response (pad after each row's eos)
    attention_mask [N, P + R]
    response_mask  [N, R]      1 on generated tokens up to and including eos (from generation, never from
                               `ids != pad`: SmolLM2's pad token is its eos)
Logits at column P - 1 + t predict response token t, so every per-token tensor below is [N, R].
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import numpy as np
import paddle

from alignment.models.generation import GenerationConfig, SampleRows, generate


@dataclasses.dataclass
class Rollout:
    input_ids: paddle.Tensor  # [N, P + R]
    attention_mask: paddle.Tensor  # [N, P + R]
    response_mask: paddle.Tensor  # [N, R] float32
    prompt_len: int  # P
    prompts: List  # raw prompt (str or list of turns) per row
    completions: List[str]  # decoded responses
    labels: Dict[str, List]  # dataset columns per row (e.g. answer) for reward functions
    old_log_probs: Optional[paddle.Tensor] = None  # [N, R]
    ref_log_probs: Optional[paddle.Tensor] = None  # [N, R]
    old_values: Optional[paddle.Tensor] = None  # [N, R] (critic only)
    end_rewards: Optional[paddle.Tensor] = None  # [N]
    advantages: Optional[paddle.Tensor] = None  # [N, R]
    returns: Optional[paddle.Tensor] = None  # [N, R] (critic only)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: paddle.Tensor) -> "Rollout":
        """The rows `index` ([n] int64) of every tensor field; lists are left out (micro-batches need none)."""
        picked = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, paddle.Tensor):
                value = paddle.gather(value, index)
            elif isinstance(value, (list, dict)):
                value = type(value)()
            picked[f.name] = value
        return Rollout(**picked)

    def trimmed(self) -> "Rollout":
        """The same rows without the columns that are padding in every row: the left padding all prompts share
        and the response columns after the longest response. Results are unchanged (padding is masked out of
        attention, losses and positions); the update phase just stops computing on it."""
        real = self.attention_mask[:, : self.prompt_len].astype("int32").max(axis=0).numpy()  # [P]
        skip = int(real.argmax()) if real.any() else 0  # leading columns that are padding in every row
        keep = max(1, int(self.response_mask.sum(axis=1).max()))  # responses are contiguous from column 0
        width = self.prompt_len + keep
        picked = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("input_ids", "attention_mask"):
                value = value[:, skip: width]
            elif isinstance(value, paddle.Tensor) and value.ndim == 2:
                value = value[:, :keep]  # [n, R] per-token fields
            picked[f.name] = value
        picked["prompt_len"] = self.prompt_len - skip
        return Rollout(**picked)


def update_order(rng, lengths: np.ndarray, unit: int, group_by_length: bool) -> np.ndarray:
    """Row order for one pass over a rollout that is consumed `unit` rows at a time: a shuffle; with
    group_by_length the shuffled rows are sorted by length, cut into units and the units shuffled, so each
    micro-batch holds rows of similar length and Rollout.trimmed() removes most of its padding."""
    order = rng.permutation(len(lengths))
    if not group_by_length or len(lengths) <= unit:
        return order
    order = order[np.argsort(lengths[order], kind="stable")]
    units = [order[start: start + unit] for start in range(0, len(order), unit)]
    return np.concatenate([units[i] for i in rng.permutation(len(units))])


@paddle.no_grad()
def sample_rollout(actor, tokenizer, prompt_items, gen_config: GenerationConfig, num_return_sequences: int,
                   collate, positions: Optional[List[int]] = None, total: Optional[int] = None) -> Rollout:
    """Generate `num_return_sequences` responses per prompt item; rows of one prompt are contiguous.

    positions / total: the items' positions in a global batch of `total` prompts shared by several processes;
    each response is then sampled with that row's random numbers, the same as in a one-process run.
    """
    items = [item for item in prompt_items for _ in range(num_return_sequences)]
    positions = list(range(len(prompt_items))) if positions is None else positions
    n = num_return_sequences
    rows = SampleRows(paddle.to_tensor([p * n + s for p in positions for s in range(n)], dtype="int64"),
                      (len(prompt_items) if total is None else total) * n)
    batch = collate(items)
    prompt_ids = paddle.to_tensor(batch["input_ids"])  # [N, P]
    prompt_mask = paddle.to_tensor(batch["attention_mask"])  # [N, P]
    actor.eval()
    out = generate(actor, prompt_ids, prompt_mask, gen_config, rows=rows)
    response_mask = out.response_mask  # [N, R]
    responses = out.sequences[:, prompt_ids.shape[1]:].numpy()
    completions = [tokenizer.decode(row[: int(n)]) for row, n in zip(responses, response_mask.sum(axis=1).numpy())]
    return Rollout(
        input_ids=out.sequences,
        attention_mask=paddle.concat([prompt_mask.astype("int64"), response_mask], axis=1),
        response_mask=response_mask.astype("float32"),
        prompt_len=prompt_ids.shape[1],
        prompts=[item["prompt"] for item in items],
        completions=completions,
        labels={"answer": [item.get("answer") for item in items]},
    )


def response_log_probs(model, input_ids, attention_mask, prompt_len: int, temperature: float = 1.0,
                       with_entropy: bool = False):
    """Log-probs [N, R] of the response tokens under `model` (and their entropies [N, R] when asked).

    The LM head runs on the response positions only. Logits are divided by the sampling temperature so the
    ratio and the KL compare the distributions the responses were actually drawn from (as TRL does).
    """
    hidden, _ = model.model(input_ids, attention_mask=attention_mask)  # [N, P + R, h]
    return model.token_log_probs(hidden[:, prompt_len - 1: -1], input_ids[:, prompt_len:], temperature,
                                 with_entropy)  # [N, R] each


def critic_values(critic, input_ids, attention_mask, prompt_len: int):
    """Values [N, R]: the critic's score at the state before each response token."""
    return critic(input_ids, attention_mask).scores[:, prompt_len - 1: -1]
