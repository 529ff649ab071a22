"""Distillation losses: how far the student's next-token distributions are from a teacher's, as small pure
functions on paddle tensors ([B, T] per-token tensors as in algorithms.py, [B, T, V] logits over the vocabulary,
[B, T, K] a teacher's top-k), and the registered losses (`distill_loss`; alignment/config/registry.py) that the
teacher strategy (teacher.py) runs.

- `sampled_kl`: on-policy distillation (Agarwal et al. 2024, arXiv 2306.13649, section 3; Lu & Thinking Machines
  2025, "On-Policy Distillation"): the reverse KL log p_S(x_t) - log p_T(x_t) of each token the student sampled,
  as a per-token advantage -(log p_S - log p_T) for the policy loss. Needs only the teacher's log-prob of each
  sampled token, so a served teacher gives it.
- `jsd` (with `beta`), `forward_kl` (beta 0: KL(T || S)), `reverse_kl` (beta 1: KL(S || T)): GKD's generalised
  Jensen-Shannon divergence over the whole vocabulary (Agarwal et al. 2024, eq. 1), exactly as TRL's
  GKDTrainer.generalized_jsd_loss computes it (tests/fixtures/trl_gkd.json): with M = (1 - beta) S + beta T,
  JSD_beta = beta KL(T || M) + (1 - beta) KL(S || M), both distributions at `temperature`.
- `topk_kl`: the same divergence between the two distributions coarsened to the teacher's top-k tokens plus one
  bucket for the rest of the vocabulary (TRL's server distillation with loss_add_tail). A proper divergence of two
  (k+1)-outcome distributions, so >= 0 and at most the full-vocabulary one (data processing); for a teacher that
  returns only its top-k log-probs.

Every loss is a per-token [B, T] tensor; the policy objective aggregates it like its other terms (loss_agg_mode),
so token-mean over a step is TRL's "batchmean" and any split into micro-batches trains the same.
"""
from __future__ import annotations

import math

import paddle

from alignment.config.registry import DISTILL_LOSSES, Registered


def _float(x):
    """Half-precision logits in float32; float32 and float64 stay as they are (the parity tests run float64)."""
    return x if x.dtype in (paddle.float32, paddle.float64) else x.astype("float32")


def log_softmax(logits):
    """log softmax over the last axis, as z - log sum_v e^(z_v) with z = logits - max(logits) (the max detached: it
    cancels in the value and the gradient), the sum a product with a column of ones (as logprobs.sum_last_axis:
    faster and closer to float64 than Paddle's sum on CPU). [..., V] -> [..., V], differentiable. F.log_softmax over
    a 49152-token vocabulary takes ~0.16 s per row on CPU: [4, 48, 49152] took 30 s against 0.07 s this way
    (2 cores, Intel Xeon family 6 model 207, AVX-512, Paddle 3.3.1; within 1e-5 of it)."""
    shifted = logits - logits.max(axis=-1, keepdim=True).detach()  # [..., V]
    ones = paddle.ones([logits.shape[-1], 1], dtype=logits.dtype)  # [V, 1]
    return shifted - paddle.log(paddle.matmul(paddle.exp(shifted), ones))  # [..., V] - [..., 1]


def kl_terms(log_p, log_q):
    """Elementwise p (log p - log q), the terms of KL(p || q) (torch's F.kl_div(log_q, log_p, log_target=True)).
    [..., V] each -> [..., V]."""
    return paddle.exp(log_p) * (log_p - log_q)


def generalized_jsd(student_log_probs, teacher_log_probs, beta: float):
    """GKD's divergence per position, summed over the outcomes. [B, T, V] log-probs each -> [B, T].

    beta 0: KL(T || S) (forward); beta 1: KL(S || T) (reverse); else beta KL(T || M) + (1 - beta) KL(S || M) with
    log M = logsumexp(log S + log(1 - beta), log T + log beta) (TRL's special cases and mixture, term for term)."""
    if beta == 0:
        terms = kl_terms(teacher_log_probs, student_log_probs)
    elif beta == 1:
        terms = kl_terms(student_log_probs, teacher_log_probs)
    else:
        mixture = paddle.logsumexp(paddle.stack([student_log_probs + math.log1p(-beta),
                                                 teacher_log_probs + math.log(beta)]), axis=0)  # [B, T, V]
        terms = beta * kl_terms(teacher_log_probs, mixture) + (1 - beta) * kl_terms(student_log_probs, mixture)
    return terms.sum(axis=-1)  # [B, T]


def full_vocab_divergence(student_logits, teacher_logits, beta: float, temperature: float = 1.0):
    """generalized_jsd of softmax(logits / temperature) of both models. [B, T, V] each -> [B, T]."""
    student = log_softmax(_float(student_logits) / temperature)  # [B, T, V]
    teacher = log_softmax(_float(teacher_logits).astype(student.dtype) / temperature)  # [B, T, V]
    return generalized_jsd(student, teacher, beta)


def with_tail_bucket(top_log_probs):
    """[B, T, K] log-probs of K outcomes -> [B, T, K + 1]: the K, then log(1 - their total mass) for the rest.
    The total is kept below 1 (log at most -1e-7) as TRL's _add_tail_bucket does, so the tail stays finite."""
    total = paddle.clip(paddle.logsumexp(top_log_probs, axis=-1, keepdim=True), max=-1e-7)  # [B, T, 1]
    return paddle.concat([top_log_probs, paddle.log(-paddle.expm1(total))], axis=-1)  # [B, T, K + 1]


def topk_divergence(student_logits, teacher_ids, teacher_log_probs, beta: float, temperature: float = 1.0):
    """generalized_jsd of the student (softmax of logits / temperature) and the teacher over the teacher's top-k
    tokens plus the tail bucket. student_logits [B, T, V]; teacher_ids [B, T, K] int64 (distinct per position);
    teacher_log_probs [B, T, K] (the teacher's own, at its temperature) -> [B, T]."""
    student = log_softmax(_float(student_logits) / temperature)  # [B, T, V]
    student_top = paddle.take_along_axis(student, teacher_ids, axis=-1)  # [B, T, K]
    return generalized_jsd(with_tail_bucket(student_top), with_tail_bucket(teacher_log_probs.astype(student.dtype)),
                           beta)


def sampled_kl_advantages(student_log_probs, teacher_log_probs, mask):
    """On-policy distillation's per-token advantage -(log p_S(x_t) - log p_T(x_t)), 0 off the mask. [B, T] each;
    the student's are the sampling (old) log-probs, so the advantage carries no gradient."""
    diff = _float(student_log_probs) - _float(teacher_log_probs).astype(_float(student_log_probs).dtype)
    return -diff * mask.astype(diff.dtype)  # [B, T]


class DistillLoss(Registered, registry=DISTILL_LOSSES):
    """A distillation loss and what it needs of the teacher. as_advantage: it enters as a per-token advantage
    (advantages(...)), else as a loss term (per_token(...)); full_vocab: the teacher's logits over the whole
    vocabulary (a local teacher); top_k: the teacher's top-k log-probs (a local or served teacher); on_policy_only:
    it is a policy-gradient estimate, valid only on the student's own samples (lmbda 1)."""

    as_advantage = False
    full_vocab = False
    top_k = False
    on_policy_only = False
    fixed_beta = None  # forward_kl / reverse_kl: the beta of the divergence whatever the key says

    def per_token(self, student_logits, teacher, beta: float, temperature: float):
        """[n, R] divergence; teacher: logits [n, R, V] (full_vocab) or (ids, log-probs) [n, R, K] (top_k)."""
        raise NotImplementedError


class SampledKL(DistillLoss):
    NAME = "sampled_kl"
    as_advantage = True
    on_policy_only = True


class JSD(DistillLoss):
    NAME = "jsd"
    full_vocab = True

    def per_token(self, student_logits, teacher, beta, temperature):
        beta = beta if self.fixed_beta is None else self.fixed_beta
        return full_vocab_divergence(student_logits, teacher, beta, temperature)


class ForwardKL(JSD):
    NAME = "forward_kl"
    fixed_beta = 0.0


class ReverseKL(JSD):
    NAME = "reverse_kl"
    fixed_beta = 1.0


class TopKKL(DistillLoss):
    NAME = "topk_kl"
    top_k = True

    def per_token(self, student_logits, teacher, beta, temperature):
        ids, log_probs = teacher
        return topk_divergence(student_logits, ids, log_probs, beta, temperature)
