"""Asynchronous RL launches (marked `parallel`): one training and one rollout rank. max_staleness 0 trains exactly
as the one-process synchronous run (every metric, bitwise weights) for PPO with a critic and for GRPO; staleness 1
overlaps and its ledger holds every sample once; kill -9 of the rollout rank or of the training rank stops the
launch, and resume_from_checkpoint auto continues to the uninterrupted run's metrics and weights, the ledger still
holding every sample exactly once; so does a kill in the middle of a weight transfer; partial rollouts tag each
token with the version that drew it and resume exactly."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from safetensors.numpy import load_file

from alignment.commands import replay_ledger
from alignment.ppo.asynchronous.asynchronous import HOLD_VARIABLE, token_version
from alignment.ppo.rollout.ledger import read_ledger
from tests.helpers import REPO, read_metrics

pytestmark = pytest.mark.parallel
SCRIPT = os.path.join(REPO, "alignment", "ppo", "run_ppo.py")


@pytest.fixture(scope="module", autouse=True)
def one_mkl_thread_in_every_process():
    """Every run here, launched or not (and the module's shared uninterrupted run), on 1 MKL thread: runs are
    compared bit for bit, and MKL sums a GEMM in another order on 2 threads, which a launch's training rank and a
    one-process run would otherwise have while the rollout rank has 1 (alignment/cpu_env.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MKL_NUM_THREADS", "1")
        yield


def ppo_args(out, actor, reward, estimator, *extra):
    args = [SCRIPT, os.path.join(REPO, "config", "tiny", "ppo_argument.json"), "--actor_model_name_or_path", actor,
            "--reward_model_name_or_path", reward, "--output_dir", str(out), "--disable_tqdm", "--eval_datasets", "",
            "--max_steps", "6", "--max_new_tokens", "8", "--per_device_prompt_batch_size", "4",
            "--per_device_train_batch_size", "4", "--logging_steps", "1", "--advantage_estimator", estimator]
    if estimator == "grpo":
        args += ["--num_return_sequences", "2", "--kl_in_loss", "true", "--kl_estimator", "k3"]
    return args + list(extra)


def launch(log_dir, args, check=True):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(log_dir),
           *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return done


def comparable(out):
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "async/"))} for row in read_metrics(out)]


def assert_same_weights(a, b, subdirs):
    for sub in subdirs:
        x, y = (load_file(os.path.join(run, sub, "model.safetensors")) for run in (a, b))
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=f"{sub} {key}")


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_max_staleness_0_equals_the_synchronous_run(tmp_path, tiny_model_dir, tiny_reward_dir, estimator):
    sync, overlapped = tmp_path / "sync", tmp_path / "async"
    subprocess.run([sys.executable, *ppo_args(sync, tiny_model_dir, tiny_reward_dir, estimator, "--max_steps", "4")],
                   cwd=REPO, check=True, capture_output=True)
    launch(tmp_path / "logs", ppo_args(overlapped, tiny_model_dir, tiny_reward_dir, estimator, "--max_steps", "4",
                                       "--rollout_ranks", "1"))
    assert comparable(sync) == comparable(overlapped)
    assert all(row["async/staleness"] == 0 for row in read_metrics(overlapped))
    assert_same_weights(sync, overlapped, ["policy"] + (["value"] if estimator == "gae" else []))


def test_staleness_1_trains_every_sample_once_and_overlaps(tmp_path, tiny_model_dir, tiny_reward_dir, monkeypatch):
    from alignment.cpu_env import usable_cores

    monkeypatch.delenv("MKL_NUM_THREADS")  # chosen per rank
    out = tmp_path / "run"
    launch(tmp_path / "logs", ppo_args(out, tiny_model_dir, tiny_reward_dir, "gae", "--rollout_ranks", "1",
                                       "--max_staleness", "1"))
    # the training rank (0) runs on the host's cores, not on the half the launch gave each of the two processes
    assert f"MKL_NUM_THREADS={usable_cores()}," in (tmp_path / "logs" / "workerlog.0").read_text()
    rows = read_metrics(out)
    assert [r["async/staleness"] for r in rows] == [0, 1, 1, 1, 1, 1]
    assert all(0.25 < r["async/behaviour_weight"] < 4 for r in rows[1:])
    # it overlaps: batch b (trained by step b + 1) is sampled with version b - 1, sent at step b's start, while step
    # b trains batch b - 1 (the rollout rank's timeline against the training rank's step starts); a synchronous
    # schedule would start sampling it only after step b (none of the 5; a rank starved of the CPU for a whole step
    # may miss one)
    starts = [r["time/step_start"] for r in rows]
    sampled = {t["batch"]: t for t in (json.loads(line) for line in open(out / "rollout_rank1.jsonl"))}
    during = [b for b in range(1, 6) if starts[b - 1] <= sampled[b]["sample_start"] < starts[b]]
    assert len(during) >= 4, (starts, sampled)
    ledger = read_ledger(str(out))
    assert len(ledger) == 6 * 4 and [r["version"] for r in ledger if r["step"] == 4] == [2] * 4
    assert all(len(r["behaviour_log_probs"]) == sum(r["policy_token"]) for r in ledger)
    assert replay_ledger.main([str(out)]) == 0


def rank_pid(launcher_pid: int, rank: int) -> int:
    """The pid of a rank's process under the launcher (PADDLE_TRAINER_ID in its environment)."""
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if child.environ().get("PADDLE_TRAINER_ID") == str(rank) and "run_ppo.py" in " ".join(child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    raise AssertionError(f"rank {rank} not found")


KILL_FLAGS = ("--rollout_ranks", "1", "--max_staleness", "1", "--save_steps", "2")


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tiny_reward_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    launch(out.parent / "logs", ppo_args(out, tiny_model_dir, tiny_reward_dir, "gae", *KILL_FLAGS))
    return out


def kill_then_resume(tmp_path, args, killed_rank, straight, when, env=None):
    """Launch `args` (writing to tmp_path / "killed"), kill -9 `killed_rank` once the path `when` exists, check the
    launch stops naming it, resume auto and compare with the uninterrupted run `straight`."""
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
           str(tmp_path / "logs-killed"), *args(killed)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    deadline = time.time() + 300
    while not when(killed).exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.kill(rank_pid(proc.pid, killed_rank), signal.SIGKILL)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and f"Container rank {killed_rank} status failed" in output, output[-3000:]
    trained = [r["step"] for r in read_metrics(killed)]
    assert (killed / "latest").exists() and len(trained) < 6, trained
    launch(tmp_path / "logs-resumed", [*args(killed), "--resume_from_checkpoint", "auto"])
    assert comparable(killed) == comparable(straight)
    assert_same_weights(straight, killed, ["policy"] + (["value"] if (straight / "value").exists() else []))
    assert replay_ledger.main([str(killed)]) == 0  # every sample once across the kill
    assert [r["sample"] for r in read_ledger(str(killed))] == [r["sample"] for r in read_ledger(str(straight))]
    return killed


@pytest.mark.parametrize("killed_rank", [1, 0], ids=["rollout-rank", "training-rank"])
def test_kill_9_of_a_rank_then_resume_auto_continues_exactly(tmp_path, tiny_model_dir, tiny_reward_dir,
                                                             killed_rank, uninterrupted):
    kill_then_resume(tmp_path, lambda out: ppo_args(out, tiny_model_dir, tiny_reward_dir, "gae", *KILL_FLAGS),
                     killed_rank, uninterrupted, lambda out: out / "latest")


@pytest.mark.parametrize("killed_rank", [1, 0], ids=["rollout-rank", "training-rank"])
def test_kill_9_during_a_weight_transfer_then_resume_auto_continues_exactly(tmp_path, tiny_model_dir,
                                                                            tiny_reward_dir, killed_rank,
                                                                            uninterrupted):
    """The sender of version 3 (after checkpoint-2) holds between the header and the weights (the receiver has
    posted its recv for them) until the test kills one side."""
    held = tmp_path / "held"
    kill_then_resume(tmp_path, lambda out: ppo_args(out, tiny_model_dir, tiny_reward_dir, "gae", *KILL_FLAGS),
                     killed_rank, uninterrupted, lambda out: held, {HOLD_VARIABLE: f"3:{held}"})


PARTIAL = 3  # partial_rollout_tokens: 8 new tokens are drawn by up to 3 versions' segments (two, after the cap)


def test_partial_rollouts_tag_each_token_with_its_version_and_resume_exactly(tmp_path, tiny_model_dir,
                                                                             tiny_reward_dir):
    def args(out):
        return ppo_args(out, tiny_model_dir, tiny_reward_dir, "grpo", "--rollout_ranks", "1", "--max_staleness",
                        "2", "--partial_rollout_tokens", str(PARTIAL), "--save_steps", "2")

    straight = tmp_path / "straight"
    launch(tmp_path / "logs-straight", args(straight))
    ledger = read_ledger(str(straight))
    for row in ledger:
        batch = int(row["sample"].split(":")[0])
        drawn = [t for t, policy in enumerate(row["policy_token"]) if policy]
        assert row["token_versions"] == [token_version(batch, t, 2, PARTIAL) for t in drawn], row["sample"]
    assert any(len(set(row["token_versions"])) == 2 for row in ledger)  # generations that moved on mid-way
    staleness = [r["async/staleness"] for r in read_metrics(straight)]
    assert staleness[:2] == [0, 1] and all(1 <= s <= 2 for s in staleness[2:]), staleness
    kill_then_resume(tmp_path, args, 1, straight, lambda out: out / "latest")


def test_a_reward_server_scores_an_asynchronous_run_as_the_in_process_reward_model(tmp_path, tiny_model_dir,
                                                                                   tiny_reward_dir):
    from tests.rewards.test_reward_server import TOKEN, Server, server_argv

    sync, served = tmp_path / "sync", tmp_path / "served"
    subprocess.run([sys.executable, *ppo_args(sync, tiny_model_dir, tiny_reward_dir, "gae", "--max_steps", "3")],
                   cwd=REPO, check=True, capture_output=True)
    server = Server(tmp_path, "--model", tiny_reward_dir, "--token", TOKEN).wait()
    try:
        launch(tmp_path / "logs", ppo_args(served, tiny_model_dir, tiny_reward_dir, "gae", "--max_steps", "3",
                                           "--rollout_ranks", "1", *server_argv(server.url)))
    finally:
        server.stop()
    without_server = [{k: v for k, v in row.items() if not k.startswith("reward_server/")} for row in comparable(served)]
    assert without_server == comparable(sync)
    assert server.url in (served / "ledger" / "sources.json").read_text()


def test_dynamic_sampling_keeps_groups_from_the_batches_sampled_ahead_and_the_ledger_accounts_for_every_row(
        tmp_path, tiny_model_dir):
    """max_gen_batches 3: the rollout rank samples 3 prompt batches for every step; the trainer keeps the groups
    with reward spread in order, as synchronous DAPO does, and the batches it does not need are dropped unscored."""
    from tests.ppo.test_dynamic_sampling import GRPO_CONFIG, PROMPTS, REWARDS

    rewards = tmp_path / "ds_rewards.py"
    rewards.write_text(REWARDS)
    out = tmp_path / "run"
    launch(tmp_path / "logs", [SCRIPT, GRPO_CONFIG, "--actor_model_name_or_path", tiny_model_dir, "--output_dir",
                               str(out), "--disable_tqdm", "--train_datasets", PROMPTS, "--eval_datasets", "",
                               "--max_new_tokens", "6", "--max_steps", "3", "--per_device_prompt_batch_size", "4",
                               "--num_return_sequences", "4", "--logging_steps", "1", "--reward_funcs",
                               f"{rewards}:some_equal", "--dynamic_sampling", "true", "--max_gen_batches", "3",
                               "--rollout_ranks", "1", "--max_staleness", "1"])
    rows = read_metrics(out)
    assert [r["async/staleness"] for r in rows] == [0, 1, 1]
    assert all(r["dynamic_sampling/filled"] == 1.0 for r in rows)
    gen = [int(r["dynamic_sampling/gen_batches"]) for r in rows]
    ledger = read_ledger(str(out))
    trained = [r for r in ledger if "dropped" not in r]
    why = {r["dropped"] for r in ledger if "dropped" in r}
    assert len(trained) == 3 * 16 and "no reward spread" in why
    assert len(ledger) == 3 * 3 * 16  # every row of the 9 batches sampled, trained or dropped, once
    assert sum(r["dropped"] == "not needed" for r in ledger if "dropped" in r) == sum(16 * (3 - g) for g in gen)
    assert replay_ledger.main([str(out)]) == 0


@pytest.mark.parametrize("player", ["environment", "agent"])
def test_multi_turn_episodes_with_lora_run_asynchronously(tmp_path, tiny_model_dir, player):
    """Episodes of an environment, or of an OpenAI-client agent program through the gateway on the rollout rank."""
    out = tmp_path / "run"
    players = {"environment": ["--environment", "guess-number", "--environment_args", "{}"],
               "agent": ["--environment", "", "--environment_args", "{}", "--agent",
                         os.path.join(REPO, "examples", "openai_agent", "guess_number_agent.py") + ":play"]}
    args = [SCRIPT, os.path.join(REPO, "config", "tiny", "grpo_tools_argument.json"), "--actor_model_name_or_path",
            tiny_model_dir, "--output_dir", str(out), "--disable_tqdm", *players[player],
            "--user_env_modules", os.path.join(REPO, "examples", "guess_number_env.py"),
            "--reward_funcs", "", "--gold_judge", "", "--eval_datasets", "", "--max_steps", "4", "--max_turns", "3",
            "--max_new_tokens", "6", "--max_length", "160", "--max_trajectory_tokens", "96",
            "--num_return_sequences", "2", "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size",
            "4", "--lora", "true", "--lora_rank", "4", "--rollout_ranks", "1", "--max_staleness", "1"]
    launch(tmp_path / "logs", args)
    rows = read_metrics(out)
    assert len(rows) == 4 and all(r["env/turns"] > 1 for r in rows) and rows[-1]["async/staleness"] == 1
    ledger = read_ledger(str(out))
    assert len(ledger) == 16 and all(0 in r["policy_token"] for r in ledger)  # observations in, not trained
    if player == "agent":  # every call the agents made on the rollout rank, recorded
        assert all(r["rollout/failed_episodes"] == 0 for r in rows)
        assert all(sum(len(c["sampled"]) for c in r["calls"]) == sum(r["policy_token"]) for r in ledger)
    assert replay_ledger.main([str(out)]) == 0


def test_partial_rollouts_with_compiled_decoding_load_each_version_into_the_compiled_step(tmp_path, tiny_model_dir,
                                                                                         tiny_reward_dir):
    """rollout_decode static runs the decode steps as a compiled program: a version loaded mid-generation must reach
    it (the same tokens and behaviour log-probs as eager decoding)."""
    flags = ("--rollout_ranks", "1", "--max_staleness", "2", "--partial_rollout_tokens", str(PARTIAL), "--max_steps",
             "4")
    eager, static = tmp_path / "eager", tmp_path / "static"
    launch(tmp_path / "logs-eager", ppo_args(eager, tiny_model_dir, tiny_reward_dir, "grpo", *flags))
    launch(tmp_path / "logs-static", ppo_args(static, tiny_model_dir, tiny_reward_dir, "grpo", *flags,
                                              "--rollout_decode", "static"))
    a, b = read_ledger(str(eager)), read_ledger(str(static))
    assert any(len(set(row["token_versions"])) == 2 for row in b)
    assert [r["response_ids"] for r in a] == [r["response_ids"] for r in b]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x["behaviour_log_probs"], y["behaviour_log_probs"], atol=1e-4)
