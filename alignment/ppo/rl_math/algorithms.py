"""The RL math of PPO / GRPO / REINFORCE++ / RLOO as small pure functions on paddle tensors.

Shapes: B = batch (rows), T = time (tokens), V = vocabulary, N = num_prompts * group_size.
A `mask` is a float/int/bool [B, T] tensor that is 1 on the response tokens being trained and 0 elsewhere; the
response block may sit anywhere in the row (left or right padding, or the response part of a full sequence).
Values outside the mask never leak into results: they are selected away with `paddle.where`, so even inf/NaN
garbage at padded positions gives finite outputs. Everything is computed in float32.
Conventions: p = current policy (actor), q = reference policy, rho = exp(log p_new - log p_old).
Token log-probs and entropies from logits are the models' (alignment/models/logprobs.py); this module starts from
log-probs. Built on these: the policy losses (surrogate.py), the KL estimators (kl.py) and the advantage estimators
(estimators.py), whose classes the arguments name. It imports nothing of the package.
"""
import paddle


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
    lam: a float, or one lambda per row [B] (VAPO's length-adaptive lambda).

    The masked tokens are the time steps; an unmasked token between two of them (an environment's or a tool's
    text in a multi-turn trajectory) is not a step and passes the next step's value and advantage through
    unchanged (as verl's multi-turn GAE). With t' the next masked token after t and V, r zeroed outside the mask:
    delta_t = r_t + gamma V_{t'} - V_t,  A_t = (delta_t + gamma lam A_{t'}) * m_t,  returns R_t = A_t + V_t.
    After the last masked token V = A = 0, so the block may sit anywhere in the row; an all-masked row has
    A = R = 0. Outputs are detached.
    """
    mask = _f32(mask).detach()
    values, rewards = _masked(values.detach(), mask), _masked(rewards.detach(), mask)  # [B, T]
    lam = lam if isinstance(lam, (int, float)) else _f32(lam).reshape([-1])  # float or [B]
    next_value = paddle.zeros_like(values[:, 0])  # [B]  V at the next masked token
    next_adv = paddle.zeros_like(values[:, 0])  # [B]  A at the next masked token
    advs = []
    for t in reversed(range(values.shape[1])):
        step = mask[:, t] > 0  # [B]
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # [B]
        adv = (delta + gamma * lam * next_adv) * mask[:, t]  # [B]
        next_adv = paddle.where(step, adv, next_adv)  # [B]
        next_value = paddle.where(step, values[:, t], next_value)  # [B]
        advs.append(adv)
    advantages = paddle.stack(advs[::-1], axis=1)  # [B, T]
    return advantages, advantages + values  # [B, T], [B, T]


def length_adaptive_lambda(lengths, alpha):
    """VAPO's policy lambda per response (Yue et al. 2025, arXiv 2504.05118, eq. 8): 1 - 1 / (alpha * l), so the
    sum of lambda^t over a response of l tokens is about alpha * l; clipped to [0, 1]. lengths [B] -> [B]."""
    lengths = paddle.clip(_f32(lengths), min=1.0)  # [B]
    return paddle.clip(1.0 - 1.0 / (alpha * lengths), 0.0, 1.0)  # [B]


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


def reward_with_kl(end_scores, log_probs, ref_log_probs, mask, kl_coeff, clip_range_score, kl_estimate):
    """Token rewards r_t = -kl_coeff * KL_t * m_t + [t == last valid] * clip(score, -c, c). -> (rewards, kl) [B,T].

    `kl` is the masked per-token KL estimate (kl_estimate: one of kl.py's; 0 outside the mask). end_scores: [B].
    """
    kl = _masked(kl_estimate(log_probs, ref_log_probs), mask)  # [B, T]
    scores = paddle.clip(_f32(end_scores), -clip_range_score, clip_range_score)  # [B]
    return -kl_coeff * kl + _end_reward(scores, mask), kl  # [B, T], [B, T]


def sequence_kl(log_probs, ref_log_probs, mask, kl_estimate):
    """The logged KL: per-token estimate summed over each response, averaged over rows. [B, T] -> scalar."""
    return masked_sum(kl_estimate(log_probs, ref_log_probs), mask, axis=1).mean()


def critic_loss(values, old_values, returns, mask, clip_range_value):
    """Clipped value loss: 0.5 * masked_mean(max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2))."""
    values, old_values, returns = _f32(values), _f32(old_values), _f32(returns)
    clipped = old_values + paddle.clip(values - old_values, -clip_range_value, clip_range_value)  # [B, T]
    losses = paddle.maximum((values - returns).square(), (clipped - returns).square())  # [B, T]
    return 0.5 * masked_mean(losses, mask)


def sample_std(x, axis=None, keepdim=False):
    """Sample std (ddof=1); 0 when there is a single element."""
    n = x.size if axis is None else x.shape[axis]
    centered = x - x.mean(axis=axis, keepdim=True)
    return (centered.square().sum(axis=axis, keepdim=keepdim) / max(n - 1, 1)).sqrt()


def centered_groups(rewards, group_size):
    """rewards [N], ordered group by group (each prompt's group_size samples contiguous) -> (rewards [P, G],
    rewards minus their group's mean [P, G]); ValueError unless N is a whole number of groups."""
    rewards = _f32(rewards).reshape([-1])  # [N]
    n = rewards.shape[0]
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rewards are not a whole number of groups of num_return_sequences={group_size}")
    grouped = rewards.reshape([-1, group_size])  # [P, G]
    return grouped, grouped - grouped.mean(axis=1, keepdim=True)  # [P, G], [P, G]


def reinforce_plus_plus_advantages(end_scores, log_probs, ref_log_probs, mask, kl_coeff, gamma, kl_estimate,
                                   reduce_sum=None):
    """REINFORCE++ (Hu 2025; OpenRLHF). r_t = -kl_coeff * KL_t + [t == last valid] * score (no score clipping),
    G_t = sum_{s >= t, masked} gamma^(s-t) r_s  (returns-to-go), A = masked_whiten(G, mask) over all masked
    tokens of the batch (0 outside the mask; reduce_sum as in masked_whiten). -> [B,T], detached.
    """
    rewards, _ = reward_with_kl(end_scores, log_probs, ref_log_probs, mask, kl_coeff, float("inf"), kl_estimate)
    return whitened_returns(rewards, mask, gamma, reduce_sum)  # [B, T]


def whitened_returns(rewards, mask, gamma, reduce_sum=None):
    """REINFORCE++'s advantages from token rewards [B, T]: the returns-to-go over the masked tokens (compute_gae
    with V = 0, lam = 1), whitened over all masked tokens of the batch. -> [B, T], detached."""
    returns, _ = compute_gae(paddle.zeros_like(_f32(rewards)), rewards, mask, gamma, 1.0)  # [B, T]
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
