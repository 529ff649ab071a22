"""The decode engine's KV cache: a fixed number of slots (sequences) by a number of columns that only grows.

Per layer k and v are [slots, kv_heads, width, d], the width at most capacity + 1. A slot's tokens sit in columns
0 .. length - 1, in order, so a token's column is its RoPE position; the last column is scratch, written by the
decode step for the slots that have no token to feed and attended by no one. Columns a slot has not written hold
zeros.

Why fixed rows: every decode step runs on [slots, 1] tokens whatever the sequences are doing, and a prefill runs on
one sequence's own columns. Paddle's CPU GEMMs give each row the same bits for a fixed number of rows whatever the
other rows hold (and different bits for other row counts; both measured; `step_rows` keeps every row in a full
block of 8). So a sequence's tokens and log-probs depend on its own tokens only: not on which slot it has, on its
neighbours, or on when it joined or paused (continuous batching, overlapped episodes, a gateway's requests give the
bits a lockstep batch gives). Masked columns get weights of ~1e-28 from Paddle's softmax (it clips at -64 before
exponentiating), not 0: that is why they hold zeros.

Widths from a ladder (`grows=True`): the columns a step attends to cost time (at [64 slots, hidden 256, 4 layers]
a step over 513 columns took 2x one over 129 on an Intel Xeon, family 6 model 207), so a cache starts at the
narrowest width its sequences need and grows by whole rungs: multiples of WIDTH_STEP from LADDER_FLOOR, the last
rung capacity + 1. A row's bits do not depend on which rung it runs at, so on nothing but its own tokens still:
- Paddle's CPU softmax sums in 8-float lanes plus a scalar tail: every rung but the last is a multiple of 64, so a
  row's columns are never in the tail of one, and a row reaching past the last multiple of 8 below capacity + 1
  fits the last rung only;
- it exponentiates below 128 columns with std::exp and from 128 on with MKL's vsExp: hence the floor, every rung on
  one side;
- probs @ v and q @ k^T add exact zeros for the zero columns past the row.
Measured on that Xeon: the same logits at every width from 128 to 2100 for a row of 50 columns, and changes at 56
and 128; tests/models/test_slot_cache.py checks it on the machine it runs on. A cache whose capacity + 1 is at most the
floor keeps one width.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import paddle

WIDTH_STEP = 64  # rungs of the width ladder: multiples of this (of 8, the softmax's lanes)
LADDER_FLOOR = 128  # Paddle's CPU exp switches from std::exp to MKL's vsExp at 128 columns
ROW_BLOCK = 8  # MKL's GEMMs round a last, partial block of rows differently from the full ones before it


def step_rows(slots: int) -> int:
    """The rows a decode step runs for `slots` sequences: up to ROW_BLOCK as asked, above it a multiple of it, so
    every row is in a full block and a sequence's bits do not depend on its slot."""
    return slots if slots <= ROW_BLOCK else -(-slots // ROW_BLOCK) * ROW_BLOCK


def ladder_width(columns: int, full: int) -> int:
    """The narrowest rung that holds `columns` written columns plus the scratch one, for a cache whose widest rung
    is `full` (capacity + 1)."""
    if full <= LADDER_FLOOR:
        return full
    rung = max(LADDER_FLOOR, -(-(columns + 1) // WIDTH_STEP) * WIDTH_STEP)
    return full if rung >= full else rung


class SlotCache:
    """KV cache of `slots` sequences of at most `capacity` tokens each (kv_heads: this rank's, under tensor
    parallelism)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, slots: int, capacity: int, dtype="float32",
                 grows: bool = False):
        if slots < 1 or capacity < 1:
            raise ValueError(f"SlotCache: slots and capacity must be >= 1, got {slots}, {capacity}")
        self.slots, self.capacity = slots, capacity
        self.full = capacity + 1  # the widest: the last column is scratch
        self.width = ladder_width(0, self.full) if grows else self.full
        shape = [slots, kv_heads, self.width, head_dim]
        self.k = [paddle.zeros(shape, dtype) for _ in range(layers)]
        self.v = [paddle.zeros(shape, dtype) for _ in range(layers)]
        self.lengths = np.zeros([slots], dtype="int64")  # tokens each slot holds

    @classmethod
    def for_model(cls, model, slots: int, capacity: int, grows: bool = False) -> "SlotCache":
        """A cache for `model`'s layers (this rank's kv heads under tensor parallelism) in its weights' dtype."""
        cfg = model.config
        params = model.parameters() if hasattr(model, "parameters") else []
        dtype = params[0].dtype if params else getattr(model, "dtype", "float32")  # an exported program's
        return cls(cfg.num_hidden_layers, cfg.num_key_value_heads // cfg.tensor_parallel_degree, cfg.head_dim,
                   slots, capacity, dtype, grows)

    @property
    def scratch(self) -> int:
        return self.width - 1

    def hold(self, columns: int) -> None:
        """Make room for `columns` written columns (at most the capacity): grow to the rung that holds them, the
        written columns copied, the new ones zeros (a fixed-width cache has room already)."""
        width = ladder_width(min(columns, self.capacity), self.full)
        if width <= self.width:
            return
        extra = [self.slots, self.k[0].shape[1], width - self.width, self.k[0].shape[3]]
        self.k = [paddle.concat([t, paddle.zeros(extra, t.dtype)], axis=2) for t in self.k]
        self.v = [paddle.concat([t, paddle.zeros(extra, t.dtype)], axis=2) for t in self.v]
        self.width = width

    def pairs(self) -> List[Tuple[paddle.Tensor, paddle.Tensor]]:
        return list(zip(self.k, self.v))

    def set_pairs(self, pairs) -> None:
        """Take the caches a compiled step returned (it writes out of place)."""
        self.k, self.v = [k for k, _ in pairs], [v for _, v in pairs]

    def clear(self, slot: int) -> None:
        """Empty a slot for a new sequence: its written columns back to zeros."""
        self.truncate(slot, 0)

    def truncate(self, slot: int, length: int) -> None:
        """Keep the slot's first `length` tokens: the columns written past them back to zeros."""
        used = int(self.lengths[slot])
        if used > length:
            for t in self.k + self.v:
                t[slot, :, length:used] = 0.0
        self.lengths[slot] = min(used, length)

    def past(self, slot: int) -> Optional[list]:
        """The slot's tokens as a one-row KV cache [(k, v) [1, kv_heads, length, d]], None when empty."""
        used = int(self.lengths[slot])
        if not used:
            return None
        return [(k[slot: slot + 1, :, :used], v[slot: slot + 1, :, :used]) for k, v in zip(self.k, self.v)]

    def write(self, slot: int, presents, start: int) -> None:
        """Store columns start .. of a one-row forward's presents [(k, v) [1, kv_heads, t, d]] (t = the slot's
        length + the new tokens) in the slot."""
        end = presents[0][0].shape[2]
        if end > self.capacity:
            raise ValueError(f"SlotCache: {end} tokens do not fit a capacity of {self.capacity}")
        self.hold(end)
        for layer, (k, v) in enumerate(presents):
            self.k[layer][slot: slot + 1, :, start:end] = k[:, :, start:]
            self.v[layer][slot: slot + 1, :, start:end] = v[:, :, start:]
        self.lengths[slot] = end

    def copy(self, source: int, target: int) -> None:
        """Give slot `target` the tokens of slot `source` (rows sharing a prompt prefill it once)."""
        used = int(self.lengths[source])
        for t in self.k + self.v:
            t[target, :, :used] = t[source, :, :used]
        self.lengths[target] = used

    def step_inputs(self, feeding: np.ndarray):
        """For a decode step where the slots `feeding` [slots] bool feed one token each: (column [slots] int64 the
        token is written at (scratch for the others), attention mask [slots, width] int64, positions [slots, 1]).
        The others attend to column 0 only: their logits are never read."""
        self.hold(int(self.lengths[feeding].max(initial=0)) + 1)
        columns = np.where(feeding, self.lengths, self.scratch)  # [slots]
        limit = np.where(feeding, self.lengths, 0)  # [slots] last column attended
        mask = (np.arange(self.width)[None, :] <= limit[:, None]).astype("int64")  # [slots, width]
        positions = np.where(feeding, self.lengths, 0).reshape([-1, 1])  # [slots, 1]
        return paddle.to_tensor(columns), paddle.to_tensor(mask), paddle.to_tensor(positions)

    def after_step(self, feeding: np.ndarray) -> None:
        """A decode step wrote one column per slot (step_inputs' columns); the scratch column goes back to zeros
        where a slot wrote it: one not feeding, or one fed at the last column. When every slot feeds its own next
        column, as in a lockstep rollout, nothing is cleared (a column assignment per layer per step)."""
        wrote_scratch = not feeding.all() or int(self.lengths.max(initial=0)) >= self.scratch
        self.lengths = self.lengths + feeding.astype("int64")
        if wrote_scratch:
            for t in self.k + self.v:
                t[:, :, self.scratch] = 0.0

    def verify_inputs(self, feeding: np.ndarray, width: int):
        """For a step where the slots `feeding` [slots] bool feed `width` tokens each (speculative decoding's
        verify step, speculative_step.py): (columns [slots, width] int64 written, each query's attention mask
        [slots, width, self.width] int64, positions [slots, width]). Columns past the capacity and the other
        slots' go to scratch; their queries are never read."""
        self.hold(int(self.lengths[feeding].max(initial=0)) + width)
        wanted = np.minimum(self.lengths[:, None] + np.arange(width)[None, :], self.scratch)  # [slots, width]
        columns = np.where(feeding[:, None], wanted, self.scratch)
        limit = np.where(feeding[:, None], wanted, 0)  # [slots, width] each query's last column attended
        mask = (np.arange(self.width)[None, None, :] <= limit[:, :, None]).astype("int64")  # [slots, width, W]
        return paddle.to_tensor(columns), paddle.to_tensor(mask), paddle.to_tensor(limit)

    def keep(self, columns, lengths: np.ndarray) -> None:
        """After a verify step wrote `columns` [slots, width] (verify_inputs'): each slot keeps its first
        lengths [slots] columns; the columns written past them (rejected draft tokens, padding) and the scratch
        column go back to zeros, so no later step attends to what they held."""
        columns = columns.numpy()
        zeroed = np.where(columns >= lengths[:, None], columns, self.scratch)  # [slots, width]
        zeroed = np.concatenate([zeroed, np.full([self.slots, 1], self.scratch)], axis=1)  # [slots, width + 1]
        shape = [self.slots, self.k[0].shape[1], zeroed.shape[1], self.k[0].shape[3]]
        index = paddle.expand(paddle.to_tensor(zeroed).reshape([self.slots, 1, -1, 1]), shape)
        zeros = paddle.zeros(shape, self.k[0].dtype)
        for t in self.k + self.v:
            t.put_along_axis_(index, zeros, 2)
        self.lengths = lengths.astype("int64")
