"""benchmarks/bench_speculative_rl.py with tiny settings: one GRPO step per mode, each in its own process, on the
tiny model; a result is written through benchmarks/record.py with each mode's figures and their ratios to plain
decoding."""
import pytest

from tests.helpers import benchmark_result


@pytest.mark.slow  # two whole alignment-ppo runs in processes of their own
def test_a_tiny_run_writes_each_modes_step_and_its_ratio(tmp_path, tiny_model_dir):
    result = benchmark_result("bench_speculative_rl.py", ["--model", tiny_model_dir, "--tasks", "dialogue", "--modes",
                                                          "plain,draft", "--repeats", "1", "--new-tokens", "4",
                                                          "--group", "2"], tmp_path)
    assert result["benchmark"] == "speculative_rl" and result["machine"]["model"]
    plain, draft = result["rows"]
    assert [plain["mode"], draft["mode"]] == ["plain", "draft"] and plain["tokens_per_s_ratio"] == 1.0
    assert draft["tokens_per_s_ratio"] == pytest.approx(draft["tokens_per_s"] / plain["tokens_per_s"])
    assert draft["step_speedup"] == pytest.approx(plain["step_s"] / draft["step_s"])
    assert all(r["generated_tokens"] > 0 and r["step_s"] > r["generate_s"] > 0 for r in result["rows"])


def test_the_docs_table_renders_each_mode_with_its_ratios():
    from docsgen import results_tables

    rows = [{"task": "tool", "mode": "lookup", "generated_tokens": 346.0, "tokens_per_s": 62.1,
             "tokens_per_s_ratio": 0.591, "step_s": 8.61, "step_speedup": 0.752}]
    assert results_tables.TABLES["speculative_rl"].rows({"rows": rows}) == [
        ["tool", "lookup", "346", "62.1", "**0.59x**", "8.6", "**0.75x**"]]
