"""The RL math of PPO / GRPO / REINFORCE++ / RLOO as small pure functions on paddle tensors.

Shapes: B = batch (rows), T = time (tokens), V = vocabulary, N = num_prompts * group_size.
A `mask` is a float/int/bool [B, T] tensor that is 1 on the response tokens being trained and 0 elsewhere; the
response block may sit anywhere in the row (left or right padding, or the response part of a full sequence).
Values outside the mask never leak into results: they are selected away with `paddle.where`, so even inf/NaN
garbage at padded positions gives finite outputs. Everything is computed in float32.
Conventions: p = current policy (actor), q = reference policy, rho = exp(log p_new - log p_old).
Token log-probs and entropies from logits are the models' (alignment/models/logprobs.py); this module starts from
log-probs. It imports nothing of the package but the names of the choices (alignment/config/choices.py).
"""
import paddle


from alignment.config.choices import GROUP_ESTIMATORS, KL_ESTIMATORS, KL_LOSS_ESTIMATORS, LOSS_AGG_MODES


def _f32(x):
    x = paddle.to_tensor(x) if not isinstance(x, paddle.Tensor) else x
    return x if x.dtype == paddle.float32 else x.astype("float32")


def _masked(x, mask):
    """x * mask where mask > 0, exactly 0 elsewhere (also when x is inf/NaN there; gradients there are 0)."""
    x, mask = _f32(x), _f32(mask)
    product = x * mask  # broadcast shape of x and mask
    return paddle.where(mask > 0, product, paddle.zeros_like(product))  # broadcast shape


def _safe_div(num, den):
    """num / den, and 0 where den == 0 (num is 0 there for masked sums)."""
    ok = den > 0
    return paddle.where(ok, num / paddle.where(ok, den, paddle.ones_like(den)), paddle.zeros_like(num))


def kl_penalty(log_probs, ref_log_probs, estimator="k1"):
    """Per-token estimate of KL(p || q) from samples of p (Schulman's k1/k2/k3). [B,T] -> [B,T].

    k1 = log p - log q;  k2 = 0.5 (log p - log q)^2;  k3 = exp(log q - log p) - (log q - log p) - 1  (>= 0).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")
    log_ratio = _f32(log_probs) - _f32(ref_log_probs)  # [B, T]  log p - log q
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()  # [B, T]
    return paddle.exp(-log_ratio) + log_ratio - 1.0  # [B, T]


def masked_sum(x, mask, axis=None):
    """sum(x * mask) over `axis` (all elements when None)."""
    return _masked(x, mask).sum(axis=axis)


def masked_mean(x, mask, axis=None):
    """sum(x * mask) / sum(mask) over `axis`; 0 (not NaN) where sum(mask) == 0."""
    mask = _f32(mask) * paddle.ones_like(_f32(x))  # broadcast to x's shape
    return _safe_div(masked_sum(x, mask, axis), mask.sum(axis=axis))


def masked_var(x, mask, unbiased=True):
    """Variance of the masked elements; unbiased divides by (n - 1) (as TRL's whiten), by 1 when n <= 1."""
    mean = masked_mean(x, mask)
    sq = masked_sum((_f32(x) - mean).square(), mask)
    n = _f32(mask).sum()
    return sq / paddle.clip(n - 1.0, min=1.0) if unbiased else _safe_div(sq, n)


def masked_whiten(x, mask, shift_mean=True, eps=1e-8, reduce_sum=None):
    """(x - mean) / sqrt(var + eps) with mean / unbiased var over the masked elements (TRL's whiten);
    with shift_mean=False the mean is added back. Result is 0 outside the mask, so an all-masked input gives
    all zeros (no NaN). A single masked element has var 0 and whitens to 0 (or to itself with shift_mean=False).
    reduce_sum: sums a tensor over the data-parallel processes, so mean and variance are the whole batch's.
    """
    x = _f32(x)
    if reduce_sum is None:
        mean, var = masked_mean(x, mask), masked_var(x, mask)
    else:
        mask = _f32(mask) * paddle.ones_like(x)
        totals = reduce_sum(paddle.stack([masked_sum(x, mask), mask.sum()]))  # [2]
        mean = _safe_div(totals[0], totals[1])
        var = reduce_sum(masked_sum((x - mean).square(), mask)) / paddle.clip(totals[1] - 1.0, min=1.0)
    whitened = (x - mean) * paddle.rsqrt(var + eps)  # same shape as x
    if not shift_mean:
        whitened = whitened + mean
    return _masked(whitened, mask)


def compute_gae(values, rewards, mask, gamma, lam):
    """Generalised advantage estimation over the masked tokens. All [B,T] -> (advantages, returns), both [B,T].

    With V, r zeroed outside the mask:  delta_t = r_t + gamma V_{t+1} - V_t,
    A_t = (delta_t + gamma lam A_{t+1}) * m_t,  returns R_t = A_t + V_t.  After the last valid token V = A = 0,
    so the block may sit anywhere in the row; an all-masked row has A = R = 0. Outputs are detached.
    """
    mask = _f32(mask).detach()
    values, rewards = _masked(values.detach(), mask), _masked(rewards.detach(), mask)  # [B, T]
    next_value = paddle.zeros_like(values[:, 0])  # [B]
    next_adv = paddle.zeros_like(values[:, 0])  # [B]
    advs = []
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # [B]
        next_adv = (delta + gamma * lam * next_adv) * mask[:, t]  # [B]
        next_value = values[:, t]  # [B]
        advs.append(next_adv)
    advantages = paddle.stack(advs[::-1], axis=1)  # [B, T]
    return advantages, advantages + values  # [B, T], [B, T]


def last_valid_index(mask):
    """Index of the last position with mask > 0 in each row, int64 [B]; -1 for a row with no valid token."""
    positions = paddle.arange(1, mask.shape[1] + 1, dtype="int64").unsqueeze(0)  # [1, T]  1..T
    return (positions * (mask > 0).astype("int64")).max(axis=1) - 1  # [B]


def _end_reward(end_scores, mask):
    """The [B] end score placed at each row's last valid token, 0 elsewhere (and for all-masked rows). -> [B,T]"""
    last = last_valid_index(mask)  # [B]
    positions = paddle.arange(mask.shape[1], dtype="int64").unsqueeze(0)  # [1, T]
    at_end = (positions == last.unsqueeze(1)).astype("float32")  # [B, T]
    return at_end * _f32(end_scores).reshape([-1, 1])  # [B, T]


def reward_with_kl(end_scores, log_probs, ref_log_probs, mask, kl_coeff, clip_range_score, estimator="k1"):
    """Token rewards r_t = -kl_coeff * KL_t * m_t + [t == last valid] * clip(score, -c, c). -> (rewards, kl) [B,T].

    `kl` is the masked per-token KL estimate (0 outside the mask). end_scores: [B].
    """
    kl = _masked(kl_penalty(log_probs, ref_log_probs, estimator), mask)  # [B, T]
    scores = paddle.clip(_f32(end_scores), -clip_range_score, clip_range_score)  # [B]
    return -kl_coeff * kl + _end_reward(scores, mask), kl  # [B, T], [B, T]


def policy_loss_and_stats(log_probs, old_log_probs, advantages, mask, clip_range_ratio):
    """PPO clipped surrogate. rho = exp(log_probs - old_log_probs) (1 outside the mask),
    loss = sum_t max(-A rho, -A clip(rho, 1-eps, 1+eps)) m_t / sum_t m_t  (token mean over the batch).

    Stats (detached float32 scalars): clip_frac = masked mean of [|rho - 1| > eps];
    approx_kl = masked mean of (rho - 1) - log rho  (k3 estimate of KL(old || new), >= 0); ratio = masked mean rho.
    """
    mask = _f32(mask)
    log_ratio = _masked(_f32(log_probs) - _f32(old_log_probs), mask)  # [B, T]
    ratio = paddle.exp(log_ratio)  # [B, T]
    advantages = _masked(advantages, mask)  # [B, T]
    clipped = paddle.clip(ratio, 1.0 - clip_range_ratio, 1.0 + clip_range_ratio)  # [B, T]
    losses = paddle.maximum(-advantages * ratio, -advantages * clipped)  # [B, T]
    loss = masked_mean(losses, mask)
    with paddle.no_grad():
        stats = {
            "clip_frac": masked_mean(((ratio - 1.0).abs() > clip_range_ratio).astype("float32"), mask),
            "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask),
            "ratio": masked_mean(ratio, mask),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def policy_objective(log_probs, old_log_probs, advantages, mask, ref_log_probs, clip_range_ratio,
                     kl_coeff_in_loss=None, kl_estimator="k1"):
    """The actor's loss and stats: the clipped surrogate of `policy_loss_and_stats`, plus
    kl_coeff_in_loss * masked_mean(kl_penalty(log_probs, ref_log_probs)) when the KL is a loss term (GRPO style;
    None = the KL is in the reward instead). All [B, T] -> scalar loss, {stat: scalar}."""
    loss, stats = policy_loss_and_stats(log_probs, old_log_probs, advantages, mask, clip_range_ratio)
    if kl_coeff_in_loss is not None:
        loss = loss + kl_coeff_in_loss * masked_mean(kl_penalty(log_probs, ref_log_probs, kl_estimator), mask)
    return loss, stats


def sequence_kl(log_probs, ref_log_probs, mask, estimator="k1"):
    """The logged KL: per-token estimate summed over each response, averaged over rows. [B, T] -> scalar."""
    return masked_sum(kl_penalty(log_probs, ref_log_probs, estimator), mask, axis=1).mean()


def actor_loss(log_probs, old_log_probs, advantages, mask, clip_range_ratio):
    """The scalar PPO clipped policy loss of `policy_loss_and_stats`."""
    return policy_loss_and_stats(log_probs, old_log_probs, advantages, mask, clip_range_ratio)[0]


def critic_loss(values, old_values, returns, mask, clip_range_value):
    """Clipped value loss: 0.5 * masked_mean(max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2))."""
    values, old_values, returns = _f32(values), _f32(old_values), _f32(returns)
    clipped = old_values + paddle.clip(values - old_values, -clip_range_value, clip_range_value)  # [B, T]
    losses = paddle.maximum((values - returns).square(), (clipped - returns).square())  # [B, T]
    return 0.5 * masked_mean(losses, mask)


def _std(x, axis=None, keepdim=False):
    """Sample std (ddof=1); 0 when there is a single element."""
    n = x.size if axis is None else x.shape[axis]
    centered = x - x.mean(axis=axis, keepdim=True)
    return (centered.square().sum(axis=axis, keepdim=keepdim) / max(n - 1, 1)).sqrt()


def group_advantages(rewards, group_size, estimator, eps=1e-6):
    """Sequence-level advantages from groups of samples of the same prompt. rewards [N] -> [N].

    rewards are ordered group by group (each prompt's group_size samples contiguous); mean/std are per group:
      grpo:               (r - mean_g) / (std_g + eps)         (std with ddof=1)
      dr_grpo:            r - mean_g
      rloo:               r - mean of the other G-1 members = (G r - sum_g) / (G - 1)
      reinforce_baseline: (r - mean_g) / (std over the whole batch of (r - mean_g), ddof=1, + eps)
    group_size 1: grpo and rloo raise ValueError (they need num_return_sequences >= 2); dr_grpo and
    reinforce_baseline give all-zero advantages.
    """
    if estimator not in GROUP_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {GROUP_ESTIMATORS}")
    rewards = _f32(rewards).reshape([-1])  # [N]
    n = rewards.shape[0]
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rewards are not a whole number of groups of num_return_sequences={group_size}")
    if group_size < 2 and estimator in ("grpo", "rloo"):
        raise ValueError(f"{estimator} needs num_return_sequences >= 2, got {group_size}")
    grouped = rewards.reshape([-1, group_size])  # [P, G]
    centered = grouped - grouped.mean(axis=1, keepdim=True)  # [P, G]
    if estimator == "grpo":
        adv = centered / (_std(grouped, axis=1, keepdim=True) + eps)  # [P, G]
    elif estimator == "dr_grpo":
        adv = centered  # [P, G]
    elif estimator == "rloo":
        adv = centered * group_size / (group_size - 1)  # [P, G]
    else:
        adv = centered / (_std(centered) + eps)  # [P, G]
    return adv.reshape([-1])  # [N]


def reinforce_plus_plus_advantages(end_scores, log_probs, ref_log_probs, mask, kl_coeff, gamma=1.0, estimator="k1",
                                   reduce_sum=None):
    """REINFORCE++ (Hu 2025; OpenRLHF). r_t = -kl_coeff * KL_t + [t == last valid] * score (no score clipping),
    G_t = sum_{s >= t, masked} gamma^(s-t) r_s  (returns-to-go), A = masked_whiten(G, mask) over all masked
    tokens of the batch (0 outside the mask; reduce_sum as in masked_whiten). -> [B,T], detached.
    """
    rewards, _ = reward_with_kl(end_scores, log_probs, ref_log_probs, mask, kl_coeff, float("inf"), estimator)
    returns, _ = compute_gae(paddle.zeros_like(rewards), rewards, mask, gamma, 1.0)  # [B, T]  (V=0, lam=1)
    return masked_whiten(returns, mask, reduce_sum=reduce_sum)  # [B, T]


def broadcast_sequence_advantages(adv, mask):
    """One advantage per sequence spread over its response tokens: adv[:, None] * mask. [N], [N,T] -> [N,T]."""
    return _masked(_f32(adv).reshape([-1, 1]), mask)  # [N, T]


def explained_variance(values, returns, mask):
    """1 - Var(R - V) / Var(R) over the masked elements (float32 scalar tensor). Defined as 0 when Var(R) == 0
    (including all-masked input) instead of NaN / -inf. 1 = perfect value function, 0 = no better than the mean.
    """
    values, returns = _f32(values), _f32(returns)
    var_r = masked_var(returns, mask, unbiased=False)
    var_err = masked_var(returns - values, mask, unbiased=False)
    return paddle.where(var_r > 0, 1.0 - var_err / paddle.where(var_r > 0, var_r, paddle.ones_like(var_r)),
                        paddle.zeros_like(var_r))


# ---------------------------------------------------------------- recipes of DAPO / Dr.GRPO / GSPO / GRPO's KL loss
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


def _ratio_clip_stats(ratio, log_ratio, mask, low, high):
    """Detached stats of ratios clipped to [1 - low, 1 + high] over `mask` (tokens or rows)."""
    with paddle.no_grad():
        below = masked_mean((ratio < 1.0 - low).astype("float32"), mask)
        above = masked_mean((ratio > 1.0 + high).astype("float32"), mask)
        stats = {"clip_frac": below + above, "clip_frac_low": below, "clip_frac_high": above,
                 "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask), "ratio": masked_mean(ratio, mask)}
    return {k: v.detach() for k, v in stats.items()}


def _clipped_surrogate(ratio, advantages, low, high):
    """Per-element max(-A rho, -A clip(rho, 1 - low, 1 + high))."""
    return paddle.maximum(-advantages * ratio, -advantages * paddle.clip(ratio, 1.0 - low, 1.0 + high))


def asymmetric_policy_loss_and_stats(log_probs, old_log_probs, advantages, mask, clip_range_ratio_low,
                                     clip_range_ratio_high, loss_agg_mode="token-mean", loss_agg_constant=None):
    """PPO clipped surrogate with the ratio clipped to [1 - low, 1 + high] (DAPO's clip-higher: high > low lets
    unlikely tokens gain probability). rho = exp(log_probs - old_log_probs) (1 outside the mask);
    loss = aggregate_loss(max(-A rho, -A clip(rho, 1 - low, 1 + high)), mask, loss_agg_mode, loss_agg_constant).
    With low == high and token-mean this is `policy_loss_and_stats`. All [B, T] -> scalar loss, {stat: scalar}.

    Stats (detached, masked token means): clip_frac_low = [rho < 1 - low], clip_frac_high = [rho > 1 + high],
    clip_frac = their sum (ratio outside the range, whatever the sign of A; verl's pg_clipfrac counts only
    tokens where the clipped branch is taken), approx_kl = (rho - 1) - log rho, ratio = rho.
    """
    mask = _f32(mask)
    log_ratio = _masked(_f32(log_probs) - _f32(old_log_probs), mask)  # [B, T]
    ratio = paddle.exp(log_ratio)  # [B, T]
    losses = _clipped_surrogate(ratio, _masked(advantages, mask), clip_range_ratio_low, clip_range_ratio_high)
    loss = aggregate_loss(losses, mask, loss_agg_mode, loss_agg_constant)
    return loss, _ratio_clip_stats(ratio, log_ratio, mask, clip_range_ratio_low, clip_range_ratio_high)


def gspo_policy_loss_and_stats(log_probs, old_log_probs, advantages, mask, clip_range_ratio_low,
                               clip_range_ratio_high):
    """GSPO (Zheng et al. 2025, arXiv 2507.18071; verl core_algos.compute_policy_loss_gspo). All [B,T] -> loss, stats.

    Sequence ratio s_i = exp(sum_t m (log p - log p_old) / sum_t m)  (length-normalised; 1 for an all-masked row).
    Token ratio s_it = sg(s_i) * p_t / sg(p_t): its value is s_i at every token, its gradient s_i * grad log p_t
    (verl clamps log s_it at 10 as well). loss = seq-mean-token-mean of max(-A s_it, -A clip(s_it, 1-low, 1+high)),
    so for a sequence-level A the gradient is the paper's -(1/G) sum_i A_i s_i (1/|y_i|) sum_t grad log p_t on
    unclipped sequences and 0 on clipped ones.
    Stats: clip_frac(_low/_high) and ratio are means over the rows with tokens of [s_i < 1 - low], [s_i > 1 + high]
    and s_i; approx_kl is the token-level masked mean of (rho_t - 1) - log rho_t, as elsewhere.
    """
    mask = _f32(mask)
    log_probs = _masked(log_probs, mask)  # [B, T]
    log_ratio = _masked(log_probs - _f32(old_log_probs), mask)  # [B, T]
    seq_log_ratio = masked_mean(log_ratio, mask, axis=1)  # [B]
    token_log_ratio = log_probs - log_probs.detach() + seq_log_ratio.detach().unsqueeze(1)  # [B, T]  value log s_i
    ratio = paddle.exp(paddle.clip(token_log_ratio, max=10.0))  # [B, T]
    losses = _clipped_surrogate(ratio, _masked(advantages, mask), clip_range_ratio_low, clip_range_ratio_high)
    loss = aggregate_loss(losses, mask, "seq-mean-token-mean")
    has_tokens = (mask.sum(axis=1) > 0).astype("float32")  # [B]
    stats = _ratio_clip_stats(paddle.exp(seq_log_ratio), seq_log_ratio, has_tokens, clip_range_ratio_low,
                              clip_range_ratio_high)
    with paddle.no_grad():
        token_ratio = paddle.exp(log_ratio)  # [B, T]
        stats["approx_kl"] = masked_mean(token_ratio - 1.0 - log_ratio, mask).detach()
    return loss, stats


def entropy_bonus_loss(policy_loss, entropy, mask, entropy_coeff, loss_agg_mode="token-mean",
                       loss_agg_constant=None):
    """policy_loss - entropy_coeff * aggregate_loss(entropy, mask, loss_agg_mode) (verl dp_actor: the entropy is
    aggregated like the policy loss). entropy: per-token [B, T]. -> (loss, aggregated entropy, detached)."""
    entropy = aggregate_loss(entropy, mask, loss_agg_mode, loss_agg_constant)
    return _f32(policy_loss) - entropy_coeff * entropy, entropy.detach()


def kl_loss_estimate(log_probs, ref_log_probs, estimator="low_var_kl"):
    """Per-token KL(p || q) estimate for the KL loss term (verl core_algos.kl_penalty / kl_penalty_forward).
    [B, T] -> [B, T].
      k1, k2, k3   as `kl_penalty` (k3 unclamped)
      low_var_kl   k3 with log q - log p clamped to [-20, 20] and the result to [-10, 10] (verl; its "k3" is this)
      k1+, k3+, low_var_kl+   the value of k1 / k3 / low_var_kl with the gradient of k2, (log p - log q) grad log p,
                   whose expectation under p is the gradient of KL(p || q) (straight-through: k2 - sg(k2) + sg(kl))
    """
    if estimator not in KL_LOSS_ESTIMATORS:
        raise ValueError(f"unknown KL loss estimator {estimator!r}; choose one of {KL_LOSS_ESTIMATORS}")
    log_probs, ref_log_probs = _f32(log_probs), _f32(ref_log_probs)
    base = estimator.rstrip("+")
    if base == "low_var_kl":
        log_ratio = paddle.clip(ref_log_probs - log_probs, -20.0, 20.0)  # [B, T]  log q - log p
        kl = paddle.clip(paddle.exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0)  # [B, T]
    else:
        kl = kl_penalty(log_probs, ref_log_probs, base)  # [B, T]
    if estimator.endswith("+"):
        k2 = kl_penalty(log_probs, ref_log_probs, "k2")  # [B, T]
        kl = k2 - k2.detach() + kl.detach()
    return kl


def kl_loss(log_probs, ref_log_probs, mask, estimator="low_var_kl", loss_agg_mode="token-mean",
            loss_agg_constant=None):
    """The GRPO-style KL loss term (to be scaled by kl_loss_coeff): aggregate_loss(kl_loss_estimate(p, q), mask,
    loss_agg_mode). Log-probs outside the mask are zeroed first, so garbage there gives no NaN gradient. -> scalar."""
    log_probs, ref_log_probs = _masked(log_probs, mask), _masked(ref_log_probs, mask)  # [B, T]
    return aggregate_loss(kl_loss_estimate(log_probs, ref_log_probs, estimator), mask, loss_agg_mode,
                          loss_agg_constant)
