"""Offline preference losses, registered by name (`loss_type`; alignment/config/registry.py): DPO and its
variants on preference pairs, and KTO on unpaired rows. Pure math on paddle tensors.

Inputs are per-sequence log-probabilities, already summed over the response tokens (prompt and padding
excluded; see `alignment.dpo.dpo_trainer.sequence_log_probs`), with the token counts where a variant averages.
Every loss gives (losses [b], chosen_rewards [b], rejected_rewards [b]); rewards are the implicit
rewards beta * (log pi - log pi_ref), detached, for logging.

A loss's traits say what the stage does for it, so neither the arguments, the data nor the trainer ask which loss
they have: `paired` (preference pairs; KTO reads unpaired rows), `reference_free` (no reference model is loaded:
log pi_ref = 0), `token_averaged` (the ratios are averaged over the response tokens), `takes_label_smoothing`
(cDPO's label_smoothing applies). The variants PaddleNLP and PaddleFormers add (dpop, kto_pair, sppo_hard, nca_pair, or)
follow their criterion (paddlenlp/trl/dpo_criterion.py `dpo_loss`, paddleformers/nn/criterion/dpo_loss.py
`cal_dpo_loss`): ipo, simpo and or on token-averaged log-probs, the others on summed ones.
"""
from __future__ import annotations

import paddle
import paddle.nn.functional as F

from alignment.config.registry import PREFERENCE_LOSSES, Registered


class PreferenceLoss(Registered, registry=PREFERENCE_LOSSES):
    """A `loss_type`. A paired loss's __call__(c, r, options) -> losses [b], where c = log pi(chosen) -
    log pi_ref(chosen) and r likewise for the rejected answer ([b] each; token-averaged when token_averaged, the
    reference 0 when reference_free; preference_loss below prepares them); options: beta, label_smoothing,
    simpo_gamma, dpop_lambda. An unpaired loss (paired False) is called as kto_loss below, with the reference
    point its reference_point(policy_mismatched, ref_mismatched) gives (kto_kl_estimate's signature)."""

    paired = True  # reads preference pairs (chosen, rejected); False: unpaired rows, each desirable or not
    reference_free = False  # ignores the reference: no reference model is loaded (PaddleNLP's reference_free)
    token_averaged = False  # the log-ratios are averaged over each response's tokens
    takes_label_smoothing = False  # label_smoothing applies (cDPO's flipped-label probability)

    def __call__(self, c, r, o):
        raise NotImplementedError


def _smoothed(logits, label_smoothing):
    """cDPO: -(1 - ls) log s(x) - ls log s(-x)."""
    return -(1 - label_smoothing) * F.log_sigmoid(logits) - label_smoothing * F.log_sigmoid(-logits)


class Sigmoid(PreferenceLoss):
    """DPO: h = (pc - rc) - (pr - rr); -(1 - ls) log s(beta h) - ls log s(-beta h)."""

    NAME = "sigmoid"
    takes_label_smoothing = True

    def __call__(self, c, r, o):
        return _smoothed(o["beta"] * (c - r), o["label_smoothing"])


class IPO(PreferenceLoss):
    """IPO on token-averaged ratios: (h - 1 / (2 beta))^2."""

    NAME = "ipo"
    token_averaged = True

    def __call__(self, c, r, o):
        return (c - r - 1.0 / (2.0 * o["beta"])) ** 2


class Hinge(PreferenceLoss):
    """SLiC: relu(1 - beta h)."""

    NAME = "hinge"

    def __call__(self, c, r, o):
        return F.relu(1.0 - o["beta"] * (c - r))


class SimPO(PreferenceLoss):
    """SimPO (reference-free, token-averaged): -(1 - ls) log s(beta (pc - pr) - gamma) - ls log s(-...)."""

    NAME = "simpo"
    reference_free = True
    token_averaged = True
    takes_label_smoothing = True

    def __call__(self, c, r, o):
        return _smoothed(o["beta"] * (c - r) - o["simpo_gamma"], o["label_smoothing"])


class DPOP(PreferenceLoss):
    """DPO-Positive: -log s(beta (h - lambda max(0, rc - pc))): a penalty when the chosen answer loses
    probability."""

    NAME = "dpop"

    def __call__(self, c, r, o):
        return -F.log_sigmoid(o["beta"] * (c - r - o["dpop_lambda"] * paddle.clip(-c, min=0.0)))


class KTOPair(PreferenceLoss):
    """KTO on pairs (HALOs eqn 7): each side's reference point is the other side's batch-mean ratio, clipped at 0;
    1 - s(beta (c - KL_r)) for the chosen and 1 - s(beta (KL_c - r)) for the rejected half, averaged per pair
    (PaddleNLP averages the concatenation: the same mean)."""

    NAME = "kto_pair"

    def __call__(self, c, r, o):
        chosen_kl, rejected_kl = paddle.clip(c.mean(), min=0.0), paddle.clip(r.mean(), min=0.0)
        beta = o["beta"]
        return ((1 - F.sigmoid(beta * (c - rejected_kl))) + (1 - F.sigmoid(beta * (chosen_kl - r)))) / 2


class SPPOHard(PreferenceLoss):
    """SPPO with hard probabilities (winner 1, loser 0): (c - 1 / (2 beta))^2 + (r + 1 / (2 beta))^2."""

    NAME = "sppo_hard"

    def __call__(self, c, r, o):
        half = 0.5 / o["beta"]
        return (c - half) ** 2 + (r + half) ** 2


class NCAPair(PreferenceLoss):
    """NCA: -log s(beta c) - 0.5 log s(-beta c) - 0.5 log s(-beta r)."""

    NAME = "nca_pair"

    def __call__(self, c, r, o):
        beta = o["beta"]
        return -F.log_sigmoid(beta * c) - 0.5 * F.log_sigmoid(-beta * c) - 0.5 * F.log_sigmoid(-beta * r)


class OddsRatio(PreferenceLoss):
    """ORPO's odds-ratio term on token-averaged log-probs (reference-free): -log s(log odds(c) - log odds(r)),
    log odds(p) = log p - log(1 - p); the NLL part of ORPO is nll_loss_coef (PaddleNLP's sft_loss_ratio)."""

    NAME = "or"
    reference_free = True
    token_averaged = True

    def __call__(self, c, r, o):
        log_odds = (c - r) - (paddle.log1p(-paddle.exp(c)) - paddle.log1p(-paddle.exp(r)))
        return -F.log_sigmoid(log_odds)


def preference_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_tokens, rejected_tokens,
                    loss_type: str = "sigmoid", beta: float = 0.1, label_smoothing: float = 0.0,
                    simpo_gamma: float = 0.5, dpop_lambda: float = 50.0):
    """Pairwise losses; all inputs [b] (log-probs summed over response tokens; token counts as float).

    The loss sees c = log pi(chosen) - log pi_ref(chosen) and r likewise for the rejected answer (token-averaged
    for ipo, simpo and or; the reference is 0 for the reference-free simpo and or); see each function above.
    """
    loss = PREFERENCE_LOSSES.lookup(loss_type)
    if not loss.paired:
        paired = PREFERENCE_LOSSES.names(where=lambda cls: cls.paired)
        raise ValueError(f"{loss_type!r} is not a paired loss; the paired ones: {', '.join(paired)}")
    averaged, uses_reference = loss.token_averaged, not loss.reference_free
    chosen = policy_chosen - ref_chosen if uses_reference else policy_chosen  # [b]
    rejected = policy_rejected - ref_rejected if uses_reference else policy_rejected  # [b]
    if averaged:
        chosen, rejected = chosen / chosen_tokens, rejected / rejected_tokens
    options = {"beta": beta, "label_smoothing": label_smoothing, "simpo_gamma": simpo_gamma,
               "dpop_lambda": dpop_lambda}
    losses = loss()(chosen, rejected, options)
    if uses_reference and averaged:  # ipo logs the summed ratios, as before
        chosen, rejected = policy_chosen - ref_chosen, policy_rejected - ref_rejected
    return losses, (beta * chosen).detach(), (beta * rejected).detach()


def kto_kl_estimate(policy_mismatched, ref_mismatched):
    """KTO's reference point z0: the batch mean of log pi - log pi_ref on mismatched (prompt, completion) rows,
    clamped at 0 and detached (as in the paper and TRL). Inputs [m] -> scalar."""
    return paddle.clip((policy_mismatched - ref_mismatched).mean(), min=0.0).detach()


def kto_loss(policy_logps, ref_logps, desirable, kl, beta: float = 0.1, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0):
    """KTO on unpaired rows. policy_logps, ref_logps [b] (summed over response tokens); desirable [b] bool;
    kl: scalar reference point (kto_kl_estimate).

    desirable:    w_d (1 - s(beta (log ratio - kl)))
    undesirable:  w_u (1 - s(beta (kl - log ratio)))
    Returns (losses [b], rewards of desirable rows [b], rewards of undesirable rows [b]); the reward of a row of
    the other kind is 0 (use the masks to average).
    """
    ratio = policy_logps - ref_logps  # [b]
    want = desirable.astype(ratio.dtype)  # [b]
    desirable_losses = desirable_weight * (1 - F.sigmoid(beta * (ratio - kl)))
    undesirable_losses = undesirable_weight * (1 - F.sigmoid(beta * (kl - ratio)))
    losses = want * desirable_losses + (1 - want) * undesirable_losses
    rewards = (beta * ratio).detach()
    return losses, rewards * want, rewards * (1 - want)


class KTO(PreferenceLoss):
    """KTO on unpaired rows (Ethayarajh et al. 2024, arXiv 2402.01306): kto_loss, its reference point
    kto_kl_estimate."""

    NAME = "kto"
    paired = False
    reference_point = staticmethod(kto_kl_estimate)

    def __call__(self, policy_logps, ref_logps, desirable, kl, beta, desirable_weight, undesirable_weight):
        return kto_loss(policy_logps, ref_logps, desirable, kl, beta, desirable_weight, undesirable_weight)
