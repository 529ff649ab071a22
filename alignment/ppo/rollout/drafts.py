"""The draft model rollouts speculate with (keys `speculative_draft_model`, `speculative_draft_keep_every`): the
sampler strategies (samplers.py, agent_programs.py) ask it for the draft of the model that generates and hand that
to the decode engine (models/draft_model.py; single-turn rollouts through generate, episodes through
envs/multiturn.py, agents through the gateway's engine).

- A checkpoint (`FrozenDraft`) stays as loaded: it is another model (a distilled student, say), not a function of
  the policy's weights, and training it would need a loss of its own; its acceptance may fall as the policy moves
  away from it, which costs speed only.
- The policy with layers dropped (`DroppedLayersDraft`) is a function of the policy's weights, so it follows them:
  its own copy (the engine's fused decoder reads whole weight matrices of one model) is refreshed from the model
  that generates whenever that model is at another policy version (weights_digest.policy_version, set at every
  step; a model no one marked is copied at every draw).

Exactness does not depend on either: the policy verifies every draft token and every kept token's log-prob comes
from the policy's verifying pass (models/speculative_step.py). Partial rollouts that move the weights within a
draw keep the draft of the draw's first version (the acceptance, not the tokens' law, changes).
"""
from __future__ import annotations

from typing import Optional, Tuple

from alignment.models.draft_model import DraftModel, copy_dropped, layer_dropped
from alignment.models.weights_digest import policy_version


class FrozenDraft:
    """A draft model loaded from a checkpoint (speculative_draft_model), the same for every policy version."""

    def __init__(self, model):
        self.model, self.draft = model, DraftModel(model)

    @property
    def models(self) -> Tuple:
        """The models the generate phase uses (offload brings them to the device for it)."""
        return (self.model,)

    def for_model(self, model) -> Optional[DraftModel]:
        return self.draft


class DroppedLayersDraft:
    """The generating policy with decoder layers 0, k, 2k, ... kept (speculative_draft_keep_every = k), its weights
    copied from that policy at each of its versions."""

    def __init__(self, policy, keep_every: int):
        self.keep_every = keep_every
        self.model = layer_dropped(policy, keep_every)
        self.draft = DraftModel(self.model)
        self.shape = _shape(policy)
        self.copied: Optional[Tuple[int, int]] = None  # (id of the model, its version) the weights are from

    @property
    def models(self) -> Tuple:
        return (self.model,)

    def for_model(self, model) -> Optional[DraftModel]:
        """The draft of `model` (the policy, or its whole copy), refreshed to its version; None for a model of
        another shape (a seq_kd teacher samples without a draft)."""
        if _shape(model) != self.shape:
            return None
        key = (id(model), policy_version(model))
        if key[1] is None or key != self.copied:
            copy_dropped(self.model, model, self.keep_every)
            self.copied = key
        return self.draft


def _shape(model) -> tuple:
    config = model.config
    return (config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.vocab_size)


def draft_for(draft, model) -> Optional[DraftModel]:
    """The DraftModel the engine decoding with `model` speculates with (None: no draft)."""
    return None if draft is None else draft.for_model(model)
