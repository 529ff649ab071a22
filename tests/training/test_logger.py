"""Metric logging: VisualDL tags fall into a few groups; a row cut short by a kill is dropped on resume."""
import json

from alignment.training.logger import MetricsLogger
from alignment.training.trackers.files import visualdl_order, visualdl_tag

PPO_KEYS = ["reward/mean", "reward/std", "kl", "actor_loss", "critic_loss", "entropy", "clip_frac", "approx_kl",
            "explained_variance", "response_length", "truncated", "gold_reward/mean", "time/generate",
            "time/score", "time/train", "eval/reward", "eval/gold_reward", "memory/train_before", "lr"]


def test_ppo_metrics_fall_into_four_visualdl_groups():
    tags = [visualdl_tag(k) for k in PPO_KEYS]
    assert {t.split("/")[0] for t in tags} == {"train", "time", "eval", "memory"}
    assert visualdl_tag("reward/mean") == "train/reward_mean" and len(set(tags)) == len(tags)


def test_a_half_written_row_is_dropped_when_a_run_resumes(tmp_path):
    rows = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.9}, {"step": 3, "loss": 0.8}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "lo')
    logger = MetricsLogger(str(tmp_path))
    logger.resume_at(2)
    logger.log(3, {"loss": 0.7}, echo=None)
    logger.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [rows[0], rows[1], {"step": 3, "loss": 0.7}]


def test_rewards_and_kl_are_written_first_so_visualdl_shows_them_first():
    row = {"step": 3, "actor_loss": 0.1, "time/generate": 1.0, "kl": 2.0, "eval/response_length": 9.0,
           "reward/mean": 0.5, "eval/gold_reward": 0.3, "gold_reward/mean": 0.2, "approx_kl": 0.01}
    assert visualdl_order(row) == ["kl", "reward/mean", "eval/gold_reward", "gold_reward/mean", "step",
                                   "actor_loss", "time/generate", "eval/response_length", "approx_kl"]
