"""The teacher's part of a PPO-family step, as a strategy (like critic.py's): `NoTeacher`, or `Teacher` with a
source of the teacher's numbers (`LocalTeacher`: a model in this process; `ServedTeacher`: an OpenAI-style server,
openai_client.py) and a registered loss (distill.py), so the trainer never asks which it has.

Its seam with the trainer is this class's six members, one per place of the step's recipe:
- building: `sampler` wraps the trainer's sampler (GKD's mix of on- and off-policy answers), `estimator` wraps the
  advantage estimator (sampled_kl's per-token term; the old log-probs always scored), `sources` adds to the
  rollout ledger's sources.json;
- each phase: `models(phase)` names the teacher's models the phase uses (offload moves them);
- score: `score` puts the teacher's log-prob of every response token on the rollout (`Rollout.teacher_log_probs`:
  logged as distill/reverse_kl, written to the ledger, read by sampled_kl's advantages) and, from a server, keeps
  its top-k;
- update: `student_pass` computes the student's logits once per micro-batch and returns the per-token divergence
  the objective adds (objective.py), with a local teacher's logits of the same micro-batch.
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import paddle

from alignment.models.logprobs import entropy_from_logits, gather_log_probs, log_probs_and_entropy
from alignment.ppo.rl_math import algorithms as rl
from alignment.ppo.rl_math.distill import log_softmax, sampled_kl_advantages
from alignment.ppo.teacher.distill_sampler import MixedSampler
from alignment.ppo.rollout.ledger import file_digest
from alignment.ppo.rollout.rollout import response_log_probs
from alignment.ppo.learner.update import first_pass_log_probs


def response_hidden(model, batch):
    """(hidden states [n, R, h] at the positions predicting each response token, the tokens [n, R]) of a micro-batch
    (as response_log_probs runs it: packed, or sharing prompts)."""
    if batch.prompt_groups is None:
        hidden, _ = model.model(batch.input_ids, attention_mask=batch.attention_mask)  # [n, W, h]
    else:
        hidden = model.model.forward_sharing_prompts(batch.input_ids, batch.attention_mask, batch.prompt_len,
                                                     batch.prompt_groups)
    if batch.response_index is None:
        return hidden[:, batch.prompt_len - 1: -1], batch.input_ids[:, batch.prompt_len:]
    index = batch.response_index
    states = paddle.take_along_axis(hidden, (index - 1).unsqueeze(-1).expand([*index.shape, hidden.shape[-1]]), 1)
    return states, paddle.take_along_axis(batch.input_ids, index, axis=1)


def real_tokens(input_ids: np.ndarray, attention_mask: np.ndarray) -> List[Tuple[int, ...]]:
    """Each row's tokens without padding: the key of its teacher numbers in any layout (padded, packed, trimmed)."""
    return [tuple(ids[mask > 0].tolist()) for ids, mask in zip(input_ids, attention_mask)]


class NoTeacher:
    model = None

    def models(self, phase: str) -> tuple:
        """The teacher's models that a phase of the trainer uses ("generate", "score", "train"; "frozen": every
        one, kept on the host between phases), which offload brings to the device for it."""
        return ()

    def score(self, rollout, step: int) -> Dict[str, float]:
        return {}

    def estimator(self, inner):
        """The advantage estimator the trainer uses: `inner` (estimators.py), or it with the teacher's term."""
        return inner

    def student_pass(self, actor, batch, temperature: float, entropy_grad: bool):
        """(log-probs [n, R], entropies [n, R], (distill_coeff, divergence [n, R]) or None) of a micro-batch."""
        log_probs, entropy = response_log_probs(actor, batch.input_ids, batch.attention_mask, batch.prompt_len,
                                                temperature, with_entropy=True, response_index=batch.response_index,
                                                prompt_groups=batch.prompt_groups, entropy_grad=entropy_grad)
        return log_probs, entropy, None

    def sources(self) -> dict:
        return {}

    def sampler(self, inner, max_length: int):
        """The trainer's sampler (samplers.py), or GKD's mix of it with off-policy answers (distill_sampler.py)."""
        return inner


class LocalTeacher:
    """A frozen causal LM with the student's tokenizer, whole on every rank (as the reference model)."""

    def __init__(self, model, path: str, top_k: int):
        self.model, self.path, self.k = model, path, top_k

    def token_log_probs(self, rollout, ppo, train_args, step: int):
        self.model.eval()
        return first_pass_log_probs(self.model, rollout, ppo, train_args, step)  # [N, R]

    @paddle.no_grad()
    def batch_input(self, batch, temperature: float, loss):
        """The teacher's side of a micro-batch's loss: logits [n, R, V], or its top-k (ids, log-probs) [n, R, k]."""
        self.model.eval()
        states, _ = response_hidden(self.model, batch)
        logits = self.model.compute_logits(states)  # [n, R, V]
        if not loss.top_k:
            return logits
        values, ids = paddle.topk(log_softmax(logits / temperature), self.k)
        return ids, values

    def sources(self) -> dict:
        return {"teacher": self.path, "teacher_sha256": file_digest(self.path)}


class ServedTeacher:
    """A teacher behind an OpenAI-compatible /v1/completions (openai_client.OpenAIEndpoint)."""

    model = None

    def __init__(self, endpoint, top_k: int):
        self.endpoint, self.k, self.top = endpoint, top_k, {}

    def token_log_probs(self, rollout, ppo, train_args, step: int):
        ids, mask = rollout.input_ids.numpy(), rollout.attention_mask.numpy()
        keys = real_tokens(ids, mask)
        starts = mask[:, : rollout.prompt_len].sum(axis=1)  # [N] real prompt tokens
        answers, self.retries = self.endpoint.prompt_log_probs([list(k) for k in keys], self.k)
        out = np.zeros(rollout.response_mask.shape, "float32")  # [N, R]
        self.top = {}
        for row, (key, start, (token, top_ids, top_values)) in enumerate(zip(keys, starts, answers)):
            out[row, : len(key) - start] = token[start:]
            self.top[key] = (top_ids[start:], top_values[start:])  # [L_i, k] each, from response token 0
        return paddle.to_tensor(out)

    def batch_input(self, batch, temperature: float, loss):
        """The top-k (ids, log-probs) [n, R, k] of a micro-batch's rows, from this step's answers."""
        width = batch.response_mask.shape[1]
        ids, values = np.zeros([len(batch), width, self.k], "int64"), np.zeros([len(batch), width, self.k], "float32")
        for row, key in enumerate(real_tokens(batch.input_ids.numpy(), batch.attention_mask.numpy())):
            top_ids, top_values = self.top[key]
            ids[row, : len(top_ids[:width])], values[row, : len(top_ids[:width])] = top_ids[:width], top_values[:width]
        return paddle.to_tensor(ids), paddle.to_tensor(values)

    def sources(self) -> dict:
        return {"teacher": self.endpoint.urls, "teacher_served_model": self.endpoint.model}


class Teacher(NoTeacher):
    def __init__(self, source, distill_args, ppo, train_args):
        self.source, self.args, self.ppo, self.train_args = source, distill_args, ppo, train_args
        self.loss = distill_args.loss()
        self.model = getattr(source, "model", None)
        self.phase_models = {"frozen": (self.model,), "score": (self.model,),
                             "generate": (self.model,) if distill_args.seq_kd else (),  # it samples answers
                             "train": (self.model,) if not self.loss.as_advantage and self.model is not None
                             else ()}  # its logits of each micro-batch

    def models(self, phase: str) -> tuple:
        return self.phase_models[phase]

    @paddle.no_grad()
    def score(self, rollout, step: int) -> Dict[str, float]:
        start = time.perf_counter()
        teacher = rollout.teacher_log_probs = self.source.token_log_probs(rollout, self.ppo, self.train_args,
                                                                           step)  # [N, R]
        mask = rollout.response_mask
        out = {"time/teacher": time.perf_counter() - start,
               "distill/teacher_log_prob": float(rl.masked_mean(teacher, mask))}
        if rollout.old_log_probs is not None:  # the sampled tokens' reverse KL, per token
            out["distill/reverse_kl"] = float(rl.masked_mean(rollout.old_log_probs - teacher, mask))
        if getattr(self.source, "retries", None) is not None:  # a served teacher's
            out["distill/teacher_retries"] = float(self.source.retries)
        return out

    def estimator(self, inner):
        return TeacherAdvantages(inner, self.args.distill_coeff if self.loss.as_advantage else None)

    def student_pass(self, actor, batch, temperature: float, entropy_grad: bool):
        if self.loss.as_advantage:
            return super().student_pass(actor, batch, temperature, entropy_grad)
        states, labels = response_hidden(actor, batch)
        logits = actor.compute_logits(states)  # [n, R, V] float32, the whole vocabulary
        scaled = logits / temperature if temperature != 1.0 else logits
        if entropy_grad:
            log_probs, entropy = gather_log_probs(scaled, labels), entropy_from_logits(scaled)
        else:
            log_probs, entropy = log_probs_and_entropy(scaled, labels)
        teacher = self.source.batch_input(batch, temperature, self.loss)
        divergence = self.loss.per_token(logits, teacher, self.args.beta, temperature)  # [n, R]
        return log_probs, entropy, (self.args.distill_coeff, divergence)

    def sampler(self, inner, max_length: int):
        if self.args.lmbda >= 1:
            return inner
        return MixedSampler(inner, self.args, self.model, max_length, self.ppo.max_new_tokens)

    def sources(self) -> dict:
        return {**self.source.sources(), "distill_loss": self.args.distill_loss, "distill_coeff":
                self.args.distill_coeff, "beta": self.args.beta, "lmbda": self.args.lmbda}


class TeacherAdvantages:
    """An advantage estimator (estimators.py) as a teacher changes it: its traits are the inner one's, except that
    the rollout's old log-probs are always scored (distill/reverse_kl reads them); with sampled_kl (coeff not None)
    the advantages gain coeff x -(log p_old - log p_teacher) per token."""

    uses_old_log_probs = True

    def __init__(self, inner, coeff: Optional[float]):
        self.inner, self.coeff = inner, coeff

    def __getattr__(self, name: str):  # needs_critic, critic_returns, min_group_size, ...
        if name == "inner":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, rollout, ppo, reduce_sum):
        advantages, returns = self.inner(rollout, ppo, reduce_sum)  # [N, R] each
        if self.coeff is not None:
            advantages = advantages + self.coeff * sampled_kl_advantages(
                rollout.old_log_probs, rollout.teacher_log_probs, rollout.response_mask)  # [N, R]
        return advantages, returns


def make_teacher(distill_args, ppo, train_args, model=None, endpoint=None):
    """The strategy the arguments ask for: NoTeacher without a teacher; a local model or a served endpoint."""
    if distill_args is None or not distill_args.distills:
        return NoTeacher()
    top_k = distill_args.teacher_top_k if distill_args.loss.top_k else 1  # else only the sampled tokens' are read
    source = ServedTeacher(endpoint, top_k) if distill_args.served else LocalTeacher(
        model, distill_args.teacher_model_name_or_path, top_k)
    return Teacher(source, distill_args, ppo, train_args)
