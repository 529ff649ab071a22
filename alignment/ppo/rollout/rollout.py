"""Rollouts: sample responses, then the per-token quantities PPO needs from the four models.

Layout of one rollout batch (N = prompts x num_return_sequences, P = padded prompt width, R = response width):
    input_ids      [N, P + R]  left-padded prompt, then the response (pad after each row's eos)
    attention_mask [N, P + R]
    response_mask  [N, R]      1 on generated tokens up to and including eos (from generation, never from
                               `ids != pad`: SmolLM2's pad token is its eos)
Logits at column P - 1 + t predict response token t, so every per-token tensor below is [N, R].
A multi-turn rollout (episodes.py) has the same layout: the "response" is everything after the prompt (the
policy's turns, the environment's observations and the chat template's text between them), and response_mask is
1 on the policy's own tokens only, so observations carry no log-prob, KL, value, entropy or gradient.

For the update, micro-batches are `packed()`: each row's tokens start at column 0 (prompt, response, padding), so
rows share no left padding; `response_index` [N, R] then gives the column of each response token.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional

import numpy as np
import paddle

from alignment.models.generation import GenerationConfig, SampleRows, generate
from alignment.models.prompt_groups import distinct_prompts


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
    response_index: Optional[paddle.Tensor] = None  # [N, R] int64 column of response token t (None: P + t)
    turn_rewards: Optional[paddle.Tensor] = None  # [N, R] multi-turn per_turn_rewards: each turn's at its last token
    episodes: Optional[List[dict]] = None  # multi-turn: per row turns, tool statistics, messages (episodes.py)
    sample_ids: Optional[List[str]] = None  # "batch:row" of each row in the prompt stream (the rollout ledger)
    versions: Optional[List[int]] = None  # asynchronous RL: the policy version that sampled each row
    behaviour_log_probs: Optional[paddle.Tensor] = None  # [N, R] asynchronous RL: the sampler's log-probs
    teacher_log_probs: Optional[paddle.Tensor] = None  # [N, R] distillation: the teacher's (teacher.py's score)
    token_versions: Optional[paddle.Tensor] = None  # [N, R] int64 partial rollouts: the version that drew each token
    reward_rows: Optional[List[dict]] = None  # each row's reward parts (the rollout ledger)
    prompt_groups: Optional[paddle.Tensor] = None  # [N] int64 micro-batches sharing prompts: see micro_batch
    weight_digests: Optional[List[str]] = None  # the digest of the weights that sampled each row (weight_check.py)
    sampled_by: Optional[List[str]] = None  # which sampler drew each row ("local engine of rank 0", "rollout rank 2")
    experts: Optional[paddle.Tensor] = None  # [N, P + R, sparse layers, k] int64 MoE routing replay: the experts the
    # sampler routed each input column to (-1: not fed, i.e. padding and the last token; routing_replay.py)

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

    def take(self, rows: List[int]) -> "Rollout":
        """The rows `rows` (non-empty) of every field, the per-row lists and labels included."""
        picked = self.select(paddle.to_tensor(np.asarray(rows, dtype="int64")))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                setattr(picked, f.name, [value[i] for i in rows])
        picked.labels = {key: [values[i] for i in rows] for key, values in self.labels.items()}
        return picked

    def response_width(self) -> int:
        """Response columns up to the last policy token of any row (>= 1); after it every row is padding."""
        mask = self.response_mask.numpy() > 0  # [N, R]
        last = np.where(mask.any(axis=1), mask.shape[1] - np.argmax(mask[:, ::-1], axis=1), 0)  # [N]
        return max(1, int(last.max()))

    def _per_token_fields_cut(self, keep: int) -> dict:
        """Every field, with the [n, R] per-token tensors cut to their first `keep` response columns (the caller
        replaces input_ids and attention_mask)."""
        picked = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in ("input_ids", "attention_mask") and isinstance(value, paddle.Tensor) and value.ndim == 2:
                value = value[:, :keep]
            picked[f.name] = value
        return picked

    def trimmed(self) -> "Rollout":
        """The same rows without the columns that are padding in every row: the left padding all prompts share
        and the response columns after the longest response. Results are unchanged (padding is masked out of
        attention, losses and positions); the update phase just stops computing on it."""
        real = self.attention_mask[:, : self.prompt_len].astype("int32").max(axis=0).numpy()  # [P]
        skip = int(real.argmax()) if real.any() else 0  # leading columns that are padding in every row
        keep = self.response_width()
        width = self.prompt_len + keep
        picked = self._per_token_fields_cut(keep)
        picked["input_ids"] = self.input_ids[:, skip: width]
        picked["attention_mask"] = self.attention_mask[:, skip: width]
        if self.experts is not None:
            picked["experts"] = self.experts[:, skip: width]
        picked["prompt_len"] = self.prompt_len - skip
        return Rollout(**picked)

    def packed(self) -> "Rollout":
        """The same rows with each row's real tokens moved to column 0 (its prompt, then its response, then
        padding) and the width cut to the longest row: no left padding and no shared right padding. Positions come
        from the attention mask, so logits, log-probs and values are those of the padded rows."""
        mask = self.attention_mask.numpy()
        prompt_lens = mask[:, : self.prompt_len].sum(axis=1)  # [n]
        lengths = mask.sum(axis=1)  # [n] prompt + response tokens (responses end at eos)
        width = max(1, int(lengths.max()))
        keep = self.response_width()
        total = mask.shape[1]
        columns = np.minimum((self.prompt_len - prompt_lens)[:, None] + np.arange(width)[None], total - 1)  # [n, W]
        picked = self._per_token_fields_cut(keep)
        picked["input_ids"] = paddle.take_along_axis(self.input_ids, paddle.to_tensor(columns), axis=1)
        picked["attention_mask"] = paddle.to_tensor((np.arange(width)[None] < lengths[:, None]).astype("int64"))
        if self.experts is not None:  # the same columns; -1 (own choice) on the padding after each row
            experts = self.experts.numpy()[np.arange(len(mask))[:, None], columns]  # [n, W, layers, k]
            experts[np.arange(width)[None] >= lengths[:, None]] = -1
            picked["experts"] = paddle.to_tensor(experts)
        index = np.minimum(prompt_lens[:, None] + np.arange(keep)[None], width - 1)  # [n, R]: masked ones clipped
        picked["response_index"] = paddle.to_tensor(index.astype("int64"))
        picked["prompt_len"] = 0  # rows no longer share a prompt width: response_index says where responses are
        return Rollout(**picked)

    def micro_batch(self, rows: np.ndarray, share_prompts: bool) -> "Rollout":
        """The rows `rows` as the update computes them: packed(), or, with share_prompts and a prompt repeated
        among them, trimmed() with prompt_groups set (each row's prompt among the distinct ones, as generation's
        prompt_groups.distinct_prompts numbers them), so the model runs each prompt once
        (LlamaModel.forward_sharing_prompts)."""
        picked = self.select(paddle.to_tensor(rows))
        groups = None if not share_prompts or picked.response_index is not None else distinct_prompts(
            picked.input_ids[:, :self.prompt_len], picked.attention_mask[:, :self.prompt_len])
        if groups is None:
            return picked.packed()
        batch = picked.trimmed()
        batch.prompt_groups = groups[1]
        return batch


def _pad_columns(x: paddle.Tensor, left: int, right: int, value) -> paddle.Tensor:
    """x [n, W, ...] -> [n, left + W + right, ...], the new columns filled with `value`."""
    pieces = [paddle.full([x.shape[0], width, *x.shape[2:]], value, dtype=x.dtype) for width in (left, right)]
    return paddle.concat([p for p in (pieces[0], x, pieces[1]) if p.shape[1]], axis=1)


def concat_rollouts(parts: List[Rollout], pad_id: int) -> Rollout:
    """The rows of several unpacked rollouts in one (dynamic sampling's kept groups from several generation
    batches): prompts left-padded to the widest prompt P, responses right-padded to the widest response R (the
    new columns are masked out: pad ids, attention and response masks 0, per-token fields 0); per-row tensors and
    the lists are joined in order. A field set in one part must be set in all."""
    if len(parts) == 1:
        return parts[0]
    p = max(part.prompt_len for part in parts)
    r = max(part.response_mask.shape[1] for part in parts)
    joined = {}
    for f in dataclasses.fields(Rollout):
        values = [getattr(part, f.name) for part in parts]
        if f.name == "prompt_len":
            joined[f.name] = p
        elif f.name == "labels":
            joined[f.name] = {key: [v for part in values for v in part[key]] for key in values[0]}
        elif isinstance(values[0], list):
            joined[f.name] = [v for part in values for v in part]
        elif all(v is None for v in values):
            joined[f.name] = None
        elif f.name in ("input_ids", "attention_mask", "experts"):
            fill = {"input_ids": pad_id, "attention_mask": 0, "experts": -1}[f.name]
            joined[f.name] = paddle.concat([_pad_columns(v, p - part.prompt_len, r - part.response_mask.shape[1],
                                                         fill) for v, part in zip(values, parts)])  # [N, P + R]
        elif f.name == "response_index" or any(v is None for v in values):
            raise ValueError(f"concat_rollouts: field {f.name!r} is set in some parts only (or rows are packed)")
        elif values[0].ndim == 2:  # per-token [n, R_i] -> [N, R]
            joined[f.name] = paddle.concat([_pad_columns(v, 0, r - v.shape[1], 0) for v in values])
        else:  # per-row [n]
            joined[f.name] = paddle.concat(values)
    return Rollout(**joined)


def update_order(rng, lengths: np.ndarray, unit: int, group_by_length: bool, together: int = 1) -> np.ndarray:
    """Row order for one pass over a rollout that is consumed `unit` rows at a time: a shuffle; with
    group_by_length the shuffled rows are sorted by length, cut into units and the units shuffled, so each
    micro-batch holds rows of similar length and Rollout.trimmed() removes most of its padding.
    together > 1 (dividing unit and the rows): runs of that many consecutive rows (one prompt's answers) are ordered
    as one, by their longest row, so micro-batches hold whole groups and share their prompts (Rollout.micro_batch)."""
    if together > 1:
        groups = update_order(rng, lengths.reshape([-1, together]).max(axis=1), unit // together, group_by_length)
        return (groups[:, None] * together + np.arange(together)[None]).reshape([-1])
    order = rng.permutation(len(lengths))
    if not group_by_length or len(lengths) <= unit:
        return order
    order = order[np.argsort(lengths[order], kind="stable")]
    units = [order[start: start + unit] for start in range(0, len(order), unit)]
    return np.concatenate([units[i] for i in rng.permutation(len(units))])


@paddle.no_grad()
def sample_rollout(actor, tokenizer, prompt_items, gen_config: GenerationConfig, num_return_sequences: int,
                   collate, positions: Optional[List[int]] = None, total: Optional[int] = None,
                   static=None, log_prob_temperature: Optional[float] = None,
                   between_tokens: Optional[Callable[[int], bool]] = None, keep_experts: bool = False,
                   draft=None) -> Rollout:
    """Generate `num_return_sequences` responses per prompt item; rows of one prompt are contiguous.

    positions / total: the items' positions in a global batch of `total` prompts shared by several processes;
    each response is then sampled with that row's random numbers, the same as in a one-process run.
    static: a StaticDecoder of `actor` to run the decode steps with (see generate).
    log_prob_temperature: set old_log_probs from the sampling pass (see generate); None leaves them unset.
    between_tokens: called with the number of tokens drawn before each decode step (see generate).
    keep_experts: an MoE actor's expert choice per token on the rollout (routing_replay.py).
    draft: a draft model (models/draft_model.DraftModel) the engine speculates with (drafts.py).
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
    out = generate(actor, prompt_ids, prompt_mask, gen_config, static=static, rows=rows,
                   log_prob_temperature=log_prob_temperature, between_tokens=between_tokens, draft=draft)
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
        old_log_probs=out.log_probs,
        experts=out.experts if keep_experts else None,
    )


def response_log_probs(model, input_ids, attention_mask, prompt_len: int, temperature: float = 1.0,
                       with_entropy: bool = False, response_index=None, entropy_grad: bool = False,
                       prompt_groups=None):
    """Log-probs [N, R] of the response tokens under `model` (and their entropies [N, R] when asked).

    The LM head runs on the response positions only. Logits are divided by the sampling temperature so the
    ratio and the KL compare the distributions the responses were actually drawn from (as TRL does).
    response_index [N, R]: the response tokens' columns in packed rows (default: prompt_len + t).
    entropy_grad: keep the entropies in the autograd graph (an entropy bonus in the loss).
    prompt_groups [N]: rows that share a prompt (Rollout.micro_batch) compute it once.
    """
    if prompt_groups is None:
        hidden, _ = model.model(input_ids, attention_mask=attention_mask)  # [N, W, h]
    else:
        hidden = model.model.forward_sharing_prompts(input_ids, attention_mask, prompt_len, prompt_groups)
    if response_index is None:
        states, labels = hidden[:, prompt_len - 1: -1], input_ids[:, prompt_len:]  # [N, R, h], [N, R]
    else:
        states = paddle.take_along_axis(hidden, (response_index - 1).unsqueeze(-1).expand(
            [*response_index.shape, hidden.shape[-1]]), axis=1)  # [N, R, h]
        labels = paddle.take_along_axis(input_ids, response_index, axis=1)  # [N, R]
    return model.token_log_probs(states, labels, temperature, with_entropy, entropy_grad)  # [N, R] each


def critic_values(critic, input_ids, attention_mask, prompt_len: int, response_index=None):
    """Values [N, R]: the critic's score at the state before each response token."""
    scores = critic(input_ids, attention_mask).scores  # [N, W]
    if response_index is None:
        return scores[:, prompt_len - 1: -1]
    return paddle.take_along_axis(scores, response_index - 1, axis=1)
