"""benchmarks/bench_gateway.py on the tiny model with tiny settings: the calls through the gateway sample the engine
alone's tokens (and a call that samples others stops the run), the figures are computed from the measured times,
the result file has record.py's header, and the docs' table renders it."""
import json
import statistics

import pytest

from benchmarks import bench_gateway
from docsgen import results_tables


def test_a_tiny_run_measures_both_sides_on_the_same_tokens_and_the_docs_table_renders_it(tiny_model_dir, tmp_path):
    figures = bench_gateway.main(["--model", tiny_model_dir, "--sessions", "2", "--single-calls", "2",
                                  "--max-tokens", "4", "--max-length", "128", "--repeats", "2",
                                  "--results-dir", str(tmp_path)])
    path, = tmp_path.glob("gateway_*.json")
    result = json.loads(path.read_text())
    assert result["benchmark"] == "gateway" and result["machine"]["model"] and result["commit"]
    times, one, many = result["times"], result["single_call"], result["concurrent"]
    assert result["same_tokens"] and times["single_new_tokens"] == [4, 4] and times["concurrent_new_tokens"] == 8
    for side in ("engine", "gateway"):
        assert [len(t) for t in times[f"{side}_single_s"]] == [2, 2] and len(times[f"{side}_concurrent_s"]) == 2
        assert all(s > 0 for t in times[f"{side}_single_s"] + [times[f"{side}_concurrent_s"]] for s in t)
    # the overhead and the ratio: medians over the pairs of blocks that ran one after the other
    pairs = [pair for g, e in zip(times["gateway_single_s"], times["engine_single_s"]) for pair in zip(g, e)]
    assert one["overhead_ms"] == pytest.approx(1000 * statistics.median(g - e for g, e in pairs))
    assert one["overhead_share"] == pytest.approx(statistics.median((g - e) / g for g, e in pairs))
    assert one["engine_ms"] == pytest.approx(1000 * statistics.median(e for _, e in pairs))
    assert one["gateway_ms"] == pytest.approx(1000 * statistics.median(g for g, _ in pairs))
    engine_s, gateway_s = times["engine_concurrent_s"], times["gateway_concurrent_s"]
    assert many["engine_tokens_per_s"] == pytest.approx(8 / statistics.median(engine_s))
    assert many["gateway_tokens_per_s"] == pytest.approx(8 / statistics.median(gateway_s))
    assert many["gateway_over_engine"] == pytest.approx(statistics.median(e / g for e, g in zip(engine_s, gateway_s)))
    assert figures["concurrent"] == many
    # the time to the first content delta: per single call and repeat, per concurrent block the sessions' median
    firsts = times["gateway_single_first_token_s"]
    assert len(firsts) == 2 and all(len(f) <= 2 for f in firsts)
    assert len(times["gateway_concurrent_first_token_s"]) <= 2
    singles = [t for f in firsts for t in f]
    assert one["first_token_ms"] == (pytest.approx(1000 * statistics.median(singles)) if singles else None)
    assert all(0 < t <= g for f, gs in zip(firsts, times["gateway_single_s"]) for t, g in zip(f, gs))
    table = results_tables.TABLES["gateway"]
    cells, = table.rows(result)
    assert len(cells) == len(table.header) and cells[0] == result["model"] and cells[5] == "2"


def test_a_gateway_call_that_samples_other_tokens_than_the_engine_stops_the_run():
    alone = type("Alone", (), {"prompts": [(1, 2, 3)]})()
    choice = type("Choice", (), {"tokens": (7, 8), "message": type("Message", (), {"content": "ab"})()})()
    answer = {"content": "ab", "completion_tokens": 2}
    bench_gateway.check_gateway(alone, [0], [(7, 8)], [answer], {(1, 2, 3): choice})
    with pytest.raises(AssertionError, match="the gateway sampled"):
        bench_gateway.check_gateway(alone, [0], [(7, 9)], [answer], {(1, 2, 3): choice})
    with pytest.raises(AssertionError, match="streamed"):
        bench_gateway.check_gateway(alone, [0], [(7, 8)], [{**answer, "content": "a"}], {(1, 2, 3): choice})
