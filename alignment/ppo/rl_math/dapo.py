"""DAPO's sample-side recipes (Yu et al. 2025, arXiv 2503.14476) as small pure functions on paddle tensors:
dynamic sampling's group filter, the soft overlong punishment and truncated-response masking. The loss-side parts
(clip-higher, token-level aggregation) are in algorithms.py. Like algorithms.py, this imports only paddle and
nothing of the package; lengths come from masks, never from ids (eos may equal pad).
"""
import paddle


def _as(x, dtype):
    if not isinstance(x, paddle.Tensor):
        return paddle.to_tensor(x, dtype=dtype)
    return x if x.dtype == getattr(paddle, dtype) else x.astype(dtype)


def groups_with_reward_spread(rewards, group_size, tol=0.0):
    """Dynamic sampling's filter: True for each group whose rewards are not all equal. rewards [P * G] -> bool [P].

    rewards are ordered group by group (each prompt's group_size samples contiguous). A group is kept when the
    population std (ddof 0, as verl's np.std in the DAPO trainer) of its rewards is > tol; the std is taken in
    float64 of the rewards minus the group's first reward, so equal rewards give exactly 0. As in verl, a group of
    size 1 is always kept (there is nothing to compare).
    """
    rewards = _as(rewards, "float64").reshape([-1])  # [N]
    n = rewards.shape[0]
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rewards are not a whole number of groups of num_return_sequences={group_size}")
    grouped = rewards.reshape([-1, group_size])  # [P, G]
    shifted = grouped - grouped[:, :1]  # [P, G]
    std = (shifted - shifted.mean(axis=1, keepdim=True)).square().mean(axis=1).sqrt()  # [P]
    return std > tol if group_size > 1 else paddle.ones_like(std, dtype="bool")  # [P]


def rows_of_groups(group_mask, group_size):
    """Row indices (int64 [K * G], ascending) of the groups where group_mask [P] is True."""
    rows = paddle.repeat_interleave(_as(group_mask, "int64"), group_size) > 0  # [P * G]
    return paddle.nonzero(rows).reshape([-1])  # [K * G]


def overlong_penalty(response_lengths, max_resp_len, overlong_buffer_len, penalty_factor):
    """DAPO's soft overlong punishment, an additive reward per response. lengths [B] -> float32 [B]:
        -penalty_factor * min(max(L - (max_resp_len - overlong_buffer_len), 0) / overlong_buffer_len, 1)
    i.e. 0 up to max - buffer, linear down to -penalty_factor at L == max_resp_len, and -penalty_factor beyond
    (the DAPO paper's soft overlong punishment). verl's DAPORewardManager computes
    min(-(L - (max - buffer)) / buffer * factor, 0): the same for L <= max_resp_len, unclamped beyond (which
    generation capped at max_resp_len never reaches).
    L counts the response's valid tokens including its EOS (verl: the response's attention-mask sum).
    """
    if not 0 < overlong_buffer_len <= max_resp_len:
        raise ValueError(f"overlong_buffer_len must be in (0, max_resp_len={max_resp_len}], "
                         f"got {overlong_buffer_len}")
    excess = paddle.clip(_as(response_lengths, "float32") - (max_resp_len - overlong_buffer_len), min=0.0)  # [B]
    return -penalty_factor * paddle.clip(excess / overlong_buffer_len, max=1.0)  # [B]


def truncated_responses(response_lengths, max_resp_len, ends_with_eos):
    """bool [B]: the response used all max_resp_len tokens and its last valid token is not EOS (generation was cut
    off). ends_with_eos: bool [B], read at the last valid position of the mask (not 'any id == eos': eos may equal
    pad)."""
    return (_as(response_lengths, "float32") >= max_resp_len) & ~_as(ends_with_eos, "bool")


def mask_truncated_responses(mask, truncated):
    """DAPO's overlong filtering: the loss mask with the rows of truncated responses zeroed.
    mask [B, T], truncated bool [B] -> float32 [B, T]."""
    keep = (~_as(truncated, "bool")).astype("float32").reshape([-1, 1])  # [B, 1]
    return _as(mask, "float32") * keep  # [B, T]
