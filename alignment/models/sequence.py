"""A sequence in the decode engine (engine.py): what it feeds, what its turns sampled, and when a turn ends."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence as Seq

import numpy as np

from alignment.models.sampling import GenerationConfig

PREFILL, SAMPLE, DECODE, PAUSED = "prefill", "sample", "decode", "paused"


class DecodeSequence:
    """A sequence in the engine: `ids` to feed first, the sampler `config` of its turns (max_new_tokens caps a
    turn), `max_len` tokens it may hold in all (prompt included). rng: a numpy Generator giving its uniform
    numbers, one per sampled token (None: the engine's batch draw); stop(turn ids) -> True when a stop string
    ended the turn; log_prob_temperature: the temperature its tokens' log-probs are taken at (None: not taken,
    turn_log_probs stay 0); top_logprobs: also keep the k most likely tokens and their log-probs at each sampled
    position (turn_top: per token [(id, log-prob)], most likely first); adapter: the index of the served LoRA
    adapter it runs (multi_lora.py; None: the model as it is)."""

    def __init__(self, ids: Seq[int], config: GenerationConfig, max_len: int, rng=None,
                 stop: Optional[Callable[[List[int]], bool]] = None, log_prob_temperature: Optional[float] = 1.0,
                 top_logprobs: int = 0, adapter: Optional[int] = None):
        if not ids:
            raise ValueError("DecodeSequence: at least one id to start from")
        self.config, self.max_len, self.rng, self.stop = config, max_len, rng, stop
        self.log_prob_temperature, self.top_logprobs, self.adapter = log_prob_temperature, top_logprobs, adapter
        self.turn_top: List[list] = []
        self.pending: List[int] = list(ids)  # ids to feed (the paused turn's last token first)
        self.fed = 0  # ids in the cache
        self.history: List[int] = []  # the ids in the cache (what prompt lookup drafts from)
        self.turn: List[int] = []  # tokens sampled this turn
        self.experts: List[np.ndarray] = []  # MoE: per fed token, [sparse layers, k] experts it was routed to
        self.turn_log_probs: List[float] = []
        self.ending: Optional[str] = None  # why the last turn ended: eos, stop, length, budget
        self.rejected: Optional[int] = None  # a draft token the next draw must leave out (speculative.py)
        self.residual = None  # [vocab] after a draft model's rejected token: what the next draw comes from
        self.slot: Optional[int] = None
        self.state = PREFILL

    @property
    def length(self) -> int:
        """Tokens in the sequence: fed and to feed."""
        return self.fed + len(self.pending)


def turn_end(seq: DecodeSequence, token: int) -> Optional[str]:
    """Why `token`, just appended to seq.turn, ends the turn (None: it goes on)."""
    if token in seq.config.eos_ids:
        return "eos"
    if seq.stop is not None and seq.stop(seq.turn):
        return "stop"
    if seq.length >= seq.max_len:
        return "budget"
    return "length" if len(seq.turn) >= seq.config.max_new_tokens else None


def sampler_groups(sampling: List[DecodeSequence]):
    """(config, log-prob temperature, sequences) for each distinct sampler among `sampling`."""
    groups: Dict[tuple, list] = {}
    for seq in sampling:
        groups.setdefault((id(seq.config), seq.log_prob_temperature), [seq.config, seq.log_prob_temperature, []])
        groups[(id(seq.config), seq.log_prob_temperature)][2].append(seq)
    return list(groups.values())
