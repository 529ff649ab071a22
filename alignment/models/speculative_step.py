"""Speculative decoding in the decode engine (engine.py): a sequence whose config sets prompt_lookup_num_tokens = k
(or, in an engine given a draft model, num_assistant_tokens = k: draft_model.py) feeds its sampled token and a
draft of up to k tokens in one forward of the policy, of a fixed width over all slots (k + 1, widened so that the
step's rows fill MKL's row blocks: verify_width; shorter drafts padded), and keeps the draft's accepted prefix
(speculative.py's rules).

After the verify step a sequence holds the sampled token and the accepted draft tokens in its cache (the columns of
rejected tokens and padding go back to zeros), their log-probs come from the verifying pass's logits, and the
logits after its last accepted token wait for the engine's next sampling round: the token after a rejection is
drawn there from the policy's distribution without the rejected token (after a draft model's: from
norm(max(0, p - q)) at the rejected position, `residual_draws`), the bonus token after a fully accepted draft from
the policy's distribution. A sequence without a draft this step takes the engine's one-token step.

What a sequence gets depends on its own tokens only: its draft is a function of them, the verify step has a fixed
shape whatever the other slots feed, and its uniform numbers come from its own rng or from batch draws made at
every step it decodes (k more per step; with a draft model 2k, k for the draft's draws). The verify step's logits
differ from one-token steps' by float rounding (other GEMM shapes): greedy tokens are plain decoding's unless two
logits tie to rounding; log-probs agree to rounding (tests/models/test_speculative.py holds them to 1e-5 of a full
forward's).

Steppers with a `verify` method take part (the fused decoder, the model's layers); an exported program, a
compiled static step or a model whose experts are recorded (MoE) decode one token a step.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import paddle

from alignment.models.logprobs import top_log_probs
from alignment.models.sampling import token_log_prob
from alignment.models.sequence import PAUSED, SAMPLE, DecodeSequence, sampler_groups, turn_end
from alignment.models.slot_cache import ROW_BLOCK
from alignment.models.speculative import (accepted_lengths, draft_probabilities, draw_from, filtered_probabilities,
                                          greedy_agreement, point_mass_agreement, position_logits, prompt_lookup,
                                          ratio_agreement, rejection_distribution)


class Speculator:
    """The speculative side of `engine`, drafting by prompt lookup or with `draft` (a draft_model.DraftModel).
    stats: verify forwards, sequences verified, draft tokens fed, and draft tokens accepted into turns, over the
    engine's life."""

    def __init__(self, engine, draft=None):
        self.engine = engine
        self.verify_step = None if engine.routing else getattr(engine.stepper, "verify", None)
        if draft is not None and self.verify_step is None:
            raise ValueError("DecodeEngine: a draft model needs a decode step that verifies (the fused decoder or the "
                             "model's layers; not a compiled or exported step, nor a model whose experts are recorded)")
        self.drafter = None if draft is None else draft.drafter(engine)
        self.stats = {"forwards": 0, "verified": 0, "drafted": 0, "accepted": 0}
        self.batch_uniforms: Dict[int, np.ndarray] = {}  # draft width -> [slots, k] this step's batch draws
        self.q: Dict[DecodeSequence, paddle.Tensor] = {}  # the draft model's [room, vocab] distributions this step
        self.residuals: Dict[int, paddle.Tensor] = {}  # slot -> [vocab] norm(max(0, p - q)) after a rejection

    def modelled(self, config) -> bool:
        """Whether sequences with `config` draft with the draft model."""
        if self.drafter is None or not config.num_assistant_tokens:
            return False
        if config.prompt_lookup_num_tokens:
            raise ValueError("speculative decoding: a draft model and prompt_lookup_num_tokens; set one of "
                             "num_assistant_tokens and prompt_lookup_num_tokens to 0")
        return True

    def width(self, config) -> int:
        """The draft tokens a sequence with `config` feeds at most (0: it does not speculate)."""
        return config.num_assistant_tokens if self.modelled(config) else config.prompt_lookup_num_tokens

    def drafts(self, feeding: List[DecodeSequence]) -> Dict[DecodeSequence, List[int]]:
        """The draft of each sequence of `feeding` (the step's sampled token pending) that speculates and has one;
        draws the step's batch uniforms for the acceptance tests of sequences without an rng."""
        self.batch_uniforms, self.q = {}, {}
        if self.verify_step is None:
            return {}
        drafts, rooms = {}, {}
        for seq in feeding:
            config, k = seq.config, self.width(seq.config)
            if not k:
                continue
            if config.do_sample and seq.rng is None and k not in self.batch_uniforms:
                self.batch_uniforms[k] = self._batch_draws(k)
            room = min(k, config.max_new_tokens - len(seq.turn), seq.max_len - seq.length)
            if self.modelled(config):
                rooms[seq] = room
                continue
            draft = prompt_lookup(seq.history + seq.pending, room, config.prompt_lookup_max, config.prompt_lookup_min)
            if draft:
                drafts[seq] = draft
        if rooms:
            modelled, self.q = self.drafter.propose(rooms, self._draft_uniforms(rooms))
            drafts.update(modelled)
        return drafts

    def _batch_draws(self, k: int) -> np.ndarray:
        return np.stack([self.engine.draw_uniforms().numpy() for _ in range(k)], axis=1)  # [slots, k]

    def _draft_uniforms(self, rooms) -> Dict[DecodeSequence, np.ndarray]:
        """The numbers the draft model's draws take: k per sampling sequence, its rng's or a batch draw's."""
        batch: Dict[int, np.ndarray] = {}
        uniforms = {}
        for seq in rooms:
            k = seq.config.num_assistant_tokens
            if not seq.config.do_sample:
                continue
            if seq.rng is None and k not in batch:
                batch[k] = self._batch_draws(k)
            uniforms[seq] = seq.rng.random(k) if seq.rng is not None else batch[k][seq.slot]
        return uniforms

    def verify(self, drafts: Dict[DecodeSequence, List[int]]) -> List[DecodeSequence]:
        """One verify step per draft width; -> the sequences whose turn ended inside an accepted draft."""
        widths: Dict[int, List[DecodeSequence]] = {}
        for seq in drafts:
            widths.setdefault(self.width(seq.config), []).append(seq)
        return [seq for k in sorted(widths) for seq in self._verify(k, widths[k], drafts)]

    def _verify(self, k: int, seqs: List[DecodeSequence], drafts) -> List[DecodeSequence]:
        engine, slots = self.engine, self.engine.slots
        width = verify_width(k, slots)
        tokens = np.zeros([slots, width], "int64")  # [slots, width]: the sampled token, the draft, padding
        lengths = np.zeros([slots], "int64")  # [slots] draft lengths
        feeding = np.zeros([slots], bool)
        for seq in seqs:
            row = seq.pending + drafts[seq]
            tokens[seq.slot] = row + row[-1:] * (width - len(row))
            lengths[seq.slot], feeding[seq.slot] = len(row) - 1, True
        columns, mask, positions = engine.cache.verify_inputs(feeding, width)
        logits = self.verify_step(paddle.to_tensor(tokens), engine.cache, columns, mask, positions)  # [slots, width, V]
        accepted, log_probs, tops = self._accept(k, seqs, tokens, lengths, logits)
        self.stats["forwards"] += 1
        ended, after = [], np.zeros([slots], "int64")  # [slots] the position whose logits come next
        kept = engine.cache.lengths.copy()  # [slots] columns each slot keeps
        for seq in seqs:
            if self._take(seq, drafts[seq], int(accepted[seq.slot]), log_probs[seq.slot], tops.get(seq.slot)):
                ended.append(seq)
            seq.residual = self.residuals.get(seq.slot) if seq.state == SAMPLE else None
            if self.drafter is not None and self.modelled(seq.config):  # its draft cache: the accepted prefix
                self.drafter.keep(seq, seq.history + seq.pending)
            after[seq.slot], kept[seq.slot] = accepted[seq.slot], seq.fed
        engine.cache.keep(columns, kept)
        going = np.zeros([slots], bool)
        going[[s.slot for s in seqs if s.state == SAMPLE]] = True
        index = paddle.to_tensor(after).reshape([slots, 1, 1]).expand([slots, 1, logits.shape[-1]])
        nxt = paddle.take_along_axis(logits, index, axis=1).squeeze(1)  # [slots, vocab]
        engine.logits = paddle.where(paddle.to_tensor(going).unsqueeze(-1).expand(nxt.shape), nxt, engine.logits)
        return ended

    def _accept(self, k: int, seqs: List[DecodeSequence], tokens: np.ndarray, lengths: np.ndarray, logits):
        """-> (accepted [slots] draft tokens, their log-probs [slots, k], slot -> per position [(id, log-prob)])."""
        engine, slots = self.engine, self.engine.slots
        accepted, log_probs, tops = np.zeros([slots], "int64"), np.zeros([slots, k], "float32"), {}
        self.residuals = {}
        draft = tokens[:, 1:k + 1]  # [slots, k]
        flat = logits[:, :k].reshape([slots * k, -1])  # [slots k, vocab]: the logits each draft token is drawn at
        drafted = paddle.to_tensor(draft.reshape([-1]))  # [slots k]
        for config, temperature, group in sampler_groups(seqs):
            rows = [s.slot for s in group]
            turn_lengths = np.zeros([slots], "int64")
            turn_lengths[rows] = [len(s.turn) for s in group]
            seen = engine.seen if config.repetition_penalty != 1.0 else None
            sampling = position_logits(logits[:, :k], config, seen, paddle.to_tensor(tokens[:, :k]), turn_lengths)
            ratio = config.do_sample and self.modelled(config)
            if ratio:
                p, q = filtered_probabilities(sampling), self._q_rows(group, k)  # [slots k, vocab] each
                keep = ratio_agreement(p, q, drafted, self._uniforms(group, k))
            elif config.do_sample:
                p, sole = draft_probabilities(sampling, drafted)  # [slots k] each
                keep = point_mass_agreement(p.numpy().reshape([slots, k]), self._uniforms(group, k),
                                            sole.numpy().reshape([slots, k]))
            else:
                keep = greedy_agreement(draft, paddle.argmax(sampling, axis=-1).numpy().reshape([slots, k]))
            accepted[rows] = accepted_lengths(keep, lengths)[rows]
            for s in group if ratio else []:  # norm(max(0, p - q)) at the first rejected position
                at = s.slot * k + int(accepted[s.slot])
                if accepted[s.slot] < lengths[s.slot]:
                    self.residuals[s.slot] = rejection_distribution(p[at:at + 1], q[at:at + 1])[0]
            if temperature is None:
                continue
            log_probs[rows] = token_log_prob(flat, drafted, temperature).numpy().reshape([slots, k])[rows]
            top = max(s.top_logprobs for s in group)
            if top:
                values, ids = (t.numpy().reshape([slots, k, top]) for t in
                               top_log_probs(paddle.scale(flat, 1.0 / temperature), top))
                for s in group:
                    tops[s.slot] = [list(zip(ids[s.slot, j, :s.top_logprobs].tolist(),
                                             values[s.slot, j, :s.top_logprobs].tolist())) for j in range(k)]
        return accepted, log_probs, tops

    def _q_rows(self, group: List[DecodeSequence], k: int):
        """[slots k, vocab]: the draft model's distributions of `group`'s draft positions, zeros elsewhere."""
        vocab, q = self.engine.vocab, {s.slot: self.q[s] for s in group}
        blocks = []
        for slot in range(self.engine.slots):
            drafted = q[slot].shape[0] if slot in q else 0  # q[slot] [drafted, vocab]
            blocks += ([q[slot]] if drafted else []) + ([paddle.zeros([k - drafted, vocab])] if drafted < k else [])
        return paddle.concat(blocks)

    def _uniforms(self, group: List[DecodeSequence], k: int) -> np.ndarray:
        """[slots, k] uniform numbers for the acceptance tests: a sequence's own rng's, else the step's batch draw."""
        values = np.zeros([self.engine.slots, k], "float32")
        for seq in group:
            values[seq.slot] = seq.rng.random(k) if seq.rng is not None else self.batch_uniforms[k][seq.slot]
        return values

    def _take(self, seq: DecodeSequence, draft: List[int], accepted: int, log_probs: np.ndarray, tops) -> bool:
        """Feed seq's sampled token and its draft's first `accepted` tokens, ending the turn where one ends it;
        -> whether it ended."""
        engine = self.engine
        self.stats["verified"] += 1
        self.stats["drafted"] += len(draft)
        engine.mark_fed(seq, seq.pending)
        seq.fed, seq.pending = seq.fed + 1, []
        for i, token in enumerate(draft[:accepted]):
            seq.turn.append(token)
            seq.turn_log_probs.append(float(log_probs[i]))
            if seq.top_logprobs and tops is not None:
                seq.turn_top.append(tops[i])
            self.stats["accepted"] += 1
            seq.pending = [token]
            seq.ending = turn_end(seq, token)
            if seq.ending is not None:
                seq.state = PAUSED
                return True
            engine.mark_fed(seq, seq.pending)
            seq.fed, seq.pending = seq.fed + 1, []
        seq.state = SAMPLE
        lookup = not self.modelled(seq.config)
        seq.rejected = draft[accepted] if accepted < len(draft) and seq.config.do_sample and lookup else None
        return False


def verify_width(k: int, slots: int) -> int:
    """The positions per slot of a verify step for drafts of up to k tokens: k + 1, or more so that the step's
    slots x width rows are at most ROW_BLOCK or a multiple of it. MKL's GEMMs round a last, partial block of rows
    differently (slot_cache.step_rows); at 3 slots of width 5 the rows of slots 1 and 2 fall in one and their logits
    differed from the same tokens' in slot 0 (Intel Xeon, measured)."""
    width = k + 1
    while slots * width > ROW_BLOCK and slots * width % ROW_BLOCK:
        width += 1
    return width


def rejected_tokens(group: List[DecodeSequence], slots: int) -> Optional[paddle.Tensor]:
    """[slots] int64: the draft token each sequence of `group` rejected at its last verify step, which its next
    draw leaves out (-1: none); None when no sequence has one."""
    rejected = [(s.slot, s.rejected) for s in group if s.rejected is not None]
    if not rejected:
        return None
    tokens = np.full([slots], -1, "int64")
    for slot, token in rejected:
        tokens[slot] = token
    return paddle.to_tensor(tokens)


def residual_draws(group: List[DecodeSequence], drawn, uniform):
    """drawn [slots] the engine's draws for `group`, uniform [slots] their numbers -> drawn, with each sequence
    whose draft-model token was rejected at its last verify step drawing instead from its residual
    norm(max(0, p - q)) (seq.residual [vocab], taken up) with the same number."""
    waiting = [s for s in group if s.residual is not None]
    if not waiting:
        return drawn
    tokens = drawn.numpy().copy()
    for seq in waiting:  # one row each: its bits its own
        tokens[seq.slot] = int(draw_from(seq.residual.unsqueeze(0), uniform[seq.slot:seq.slot + 1])[0])
        seq.residual = None
    return paddle.to_tensor(tokens)
