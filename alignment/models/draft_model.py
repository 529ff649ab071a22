"""A draft model for speculative decoding (speculative_step.py): a small LLaMA with the policy's vocabulary (a
layer-dropped copy of the policy, `layer_dropped`, or one the user gives) proposes GenerationConfig.
num_assistant_tokens tokens one at a time, and the policy verifies them in one forward.

`DecodeEngine(..., draft=DraftModel(model))` (or `generate(..., draft=...)`) gives the engine a `Drafter`: the draft
model's own KV cache (SlotCache) over the engine's slots, holding each speculating sequence's tokens, and a decode
step of its own (the fused decoder for a plain float32 LLaMA, its layers otherwise). After a verify step a slot
keeps the longest prefix of what it holds that the sequence still has (the accepted draft tokens; the columns past
them go back to zeros); before the next draft the sequence's tokens it has not seen but the last are prefilled
alone (a one-row forward over its own columns: the prompt, the last draft token after a full accept, a resumed
turn's ids), and the last (the token the engine just sampled) and the draft tokens are fed in steps of
all slots, each drawing the next draft token: the argmax when greedy, a draw from q when sampling, q the draft
model's distribution after the sequence's own filters (repetition penalty over the sequence and the draft so far,
temperature, top-k, top-p, eos blocked before min_new_tokens: sampling.sampling_logits). Fixed shapes again: which
tokens a slot prefills and which it feeds in a step depends on its own tokens and acceptances only, so its draft,
hence its output, does not depend on its neighbours.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np
import paddle
import paddle.nn.functional as F

from alignment.models.engine import pick_stepper
from alignment.models.llama import LlamaForCausalLM
from alignment.models.sampling import block_tokens, sampling_logits
from alignment.models.sequence import DecodeSequence, sampler_groups
from alignment.models.slot_cache import SlotCache
from alignment.models.speculative import draw_from, filtered_probabilities


def dropped_state(model: LlamaForCausalLM, keep_every: int) -> Dict[str, paddle.Tensor]:
    """`model`'s weights with decoder layers 0, keep_every, 2 keep_every, ... kept, renumbered 0, 1, 2, ...
    (the embeddings, final norm and head as they are): the state of layer_dropped's copy."""
    kept = list(range(0, model.config.num_hidden_layers, keep_every))
    state = {}
    for name, value in model.state_dict().items():
        if name.startswith("model.layers."):
            index, rest = name[len("model.layers."):].split(".", 1)
            if int(index) not in kept:
                continue
            name = f"model.layers.{kept.index(int(index))}.{rest}"
        state[name] = value
    return state


def layer_dropped(model: LlamaForCausalLM, keep_every: int = 2) -> LlamaForCausalLM:
    """A copy of `model` with decoder layers 0, keep_every, 2 keep_every, ... kept (SmolLM2-135M at 2: 15 of 30),
    the embeddings, final norm and head copied; the distillation demo's student (examples/distill_demo)."""
    layers = len(range(0, model.config.num_hidden_layers, keep_every))
    smaller = LlamaForCausalLM(dataclasses.replace(model.config, num_hidden_layers=layers))
    copy_dropped(smaller, model, keep_every)
    smaller.eval()
    return smaller


def copy_dropped(smaller: LlamaForCausalLM, model: LlamaForCausalLM, keep_every: int) -> None:
    """Copy `model`'s weights into its layer-dropped copy `smaller` (layer_dropped's), in place: a draft that
    follows the policy's updates is refreshed this way. A LoRA model's adapters are left out (its base weights)."""
    own = smaller.state_dict()
    state = {name: value for name, value in dropped_state(model, keep_every).items() if name in own}  # LoRA: base
    missing = set(own) - set(state)
    if missing:
        raise ValueError(f"layer_dropped: no weights for {sorted(missing)[:3]}")
    smaller.set_state_dict(state)


class DraftModel:
    """The draft model an engine speculates with: `model` a LlamaForCausalLM with the policy's vocabulary; fused:
    decode it through the fused decoder when it qualifies (fused_decode.fusable)."""

    def __init__(self, model, fused: bool = True):
        self.model, self.fused = model, fused

    @classmethod
    def layer_dropped(cls, policy, keep_every: int = 2) -> "DraftModel":
        return cls(layer_dropped(policy, keep_every))

    def drafter(self, engine) -> "Drafter":
        return Drafter(self.model, engine, self.fused)


def common_prefix(a: List[int], b: List[int]) -> int:
    """The number of leading ids `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n], "int64") != np.asarray(b[:n], "int64"))
    return int(differ[0]) if differ.size else n


class Drafter:
    """The draft model's side of one engine (its slots and capacity). held[slot]: the sequence whose tokens the
    slot's columns hold, and those tokens. stats: draft steps run, tokens prefilled."""

    def __init__(self, model, engine, fused: bool = True):
        if model.config.vocab_size != engine.vocab:
            raise ValueError(f"draft model: a vocabulary of {model.config.vocab_size} tokens, the policy's has "
                             f"{engine.vocab}")
        self.model, self.slots = model, engine.slots
        self.engine = engine  # its `seen`: the tokens a repetition penalty applies to
        self.stepper = pick_stepper(model, engine.slots, fused)
        self.cache = SlotCache.for_model(model, engine.slots, engine.capacity,
                                         getattr(self.stepper, "grows_cache", False))
        self.held: List[Tuple[Optional[DecodeSequence], List[int]]] = [(None, [])] * engine.slots
        self.stats = {"steps": 0, "prefilled": 0}

    def propose(self, rooms: Dict[DecodeSequence, int], uniforms: Dict[DecodeSequence, np.ndarray]):
        """rooms: each drafting sequence (its sampled token pending) -> the draft tokens it takes (>= 1);
        uniforms: each sampling one's numbers, one per draft position. -> (sequence -> draft ids, sequence ->
        q [room, vocab] the distribution each draft token was drawn from, for the sampling ones)."""
        fed = np.zeros([self.slots], "int64")  # [slots] the token each slot feeds at this step
        for seq in rooms:
            fed[seq.slot] = self._catch_up(seq)
        drafts: Dict[DecodeSequence, List[int]] = {seq: [] for seq in rooms}
        qs: Dict[DecodeSequence, list] = {seq: [] for seq in rooms if seq.config.do_sample}
        penalised = any(s.config.repetition_penalty != 1.0 for s in rooms)
        seen = self.engine.seen if penalised else None  # [slots, vocab] bool: the sequence and its draft so far
        for j in range(max(rooms.values())):
            feeding = np.zeros([self.slots], bool)
            feeding[[s.slot for s, room in rooms.items() if room > j]] = True
            column, mask, position = self.cache.step_inputs(feeding)
            logits = self.stepper.step(paddle.to_tensor(fed), self.cache, column, mask, position)  # [slots, vocab]
            self.cache.after_step(feeding)
            self.stats["steps"] += 1
            if seen is not None:
                seen = seen | (F.one_hot(paddle.to_tensor(fed), logits.shape[-1]) > 0)
            for config, _, group in sampler_groups([s for s, room in rooms.items() if room > j]):
                drawn, q = self._draw(logits, config, group, j, seen, uniforms)
                for seq in group:
                    fed[seq.slot] = drawn[seq.slot]
                    drafts[seq].append(int(drawn[seq.slot]))
                    if q is not None:
                        qs[seq].append(q[seq.slot])
        for seq in rooms:  # the last draft token is drawn, not fed
            self.held[seq.slot] = (seq, seq.history + seq.pending + drafts[seq][:-1])
        return drafts, {seq: paddle.stack(q) for seq, q in qs.items()}

    def _catch_up(self, seq: DecodeSequence) -> int:
        """Bring seq's slot to its tokens but the last: keep the longest prefix it holds, prefill the rest alone;
        -> the last token (fed by the first draft step)."""
        tokens = seq.history + seq.pending
        same = self.keep(seq, tokens[:-1])
        if same < len(tokens) - 1:
            ids = tokens[same:-1]
            out = self.model(paddle.to_tensor([ids], dtype="int64"), attention_mask=paddle.ones(
                [1, len(tokens) - 1], "int64"), position_ids=paddle.arange(same, len(tokens) - 1).unsqueeze(0),
                past_key_values=self.cache.past(seq.slot), use_cache=True, last_only=True)
            self.cache.write(seq.slot, out.past_key_values, same)
            self.stats["prefilled"] += len(ids)
        self.held[seq.slot] = (seq, tokens[:-1])
        return tokens[-1]

    def keep(self, seq: DecodeSequence, tokens: List[int]) -> int:
        """Keep the longest prefix of what seq's slot holds that is a prefix of `tokens` (after a verify step, seq's
        tokens: the accepted ones), the columns past it back to zeros; -> its length."""
        holder, held = self.held[seq.slot]
        same = common_prefix(held if holder is seq else [], tokens)
        self.cache.truncate(seq.slot, same)
        self.held[seq.slot] = (seq, held[:same] if holder is seq else [])
        return same

    def _draw(self, logits, config, group: List[DecodeSequence], j: int, seen, uniforms):
        """Draft position j's token for each sequence of `group` from the draft model's logits [slots, vocab];
        -> (ids [slots], q [slots, vocab] or None when greedy)."""
        under = np.zeros([self.slots], bool)
        under[[s.slot for s in group]] = [len(s.turn) + j < config.min_new_tokens for s in group]
        if config.eos_ids and under.any():
            logits = block_tokens(logits, config.eos_ids, paddle.to_tensor(under))
        filtered = sampling_logits(logits, config, seen if config.repetition_penalty != 1.0 else None)
        if not config.do_sample:
            return paddle.argmax(filtered, axis=-1).numpy(), None
        q = filtered_probabilities(filtered)  # [slots, vocab]
        uniform = np.zeros([self.slots], "float32")
        for seq in group:
            uniform[seq.slot] = uniforms[seq][j]
        return draw_from(q, paddle.to_tensor(uniform)).numpy(), q
