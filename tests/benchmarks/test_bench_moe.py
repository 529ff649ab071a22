"""benchmarks/bench_moe.py with tiny settings: each model runs in its own process, the MoE has the parameters of
the wide dense model and more than the narrow one, the ratios are the figures' own, a result is written through
benchmarks/record.py and the docs' table renders it."""
import pytest

from docsgen import results_tables
from tests.helpers import benchmark_result


def test_a_tiny_run_writes_a_result_the_docs_table_renders(tmp_path):
    result = benchmark_result("bench_moe.py", ["--batch", "2", "--seq", "16", "--steps", "1", "--new-tokens", "4"],
                              tmp_path)
    assert result["benchmark"] == "moe" and result["machine"]["model"]
    models, ratios = result["models"], result["ratios"]
    assert models["moe"]["parameters_m"] == pytest.approx(models["dense_same_parameters"]["parameters_m"], rel=0.01)
    assert models["moe"]["parameters_m"] > 1.5 * models["dense_same_compute"]["parameters_m"]
    for dense, ratio in ratios.items():
        assert ratio["step_time"] == pytest.approx(models["moe"]["step_s"] / models[dense]["step_s"])
        assert all(m["peak_rss_mib"] > 100 and m["decode_tokens_per_s"] > 0 for m in models.values())
    table = results_tables.TABLES["moe"]
    cells = table.rows(result)
    assert len(cells) == 2 and all(len(c) == len(table.header) for c in cells)
