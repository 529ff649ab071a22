"""The harness of the split-invariance tests: a tiny LLaMA built from config, a synthetic scored rollout with rows of
different prompt and response lengths, the real update loop (ppo/learner/update.py: run_update, EagerMicroBatches, and
PPOTrainer.actor_step itself) run for several micro-batch / gradient-accumulation splits of one optimizer step, and an
independent float64 reference of every objective on the whole batch.

The reference is exact in the loss: it takes the per-token log-probs and entropies of one float32 pass over the
whole batch as float64 leaves, computes the loss in float64 and its gradient with respect to them, and carries
that gradient to the weights with the float32 model's own backward (paddle.grad with grad_outputs), so float32
enters only through the model's forward and backward, never through a normalisation.
"""
from __future__ import annotations

import functools
import types

import numpy as np
import paddle

from alignment.config.ppo import PPOArguments
from alignment.config.training import TrainingArguments
from alignment.models import LlamaForCausalLM
from alignment.models.config import LlamaConfig
from alignment.models.score_model import ScoreConfig, ScoreModel
from alignment.ppo.learner.critic import make_critic
from alignment.ppo.rollout.rollout import Rollout, critic_values, response_log_probs
from alignment.ppo.learner.ptx import NoPtx
from alignment.ppo.learner.routing_replay import OwnRouting
from alignment.ppo.teacher.teacher import NoTeacher
from alignment.ppo.ppo_trainer import PPOTrainer
from alignment.ppo.learner.update import EagerMicroBatches, run_update
from alignment.training.precision import Precision

CONFIG = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=64)
N, P, R = 6, 4, 6  # rows (3 prompts x 2 answers), prompt width, response width
# (per_device_train_batch_size, gradient_accumulation_steps, group_by_length): one optimizer step over the N rows
SPLITS = ((N, 1, False), (1, N, False), (4, 2, True), (2, 3, False))


def tiny_models(seed=0, critic=False):
    paddle.seed(seed)
    actor = LlamaForCausalLM(LlamaConfig(**CONFIG))
    value = None
    if critic:
        value = ScoreModel(ScoreConfig(**CONFIG, score_type="critic"))
        value.score.weight.set_value(paddle.randn(value.score.weight.shape) * 0.5)
    return actor, value


def tiny_rollout(seed=0, answers_per_prompt=1) -> Rollout:
    """N left-padded prompts of 1..P tokens and responses of 1..R tokens (no two micro-batches alike), with old and
    reference log-probs near the policy's (ratios off 1 by up to ~0.6, so some clip), rewards and old values.
    answers_per_prompt: consecutive rows of that many share their prompt (GRPO's groups)."""
    rng = np.random.default_rng(seed)
    prompt_lens, response_lens = rng.integers(1, P + 1, N), np.array([1, R, 2, 5, 3, R])[rng.permutation(N)]
    prompt_lens = np.repeat(prompt_lens[::answers_per_prompt], answers_per_prompt)
    attention, response = np.zeros((N, P + R), "int64"), np.zeros((N, R), "float32")
    for i in range(N):
        attention[i, P - prompt_lens[i]: P + response_lens[i]] = 1
        response[i, : response_lens[i]] = 1
    noise = lambda scale: paddle.to_tensor(rng.normal(0, scale, (N, R)).astype("float32"))  # noqa: E731
    ids = rng.integers(0, CONFIG["vocab_size"], (N, P + R))
    ids[:, :P] = np.repeat(ids[::answers_per_prompt, :P], answers_per_prompt, axis=0)
    return Rollout(paddle.to_tensor(ids), paddle.to_tensor(attention),
                   paddle.to_tensor(response), P, [], [], {}, old_log_probs=noise(0.3) - 3.5,
                   ref_log_probs=noise(0.3) - 3.5, end_rewards=paddle.to_tensor(rng.normal(0, 1, N).astype("float32")),
                   old_values=noise(0.5))


def with_policy_log_probs(rollout, actor, shift=0.25, seed=1):
    """old / ref log-probs = the policy's own + noise of `shift`: ratios near 1 that sometimes clip."""
    with paddle.no_grad():
        log_probs, _ = response_log_probs(actor, rollout.input_ids, rollout.attention_mask, rollout.prompt_len)
    rng = np.random.default_rng(seed)
    for name in ("old_log_probs", "ref_log_probs"):
        setattr(rollout, name, log_probs + paddle.to_tensor(rng.normal(0, shift, log_probs.shape).astype("float32")))
    return rollout


def ppo_args(**overrides) -> PPOArguments:
    args = dict(advantage_estimator="grpo", num_return_sequences=2, max_new_tokens=R, kl_coeff=0.1,
                clip_range_ratio=0.2)
    args.update(overrides)
    ppo = PPOArguments(**args)
    ppo.validate()
    return ppo


class Update:
    """One optimizer step of the real update loop over `rollout`, split as asked: (the step's actor loss, critic
    loss or None, {parameter: gradient} of actor and critic). The optimizer step is replaced by reading and
    clearing the accumulated gradients."""

    def __init__(self, ppo, actor, critic=None, values_in_update=False, teacher=None):
        """values_in_update: the critic's old values and returns, and the advantages, come from the update's own
        critic passes (Critic.values_in_update), as in PPOTrainer; the rollout then has none of them.
        teacher: teacher.py's strategy (default NoTeacher)."""
        self.ppo, self.actor, self.critic, self.values_in_update = ppo, actor, critic, values_in_update
        self.trainer = types.SimpleNamespace(  # what PPOTrainer.actor_step reads of its trainer
            ppo=ppo, actor=actor, precision=Precision(TrainingArguments()), ptx=NoPtx(), global_step=0,
            sampler_gap=None, teacher=teacher or NoTeacher(), routing=OwnRouting(actor),
            policy=types.SimpleNamespace(optimizer=types.SimpleNamespace(get_lr=lambda: 0.0)))

    def parameters(self):
        return [*self.actor.parameters(), *(self.critic.parameters() if self.critic is not None else [])]

    def __call__(self, rollout, size, accum, group_by_length=False):
        ppo = dict(self.ppo.__dict__, group_by_length=group_by_length)
        ppo = types.SimpleNamespace(**ppo)
        self.trainer.ppo = ppo
        estimator = self.ppo.estimator()
        returns_of = functools.partial(estimator.critic_returns, ppo=ppo) if self.values_in_update else None

        def advantages(rollout):
            rollout.advantages, rollout.returns = estimator(rollout, ppo, lambda t: t)
            return {"advantage/mean": float(rollout.advantages.mean())}
        runner = EagerMicroBatches(functools.partial(PPOTrainer.actor_step, self.trainer),
                                   make_critic(self.critic, ppo.clip_range_value, returns_of=returns_of), ppo,
                                   advantages)
        grads = []

        def optimizer_step():
            grads.append({p.name: p.grad.numpy().copy() for p in self.parameters() if p.grad is not None})
            for p in self.parameters():
                p.clear_gradient()

        args = TrainingArguments(per_device_train_batch_size=size, gradient_accumulation_steps=accum)
        stats = run_update(rollout, runner, optimizer_step, np.random.default_rng(7), ppo, args)
        assert len(grads) == 1, "the split must be one optimizer step"
        return stats["actor_loss"], stats.get("critic_loss"), grads[0]


# --- the float64 reference ----------------------------------------------------------------------------------------
def f64(x):
    return paddle.to_tensor(np.asarray(x, dtype="float64"))


def aggregate(x, mask, mode, constant):
    """The loss aggregations by their definitions, over the whole batch. x, mask: [N, R] float64 -> scalar."""
    if mode == "token-mean":
        return (x * mask).sum() / mask.sum()
    rows = mask.sum(axis=1)  # [N]
    sums = (x * mask).sum(axis=1)  # [N]
    per_row = {"seq-mean-token-mean": sums / paddle.clip(rows, min=1.0), "seq-mean-token-sum": sums,
               "seq-mean-token-sum-norm": sums / constant}[mode]
    has = (rows > 0).astype("float64")
    return (per_row * has).sum() / has.sum()


def kl_reference(name, lp, ref):
    """Every registered KL estimator by its definition (kl.py's docstrings); lp, ref [N, R] float64."""
    d = lp - ref  # log p - log q
    values = {"k1": d, "k2": 0.5 * d * d, "k3": paddle.exp(-d) + d - 1.0,
              "low_var_kl": paddle.clip(paddle.exp(paddle.clip(-d, -20, 20)) - paddle.clip(-d, -20, 20) - 1, -10, 10)}
    if name.endswith("+"):  # the value of the estimator, the gradient of k2
        k2 = 0.5 * d * d
        return k2 - k2.detach() + values[name[:-1]].detach()
    return values[name]


REFERENCE_KL = ("k1", "k2", "k3", "low_var_kl", "k1+", "k3+", "low_var_kl+")
REFERENCE_LOSSES = ("ppo", "gspo")


def reference_actor_loss(ppo, lp, ent, old, adv, ref, mask):
    """The actor's objective of the whole batch in float64 (losses.py / objective.py by their definitions)."""
    low = ppo.clip_range_ratio if ppo.clip_range_ratio_low is None else ppo.clip_range_ratio_low
    high = ppo.clip_range_ratio if ppo.clip_range_ratio_high is None else ppo.clip_range_ratio_high
    mode, constant = ("seq-mean-token-mean" if ppo.policy_loss_mode == "gspo" else ppo.loss_agg_mode), R
    if ppo.policy_loss_mode == "gspo":  # value s_i at each token, gradient s_i grad log p
        seq = ((lp - old) * mask).sum(axis=1, keepdim=True) / paddle.clip(mask.sum(axis=1, keepdim=True), min=1.0)
        ratio = paddle.exp(lp - lp.detach() + seq.detach())
    else:
        ratio = paddle.exp((lp - old) * mask)
    adv = adv * mask
    per_token = paddle.maximum(-adv * ratio, -adv * paddle.clip(ratio, 1 - low, 1 + high))
    loss = ppo.pg_loss_coeff * aggregate(per_token, mask, mode, constant)
    if ppo.kl_in_loss:
        loss = loss + ppo.kl_coeff * aggregate(kl_reference(ppo.kl_estimator, lp, ref), mask, mode, constant)
    if ppo.kl_loss_coeff > 0:
        loss = loss + ppo.kl_loss_coeff * aggregate(kl_reference(ppo.kl_loss_estimator, lp * mask, ref * mask),
                                                    mask, mode, constant)
    if ppo.entropy_coeff > 0:
        loss = loss - ppo.entropy_coeff * aggregate(ent, mask, mode, constant)
    return loss


def reference(ppo, rollout, actor, critic=None):
    """(float64 actor loss, critic loss or None, {parameter: gradient}) of the whole batch in one piece."""
    batch = rollout.packed()
    lp32, ent32 = response_log_probs(actor, batch.input_ids, batch.attention_mask, 0, ppo.temperature, True,
                                     batch.response_index, entropy_grad=True)
    lp, ent = f64(lp32.numpy()), f64(ent32.numpy())
    lp.stop_gradient = ent.stop_gradient = False
    mask = f64(batch.response_mask.numpy())
    loss = reference_actor_loss(ppo, lp, ent, f64(batch.old_log_probs.numpy()), f64(batch.advantages.numpy()),
                                f64(batch.ref_log_probs.numpy()), mask)
    d_lp, d_ent = paddle.grad(loss, [lp, ent], allow_unused=True)
    d_ent = paddle.zeros_like(ent) if d_ent is None else d_ent
    params = [p for p in actor.parameters() if not p.stop_gradient]
    grads = paddle.grad([lp32, ent32], params, [d_lp.astype("float32"), d_ent.astype("float32")], allow_unused=True)
    out = {p.name: g.numpy() for p, g in zip(params, grads) if g is not None}
    critic_loss = None
    if critic is not None:
        v32 = critic_values(critic, batch.input_ids, batch.attention_mask, 0, batch.response_index)
        v, old, ret = f64(v32.numpy()), f64(batch.old_values.numpy()), f64(batch.returns.numpy())
        v.stop_gradient = False
        eps = ppo.clip_range_value
        clipped = old + paddle.clip(v - old, -eps, eps)
        critic_loss = 0.5 * aggregate(paddle.maximum((v - ret) ** 2, (clipped - ret) ** 2), mask, "token-mean", R)
        d_v, = paddle.grad(critic_loss, [v])
        params = [p for p in critic.parameters() if not p.stop_gradient]
        grads = paddle.grad([v32], params, [d_v.astype("float32")], allow_unused=True)
        out.update({p.name: g.numpy() for p, g in zip(params, grads) if g is not None})
        critic_loss = float(critic_loss)
    return float(loss), critic_loss, out


def assert_matches(got, want, loss_tol=2e-6, grad_tol=1e-5, what=""):
    """(loss, critic loss, grads) equal within float32 rounding: losses to loss_tol relative (of max(1, |loss|)),
    every gradient to grad_tol of the largest gradient entry of its parameter tensor."""
    for name, a, b in (("loss", got[0], want[0]), ("critic loss", got[1], want[1])):
        if b is not None:
            assert abs(a - b) <= loss_tol * max(1.0, abs(b)), f"{what}: {name} {a!r} != reference {b!r}"
    assert got[2].keys() == want[2].keys(), what
    for key, ref in want[2].items():
        scale = max(float(np.abs(ref).max()), 1e-3)
        err = float(np.abs(got[2][key] - ref).max())
        assert err <= grad_tol * scale, f"{what}: gradient of {key} off by {err:.3g} (largest entry {scale:.3g})"
