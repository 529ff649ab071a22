"""Mixture-of-experts policies in the RL step (key moe_routing_replay), as a strategy like critic.py's: the trainer
asks neither whether its actor has experts nor whether it replays.

Without replay the sampler and the trainer each route every token for themselves, and a token whose top-k differs
between them (float rounding at the sampler, weights moved by an update or by asynchrony) makes the ratio compare
two routings as well as two policies. Rollout routing replay (R3; Ma et al. 2025, "Stabilizing MoE Reinforcement
Learning by Aligning Training and Inference Routers"; verl's router replay) records the sampler's choices (generate's
GenerationOutput.experts, or a multi-turn episode's Trajectory.experts: its prompt, turns and observations; kept as
Rollout.experts [N, P + R, sparse layers, k]) and routes the trainer's passes over the rollout (the old log-probs
and the update) to them; the gate's probabilities still weigh the chosen experts, so
the router keeps its gradient. The reference model routes for itself.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Optional, Tuple

from alignment.models.moe import moe_blocks, moe_training_terms, replayed_routing, routing_mismatch


class OwnRouting:
    """Every pass routes each token itself (moe_routing_replay: none; and every dense model)."""

    records = False  # whether the sampler keeps each token's experts on the rollout

    def __init__(self, actor):
        self.has_experts = bool(moe_blocks(actor))

    def around(self, model, batch):
        """The context a forward of `model` over `batch` (a Rollout or micro-batch of it) runs in."""
        return contextlib.nullcontext()

    def step_terms(self, model, batch) -> Tuple[Optional[object], Dict[str, float]]:
        """After the actor's forward over `batch`: (the load-balancing loss to add, as transformers adds it when the
        config's output_router_logits is set, else None; moe/* metrics: the auxiliary loss and each sparse layer's
        largest expert load). (None, {}) for a dense model."""
        if not self.has_experts:
            return None, {}
        return moe_training_terms(model, batch.attention_mask)


class RolloutRouting(OwnRouting):
    """The trainer's passes over a rollout use the experts its sampler chose (moe_routing_replay: rollout). A rollout
    with no record (answers the actor did not sample, e.g. GKD's dataset answers) routes itself."""

    records = True

    def __init__(self, actor):
        super().__init__(actor)
        if not self.has_experts:
            raise ValueError("key 'moe_routing_replay' 'rollout' replays expert choices, but the actor has no expert "
                             "layers (set it to 'none' for a dense model)")

    def around(self, model, batch):
        return contextlib.nullcontext() if batch.experts is None else replayed_routing(model, batch.experts)

    def step_terms(self, model, batch):
        """OwnRouting's, and (inside around) moe/routing_mismatch: the share of replayed (token, layer) choices the
        trainer's router would have made otherwise, the disagreement replay removes."""
        aux, metrics = super().step_terms(model, batch)
        if batch.experts is not None:
            metrics["moe/routing_mismatch"] = routing_mismatch(model)
        return aux, metrics


REPLAYS = {"none": OwnRouting, "rollout": RolloutRouting}  # config/choices.py MOE_ROUTING_REPLAYS


def routing_for(name: str, actor) -> OwnRouting:
    return REPLAYS[name](actor)
