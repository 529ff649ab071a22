"""Rows of the serving memory table (docsgen/results_tables.py): each figure a field of a result file of
benchmarks/bench_multi_lora_serve.py."""
from __future__ import annotations

from typing import List


def multi_lora_serve(r: dict) -> List[List[str]]:
    """Per model: the adapters, peak RSS MiB of the base alone, of one server with every adapter and of one server
    per adapter summed, the ratio, and whether the adapters' greedy answers agreed."""
    return [[x["model"], f"{x['adapters']} x rank {x['rank']}", *(f"{x[k]:.0f}" for k in (
        "base_alone_mib", "shared_server_mib", "single_servers_total_mib")),
             f"**{x['shared_over_singles']:.2f}x**", "yes" if x["same_answers"] else "no"] for x in r["rows"]]
