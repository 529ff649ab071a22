"""Off-policy correction for samples drawn by an older policy (asynchronous RL), as small pure functions.

Three policies meet in an asynchronous update: the behaviour policy mu that sampled a row (recorded at sampling,
`behaviour_log_probs`), the proximal policy pi_prox (the current weights before this step's update: the rollout's
recomputed old log-probs) and the policy being updated pi_theta. Decoupled PPO (Hilton, Cobbe, Schulman 2022,
"Batch size-invariance for policy optimization", arXiv 2110.00641; used by AReaL, Fu et al. 2025, arXiv
2505.24298) clips pi_theta / pi_prox as usual and weights each token's surrogate by pi_prox / mu; that weight is
truncated at C (truncated importance sampling: Espeholt et al. 2018 "IMPALA", arXiv 1802.01561; Yao et al. 2025
"Your efficient RL framework secretly brings you off-policy RL training"). The clipped surrogate is linear in the
advantage for a non-negative weight, so the weight is applied to the advantages:

    -min(r A w, clip(r) A w) = -w min(r A, clip(r) A),   r = pi_theta / pi_prox,  w = min(pi_prox / mu, C)

Rows sampled by the current weights (version == the trainer's) have mu = pi_prox up to float rounding and keep
w = 1 exactly, so max_staleness 0 trains bitwise as the synchronous run.
"""
import paddle

from alignment.ppo.rl_math import algorithms as rl


def per_token(stale):
    """stale [N] bool (a version per row) or [N, R] (partial rollouts: a version per token) -> broadcastable to
    [N, R]."""
    return stale if stale.ndim == 2 else stale.reshape([-1, 1])


def behaviour_weights(prox_log_probs, behaviour_log_probs, mask, stale, cap):
    """Truncated importance weights [N, R]: min(exp(prox - behaviour), cap) on the masked stale tokens (stale [N]
    bool per row, or [N, R] per token), 1 on every other token. Inputs [N, R]."""
    log_ratio = (rl._f32(prox_log_probs) - rl._f32(behaviour_log_probs)).clip(max=80.0)  # [N, R]
    weights = paddle.minimum(paddle.exp(log_ratio), paddle.full_like(log_ratio, cap))  # [N, R]
    use = (rl._f32(mask) > 0) & per_token(stale)  # [N, R]
    return paddle.where(use, weights, paddle.ones_like(weights))  # [N, R]


def corrected_advantages(advantages, prox_log_probs, behaviour_log_probs, mask, stale, cap):
    """advantages [N, R] times the truncated behaviour weights; unchanged (the same tensor) when no row is stale."""
    if not bool(stale.any()):
        return advantages
    return advantages * behaviour_weights(prox_log_probs, behaviour_log_probs, mask, stale, cap)  # [N, R]


def log_prob_gap(prox_log_probs, behaviour_log_probs, mask):
    """(max, p99) of |prox - behaviour| over the masked tokens: how far the sampler's log-probs are from the
    trainer's for the same weights (rounding, other kernels) or older weights (staleness). 0, 0 when none."""
    gap = (rl._f32(prox_log_probs) - rl._f32(behaviour_log_probs)).abs()  # [N, R]
    values = paddle.masked_select(gap, rl._f32(mask) > 0)  # [n]
    if values.shape[0] == 0:
        return 0.0, 0.0
    return float(values.max()), float(paddle.quantile(values, 0.99))
