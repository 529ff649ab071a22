"""The keys of speculative decoding in rollouts (a mixin of PPOArguments, ppo.py): a prompt-lookup drafter
(`prompt_lookup_num_tokens`) or a draft model (`speculative_draft_model`, a checkpoint with the policy's
vocabulary, frozen; or `speculative_draft_keep_every`, the policy with decoder layers dropped, refreshed from the
policy's weights at every version), drafting `num_assistant_tokens` tokens. Either way the policy verifies the
draft in one forward and every kept token and log-prob is the policy's (alignment/models/speculative.py)."""
from __future__ import annotations

import dataclasses

from alignment.config.parser import field


@dataclasses.dataclass
class SpeculativeKeys:
    """Speculative decoding of rollouts: prompt lookup or a draft model."""

    prompt_lookup_num_tokens: int = field(0, ge=0, help="Speculative decoding of rollouts: up to this many tokens "
                                                        "drafted by prompt lookup (what followed the sequence's "
                                                        "last n-gram earlier in it) and verified in one forward of "
                                                        "the policy; the tokens are distributed as plain decoding's "
                                                        "(greedy: the same tokens). 0 = off.")
    speculative_draft_model: str = field("", help="Speculative decoding of rollouts with a draft model: a "
                                                  "checkpoint directory of a small LLaMA-family model with the "
                                                  "policy's vocabulary and tokenizer (a distilled student, say); "
                                                  "it drafts num_assistant_tokens tokens one at a time and the "
                                                  "policy verifies them in one forward. It stays frozen (it is not "
                                                  "trained). Single-turn rollouts, episodes and agents' gateway. "
                                                  "'' = off.")
    speculative_draft_keep_every: int = field(0, ge=0, help="Speculative decoding of rollouts with the policy "
                                                            "itself, decoder layers dropped, as the draft model: "
                                                            "layers 0, k, 2k, ... kept with the embeddings, norm "
                                                            "and head; its weights are copied from the policy's at "
                                                            "every policy version, so it follows the updates. "
                                                            "0 = off.")
    num_assistant_tokens: int = field(5, ge=1, help="Tokens the draft model (speculative_draft_model or "
                                                    "speculative_draft_keep_every) drafts before each verify "
                                                    "forward of the policy (Hugging Face's name; a constant "
                                                    "number).")

    @property
    def draft_key(self) -> str:
        """The key that turns a draft model on ('' when none does)."""
        return "speculative_draft_model" if self.speculative_draft_model else \
            "speculative_draft_keep_every" if self.speculative_draft_keep_every else ""

    def validate_speculative(self, rollout_decode: str) -> None:
        if self.speculative_draft_model and self.speculative_draft_keep_every:
            raise ValueError("keys 'speculative_draft_model' and 'speculative_draft_keep_every' both name a draft "
                             "model: set one of them")
        if self.draft_key and self.prompt_lookup_num_tokens:
            raise ValueError(f"keys '{self.draft_key}' and 'prompt_lookup_num_tokens': one drafter at a time (a "
                             f"draft model or prompt lookup)")
        for key in ("prompt_lookup_num_tokens", self.draft_key):
            if key and getattr(self, key) and rollout_decode == "static":
                raise ValueError(f"key '{key}' needs 'rollout_decode': 'eager' (a compiled static step feeds one "
                                 f"token a step)")
        if self.speculative_draft_keep_every == 1:
            raise ValueError("key 'speculative_draft_keep_every' 1 keeps every layer: the draft would be the policy "
                             "(2 or more)")
