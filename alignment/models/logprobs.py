"""Token log-probabilities and entropies from logits, and the supervised loss built on them.

Every stage scores tokens through these (SFT and PPO's ptx loss, DPO's sequence log-probs, PPO's ratios and KL
via LlamaForCausalLM.token_log_probs), so they live with the models, not with any one algorithm.
"""
from __future__ import annotations

import paddle
from paddle import _C_ops

from alignment import cpu_kernels as kernels
from alignment.data.tokenized import IGNORE_INDEX
from alignment.parallel import tensor_parallel as tp
from alignment.parallel.distributed import model_parallel_degree


def _f32(x):
    return x if x.dtype == paddle.float32 else x.astype("float32")


def _softmax_cross_entropy(flat, flat_labels):
    """(softmax [N, V], nll [N, 1]) of float32 logits [N, V] and int64 labels [N, 1]: Paddle's fused kernel, the
    call F.cross_entropy makes (reduction "none", ignore_index -100), which discards the softmax it computes."""
    return _C_ops.cross_entropy_with_softmax(flat, flat_labels, False, True, True, IGNORE_INDEX, -1)


def _flat(logits, labels):
    """logits [B,T,V] -> float32 [B*T, V]; labels [B,T] -> int64 [B*T, 1]."""
    logits = _f32(logits)
    return logits.reshape([-1, logits.shape[-1]]), labels.astype("int64").reshape([-1, 1])


def gather_log_probs(logits, labels):
    """log softmax(logits)[label]  = logits[label] - logsumexp(logits), per token. [B,T,V], [B,T] -> [B,T].

    Computed as -cross_entropy (fast on CPU, unlike F.log_softmax over a big vocabulary); differentiable.
    Labels equal to -100 (paddle's ignore_index) give 0. Our CPU kernel where it is chosen (alignment/cpu_kernels).
    """
    flat, flat_labels = _flat(logits, labels)  # [N, V], [N, 1]
    fused = kernels.token_log_probs(flat, flat_labels)
    if fused is not None:
        return fused[0].reshape(labels.shape)  # [B, T]
    _, nll = _softmax_cross_entropy(flat, flat_labels)
    return -nll.reshape(labels.shape)  # [B, T]


EXACT_NLL = 50.0  # below it a label's -log p is exact; the cross-entropy kernel clips it at 64


def log_probs_and_entropy(logits, labels):
    """(log p(label) [B,T], differentiable; entropy [B,T], detached) from one softmax over the vocabulary: the
    softmax the cross-entropy kernel computes anyway. Labels must be token ids (>= 0).

    H = sum_v p_v (lse - z_v), with lse = z_label - log p(label): every term is >= 0, so the sum has no
    cancellation. The kernel clips -log p(label) at 64, so rows whose label is that unlikely take
    entropy_from_logits instead (a token of probability below e^-50; none in practice). Against
    entropy_from_logits, log-probs + entropy of [16, 32, 8000] logits took 12.5-13.0 -> 6.9-7.2 ms and of
    [32, 64, 49152] 296-311 -> 181-198 ms (2 cores, AMD EPYC family 26 / Zen 5, AVX-512)."""
    flat, flat_labels = _flat(logits, labels)  # [N, V], [N, 1]
    fused = kernels.token_log_probs(flat, flat_labels)  # our CPU kernel where chosen: one pass, exact entropy
    if fused is not None:
        return fused[0].reshape(labels.shape), fused[1].reshape(labels.shape)
    probs, nll = _softmax_cross_entropy(flat, flat_labels)  # [N, V], [N, 1]
    with paddle.no_grad():
        flat, probs, nll_value = flat.detach(), probs.detach(), nll.detach()
        lse = paddle.take_along_axis(flat, flat_labels, axis=1) + nll_value  # [N, 1]
        gaps = paddle.expand(lse, flat.shape) - flat  # [N, V], >= 0 up to rounding; expanded: faster than broadcast
        entropy = sum_last_axis(probs * gaps)  # [N]
        unlikely = paddle.nonzero(nll_value.reshape([-1]) > EXACT_NLL).reshape([-1])  # rows of clipped labels
        if unlikely.shape[0]:
            entropy = paddle.scatter(entropy, unlikely, entropy_from_logits(paddle.gather(flat, unlikely)))
    return -nll.reshape(labels.shape), entropy.reshape(labels.shape)


def sum_last_axis(x):
    """x [..., n] -> [...]: the sum over the last axis as a product with a column of ones. On CPU Paddle's sum
    over a [512, 8000] float32 row took 3.5 ms and was off by up to 1.6e-2 (one running float32 sum per row); the
    product took 0.4 ms and was off by 1.3e-3 (measured against float64). Differentiable."""
    ones = paddle.ones([x.shape[-1], 1], dtype=x.dtype)
    return paddle.matmul(x, ones).squeeze(-1)


def entropy_from_logits(logits):
    """H = -sum_v p_v log p_v = log sum_v e^(s_v) - sum_v softmax(s)_v * s_v with s = z - max(z).  [B,T,V] -> [B,T].

    One exp over the vocabulary, shared by both terms (paddle.logsumexp + softmax took ~1.9x as long on CPU).
    Centring before the product matters: float32 sums over a 49152-entry vocabulary of p * z with logits up to ~50
    (SmolLM2) were off by up to 9e-3; with s = z - max(z) the heavy terms are small. The sums are products with
    ones (sum_last_axis): the whole entropy of [512, 8000] logits 18 -> 16 ms on CPU, and closer to float64.
    The shift is detached: H does not depend on it.
    """
    logits = _f32(logits)
    shifted = logits - logits.max(axis=-1, keepdim=True).detach()  # [B, T, V], <= 0
    exp = paddle.exp(shifted)  # [B, T, V]
    total = sum_last_axis(exp)  # [B, T]
    return paddle.log(total) - sum_last_axis(exp * shifted) / total  # [B, T]


def answer_token_loss(model, input_ids, attention_mask, labels):
    """Mean cross-entropy over label tokens; the LM head runs only on those positions.

    input_ids, attention_mask, labels: [b, s] (labels = IGNORE_INDEX on prompt and padding).
    Returns (loss scalar, number of label tokens).
    """
    hidden, _ = model.model(input_ids, attention_mask=attention_mask)  # [b, s, h]
    targets = labels[:, 1:].reshape([-1])  # [b * (s-1)]: token t+1 is predicted at position t
    keep = paddle.nonzero(targets != IGNORE_INDEX).squeeze(-1)  # [n]
    states = paddle.gather(hidden[:, :-1].reshape([-1, hidden.shape[-1]]), keep)  # [n, h]
    log_probs, _ = model.token_log_probs(states, paddle.gather(targets, keep))  # [n]
    return -log_probs.mean(), int(keep.shape[0])


def logits_token_log_probs(logits, ids):
    """log p(ids) [b, n] from logits [b, n, V], or under tensor parallelism this rank's vocabulary slice
    [b, n, V/t] (the last pipeline stage's LM head output)."""
    return tp.parallel_token_log_probs(logits, ids) if model_parallel_degree() > 1 else gather_log_probs(logits, ids)


def answer_token_loss_from_logits(logits, labels):
    """answer_token_loss from whole-sequence logits [b, s, V(/t)] and labels [b, s]: (loss scalar, label tokens)."""
    targets = labels[:, 1:]  # [b, s-1]: token t+1 is predicted at position t
    keep = targets != IGNORE_INDEX
    log_probs = logits_token_log_probs(logits[:, :-1], paddle.where(keep, targets, paddle.zeros_like(targets)))
    keep = keep.astype("float32")
    count = keep.sum()
    return -(log_probs * keep).sum() / paddle.clip(count, min=1.0), int(count)


def response_log_probs_from_logits(logits, input_ids, response_mask):
    """Summed log-probs of the response tokens and their counts, both [b], from logits [b, s, V(/t)];
    input_ids, response_mask: [b, s] (response_mask 1 on answer tokens, any padding side)."""
    log_probs = logits_token_log_probs(logits[:, :-1], input_ids[:, 1:])  # [b, s-1]
    mask = response_mask[:, 1:].astype("float32")  # [b, s-1]
    return (log_probs * mask).sum(axis=1), mask.sum(axis=1)


def top_log_probs(logits, k: int):
    """The k most likely tokens of each row: (log-probs [N, k], ids [N, k] int64) of float32 logits [N, V], the
    log-probs as the cross-entropy kernel gives log softmax (no log_softmax pass over the vocabulary)."""
    flat = _f32(logits)
    values, ids = paddle.topk(flat, k, axis=-1)  # [N, k]
    _, nll = _softmax_cross_entropy(flat, ids[:, :1])  # -log p of the most likely token: lse = its logit + nll
    return values - (values[:, :1] + nll), ids
