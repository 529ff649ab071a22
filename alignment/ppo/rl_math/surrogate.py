"""The clipped policy loss of PPO and its variants, as small pure functions on paddle tensors (shapes and
conventions as in algorithms.py: [B, T] tensors, `mask` 1 on the response tokens trained, rho the ratio
p_new / p_old).

One loss, `clipped_policy_loss`: aggregate_loss(max(-A rho, -A clip(rho, 1 - low, 1 + high)), mask) (PPO,
Schulman et al. 2017, arXiv 1707.06347; with high > low DAPO's clip-higher, Yu et al. 2025, arXiv 2503.14476).
The variants differ in the ratio they clip: `token_ratio` (PPO / GRPO / DAPO) or `gspo_ratio` (GSPO's
length-normalised sequence ratio); the loss classes that combine them are in losses.py. Also here: the loss
aggregation (verl's loss_agg_mode), the entropy bonus and GRPO's KL loss. It imports nothing of the package but
algorithms.py and the names of the aggregation modes.
"""
import paddle

from alignment.config.choices import LOSS_AGG_MODES
from alignment.ppo.rl_math.algorithms import _f32, _masked, masked_mean, masked_sum


def aggregate_loss(per_token_loss, mask, mode, constant=None):
    """Reduce a [B, T] per-token loss to a float32 scalar; `mode` is one of verl's `loss_agg_mode` values:
      token-mean               sum_{i,t} l m / sum_{i,t} m                         (DAPO: every token weighs the same)
      seq-mean-token-mean      mean over rows of (sum_t l m / sum_t m)              (GRPO: every response the same)
      seq-mean-token-sum       mean over rows of sum_t l m
      seq-mean-token-sum-norm  mean over rows of (sum_t l m / constant)             (Dr.GRPO; constant e.g. the
                               maximum response length, fixed over training; required here, no default)
    "Rows" are the rows with at least one mask > 0: an all-masked row adds 0 and is not counted; an all-masked
    batch gives 0 (never NaN). verl's own seq-mean-token-sum-norm divides the sum over rows by the constant,
    without dividing by the number of rows; this is the Dr.GRPO paper's mean over rows.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; choose one of {LOSS_AGG_MODES}")
    if mode == "token-mean":
        return masked_mean(per_token_loss, mask)
    mask = _f32(mask) * paddle.ones_like(_f32(per_token_loss))  # [B, T]
    if mode == "seq-mean-token-mean":
        per_row = masked_mean(per_token_loss, mask, axis=1)  # [B]
    else:
        per_row = masked_sum(per_token_loss, mask, axis=1)  # [B]
    if mode == "seq-mean-token-sum-norm":
        if constant is None or constant <= 0:
            raise ValueError(f"loss aggregation {mode!r} needs a positive constant (e.g. the maximum response "
                             f"length), got {constant!r}")
        per_row = per_row / float(constant)
    return masked_mean(per_row, mask.sum(axis=1) > 0)


def token_ratio(log_probs, old_log_probs, mask):
    """rho_t = exp(log p - log p_old) on the mask, 1 outside it. -> (rho, log rho), both [B, T]."""
    log_ratio = _masked(_f32(log_probs) - _f32(old_log_probs), _f32(mask))  # [B, T]
    return paddle.exp(log_ratio), log_ratio  # [B, T], [B, T]


def gspo_ratio(log_probs, old_log_probs, mask):
    """GSPO (Zheng et al. 2025, arXiv 2507.18071; verl core_algos.compute_policy_loss_gspo). -> (s_it [B, T],
    log s_i [B], token log-ratios [B, T]).

    Sequence ratio s_i = exp(sum_t m (log p - log p_old) / sum_t m)  (length-normalised; 1 for an all-masked row).
    Token ratio s_it = sg(s_i) * p_t / sg(p_t): its value is s_i at every token, its gradient s_i * grad log p_t
    (verl clamps log s_it at 10 as well). Clipped and aggregated seq-mean-token-mean, for a sequence-level A the
    gradient is the paper's -(1/G) sum_i A_i s_i (1/|y_i|) sum_t grad log p_t on unclipped sequences, 0 on clipped.
    """
    mask = _f32(mask)
    log_probs = _masked(log_probs, mask)  # [B, T]
    log_ratio = _masked(log_probs - _f32(old_log_probs), mask)  # [B, T]
    seq_log_ratio = masked_mean(log_ratio, mask, axis=1)  # [B]
    token_log_ratio = log_probs - log_probs.detach() + seq_log_ratio.detach().unsqueeze(1)  # [B, T]  value log s_i
    return paddle.exp(paddle.clip(token_log_ratio, max=10.0)), seq_log_ratio, log_ratio  # [B, T], [B], [B, T]


def clipped_policy_loss(ratio, advantages, mask, low, high, loss_agg_mode="token-mean", loss_agg_constant=None):
    """THE clipped surrogate: aggregate_loss(max(-A rho, -A clip(rho, 1 - low, 1 + high)), mask, loss_agg_mode,
    loss_agg_constant); A is zeroed outside the mask. ratio, advantages, mask: [B, T] -> scalar."""
    advantages = _masked(advantages, mask)  # [B, T]
    clipped = paddle.clip(ratio, 1.0 - low, 1.0 + high)  # [B, T]
    losses = paddle.maximum(-advantages * ratio, -advantages * clipped)  # [B, T]
    return aggregate_loss(losses, mask, loss_agg_mode, loss_agg_constant)


def ppo_ratio_stats(ratio, log_ratio, mask, clip_range):
    """PPO's statistics of a symmetric clip (detached masked means): clip_frac = [|rho - 1| > eps],
    approx_kl = (rho - 1) - log rho (k3 estimate of KL(old || new), >= 0), ratio = rho."""
    with paddle.no_grad():
        stats = {"clip_frac": masked_mean(((ratio - 1.0).abs() > clip_range).astype("float32"), mask),
                 "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask), "ratio": masked_mean(ratio, mask)}
    return {k: v.detach() for k, v in stats.items()}


def ratio_clip_stats(ratio, log_ratio, mask, low, high):
    """The statistics of a clip to [1 - low, 1 + high] over `mask` (tokens or rows), detached masked means:
    clip_frac_low = [rho < 1 - low], clip_frac_high = [rho > 1 + high], clip_frac = their sum (ratio outside the
    range, whatever the sign of A; verl's pg_clipfrac counts only tokens where the clipped branch is taken),
    approx_kl = (rho - 1) - log rho, ratio = rho."""
    with paddle.no_grad():
        below = masked_mean((ratio < 1.0 - low).astype("float32"), mask)
        above = masked_mean((ratio > 1.0 + high).astype("float32"), mask)
        stats = {"clip_frac": below + above, "clip_frac_low": below, "clip_frac_high": above,
                 "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask), "ratio": masked_mean(ratio, mask)}
    return {k: v.detach() for k, v in stats.items()}


def entropy_bonus_loss(policy_loss, entropy, mask, entropy_coeff, loss_agg_mode="token-mean",
                       loss_agg_constant=None):
    """policy_loss - entropy_coeff * aggregate_loss(entropy, mask, loss_agg_mode) (verl dp_actor: the entropy is
    aggregated like the policy loss). entropy: per-token [B, T]. -> (loss, aggregated entropy, detached)."""
    entropy = aggregate_loss(entropy, mask, loss_agg_mode, loss_agg_constant)
    return _f32(policy_loss) - entropy_coeff * entropy, entropy.detach()


def kl_loss(log_probs, ref_log_probs, mask, kl_estimate, loss_agg_mode="token-mean",
            loss_agg_constant=None):
    """GRPO's KL loss term (to be scaled by kl_loss_coeff): aggregate_loss(kl_estimate(p, q), mask, loss_agg_mode)
    with kl_estimate a per-token estimate of kl.py. Log-probs outside the mask are zeroed first, so garbage
    there gives no NaN gradient. -> scalar."""
    log_probs, ref_log_probs = _masked(log_probs, mask), _masked(ref_log_probs, mask)  # [B, T]
    return aggregate_loss(kl_estimate(log_probs, ref_log_probs), mask, loss_agg_mode, loss_agg_constant)


def gspo_ratio_stats(seq_log_ratio, log_ratio, mask, low, high):
    """GSPO's statistics: clip_frac(_low/_high) and ratio over the rows with tokens of [s_i < 1 - low],
    [s_i > 1 + high] and s_i; approx_kl the token-level masked mean of (rho_t - 1) - log rho_t, as elsewhere.
    seq_log_ratio [B], log_ratio and mask [B, T]."""
    has_tokens = (_f32(mask).sum(axis=1) > 0).astype("float32")  # [B]
    stats = ratio_clip_stats(paddle.exp(seq_log_ratio), seq_log_ratio, has_tokens, low, high)
    with paddle.no_grad():
        token_ratio = paddle.exp(log_ratio)  # [B, T]
        stats["approx_kl"] = masked_mean(token_ratio - 1.0 - log_ratio, mask).detach()
    return stats
