"""tools/plan_layout.py (alignment/planning/): parameter counts against the repo's own model, the sharding /
tensor-parallel arithmetic, layout errors, the 7B x 8 x 80 GB PPO recommendation and the CLI's exit codes. Pure
arithmetic, no downloads."""
import json
import os
import subprocess
import sys

import pytest

from alignment.commands import plan_layout
from alignment.config.choices import OFFLOAD_LEVELS
from alignment.parallel.layout import Layout
from alignment.planning import memory, search

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLAMA_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False}
SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
           "tie_word_embeddings": True}  # SmolLM2-135M-Instruct's config.json (tools/import_gguf.py)
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "tie_word_embeddings": False}


def write_config(tmp_path, config, name="model"):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("overrides", [{}, {"tie_word_embeddings": True}, {"attention_bias": True, "mlp_bias": True},
                                       {"model_type": "qwen2"}, {"model_type": "ernie4_5", "use_bias": True}],
                         ids=["untied", "tied", "biases", "qwen2", "ernie4_5-use_bias"])
def test_parameter_count_matches_the_repo_model(tmp_path, overrides):
    from alignment.models import LlamaConfig, LlamaForCausalLM

    config = {**TINY, **overrides}
    model = LlamaForCausalLM(LlamaConfig.from_dict(config))
    built = sum(int(p.numel()) for p in model.parameters())
    assert memory.model_params(memory.load_model(write_config(tmp_path, config)), "causal") == built


def test_score_model_count_is_backbone_plus_head(tmp_path):
    score_model = pytest.importorskip("alignment.models.score_model")
    model = score_model.ScoreModel(score_model.ScoreConfig.from_dict(TINY))
    built = sum(int(p.numel()) for p in model.parameters())
    m = memory.load_model(write_config(tmp_path, TINY))
    assert memory.model_params(m, "score") == built == memory.model_params(m, "causal") - TINY["vocab_size"] * 64 + 64


def test_7b_parameter_count():
    m = memory.Model(4096, 11008, 32, 32, 32, 128, 32000)
    assert memory.model_params(m, "causal") == 6_738_415_616  # LLaMA-7B as published (HF: 6.74B)


def test_pipeline_stages_hold_the_layers_and_a_tied_table_twice():
    m = memory.Model(64, 96, 4, 4, 2, 16, 100, tied=True)
    whole = memory.model_params(m)
    first = memory.model_params(m, layers=2, first=True, last=False)
    last = memory.model_params(m, layers=2, first=False, last=True)
    assert first + last == whole + 100 * 64  # the last stage keeps its own copy of the tied embedding
    assert memory.stage_params(m, "causal", 1, 2) == max(first, last)


def test_stage3_needs_less_memory_than_stage2_than_stage1():
    m = memory.Model(4096, 11008, 32, 32, 32, 128, 32000)
    sft = memory.Plan(stage="sft", dtype="fp32", seq=512, micro=4, recompute=True)
    peaks = {stage: memory.peak(memory.memory(m, Layout(8, 2, 1, 4, stage), sft))[1]
             for stage in ("stage1", "stage2", "stage3")}
    assert peaks["stage3"] < peaks["stage2"] < peaks["stage1"]
    ppo = memory.Plan(stage="ppo", seq=512, response=256, micro=4, rollout=4, recompute=True)
    copies = {stage: memory.memory(m, Layout(8, 2, 1, 4, stage), ppo)["components"]["whole_copies"]
              for stage in peaks}  # PPO generates from a whole copy of a stage-3 actor
    assert copies == {"stage1": 0, "stage2": 0, "stage3": memory.model_params(m) * 2}
    parts = {stage: memory.memory(m, Layout(8, 1, 1, 8, stage), sft)["components"] for stage in peaks}
    whole = memory.model_params(m)
    norms = 2 * 4096 * 32 + 4096  # the only tensors of 2**20 elements or fewer: stage 3 keeps them whole
    assert parts["stage1"]["adamw"] == parts["stage2"]["adamw"] == whole * 8 / 8  # all stages split AdamW
    assert parts["stage3"]["adamw"] == ((whole - norms) / 8 + norms) * 8
    assert parts["stage1"]["grads"] == whole * 4 and parts["stage2"]["grads"] == whole * 4 / 8
    assert parts["stage3"]["trained_weights"] == ((whole - norms) / 8 + norms) * 4
    # during backward: the 7 other ranks' gradient buffers (stage 2); the embedding and its gradient (stage 3)
    assert parts["stage2"]["gathered"] == 7 * 2**23 * 4 and parts["stage3"]["gathered"] == 2 * 32000 * 4096 * 4


def test_stage3_keeps_small_tensors_and_a_tied_table_whole():
    m = memory.Model(576, 1536, 30, 9, 3, 64, 49152, tied=True)  # SmolLM2-135M
    plan = memory.Plan(stage="sft", dtype="fp32", segment=2**16)
    sliced, kept, largest = memory.stage3_split(m, "causal", Layout(4, 1, 1, 4, "stage3"), plan)
    assert kept == 49152 * 576 + 61 * 576  # the tied table, 60 layer norms and the final norm
    assert sliced + kept == memory.model_params(m) and largest == 576 * 1536
    sliced, kept, _ = memory.stage3_split(m, "score", Layout(4, 1, 1, 4, "stage3"), plan)
    assert kept == 61 * 576 + 576  # a score model's embedding is sliced (its head is hidden x 1)
    assert memory.stage3_split(m, "causal", Layout(4, 1, 1, 4, "stage3"), plan._replace(segment=2**20))[0] == 0


def test_model_tensors_add_up_to_the_parameter_counts():
    m = memory.Model(64, 96, 4, 4, 2, 16, 100, tied=True, qkv_bias=True)
    for kind in ("causal", "score"):
        assert sum(memory.model_tensors(m, kind, 2)) == memory.model_params(m, kind, 2)
        assert len(memory.model_tensors(m, kind)) == 4 * (2 + 7 + 3) + 1 + (kind == "score") + 1


def test_stage2_and_3_with_pipelines_are_not_recommended():
    plan = memory.Plan(stage="sft")
    assert not search.runnable(Layout(8, 1, 2, 4, "stage2"), plan, allow_unbuilt=False)
    assert search.runnable(Layout(8, 1, 2, 4, "stage2"), plan, allow_unbuilt=True)
    assert search.runnable(Layout(8, 2, 1, 4, "stage3"), plan, allow_unbuilt=False)
    assert search.runnable(Layout(8, 1, 2, 4, "stage1"), plan, allow_unbuilt=False)


def test_tensor_parallel_halves_the_split_weights():
    m = memory.Model(4096, 11008, 32, 32, 8, 128, 32000)
    replicated = 2 * m.hidden * m.layers + m.hidden  # RMSNorm weights stay whole on every rank
    one, two = memory.model_params(m, tp=1), memory.model_params(m, tp=2)
    assert two - replicated == (one - replicated) / 2
    plan = memory.Plan(stage="sft")
    w1 = memory.memory(m, Layout(2, 1, 1, 1, ""), plan)["components"]
    w2 = memory.memory(m, Layout(2, 2, 1, 1, ""), plan)["components"]
    for key in ("trained_weights", "grads", "adamw"):
        assert w2[key] == pytest.approx(w1[key] / 2, rel=1e-4)


def test_kv_cache_formula():
    m = memory.Model(4096, 11008, 32, 32, 8, 128, 32000)
    plan = memory.Plan(stage="ppo", seq=1024, rollout=4, dtype="bf16")
    kv = memory.memory(m, Layout(2, 2, 1, 1, ""), plan)["components"]["kv_cache"]
    assert kv == 2 * 32 * 8 * 128 * 1024 * 4 * 2 / 2


def test_recompute_and_offload_lower_the_peak():
    m = memory.Model(4096, 11008, 32, 32, 32, 128, 32000)
    lay, plan = Layout(8, 2, 1, 4, "stage1"), memory.Plan(stage="ppo", seq=512, micro=16, rollout=16)
    bare = memory.peak(memory.memory(m, lay, plan))[1]
    rc = memory.peak(memory.memory(m, lay, plan._replace(recompute=True)))[1]
    off = memory.peak(memory.memory(m, lay, plan._replace(recompute=True, offload=frozenset(OFFLOAD_LEVELS))))[1]
    assert off < rc < bare
    cpu = plan._replace(recompute=True, offload=frozenset(OFFLOAD_LEVELS), device="cpu", dtype="fp32")
    assert memory.memory(m, lay, cpu)["phases"] == memory.memory(m, lay, cpu._replace(offload=frozenset()))["phases"]


def test_no_layout_gives_a_clear_error(tmp_path):
    path = write_config(tmp_path, SMOLLM2)
    with pytest.raises(memory.PlanError, match=r"tensor degree must divide 8 and heads 9.*possible: \[1\]"):
        plan_layout.run(["--model", path, "--gpus", "8", "--gpu-memory-gib", "80", "--tp", "8"])
    with pytest.raises(memory.PlanError, match="no layout of 6 GPUs"):
        search.layouts(memory.load_model(path), 6, pipeline=True, fixed={"tp": 4})
    with pytest.raises(memory.PlanError, match="--gpus must be >= 1"):
        search.layouts(memory.load_model(path), 0, pipeline=True)


def test_every_layout_multiplies_to_the_world(tmp_path):
    m = memory.load_model(write_config(tmp_path, LLAMA_7B))
    lays = search.layouts(m, 16, pipeline=True)
    assert all(lay.tensor * lay.pipeline * lay.sharding * lay.data == 16 for lay in lays)
    assert {lay.tensor for lay in lays} == {1, 2, 4, 8, 16} and all(lay.stage or lay.sharding == 1 for lay in lays)
    assert {lay.pipeline for lay in search.layouts(m, 16, pipeline=False)} == {1}
    assert {lay.pipeline for lay in lays} == {1, 2, 4, 8, 16}


def test_7b_on_8x80gb_ppo_recommends_a_layout_that_fits(tmp_path, capsys):
    path = write_config(tmp_path, LLAMA_7B)
    result = plan_layout.run(["--model", path, "--gpus", "8", "--gpu-memory-gib", "80", "--seq-len", "512",
                     "--micro-batch", "16", "--rollout-batch", "16"])
    out = capsys.readouterr().out
    best = result["recommended"]
    assert best is not None and best["peak_gib"] <= result["capacity_gib"] and best["headroom_gib"] > 0
    assert f"recommended: {best['name']}" in out and "offload effect" in out and "layout (GiB per GPU)" in out
    # one model copy per GPU: sharding stage2 (gradients split too) with recompute and two offload levels fits, so
    # no tensor parallelism is needed; PaddleNLP's published llm/config/llama/ppo_argument.json for 7B, tensor
    # parallel 2 x sharding stage1 4, fits too (the next model-parallel degree)
    assert (best["tp"], best["pp"], best["sd"], best["stage"]) == (1, 1, 8, "stage2")
    assert best["settings"] == "recompute full, offload freeze_model optimizer"
    paddlenlp = next(lay for lay in result["layouts"] if lay["name"] == "tp2 pp1 sd4(stage1) dp1")
    assert max(paddlenlp["phases"].values()) <= result["capacity_gib"]
    plan_layout.run(["--model", path, "--gpus", "8", "--gpu-memory-gib", "80", "--json"])
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["recommended"]["peak_gib"] <= parsed["capacity_gib"] and len(parsed["layouts"]) > 10


def test_nothing_fits_exits_1(tmp_path):
    path = write_config(tmp_path, LLAMA_7B)
    assert plan_layout.main(["--model", path, "--gpus", "1", "--gpu-memory-gib", "16", "--top", "1"]) == 1


def test_cpu_prediction_is_within_25_percent_of_the_readme_ppo_measurement(tmp_path):
    """README (bench_lora_memory.py): SmolLM2 PPO, 8 prompts of up to 53 tokens + 32 new, peak RSS 7.35 GiB full
    fine-tuning, 4.00 GiB with LoRA r=8; uses the Paddle runtime RSS measured here."""
    path = write_config(tmp_path, SMOLLM2)
    args = ["--model", path, "--gpus", "1", "--gpu-memory-gib", "20", "--device", "cpu", "--seq-len", "85",
            "--response-len", "32", "--micro-batch", "8", "--rollout-batch", "8", "--runtime-gib",
            str(plan_layout.measure_runtime_gib())]
    for extra, measured in (([], 7.35), (["--lora-rank", "8"], 4.00)):
        predicted = plan_layout.run(args + extra + ["--json"])["recommended"]["peak_gib"]
        assert abs(predicted - measured) / measured < 0.25, (extra, predicted, measured)


def test_cli_exits_2_on_a_missing_config(tmp_path):
    done = subprocess.run([sys.executable, os.path.join(REPO, "tools", "plan_layout.py"), "--model",
                           str(tmp_path / "nowhere"), "--gpus", "8", "--gpu-memory-gib", "80"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no model config found" in done.stderr and "nowhere" in done.stderr


def test_divisors_are_the_brute_force_ones_for_large_counts_too():
    from alignment.planning.search import divisors

    for n in (1, 2, 12, 36, 97, 720720, 2 ** 20):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert divisors(10 ** 12)[:5] == [1, 2, 4, 5, 8] and len(divisors(10 ** 12)) == 169  # (12 + 1) ** 2


def test_the_planner_matches_the_measured_sharding_memory():
    """benchmarks/bench_sharding_memory.py (newest results file): every stage's peak RSS per rank on 4 processes
    within 10% of the planner's prediction for the same layout, and stage 3's weights a quarter of stage 0's."""
    import glob
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_sharding_memory",
                                                  os.path.join(REPO, "benchmarks", "bench_sharding_memory.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    newest = sorted(glob.glob(os.path.join(REPO, "benchmarks", "results", "sharding_memory_*.json")))[-1]
    result = json.load(open(newest))
    assert [row["stage"] for row in result["rows"]] == ["", "stage1", "stage2", "stage3"]
    for row in result["rows"]:
        predicted = bench.predict(result["model"], row["stage"], result["runtime_gib"])["train_total"]
        assert abs(predicted - max(row["peak_rss"])) / max(row["peak_rss"]) < 0.10, (row["stage"], predicted)
    none, stage3 = result["rows"][0], result["rows"][-1]
    assert max(stage3["weights"]) / max(none["weights"]) == pytest.approx(0.25, abs=0.01)
    above_runtime = [max(row["peak_rss"]) - result["runtime_gib"] for row in (none, stage3)]
    assert above_runtime[1] < 0.35 * above_runtime[0]  # what training holds beyond the runtime: about a quarter
