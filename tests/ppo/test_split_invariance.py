"""Every PPO-family objective is invariant to how the optimizer step's batch is split (issue 37): the loss and the
gradient of one global batch are the same, within float32 rounding, as a float64 reference of the whole batch,
whether the real update loop runs it as one micro-batch, as one row per micro-batch, or as uneven micro-batches
(grouped by length or not). Harness and reference: tests/split_invariance.py.

Covered: every distillation loss as a loss term (a local teacher's full vocabulary or top-k) under every
aggregation, every registered advantage estimator (with its critic for gae; the KL in the reward with k1/k2/k3 where
the estimator reads it), every policy loss x every loss aggregation x entropy bonus on / off, and every KL placement
(in the loss with k1/k2/k3, or as GRPO's KL loss with every registered estimator) x every aggregation. Data-rank
and pipeline splits are the parallel suite's (tests/parallel/test_layouts.py); they use the same step_shares.
"""
import dataclasses

import numpy as np
import paddle
import pytest

from alignment.config.choices import LOSS_AGG_MODES
from alignment.config.registry import ADVANTAGE_ESTIMATORS, DISTILL_LOSSES, KL_ESTIMATORS, POLICY_LOSSES
from alignment.ppo.rollout.rollout import critic_values
from tests.split_invariance import (N, R, REFERENCE_KL, REFERENCE_LOSSES, SPLITS, Update, aggregate,
                                    assert_matches, f64, ppo_args, reference, tiny_models, tiny_rollout,
                                    with_policy_log_probs)

BUILT_IN = dict(where=lambda cls: cls.__module__.startswith("alignment."))  # not the toys other tests register
LOSS_SHAPES = [("ppo", mode) for mode in LOSS_AGG_MODES] + [("gspo", "seq-mean-token-mean")]


def test_the_reference_knows_every_registered_name():
    """A new estimator, policy loss, KL estimator or aggregation fails here until the tests cover it."""
    assert set(POLICY_LOSSES.names(**BUILT_IN)) == set(REFERENCE_LOSSES)
    assert set(KL_ESTIMATORS.names(**BUILT_IN)) == set(REFERENCE_KL)
    assert set(LOSS_AGG_MODES) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                   "seq-mean-token-sum-norm"}
    assert set(ADVANTAGE_ESTIMATORS.names(**BUILT_IN)) == {"gae", "grpo", "dr_grpo", "rloo", "reinforce_baseline",
                                                           "reinforce_plus_plus", "vapo", "none"}
    assert set(DISTILL_LOSSES.names(**BUILT_IN)) == {"sampled_kl", "jsd", "forward_kl", "reverse_kl", "topk_kl"}


def scored(ppo, seed=0, critic=False, answers_per_prompt=1):
    """Models, and a rollout scored by the registered estimator (advantages, returns) as the trainer does."""
    actor, value = tiny_models(seed, critic)
    rollout = with_policy_log_probs(tiny_rollout(seed, answers_per_prompt), actor)
    rollout.advantages, rollout.returns = ppo.estimator()(rollout, ppo, lambda t: t)
    return actor, value, rollout


def check_every_split(ppo, critic=False, answers_per_prompt=1, **tolerances):
    actor, value, rollout = scored(ppo, critic=critic, answers_per_prompt=answers_per_prompt)
    want = reference(ppo, rollout, actor, value)
    update = Update(ppo, actor, value)
    for size, accum, by_length in SPLITS:
        assert_matches(update(rollout, size, accum, by_length), want, what=f"{size} rows x {accum}", **tolerances)
    return want


@pytest.mark.parametrize("estimator", sorted(ADVANTAGE_ESTIMATORS.names(**BUILT_IN)))
@pytest.mark.parametrize("kl", ["k1", "k2", "k3"])
def test_every_estimator_with_the_kl_in_the_reward(estimator, kl):
    ppo = ppo_args(advantage_estimator=estimator, kl_estimator=kl, kl_in_loss=False)
    if not ppo.estimator.uses_old_log_probs and kl != "k1":
        pytest.skip(f"{estimator}'s advantages do not read the KL")
    check_every_split(ppo, critic=ppo.estimator.needs_critic)


@pytest.mark.parametrize("loss,mode", LOSS_SHAPES)
@pytest.mark.parametrize("entropy", [0.0, 0.05])
def test_every_policy_loss_and_aggregation_with_and_without_the_entropy_bonus(loss, mode, entropy):
    check_every_split(ppo_args(policy_loss_mode=loss, loss_agg_mode=mode, entropy_coeff=entropy,
                               clip_range_ratio_high=0.28, pg_loss_coeff=0.7))


@pytest.mark.parametrize("loss,mode", LOSS_SHAPES)
@pytest.mark.parametrize("placement", [("kl_in_loss", kl) for kl in ("k1", "k2", "k3")] +
                         [("kl_loss", kl) for kl in REFERENCE_KL], ids="-".join)
def test_every_kl_placement_and_estimator_under_every_aggregation(loss, mode, placement):
    where, kl = placement
    extra = dict(kl_in_loss=True, kl_estimator=kl, kl_coeff=0.3) if where == "kl_in_loss" else \
        dict(kl_in_loss=False, kl_loss_coeff=0.3, kl_loss_estimator=kl)
    check_every_split(ppo_args(policy_loss_mode=loss, loss_agg_mode=mode, **extra))


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_prompts_shared_by_a_group_are_computed_once_or_per_row_alike(shared, estimator):
    """Rows answering one prompt (Rollout.micro_batch shares its forward) against the reference's rows each with
    its own prompt; the critic computes every row's prompt either way."""
    ppo = ppo_args(advantage_estimator=estimator, shared_prompt_forward=shared, entropy_coeff=0.05)
    check_every_split(ppo, critic=estimator == "gae", answers_per_prompt=2)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_we_are_not_the_mean_of_per_micro_batch_means(mode):
    """The aggregation some peers apply per micro-batch (OpenRLHF PR #1249, HF Trainer before num_items_in_batch):
    each micro-batch's own mean, then the mean over the micro-batches. By definition that depends on the split
    whenever micro-batches differ in tokens (token-mean) or in responses; ours must equal the whole batch's
    mean and differ from theirs by far more than the tolerance on this rollout."""
    ppo = ppo_args(loss_agg_mode=mode, shared_prompt_forward=False)  # rows shuffled one by one, as below
    actor, _, rollout = scored(ppo)
    whole = reference(ppo, rollout, actor)[0]
    size, accum = 4, 2  # micro-batches of 4 and 2 rows
    got = Update(ppo, actor)(rollout, size, accum)[0]
    order = np.random.default_rng(7).permutation(len(rollout))  # run_update's first order (group_by_length off)
    parts = [reference(ppo, rollout.select(paddle.to_tensor(order[s: s + size])), actor)[0] for s in (0, size)]
    per_micro_batch = float(np.mean(parts))
    assert abs(got - whole) <= 2e-6 * max(1.0, abs(whole))
    assert abs(per_micro_batch - whole) > 1e-3 * max(1.0, abs(whole)), "the rollout does not tell them apart"


def test_dr_grpo_needs_its_constant_fixed_over_training():
    """Without max_new_tokens the constant would be each micro-batch's longest response: refused."""
    with pytest.raises(ValueError, match="max_new_tokens"):
        ppo_args(loss_agg_mode="seq-mean-token-sum-norm", max_new_tokens=None)


def test_the_reference_aggregations_by_hand():
    """The reference's aggregations on a 2 x 3 example worked by hand (rows [1 2 -] and [4 - -])."""
    x, mask = f64([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]]), f64([[1, 1, 0], [1, 0, 0]])
    for mode, want in (("token-mean", 7 / 3), ("seq-mean-token-mean", (1.5 + 4) / 2),
                       ("seq-mean-token-sum", (3 + 4) / 2), ("seq-mean-token-sum-norm", (3 / R + 4 / R) / 2)):
        assert abs(float(aggregate(x, mask, mode, R)) - want) < 1e-12, mode


@pytest.mark.parametrize("estimator", ["gae", "vapo"])
def test_a_critic_scoring_the_rollout_in_its_first_update_step_trains_as_after_a_scoring_pass(estimator):
    """Critic.values_in_update: no critic pass before the update; each micro-batch's critic forward gives its old
    values and returns, then the advantages: the same old values, returns, advantages, losses and gradients as a
    scoring pass over the padded rollout first (and the float64 reference on it), for every split of one optimizer
    step, with one critic forward per micro-batch and none more."""
    ppo = ppo_args(advantage_estimator=estimator, num_return_sequences=1, normalize_advantage=True)
    actor, value = tiny_models(0, critic=True)
    scored = with_policy_log_probs(tiny_rollout(0), actor)
    with paddle.no_grad():
        scored.old_values = critic_values(value, scored.input_ids, scored.attention_mask, scored.prompt_len)
    scored.advantages, scored.returns = ppo.estimator()(scored, ppo, lambda t: t)
    want = reference(ppo, scored, actor, value)
    forwards = []
    hook = value.register_forward_pre_hook(lambda layer, inputs: forwards.append(inputs[0].shape[0]))
    try:
        for size, accum, by_length in SPLITS:
            rollout, forwards[:] = dataclasses.replace(scored, old_values=None, advantages=None, returns=None), []
            got = Update(ppo, actor, value, values_in_update=True)(rollout, size, accum, by_length)
            assert_matches(got, want, what=f"{size} rows x {accum}")
            mask = scored.response_mask.numpy()  # (old values after a row's response are never read)
            for name in ("old_values", "returns", "advantages"):
                np.testing.assert_allclose(getattr(rollout, name).numpy() * mask, getattr(scored, name).numpy() * mask,
                                           rtol=0, atol=2e-5, err_msg=f"{name}, {size} rows x {accum}")
            assert forwards == [len(rows) for rows in np.array_split(np.arange(N), range(size, N, size))]
        with pytest.raises(RuntimeError, match="whole rollout"):  # two optimizer steps: the second's rows unscored
            Update(ppo, actor, value, values_in_update=True)(dataclasses.replace(
                scored, old_values=None, advantages=None, returns=None), 3, 1)
    finally:
        hook.remove()


@pytest.mark.parametrize("loss", ["jsd", "forward_kl", "reverse_kl", "topk_kl"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_every_distillation_loss_term_under_every_aggregation(loss, mode):
    """Zero advantages ('none'), so the step's loss is distill_coeff x the aggregated divergence alone: the reference
    computes it over the whole batch in one pass (float64 from the float32 logits) and its gradient as above."""
    from alignment.config.distill import DistillArguments
    from alignment.config.training import TrainingArguments
    from alignment.ppo.rl_math import distill
    from alignment.ppo.teacher.teacher import LocalTeacher, Teacher, response_hidden

    ppo = ppo_args(advantage_estimator="none", loss_agg_mode=mode, kl_coeff=0.0, temperature=0.7)
    args = DistillArguments(teacher_model_name_or_path="teacher", distill_loss=loss, distill_coeff=0.5, beta=0.3,
                            teacher_top_k=4)
    args.validate()
    actor, _, rollout = scored(ppo)
    teacher_model, _ = tiny_models(seed=9)
    teacher = Teacher(LocalTeacher(teacher_model, "teacher", 4), args, ppo, TrainingArguments())
    batch = rollout.packed()
    states, _ = response_hidden(actor, batch)
    logits32 = actor.compute_logits(states)  # [N, R, V]
    logits = f64(logits32.numpy())
    logits.stop_gradient = False
    with paddle.no_grad():
        target = teacher.source.batch_input(batch, ppo.temperature, teacher.loss)
    target = f64(target.numpy()) if not isinstance(target, tuple) else (target[0], f64(target[1].numpy()))
    mask = f64(batch.response_mask.numpy())
    loss64 = 0.5 * aggregate(teacher.loss.per_token(logits, target, 0.3, 0.7), mask, mode, R)
    d_logits, = paddle.grad(loss64, [logits])
    params = [p for p in actor.parameters() if not p.stop_gradient]
    grads = paddle.grad([logits32], params, [d_logits.astype("float32")], allow_unused=True)
    want = (float(loss64), None, {p.name: g.numpy() for p, g in zip(params, grads) if g is not None})
    assert want[0] > 0 and distill.DistillLoss.lookup(loss) is type(teacher.loss)
    update = Update(ppo, actor, teacher=teacher)
    for size, accum, by_length in SPLITS:
        assert_matches(update(rollout, size, accum, by_length), want, what=f"{loss} {size} rows x {accum}")
