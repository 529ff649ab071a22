"""Process reward models: the step-labelled row formats, the reward tokens, a tiny PRM that learns a step signal
(held-out step accuracy up), PaddleNLP's prm_flashmask_argument.json, and a PRM scoring GRPO responses."""
import json
import os

import numpy as np
import pytest

from alignment.data.builtin import RowError
from alignment.data.process_rewards import ProcessRewardRows, math_shepherd_steps
from alignment.models import Tokenizer
from alignment.rewards.process import step_ids, step_tokens
from alignment.rm import run_reward
from tests.helpers import REPO, read_metrics


def test_math_shepherd_rows_become_steps_and_labels():
    text = "Q: 2+3*4? Step 1: 3*4=12 ки\nStep 2: 2+12=15 ки\nStep 3: so 15 ки"
    label = "Q: 2+3*4? Step 1: 3*4=12 +\nStep 2: 2+12=15 -\nStep 3: so 15 -"
    steps, labels = math_shepherd_steps(text, label)
    assert steps == ["Q: 2+3*4? Step 1: 3*4=12 ", "\nStep 2: 2+12=15 ", "\nStep 3: so 15 "]
    assert labels == [True, False, False]
    with pytest.raises(RowError, match="a step label must be"):
        math_shepherd_steps("a ки b ки", "a + b x")
    with pytest.raises(RowError, match="no 'ки'"):
        math_shepherd_steps("no steps here", "no steps here")
    rows = ProcessRewardRows.__new__(ProcessRewardRows)
    sample = rows.convert_row({"prompt": "Q", "steps": ["a", "b"], "labels": [1, "-"]})
    assert (sample["input"], sample["steps"], sample["step_labels"]) == ("Q", ["a", "b"], [True, False])
    with pytest.raises(RowError, match="one label per step"):
        rows.convert_row({"prompt": "Q", "steps": ["a", "b"], "labels": [1]})


def test_reward_tokens_must_be_two_single_tokens(tiny_model_dir):
    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    tokens = step_tokens(tokenizer, "ки", "+,-")
    assert tokens.good != tokens.bad and tokens.placeholder
    ids, positions = step_ids(tokenizer, "Q", ["one", "two"], tokens, 256)
    assert [ids[p - len(tokens.placeholder) + 1: p + 1] for p in positions] == [tokens.placeholder] * 2
    short, kept = step_ids(tokenizer, "Q", ["one", "two"], tokens, positions[0] + 2)
    assert kept == positions[:1] and len(short) == positions[0] + 1  # the second step does not fit
    for bad in ("+", "+,+", "plus and more,-"):
        with pytest.raises(ValueError, match="key 'reward_tokens'"):
            step_tokens(tokenizer, "ки", bad)


def write_steps(path, count, seed):
    """Solutions whose wrong steps say 'wrong' and right ones 'fine': a signal a tiny model learns quickly."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(count):
            labels = [bool(v) for v in rng.integers(0, 2, 3)]
            steps = [f"Step {i + 1}: this is {'fine' if ok else 'wrong'}." for i, ok in enumerate(labels)]
            f.write(json.dumps({"prompt": "Check the steps.", "steps": steps, "labels": labels}) + "\n")


@pytest.fixture(scope="module")
def trained_prm(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("prm")
    write_steps(folder / "train.jsonl", 64, 0)
    write_steps(folder / "eval.jsonl", 16, 1)
    out = folder / "run"
    results = run_reward.main([
        os.path.join(REPO, "tests", "fixtures", "paddlenlp", "prm_flashmask_argument.json"),
        "--model_name_or_path", tiny_model_dir, "--train_dataset_path", f"process-reward:1.0:{folder}/train.jsonl",
        "--dev_dataset_path", f"process-reward:1.0:{folder}/eval.jsonl", "--output_dir", str(out),
        "--tensor_parallel_degree", "1", "--sharding", "", "--max_steps", "30", "--learning_rate", "3e-3",
        "--gradient_accumulation_steps", "1", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size",
        "8", "--warmup_steps", "0", "--bf16", "false", "--eval_steps", "30", "--max_seq_len", "256"])
    return out, results


def test_paddlenlps_prm_file_trains_a_process_reward_model(trained_prm):
    out, results = trained_prm
    assert results["start_eval/step_accuracy"] < 0.8 <= results["eval/step_accuracy"]
    assert results["eval/loss"] < results["start_eval/loss"]
    settings = json.load(open(out / "model" / "process_reward.json"))
    assert settings == {"placeholder_token": "ки", "reward_tokens": "+,-"}
    args = json.load(open(out / "args.json"))
    assert args["process_reward"] is True
    assert all("step_accuracy" in row for row in read_metrics(out) if "loss" in row and "eval/loss" not in row)


def test_a_prm_scores_grpo_responses_step_by_step(trained_prm, tiny_model_dir, tmp_path):
    from alignment.models import LlamaForCausalLM
    from alignment.ppo import run_ppo
    from alignment.rewards.process import ProcessRewardScorer

    prm = str(trained_prm[0] / "model")
    scorer = ProcessRewardScorer(LlamaForCausalLM.from_pretrained(prm), Tokenizer.from_pretrained(prm), prm)
    scores = scorer.end_scores(["Check the steps."] * 3, ["Step 1: this is fine.\nStep 2: this is fine.",
                                                           "Step 1: this is fine.\nStep 2: this is wrong.", ""])
    assert scores[0] > 0.5 > scores[1] and scores[2] == 0.5  # no step: 0.5
    # the lowest step decides: each step's p(good) from the PRM's logits at its placeholder, by hand
    import paddle

    from alignment.rewards.process import step_logits

    steps = ["Step 1: this is fine.", "Step 2: this is wrong.", "Step 3: this is fine."]
    ids, positions = step_ids(scorer.tokenizer, "Check the steps.", steps, scorer.tokens, 4096)
    logits = step_logits(scorer.model, paddle.to_tensor([ids]), paddle.ones([1, len(ids)], dtype="int64"),
                         paddle.to_tensor([[0, p] for p in positions]), scorer.tokens).numpy().astype("float64")
    good = 1 / (1 + np.exp(logits[:, 1] - logits[:, 0]))  # softmax over (good, bad)
    (score,) = scorer.end_scores(["Check the steps."], ["\n".join(steps)])
    assert score == pytest.approx(good.min(), rel=1e-4) and abs(score - good.mean()) > 0.1
    run_ppo.main([os.path.join(REPO, "config", "tiny", "grpo_argument.json"), "--actor_model_name_or_path",
                  tiny_model_dir, "--reward_model_name_or_path", prm, "--reward_funcs", "", "--gold_judge", "",
                  "--output_dir", str(tmp_path / "grpo"), "--max_steps", "1", "--eval_datasets", "",
                  "--disable_tqdm", "--per_device_prompt_batch_size", "2", "--max_new_tokens", "8"])
    row = read_metrics(tmp_path / "grpo")[0]
    assert 0.0 <= row["reward/model"] <= 1.0
