"""Distillation end to end on the tiny model (alignment/ppo/teacher/teacher.py, run_distill.py): a teacher that differs
from the student, each loss, GKD's data mix, LoRA, the ledger, exact resume, and the arguments' errors."""
import json
import os

import numpy as np
import pytest

from alignment.models import LlamaForCausalLM
from alignment.ppo import run_distill, run_ppo
from tests.helpers import REPO, read_metrics

PROMPTS = f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl"


@pytest.fixture(scope="module")
def teacher_dir(tiny_teacher_dir):
    return tiny_teacher_dir


def distill_args(tmp_path, student, teacher, *extra, steps=2):
    return ["--actor_model_name_or_path", student, "--teacher_model_name_or_path", teacher,
            "--output_dir", str(tmp_path / "out"), "--disable_tqdm", "--train_datasets", PROMPTS,
            "--max_steps", str(steps), "--max_new_tokens", "6", "--max_length", "96", "--per_device_prompt_batch_size",
            "4", "--per_device_train_batch_size", "4", "--logging_steps", "1", "--learning_rate", "1e-3",
            "--seed", "3", *extra]


def q_weight(path):
    return LlamaForCausalLM.from_pretrained(path).model.layers[0].self_attn.q_proj.weight.numpy()


@pytest.mark.parametrize("loss", ["sampled_kl", "jsd", "topk_kl"])
def test_distillation_trains_the_student_and_logs_the_teacher(tmp_path, tiny_model_dir, teacher_dir, loss):
    run_distill.main(distill_args(tmp_path, tiny_model_dir, teacher_dir, "--distill_loss", loss,
                                  "--teacher_top_k", "5"))
    out = tmp_path / "out"
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["distill/reverse_kl"] != 0 and np.isfinite(row["distill/teacher_log_prob"])
        assert row["distill/teacher_log_prob"] < 0 and row["time/teacher"] > 0
        assert ("distill_loss" in row) == (loss != "sampled_kl")
        if loss != "sampled_kl":
            assert row["distill_loss"] > 0
    assert np.abs(q_weight(str(out / "policy")) - q_weight(tiny_model_dir)).max() > 0
    args = json.load(open(out / "args.json"))
    assert args["advantage_estimator"] == "none" and args["kl_coeff"] == 0.0


def test_the_teacher_itself_as_teacher_gives_zero_divergence(tmp_path, tiny_model_dir):
    """Student == teacher: every sampled token's reverse KL and the JSD are 0 at the first step (the same
    weights), so the check above could fail."""
    run_distill.main(distill_args(tmp_path, tiny_model_dir, tiny_model_dir, "--distill_loss", "jsd", steps=1))
    row = read_metrics(tmp_path / "out")[0]
    assert abs(row["distill/reverse_kl"]) < 1e-6 and row["distill_loss"] < 1e-6


def test_gkd_mix_trains_on_dataset_answers_and_seq_kd_on_the_teachers(tmp_path, tiny_model_dir, teacher_dir):
    data = tmp_path / "qa.jsonl"
    with open(data, "w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}."}) + "\n")
    common = ["--distill_loss", "forward_kl", "--train_datasets", f"prompt-only:1.0:{data}", "--lmbda", "0.5"]
    run_distill.main(distill_args(tmp_path / "mix", tiny_model_dir, teacher_dir, *common, steps=6))
    rows = read_metrics(tmp_path / "mix" / "out")
    on = [r["distill/on_policy"] for r in rows]
    assert 0 < sum(on) < len(on)  # both kinds of step in six (seeded)
    run_distill.main(distill_args(tmp_path / "kd", tiny_model_dir, teacher_dir, *common, "--seq_kd", "true",
                                  steps=6))
    assert [r["distill/on_policy"] for r in read_metrics(tmp_path / "kd" / "out")] == on  # the same draws


def test_distill_coeff_adds_the_teacher_to_grpo_with_rewards_and_lora(tmp_path, tiny_model_dir, teacher_dir):
    run_ppo.main(distill_args(tmp_path, tiny_model_dir, teacher_dir, "--advantage_estimator", "grpo",
                              "--num_return_sequences", "2", "--reward_funcs", "combined", "--distill_coeff", "0.5",
                              "--distill_loss", "reverse_kl", "--lora", "true", "--lora_rank", "4",
                              "--rollout_ledger", "true"))
    out = tmp_path / "out"
    rows = read_metrics(out)
    assert all(r["distill_loss"] > 0 and "reward/combined" in r for r in rows)
    sources = json.load(open(out / "ledger" / "sources.json"))
    assert sources["teacher"] == teacher_dir and len(sources["teacher_sha256"]) == 64
    assert sources["distill_loss"] == "reverse_kl" and sources["distill_coeff"] == 0.5
    ledger = [json.loads(line) for name in sorted(os.listdir(out / "ledger")) if name.startswith("steps-")
              for line in open(out / "ledger" / name)]
    assert len(ledger) == 2 * 4 * 2
    for row in ledger:
        assert len(row["teacher_log_probs"]) == sum(row["policy_token"]) > 0
        assert all(lp < 0 for lp in row["teacher_log_probs"])


def test_resume_continues_exactly(tmp_path, tiny_model_dir, teacher_dir):
    """GKD's mix and a loss term: the resumed run draws the same on/off-policy steps and ends bitwise equal."""
    common = ["--distill_loss", "jsd", "--save_steps", "2", "--lmbda", "0.5", "--seq_kd", "true"]
    run_distill.main(distill_args(tmp_path / "whole", tiny_model_dir, teacher_dir, *common, steps=4))
    checkpoint = tmp_path / "whole" / "out" / "checkpoint-2"
    run_distill.main(distill_args(tmp_path / "cut", tiny_model_dir, teacher_dir, *common, "--resume_from_checkpoint",
                                  str(checkpoint), steps=4))
    whole, cut = read_metrics(tmp_path / "whole" / "out"), read_metrics(tmp_path / "cut" / "out")
    assert [r["distill_loss"] for r in whole[2:]] == [r["distill_loss"] for r in cut[-2:]]
    assert [r["distill/on_policy"] for r in whole[2:]] == [r["distill/on_policy"] for r in cut[-2:]]
    assert np.array_equal(q_weight(str(tmp_path / "whole" / "out" / "policy")),
                          q_weight(str(tmp_path / "cut" / "out" / "policy")))


@pytest.mark.parametrize("extra,message", [
    ([], "key 'teacher_model_name_or_path' is required"),
    (["--teacher_model_name_or_path", "http://127.0.0.1:9/v1", "--distill_loss", "jsd"], "whole vocabulary"),
    (["--teacher_model_name_or_path", "T", "--lmbda", "0.5"], "sampled_kl"),
    (["--teacher_model_name_or_path", "T", "--distill_loss", "jsd", "--lmbda", "0.5", "--advantage_estimator",
      "grpo", "--reward_funcs", "combined", "--num_return_sequences", "2"], "advantage_estimator 'grpo'"),
    (["--teacher_model_name_or_path", "T", "--distill_loss", "nope"], "key 'distill_loss' must be one of"),
])
def test_bad_distillation_arguments_are_one_line_exits(tmp_path, tiny_model_dir, capsys, extra, message):
    args = ["--actor_model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "o"),
            "--train_datasets", PROMPTS, *extra]
    with pytest.raises(SystemExit) as exit_info:
        run_distill.main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("loss", ["sampled_kl", "topk_kl"])
def test_a_served_teacher_gives_the_local_teachers_numbers(tmp_path, tiny_model_dir, teacher_dir, loss):
    """The same teacher behind an OpenAI-style /v1/completions (tests/served_teacher.py: our model's real forward
    passes, vLLM's answer layout): the run's teacher log-probs, divergences and trained weights match the local
    teacher's up to float rounding (the server runs each sequence alone, the trainer a padded batch)."""
    from tests.served_teacher import Served, make_app

    common = ["--distill_loss", loss, "--teacher_top_k", "5"]
    run_distill.main(distill_args(tmp_path / "local", tiny_model_dir, teacher_dir, *common))
    app = make_app(LlamaForCausalLM.from_pretrained(teacher_dir), fail_first=1)  # one 503: retried
    with Served(app) as url:
        run_distill.main(distill_args(tmp_path / "served", tiny_model_dir, url, *common))
    assert app.state.counter["requests"] == 3  # the 503, then one request per step
    local, served = read_metrics(tmp_path / "local" / "out"), read_metrics(tmp_path / "served" / "out")
    for a, b in zip(local, served):
        assert b["distill/teacher_log_prob"] == pytest.approx(a["distill/teacher_log_prob"], rel=1e-5)
        assert b["distill/reverse_kl"] == pytest.approx(a["distill/reverse_kl"], rel=1e-4)
        assert b["actor_loss"] == pytest.approx(a["actor_loss"], rel=1e-4, abs=1e-7)
    assert [r["distill/teacher_retries"] for r in served] == [1, 0] and "distill/teacher_retries" not in local[0]
    assert np.abs(q_weight(str(tmp_path / "served" / "out" / "policy")) -
                  q_weight(str(tmp_path / "local" / "out" / "policy"))).max() < 1e-4


def test_the_gateway_serves_a_teacher_with_the_local_teachers_numbers(tmp_path, tiny_model_dir, teacher_dir):
    """`alignment-serve` (tools/serve.py) as the teacher's server: its legacy completions give the run the local
    teacher's log-probs and top-k up to float rounding (it scores each sequence alone)."""
    import subprocess
    import sys
    import time

    common = ["--distill_loss", "topk_kl", "--teacher_top_k", "5"]
    run_distill.main(distill_args(tmp_path / "local", tiny_model_dir, teacher_dir, *common))
    port = tmp_path / "port"
    server = subprocess.Popen([sys.executable, os.path.join(REPO, "tools", "serve.py"), "--model", teacher_dir,
                               "--port", "0", "--port-file", str(port), "--api-key", "teacher-key", "--name",
                               "the-teacher"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not port.exists() and server.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert port.exists(), server.stderr.read() if server.poll() is not None else "no port"
        run_distill.main(distill_args(tmp_path / "served", tiny_model_dir,
                                      f"http://127.0.0.1:{port.read_text().strip()}/v1", *common,
                                      "--teacher_server_token", "teacher-key", "--teacher_served_model",
                                      "the-teacher", "--teacher_server_timeout", "60"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    local, served = read_metrics(tmp_path / "local" / "out"), read_metrics(tmp_path / "served" / "out")
    for a, b in zip(local, served):
        assert b["distill/teacher_log_prob"] == pytest.approx(a["distill/teacher_log_prob"], rel=1e-5)
        assert b["distill/reverse_kl"] == pytest.approx(a["distill/reverse_kl"], rel=1e-4)


def test_a_teacher_server_that_is_down_stops_the_run_naming_it(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_distill.main(distill_args(tmp_path, tiny_model_dir, "http://127.0.0.1:9/v1", "--teacher_server_retries",
                                      "1"))
    assert exit_info.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: teacher server unreachable after 2 attempts") and "teacher_server_retries" in err


def test_every_offload_level_trains_as_the_run_without(tmp_path, tiny_model_dir, teacher_dir):
    """The teacher is a frozen model offloaded with freeze_model: brought back to score, to give its logits in the
    update and to sample seq_kd's answers."""
    common = ["--distill_loss", "jsd", "--lmbda", "0.5", "--seq_kd", "true"]
    run_distill.main(distill_args(tmp_path / "plain", tiny_model_dir, teacher_dir, *common, steps=3))
    run_distill.main(distill_args(tmp_path / "offload", tiny_model_dir, teacher_dir, *common, "--offload_level",
                                  "freeze_model optimizer train_model", steps=3))
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    assert strip(read_metrics(tmp_path / "plain" / "out")) == strip(read_metrics(tmp_path / "offload" / "out"))
    assert np.array_equal(q_weight(str(tmp_path / "plain" / "out" / "policy")),
                          q_weight(str(tmp_path / "offload" / "out" / "policy")))


def test_multi_turn_episodes_are_distilled_on_the_policys_tokens(tmp_path, tiny_model_dir, teacher_dir):
    """With an environment the teacher scores whole episodes; the ledger keeps one teacher log-prob per policy token
    (the response mask's, which leaves observations out; the tiny model makes no tool call, so here every episode is
    one turn)."""
    run_distill.main(distill_args(tmp_path, tiny_model_dir, teacher_dir, "--environment", "tools",
                                  "--environment_args", '{"tools": ["calculator"], "format": "hermes-compact"}',
                                  "--max_turns", "2", "--train_datasets",
                                  f"prompt-only:1.0:{REPO}/data/tool_arithmetic/train.jsonl",
                                  "--rollout_ledger", "true", "--max_length", "256", steps=1))
    folder = tmp_path / "out" / "ledger"
    rows = [json.loads(line) for name in sorted(os.listdir(folder)) if name.startswith("steps-")
            for line in open(folder / name)]
    assert len(rows) == 4
    for row in rows:
        assert len(row["teacher_log_probs"]) == sum(row["policy_token"]) > 0
        assert all(lp < 0 for lp in row["teacher_log_probs"])


class WordTokenizer:
    """Each word one id (its length), pad = eos = 0 as SmolLM2's pad is its eos."""
    pad_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return [len(word) for word in text.split()]


def test_dataset_answers_laid_out_as_a_rollout_with_eos_equal_to_pad_and_truncation():
    from alignment.data.tokenized import collate_prompts
    from alignment.ppo.teacher.distill_sampler import dataset_rollout, on_policy

    items = [{"input_ids": [5, 6], "prompt": "p1", "answer": "aa bbb"},
             {"input_ids": [7], "prompt": "p2", "answer": "c dddd eeeee ffffff"}]
    rollout = dataset_rollout(items, 1, WordTokenizer(), lambda batch: collate_prompts(batch, 0), eos_id=0, budget=3)
    assert rollout.prompt_len == 2
    assert rollout.input_ids.numpy().tolist() == [[5, 6, 2, 3, 0], [0, 7, 1, 4, 5]]  # eos after "aa bbb"; cut at 3
    assert rollout.response_mask.numpy().tolist() == [[1, 1, 1], [1, 1, 1]]  # the eos (== pad) is trained
    assert rollout.attention_mask.numpy().tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert rollout.completions == ["aa bbb", "c dddd eeeee ffffff"] and rollout.labels["answer"][1].startswith("c")
    two = dataset_rollout(items[:1], 2, WordTokenizer(), lambda batch: collate_prompts(batch, 0), 0, budget=8)
    assert two.input_ids.numpy().tolist() == [[5, 6, 2, 3, 0]] * 2 and two.response_mask.numpy().sum() == 6
    with pytest.raises(ValueError, match="prompt row 0 .* has none"):
        dataset_rollout([{"input_ids": [1], "prompt": "q"}], 1, WordTokenizer(),
                        lambda batch: collate_prompts(batch, 0), 0, 4)
    draws = [on_policy(seed, 0.3) for seed in range(1000)]
    assert 250 < sum(draws) < 350 and draws == [on_policy(seed, 0.3) for seed in range(1000)]
    assert all(on_policy(seed, 1.0) for seed in range(10)) and not any(on_policy(seed, 0.0) for seed in range(10))
