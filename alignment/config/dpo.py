"""Arguments of the offline preference stage (DPO family and KTO); key names follow TRL / PaddleNLP's DPO."""
from __future__ import annotations

import dataclasses
from typing import Optional

from alignment.config.parser import field
from alignment.config.registry import PREFERENCE_LOSSES
from alignment.config.training import pipelined


@dataclasses.dataclass
class DPOArguments:
    """The preference-optimisation loss (DPO family, KTO)."""

    beta: float = field(0.1, gt=0, help="Strength of the implicit KL to the reference: the temperature of the implicit "
                                        "reward beta * log(pi / pi_ref). For simpo the reward scale (SimPO uses 2-10).")
    loss_type: str = field("sigmoid", help="A registered preference loss (alignment/dpo/losses.py): sigmoid = "
                                           "DPO, ipo, hinge (SLiC), simpo (reference-free, length-normalised, "
                                           "margin simpo_gamma), PaddleNLP's dpop (dpop_lambda), kto_pair, "
                                           "sppo_hard, nca_pair and or (ORPO's odds-ratio term, reference-free; "
                                           "its NLL term is nll_loss_coef), kto (unpaired rows: KTO's data, or "
                                           "preference pairs split into a desirable and an undesirable row; "
                                           "alignment/dpo/run_kto.py runs it).")
    label_smoothing: float = field(0.0, ge=0, lt=0.5, help="cDPO: assumed probability that a pair's label is "
                                                           "flipped (sigmoid and simpo); 0 = plain DPO.")
    simpo_gamma: float = field(0.5, ge=0, help="SimPO target reward margin gamma (loss_type simpo only).")
    dpop_lambda: float = field(50.0, ge=0, help="DPO-Positive's weight on the chosen answer losing probability "
                                                "(loss_type dpop only; PaddleNLP's default 50).")
    reference_free: bool = field(False, help="Use a uniform reference (log pi_ref = 0): no reference model is "
                                             "loaded. simpo and or are always reference-free.")
    nll_loss_coef: float = field(0.0, ge=0, help="Weight of an SFT term: mean negative log-likelihood of the chosen "
                                                 "(for kto: desirable) response tokens, added to the loss.")
    ref_model_name_or_path: Optional[str] = field(None, help="Reference model; null = the policy's starting "
                                                             "checkpoint (model_name_or_path).")
    precompute_ref_log_probs: bool = field(False, help="Score every train and eval sample with the reference "
                                                       "model once before training, cache the log-probs and free "
                                                       "the reference model (saves its memory and forward passes).")
    desirable_weight: float = field(1.0, gt=0, help="KTO weight of desirable rows (raise it when they are rarer).")
    undesirable_weight: float = field(1.0, gt=0, help="KTO weight of undesirable rows.")

    @property
    def loss(self) -> type:
        """The preference loss's class (its traits: paired, reference_free, token_averaged, ...)."""
        return PREFERENCE_LOSSES.lookup(self.loss_type)

    @property
    def needs_reference(self) -> bool:
        return not (self.reference_free or self.loss.reference_free)

    def validate(self) -> None:
        PREFERENCE_LOSSES.check("loss_type", self.loss_type)
        if self.label_smoothing > 0 and not self.loss.takes_label_smoothing:
            smoothed = " or ".join(PREFERENCE_LOSSES.names(where=lambda loss: loss.takes_label_smoothing))
            raise ValueError(f"key 'label_smoothing' applies to loss_type {smoothed}, not {self.loss_type!r}")
        if not self.needs_reference and (self.ref_model_name_or_path or self.precompute_ref_log_probs):
            key = "ref_model_name_or_path" if self.ref_model_name_or_path else "precompute_ref_log_probs"
            why = "reference_free true" if self.reference_free else f"loss_type {self.loss_type} (reference-free)"
            raise ValueError(f"key {key!r} contradicts {why} (no reference model is used)")

    def validate_with(self, *others) -> None:
        if not self.loss.paired and pipelined(others):  # the unpaired rows' batch has a second, mismatched half
            raise ValueError(f"key 'loss_type': {self.loss_type!r} with pipeline_parallel_degree > 1 is not supported")


@dataclasses.dataclass
class KTOArguments(DPOArguments):
    """KTO's loss (run_kto.py): the KTO stage's arguments, PaddleNLP's KTOConfig keys (beta, desirable_weight,
    undesirable_weight)."""

    loss_type: str = field("kto", help="'kto' (this entry point trains KTO only; the DPO family runs with "
                                       "alignment/dpo/run_dpo.py).")

    def validate(self) -> None:
        if self.loss_type not in PREFERENCE_LOSSES or self.loss.paired:
            raise ValueError(f"key 'loss_type': run_kto.py trains KTO, not {self.loss_type!r}; train the DPO family "
                             "with alignment/dpo/run_dpo.py")
        super().validate()
