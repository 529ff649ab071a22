"""The one decode engine: every sampled token of the project comes from `DecodeEngine.step`.

Single-turn generation (generation.py: `generate`), multi-turn episodes (envs/multiturn.py), the OpenAI-style
gateway (gateway/) and the asynchronous rollout ranks all add `DecodeSequence`s to an engine and step it. Each step:

1. prefill: every sequence with ids to feed (a prompt, or after a pause the turn's last token and what the caller
   appends: an observation, a tool result, the next chat turn) runs them over its own cached tokens, alone;
   sequences added at once with the same prompt run it once;
2. sample: every sequence with logits draws its next token (its own uniform number: its `rng`, or the engine's
   batch draw), and its turn ends at eos, a stop string, max_new_tokens or its token budget;
3. decode: the sequences whose turn goes on feed their token in one step of all slots (fused_decode.py's
   decoder for a plain float32 LLaMA, the model's layers otherwise, or a compiled step); with prompt lookup on
   (GenerationConfig.prompt_lookup_num_tokens), or a draft model given as `draft` (num_assistant_tokens;
   draft_model.py), those with a draft feed it too, in one verify step of all slots that keeps the accepted prefix
   (speculative_step.py; the math in speculative.py).

A sequence whose turn ended pauses in its slot, cache kept, until the caller `resume`s it with more ids or
`release`s it; the others go on meanwhile (continuous batching over the carried KV cache). Shapes are fixed
(slot_cache.py), so a sequence's tokens and log-probs are the same bits whatever the others do, when it runs and
which slot it has. Above 8 slots a step runs a multiple of 8 rows (slot_cache.step_rows; the rows past the slots
asked for are never given out): MKL's GEMMs compute rows in blocks of 8 and round a last, partial block
differently (Intel Xeon family 6 model 207: with 12 rows, rows 8-10 apart from rows 0-7; with 16 or 24, none).

Caches and weight syncs: an engine's KV cache (SlotCache), the fused decoder's copy of the weights and the prompts
shared in a prefill are built from the weights of one policy version, and the engine is keyed by it: the version
the model was marked with (weights_digest.set_policy_version: a rollout rank's loads, the trainer's steps) when the
engine was built. A step after the model moved to another version raises StaleWeights, unless `before_decode`
moved it (partial rollouts keep the earlier tokens' keys and values on purpose, each token tagged with its version).
Nothing else outlives a call: `generate` and each rollout's gateway build a new engine, so a sync leaves nothing stale.

The cache's width grows with its longest sequence, rung by rung (slot_cache.py's ladder), for the fused decoder and
the layer path: a step attends to the columns in use, not the capacity, with the same bits at every rung.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence as Seq

import numpy as np
import paddle
import paddle.nn.functional as F

from alignment.models.fused_decode import FusedDecoder, fusable
from alignment.models.logprobs import top_log_probs
from alignment.models.moe import moe_blocks, routing_of
from alignment.models.multi_lora import routed
from alignment.models.sampling import GenerationConfig, block_tokens, next_token, token_log_prob
from alignment.models.sequence import DECODE, PAUSED, PREFILL, SAMPLE, DecodeSequence, sampler_groups, turn_end
from alignment.models.slot_cache import SlotCache, step_rows
from alignment.models.speculative_step import Speculator, rejected_tokens, residual_draws
from alignment.models.weights_digest import StaleWeights, policy_version

def pick_stepper(model, slots: int, fused: bool = True, static=None):
    """The decode step for `model`: a StaticDecoder (static_decode.py) when given, the fused decoder for a plain
    float32 LLaMA, the model's own layers, or for a program that can only append to its cache (an export)
    AppendSteps."""
    if static is not None:
        return static
    if fused and fusable(model):
        return FusedDecoder(model, slots)
    return LayerSteps(model) if getattr(model, "writes_cache_columns", True) else AppendSteps(model)


class LayerSteps:
    """A decode step through the model's own layers (LoRA, tensor-parallel, biased models)."""

    grows_cache = True  # any cache width (slot_cache.py's ladder)

    def __init__(self, model):
        self.model = model

    def load_weights(self, model) -> None:  # reads the layers' weights at every step
        pass

    def step(self, token, cache: SlotCache, column, mask, position):
        out = self.model(token.unsqueeze(-1), attention_mask=mask, position_ids=position,
                         past_key_values=cache.pairs(), use_cache=True, last_only=True, cache_column=column)
        cache.set_pairs(out.past_key_values)
        return out.logits[:, -1]

    def verify(self, tokens, cache: SlotCache, columns, mask, positions):
        """Feed tokens [b, s] at columns [b, s], each query's mask [b, s, width]; -> logits [b, s, vocab]."""
        out = self.model(tokens, attention_mask=mask, position_ids=positions, past_key_values=cache.pairs(),
                         use_cache=True, cache_column=columns)
        cache.set_pairs(out.past_key_values)
        return out.logits


class AppendSteps(LayerSteps):
    """A decode step through a model that appends the new token's keys and values after the cache it is given
    (an exported program): the token attends to its slot's columns and to itself in the appended column, whose
    keys and values then move to the slot's next column."""

    verify = None  # one token a step: no speculative verify step
    grows_cache = False  # a program exported for one cache width

    def step(self, token, cache: SlotCache, column, mask, position):
        feeding = paddle.take_along_axis(mask, column.unsqueeze(-1), axis=1)  # [b, 1]: 1 where the token is real
        mask = paddle.concat([mask * (1 - F.one_hot(column, cache.width).astype(mask.dtype)), feeding], axis=1)
        out = self.model(token.unsqueeze(-1), attention_mask=mask, position_ids=position,
                         past_key_values=cache.pairs(), use_cache=True, last_only=True)
        index = paddle.expand(column.reshape([-1, 1, 1, 1]), [token.shape[0], *cache.k[0].shape[1:2], 1,
                                                             cache.k[0].shape[3]])
        for layer, (k, v) in enumerate(out.past_key_values):
            cache.k[layer].put_along_axis_(index, k[:, :, -1:], 2)
            cache.v[layer].put_along_axis_(index, v[:, :, -1:], 2)
        return out.logits[:, -1]


class DecodeEngine:
    """`slots` sequences of at most `capacity` tokens each, sampled by `model`.

    draw_uniforms() -> [slots] float32 in [0, 1): the numbers of a step's sequences without an rng of their own
    (default: paddle.rand). before_decode(rounds) -> True when it changed the model's weights (partial rollouts),
    called before each decode step with the sampling rounds done so far. prefill_together: the prompts of
    sequences that start in the same step run in one padded forward (fewer calls; their bits then depend on which
    prompts start together, so callers whose sequences start at times of their own leave it off). fixed_width: keep
    the cache at the capacity's width instead of the ladder (the same bits, slower; benchmarks' reference).
    draft: a draft_model.DraftModel drafting for speculative decoding (GenerationConfig.num_assistant_tokens)."""

    def __init__(self, model, slots: int, capacity: int, fused: bool = True, static=None,
                 draw_uniforms: Optional[Callable[[], paddle.Tensor]] = None,
                 before_decode: Optional[Callable[[int], bool]] = None, prefill_together: bool = False,
                 fixed_width: bool = False, draft=None):
        rows = slots if static is not None else step_rows(slots)  # a compiled step keeps its own rows
        self.model, self.slots, self.capacity = model, rows, capacity
        self.prefill_together = prefill_together
        self.stepper = pick_stepper(model, rows, fused, static)
        grows = getattr(self.stepper, "grows_cache", False) and not fixed_width
        self.cache = SlotCache.for_model(model, rows, capacity, grows)
        self.draw_uniforms = draw_uniforms or (lambda: paddle.rand([slots]))
        self.before_decode = before_decode
        self.vocab = model.config.vocab_size
        self.logits = paddle.zeros([rows, self.vocab], "float32")  # [rows, vocab] the next token's
        self.seen = None  # [slots, vocab] bool: tokens fed, for a repetition penalty
        self.running: List[Optional[DecodeSequence]] = [None] * slots  # the rows past them are never given out
        self.rounds = 0  # sampling rounds done
        self.version = policy_version(model)  # the key of the cache and the weight copy
        self.routing = bool(moe_blocks(model))  # record each token's experts (MoE)
        # a compiled step returns its experts; the layers leave theirs on the expert blocks
        self.step_routing = getattr(self.stepper, "step_routing", lambda: routing_of(self.model))
        self.speculator = Speculator(self, draft)  # drafts verified in one forward (speculative_step.py)

    # ------------------------------------------------------------------ the caller's side

    def add(self, seq: DecodeSequence, slot: Optional[int] = None) -> None:
        """Give `seq` a free slot (the lowest, or `slot`); it is prefilled at the next step."""
        if seq.max_len > self.capacity:
            raise ValueError(f"DecodeEngine: a sequence of up to {seq.max_len} tokens does not fit the engine's "
                             f"capacity of {self.capacity}")
        free = [i for i, s in enumerate(self.running) if s is None]
        if not free or (slot is not None and slot not in free):
            raise RuntimeError("DecodeEngine: no free slot" if not free else f"DecodeEngine: slot {slot} is taken")
        seq.slot = free[0] if slot is None else slot
        self.cache.clear(seq.slot)
        if self.seen is not None:
            self.seen[seq.slot] = False
        self.running[seq.slot] = seq
        seq.state = PREFILL

    def resume(self, seq: DecodeSequence, ids: Seq[int], config: Optional[GenerationConfig] = None) -> None:
        """Go on with a paused sequence: feed its turn's last token and `ids`, then sample a new turn (with
        `config` if given)."""
        if seq.state != PAUSED:
            raise RuntimeError(f"DecodeEngine: resume of a sequence that is {seq.state}, not paused")
        seq.pending.extend(ids)
        seq.config = config or seq.config
        seq.turn, seq.turn_log_probs, seq.turn_top, seq.ending = [], [], [], None
        seq.state = PREFILL

    def release(self, seq: DecodeSequence) -> None:
        """Free the slot of a sequence the caller is done with."""
        if seq.slot is not None and self.running[seq.slot] is seq:
            self.running[seq.slot] = None
        seq.slot = None

    def busy(self) -> bool:
        """Whether a step has work: some sequence prefills, samples or decodes."""
        return any(s is not None and s.state != PAUSED for s in self.running)

    # ------------------------------------------------------------------ one step

    @paddle.no_grad()
    def step(self) -> List[DecodeSequence]:
        """Prefill, sample, decode once; -> the sequences whose turn ended (now paused), in slot order."""
        if policy_version(self.model) != self.version:
            raise StaleWeights(f"decode engine: its KV cache and weights are policy version {self.version}'s, the "
                               f"model is version {policy_version(self.model)} now; build a new engine after a sync")
        self._prefill()
        sampling = [s for s in self.running if s is not None and s.state == SAMPLE]
        if not sampling:
            return []
        ended = self._sample(sampling)
        feeding = [s for s in sampling if s.state == DECODE]
        if feeding:
            ended += self._decode(feeding)
        return sorted(ended, key=lambda s: s.slot)

    def _prefill(self) -> None:
        shared: Dict[tuple, DecodeSequence] = {}  # a prompt prefilled this step -> its sequence
        waiting = [s for s in self.running if s is not None and s.state == PREFILL]
        if self.prefill_together:
            shared = self._prefill_prompts([s for s in waiting if s.fed == 0])
        for seq in waiting:
            key = (seq.adapter, *seq.pending) if seq.fed == 0 else None
            if key is not None and key in shared:
                if shared[key] is not seq:
                    seq.experts = list(shared[key].experts)
                    self.cache.copy(shared[key].slot, seq.slot)
                    self.logits[seq.slot] = self.logits[shared[key].slot]
            else:
                self._prefill_one(seq)
                if key is not None:
                    shared[key] = seq
            self.mark_fed(seq, seq.pending)
            seq.fed += len(seq.pending)
            seq.pending, seq.state = [], SAMPLE

    def _prefill_prompts(self, seqs: List[DecodeSequence]) -> Dict[tuple, DecodeSequence]:
        """prefill_together: the distinct prompts of sequences that start now in one left-padded forward, each
        one's keys and values moved to its slot's first columns; -> (adapter, *prompt) -> the sequence holding it."""
        first: Dict[tuple, DecodeSequence] = {}  # (adapter, *prompt) -> its first sequence
        for seq in seqs:
            first.setdefault((seq.adapter, *seq.pending), seq)
        if len(first) < 2:
            return {}
        keys = list(first)
        prompts = [key[1:] for key in keys]
        width = max(len(p) for p in prompts)
        ids = np.zeros([len(prompts), width], "int64")  # [u, P] left-padded
        mask = np.zeros([len(prompts), width], "int64")
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt):], mask[i, width - len(prompt):] = prompt, 1
        with routed(self.model, [key[0] for key in keys]):
            out = self.model(paddle.to_tensor(ids), attention_mask=paddle.to_tensor(mask), use_cache=True,
                             last_only=True)
        routing = routing_of(self.model) if self.routing else None  # [u * P, sparse layers, k]
        self.cache.hold(width)
        for i, (key, prompt) in enumerate(zip(keys, prompts)):
            slot, n = first[key].slot, len(prompt)
            if routing is not None:
                first[key].experts = list(routing[(i + 1) * width - n:(i + 1) * width])
            for layer, (k, v) in enumerate(out.past_key_values):  # [u, kv_heads, P, d]: its last n columns
                self.cache.k[layer][slot, :, :n] = k[i, :, width - n:]
                self.cache.v[layer][slot, :, :n] = v[i, :, width - n:]
            self.cache.lengths[slot] = n
            self.logits[slot] = out.logits[i, -1]
        return first

    def _prefill_one(self, seq: DecodeSequence) -> None:
        start, n = seq.fed, len(seq.pending)
        ids = paddle.to_tensor([seq.pending], dtype="int64")  # [1, n]
        positions = paddle.arange(start, start + n, dtype="int64").unsqueeze(0)  # [1, n]
        with routed(self.model, [seq.adapter]):
            out = self.model(ids, attention_mask=paddle.ones([1, start + n], "int64"), position_ids=positions,
                             past_key_values=self.cache.past(seq.slot), use_cache=True, last_only=True)
        self.cache.write(seq.slot, out.past_key_values, start)
        self.logits[seq.slot] = out.logits[0, -1]
        seq.experts.extend(routing_of(self.model) if self.routing else [])

    def _sample(self, sampling: List[DecodeSequence]) -> List[DecodeSequence]:
        """Draw a token for each sequence in `sampling` over all slots' logits (fixed shapes: a row's draw is
        the same bits whatever the others hold); -> the sequences whose turn ended."""
        uniform = self._uniforms(sampling)  # [slots]
        tokens, log_probs = np.zeros([self.slots], "int64"), np.zeros([self.slots], "float32")
        for config, temperature, group in sampler_groups(sampling):
            logits = self.logits
            under = np.zeros([self.slots], bool)
            for s in group:
                under[s.slot] = len(s.turn) < config.min_new_tokens
            if config.eos_ids and under.any():
                logits = block_tokens(logits, config.eos_ids, paddle.to_tensor(under))
            drawn = next_token(logits, config, self.seen, uniform, rejected_tokens(group, self.slots))  # [slots]
            drawn = residual_draws(group, drawn, uniform)  # a draft model's rejection: from norm(max(0, p - q))
            rows = [s.slot for s in group]
            tokens[rows] = drawn.numpy()[rows]
            if temperature is not None:
                log_probs[rows] = token_log_prob(self.logits, drawn, temperature).numpy()[rows]  # [slots]
                k = max(s.top_logprobs for s in group)
                if k:
                    values, ids = (t.numpy() for t in top_log_probs(paddle.scale(self.logits, 1.0 / temperature), k))
                    for s in group:
                        if s.top_logprobs:
                            s.turn_top.append(list(zip(ids[s.slot, :s.top_logprobs].tolist(),
                                                       values[s.slot, :s.top_logprobs].tolist())))
        self.rounds += 1
        ended = []
        for seq in sampling:
            token = int(tokens[seq.slot])
            seq.turn.append(token)
            seq.turn_log_probs.append(float(log_probs[seq.slot]))
            seq.pending, seq.rejected = [token], None
            seq.ending = turn_end(seq, token)
            seq.state = DECODE if seq.ending is None else PAUSED
            if seq.ending is not None:
                ended.append(seq)
        return ended

    def _uniforms(self, sampling: List[DecodeSequence]) -> Optional[paddle.Tensor]:
        if not any(s.config.do_sample for s in sampling):
            return None
        own = [s for s in sampling if s.rng is not None]
        values = np.zeros([self.slots], "float32")
        if len(own) < len(sampling):
            drawn = self.draw_uniforms().numpy()  # [slots the caller asked for]
            values[:len(drawn)] = drawn
        for s in own:
            values[s.slot] = s.rng.random()
        return paddle.to_tensor(values.astype("float32"))

    def _decode(self, feeding: List[DecodeSequence]) -> List[DecodeSequence]:
        """Feed the sampled tokens: a verify step for the sequences with a draft (speculative_step.py), a
        one-token step for the others; -> the sequences whose turn ended inside an accepted draft."""
        if self.before_decode is not None and self.before_decode(self.rounds):
            self.stepper.load_weights(self.model)
            self.version = policy_version(self.model)  # the earlier tokens' cache kept on purpose (tagged)
        drafts = self.speculator.drafts(feeding)
        adapters = [None if s is None else s.adapter for s in self.running]
        with routed(self.model, adapters + [None] * (self.slots - len(adapters))):  # one per row
            if len(drafts) < len(feeding):
                self._step_one([s for s in feeding if s not in drafts])
            return self.speculator.verify(drafts)

    def _step_one(self, feeding: List[DecodeSequence]) -> None:
        mask = np.zeros([self.slots], bool)
        tokens = np.zeros([self.slots], "int64")
        for seq in feeding:
            mask[seq.slot], tokens[seq.slot] = True, seq.pending[0]
        column, attention, position = self.cache.step_inputs(mask)
        self.logits = self.stepper.step(paddle.to_tensor(tokens), self.cache, column, attention, position)
        self.cache.after_step(mask)
        routing = self.step_routing() if self.routing else None  # [slots, sparse layers, k]
        for seq in feeding:
            seq.experts.extend(routing[seq.slot:seq.slot + 1] if routing is not None else [])
            self.mark_fed(seq, seq.pending)
            seq.fed += 1
            seq.pending, seq.state = [], SAMPLE

    def mark_fed(self, seq: DecodeSequence, ids: List[int]) -> None:
        """`ids` went into seq's cache: its history, and the tokens a repetition penalty applies to."""
        seq.history.extend(ids)
        if seq.config.repetition_penalty == 1.0:
            return
        if self.seen is None:
            self.seen = paddle.zeros([self.slots, self.vocab], "bool")
        row = self.seen[seq.slot]  # (Paddle 3.3 ignores a write through seen[slot, index_tensor])
        row[paddle.to_tensor(ids, dtype="int64")] = True
        self.seen[seq.slot] = row
