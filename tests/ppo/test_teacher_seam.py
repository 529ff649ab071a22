"""The estimator the teacher hands the trainer (alignment/ppo/teacher/teacher.py): sampled_kl's per-token term on
the inner estimator's advantages, the inner one's traits, and the old log-probs always scored."""
import copy
from types import SimpleNamespace

import numpy as np
import paddle

from alignment.ppo.teacher.teacher import NoTeacher, TeacherAdvantages


class Ones:
    """An inner estimator: advantages 1 everywhere, a critic's traits."""
    needs_critic, uses_old_log_probs, critic_returns, min_group_size = True, False, "the critic's targets", 1

    def __call__(self, rollout, ppo, reduce_sum):
        return paddle.ones(rollout.response_mask.shape), "returns"


def rollout():
    return SimpleNamespace(old_log_probs=paddle.to_tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]]),
                           teacher_log_probs=paddle.to_tensor([[-1.5, -1.0, -3.0], [-2.0, 0.0, -1.0]]),
                           response_mask=paddle.to_tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_sampled_kl_adds_coeff_times_teacher_minus_old_log_probs_on_policy_tokens():
    advantages, returns = TeacherAdvantages(Ones(), 2.0)(rollout(), None, None)
    # 1 + 2 x -(old - teacher) on the mask: row 0 [1 + 2(-0.5), 1 + 2(1.0), 1], row 1 [1 + 2(-1.5), 1, 1]
    np.testing.assert_allclose(advantages.numpy(), [[0.0, 3.0, 1.0], [-2.0, 1.0, 1.0]], rtol=0, atol=1e-6)
    assert returns == "returns"


def test_other_losses_keep_the_advantages_and_the_inner_traits_but_score_old_log_probs():
    estimator = TeacherAdvantages(Ones(), None)
    advantages, _ = estimator(rollout(), None, None)
    np.testing.assert_array_equal(advantages.numpy(), np.ones([2, 3], "float32"))
    assert estimator.uses_old_log_probs and not Ones.uses_old_log_probs  # distill/reverse_kl reads them
    assert (estimator.needs_critic, estimator.critic_returns, estimator.min_group_size) == (
        True, "the critic's targets", 1)
    assert copy.copy(estimator).inner is estimator.inner  # delegation does not recurse while copying


def test_without_a_teacher_the_trainer_gets_its_own_estimator():
    inner = Ones()
    assert NoTeacher().estimator(inner) is inner
