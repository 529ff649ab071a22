"""Markdown tables of the benchmark results kept in benchmarks/results/ (benchmarks/record.py): one table per
benchmark, a row per CPU model (its latest run), each row with the CPU, date, commit and result file. Nothing here
is typed by hand: a figure in the docs is a field of a result file."""
from __future__ import annotations

import json
import os
import re
from typing import Callable, Dict, List, Optional

from benchmarks import record
from docsgen.demo_rows import curriculum_chain_sum, distill_chain_sum, grpo_reasoning, main_demo_seeds
from docsgen.serving_rows import multi_lora_serve

COMMIT_NOTE = ("A commit marked * is the one that added the file: the run predates recorded commits, and measured "
               "that commit's code or its parent's.")


def _table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _file(run: record.Run) -> str:
    return f"`{run.json_name}`"


def _x(value: float) -> str:
    return f"{value:.2f}x"


def rl_smollm2_ratio(r: dict, algo: str) -> Optional[float]:
    """Our step time over TRL's for `algo` in a bench_rl_smollm2 run; None where the run did not time both."""
    run = r.get("runs", {}).get(algo)
    if not run or not run.get("trl"):
        return None
    return run["ours"]["step_s_median"] / run["trl"]["step_s_median"]


def smollm2_ratio(r: dict, workload: str) -> Optional[float]:
    """Ours over transformers' tokens/s for `workload` in a bench_smollm2 run; None where it has no such row."""
    row = next((x for x in r.get("rows", []) if x.get("workload") == workload and "ratio" in x), None)
    return None if row is None else row["ratio"]


def _rl_smollm2(r: dict) -> List[List[str]]:
    rows = []
    for algo in ("grpo", "ppo"):
        ratio = rl_smollm2_ratio(r, algo)
        if ratio is None:
            continue
        run = r["runs"][algo]
        ours, trl = run["ours"], run["trl"]
        rows.append([algo.upper(),
                     f"{ours['step_s_median']:.2f} ({ours['generate_s_median']:.2f} / {ours['score_s_median']:.2f}"
                     f" / {ours['train_s_median']:.2f})",
                     f"{trl['step_s_median']:.2f} ({trl['generate_s_median']:.2f} / {trl['score_s_median']:.2f}"
                     f" / {trl['train_s_median']:.2f})",
                     f"**{_x(ratio)}**",
                     f"{ours['peak_rss_gib']:.2f} / {trl['peak_rss_gib']:.2f}"])
    return rows


def peer_line(algo: str, machine: Optional[dict]) -> Optional[dict]:
    """The TRL peer's latest line for the small-shape step (trl_peer_results.jsonl) measured on the CPU of
    `machine` (a run's record.Run.machine): its session names the same family and model numbers."""
    machine = machine or {}
    cpu = f"family {machine.get('family')} model {machine.get('model_number')}"
    path = os.path.join(record.RESULTS, "trl_peer_results.jsonl")
    found = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            session = row.get("session", "")
            if row.get("run", "").split("[")[0] == algo and re.search(re.escape(cpu) + r"\b", session):
                found = row
    return found


def small_shape_ratio(r: dict, machine: Optional[dict]) -> Optional[float]:
    """Our step time over the TRL peer's on the CPU of `machine` in a bench_rl_step run; None without a peer line."""
    peer = peer_line(r["result"]["algo"], machine)
    return None if peer is None else r["result"]["sec_per_step_median"] / peer["median_step_s_excl_first"]


def _rl_step(r: dict) -> List[List[str]]:
    result = r["result"]
    machine = r.get("machine") or result.get("machine")
    peer, ratio = peer_line(result["algo"], machine), small_shape_ratio(r, machine)
    return [[result["algo"].upper(),
             f"{result['sec_per_step_median']:.3f} ({result['generate_s_median']:.3f} / "
             f"{result['score_s_median']:.3f} / {result['train_s_median']:.3f})",
             f"{peer['median_step_s_excl_first']:.3f}" if peer else "-", f"**{_x(ratio)}**" if peer else "-",
             f"{100 * result['update_fraction_of_peak']:.0f}%"]]


def _smollm2(r: dict) -> List[List[str]]:
    return [[row["workload"], f"{row['ours (Paddle)']['tokens_per_s']:.1f}",
             f"{row['transformers (torch)']['tokens_per_s']:.1f}", f"**{_x(row['ratio'])}**",
             _x(row["kernels_ratio"]) if "kernels_ratio" in row else "-"]
            for row in r["rows"] if row.get("transformers (torch)")]


def _cpu_ops(r: dict) -> List[List[str]]:
    return [[x["operation"], x["shape"], f"{x['paddle_ms']:.2f}", f"{x['torch_ms']:.2f}",
             f"**{_x(x['paddle_over_torch'])}**", f"{x['kernel_ms']:.2f}" if "kernel_ms" in x else "-",
             f"**{_x(x['kernel_ms'] / x['torch_ms'])}**" if "kernel_ms" in x else "-"]
            for x in r["rows"] if "torch_ms" in x]


def _machine_limits(r: dict) -> List[List[str]]:
    bandwidth = max(max(side.values()) for side in r["bandwidth_gb_s"].values())
    ceiling = r.get("ceiling", {})
    return [[f"{r['gemm_peak_gflops']:.0f}", f"{bandwidth:.1f}",
             f"{r['train_gflops']:.0f} = **{r['train_of_peak']:.0%}**",
             f"{ceiling['train_gemms_of_peak']:.0%}" if "train_gemms_of_peak" in ceiling else "-",
             f"{r['score_gflops']:.0f} = **{r['score_of_peak']:.0%}**",
             f"{ceiling['score_gemms_of_peak']:.0%}, {ceiling['score_gemms_of_score']:.0%} of its time"
             if "score_gemms_of_score" in ceiling else "-",
             f"{r['decode_steps_tokens_s']:.1f} = **{r['decode_steps_of_bound']:.0%}** of "
             f"{r['decode_bound_tokens_s']:.0f}",
             f"{ceiling['decode_gemms_of_bound']:.0%}" if "decode_gemms_of_bound" in ceiling else "-"]]


def _decode_only(r: dict) -> List[List[str]]:
    fused, layers = r["generate"]["fused"], r["generate"]["layers"]
    return [[f"{fused['decode_steps_tokens_s']:.1f} = {fused['decode_steps_of_bound']:.0%}",
             f"{layers['decode_steps_tokens_s']:.1f} = {layers['decode_steps_of_bound']:.0%}",
             f"{r['ceiling']['decode_gemms_tokens_s']:.1f} = {r['ceiling']['decode_gemms_of_bound']:.0%}",
             f"{r['decode_bound_tokens_s']:.0f}"]]


def _cpu_settings(r: dict) -> List[List[str]]:
    base = r["results"]["chosen for this CPU"]
    decode = base.get("decode_gemm_gflops")  # recorded since the MKL path is chosen by measurement

    def decode_cells(x: dict) -> List[str]:
        return ([f"{x['decode_gemm_gflops']:.0f}", _x(x["decode_gemm_gflops"] / decode)] if decode
                else ["-", "-"])

    def rollout_cells(x: dict) -> List[str]:  # recorded since the OpenMP block time is chosen by it
        rollout = base.get("generate_tokens_per_s")
        return ([f"{x['generate_tokens_per_s']:.0f}", _x(x["generate_tokens_per_s"] / rollout)] if rollout
                else ["-", "-"])

    return [[name, f"{x['gemm_gflops']:.0f}", _x(x["gemm_gflops"] / base["gemm_gflops"]), *decode_cells(x),
             f"{x['train_tokens_per_s']:.0f}", _x(x["train_tokens_per_s"] / base["train_tokens_per_s"]),
             f"{100 * x['spread']:.1f}%", *rollout_cells(x)] for name, x in r["results"].items()]


def _rollout(r: dict) -> List[List[str]]:
    return [[str(x["prompt"]), str(x["batch"]), f"{x['kv_tokens_per_s']:.0f}", f"{x['static_tokens_per_s']:.0f}",
             f"{x['none_tokens_per_s']:.0f}", f"{x['kv_over_none']:.1f}x", _x(x["static_over_kv"]),
             str(x["same_tokens"])] for x in r["rows"]]


def _speculative(r: dict) -> List[List[str]]:
    return [[x["task"], str(x["batch"]), str(x["new_tokens"]), f"{x['plain_tokens_per_s']:.1f}",
             f"{x['lookup_tokens_per_s']:.1f}", f"**{_x(x['speedup'])}**", f"{x['accepted_per_verify']:.2f}",
             f"{100 * x['draft_acceptance']:.0f}%", str(x["same_tokens"])] for x in r["rows"]]


def _speculative_rl(r: dict) -> List[List[str]]:
    return [[x["task"], x["mode"], f"{x['generated_tokens']:.0f}", f"{x['tokens_per_s']:.1f}",
             f"**{_x(x['tokens_per_s_ratio'])}**", f"{x['step_s']:.1f}", f"**{_x(x['step_speedup'])}**"]
            for x in r["rows"]]


def _engine_width(r: dict) -> List[List[str]]:
    return [[r["model"], str(x["slots"]), str(x["prompt"]), str(x["new_tokens"]), str(x["capacity"]),
             str(x["ladder_width"]), f"{x['ladder_tokens_per_s']:.0f}", f"{x['fixed_tokens_per_s']:.0f}",
             f"**{_x(x['speedup'])}**", str(x["same_bits"]),
             _x(x["engine_over_concatenated"]) if "engine_over_concatenated" in x else "-"] for x in r["rows"]]


def _moe(r: dict) -> List[List[str]]:
    moe, rows = r["models"]["moe"], []
    for dense in ("dense_same_compute", "dense_same_parameters"):
        d, ratio = r["models"][dense], r["ratios"][dense]
        rows.append([dense.replace("_", " "), f"{moe['parameters_m']:.2f} / {d['parameters_m']:.2f}",
                     f"{moe['step_s']:.3f} / {d['step_s']:.3f}", f"**{_x(ratio['step_time'])}**",
                     f"{moe['peak_rss_mib']:.0f} / {d['peak_rss_mib']:.0f}", _x(ratio["peak_rss"]),
                     f"{moe['decode_tokens_per_s']:.0f} / {d['decode_tokens_per_s']:.0f}",
                     _x(ratio["decode_tokens_per_s"])])
    return rows


def _predict(r: dict) -> List[List[str]]:
    return [[r["model"], f"{r['exported_tokens_per_s']:.1f}", f"{r['dynamic_tokens_per_s']:.1f}",
             f"**{_x(r['ratio'])}**", str(r["same_tokens"])]]


def _async(r: dict) -> List[List[str]]:
    return [[name, f"{x['median_step_s']:.3f}", _x(x["step_time_vs_sync"]), f"{x['trained_tokens_per_s']:.0f}",
             f"{x['generate_wait_s']:.3f}", f"{x['score_s']:.2f}"] for name, x in r["runs"].items()]


def _reward_server(r: dict) -> List[List[str]]:
    rows = {}
    for x in r["load"]:
        rows.setdefault((x["model"], x["batching"]), []).append(x)
    return [[model, batching, " / ".join(f"{x['requests_per_s']:.1f}" for x in xs),
             " / ".join(f"{x['p50_ms']:.1f}" for x in xs), " / ".join(f"{x['p99_ms']:.1f}" for x in xs)]
            for (model, batching), xs in rows.items()]


def _lora_memory(r: dict) -> List[List[str]]:
    return [[name, f"{x['peak_rss_gb']:.2f}", f"{x['time_generate_s']:.1f} / {x['time_score_s']:.1f} / "
             f"{x['time_train_s']:.1f}"] for name, x in r["runs"].items()]


def _peak_memory(r: dict) -> List[List[str]]:
    def limit(x: dict) -> str:
        if "smallest_address_space_mib" not in x:
            return "not measured"
        mib = x["smallest_address_space_mib"]
        return "none up to 65536" if mib is None else f"{mib} (`ulimit -v {mib << 10}`)"

    return [[x["entry_point"], r["model_name"], f"**{x['peak_rss_mib']:.0f}**", limit(x)] for x in r["rows"]]


def _update_padding(r: dict) -> List[List[str]]:
    base = next(iter(r["ways"].values()))["sec"]
    return [[name, f"{x['sec']:.3f}", f"{x['padding']:.0%}", _x(base / x["sec"])] for name, x in r["ways"].items()]


def _tool_demo(r: dict) -> List[List[str]]:
    def time(x, stage):
        wall, cpu = x[f"{stage}_wall_s"], x[f"{stage}_cpu_s"]
        return "-" if wall is None else f"{wall / 60:.1f} / {cpu / 60:.1f}"

    same = r.get("same_trajectories")
    return [[x["arm"], f"{x['accuracy_after_sft']:.2f}", f"**{x['accuracy_after_grpo']:.2f}**",
             "-" if x["tool_calls_after"] is None else f"{x['tool_calls_after']:.2f}", time(x, "sft"), time(x, "grpo"),
             f"{same['same']} of {same['samples']}" if same and x["run"] in same["runs"] else "-"]
            for x in r["arms"]]


def _episode_overlap(r: dict) -> List[List[str]]:
    return [[name, f"{x['seconds']:.2f}", f"{x['growth_over_episode_waits']:.2f}", str(x["same_bits_as_no_waits"])]
            for name, x in r["variants"].items()]


def _distill_demo(r: dict) -> List[List[str]]:
    rows = [["teacher (the tool demo's recipe)", "-", f"{r['teacher_accuracy']:.2f}", "-", "-"],
            ["student (common start of the arms)", "-", f"{r['student_accuracy']:.2f}", "-",
             f"{r['student_cpu_minutes']:.1f}"]]
    for name, arm in r["arms"].items():
        first, last = arm["points"][0], arm["points"][-1]
        rows.append([f"arm {name}", f"{first['accuracy']:.2f}", f"**{last['accuracy']:.2f}**",
                     f"{arm['wall_minutes']:.1f}", f"{last['cpu_minutes']:.1f}"])
    return rows


def _sharding_memory(r: dict) -> List[List[str]]:
    out = []
    for x in r["rows"]:
        peak, predicted = max(x["peak_rss"]), x["predicted"]["train_total"]
        out.append([x["stage"] or "none", f"{peak:.2f} (ranks: {', '.join(f'{v:.2f}' for v in x['peak_rss'])})",
                    f"{predicted:.2f}", f"{(predicted - peak) / peak:+.0%}", f"{max(x['weights']):.3f}",
                    f"{max(x['adamw']):.3f}", f"{x['predicted']['trained_weights']:.3f}"])
    return out


def _sandbox(r: dict) -> List[List[str]]:
    ms = {name: f"{x['median_ms']:.1f} / {x['p90_ms']:.1f}" for name, x in r["stats"].items()}
    return [[ms["bare"], ms["before"], ms["audit-hook"], ms["full"], f"**{_x(r['full_over_before'])}**",
             _x(r["full_over_audit_hook"]), f"{r['concurrent_calls_per_s']:.1f} / {r['serial_calls_per_s']:.1f}",
             r.get("kernel", "-")]]


def _eval_harness(r: dict) -> List[List[str]]:
    return [[r["model"], f"{r['items']} x {r['n']}", f"{r['harness_samples_per_s']:.2f}",
             f"{r['generate_samples_per_s']:.2f}", f"**{_x(r['harness_over_generate'])}**"]]


def _gateway(r: dict) -> List[List[str]]:
    one, many = r["single_call"], r["concurrent"]
    return [[r["model"], f"{one['new_tokens']:.0f}", f"{one['engine_ms']:.1f}", f"{one['gateway_ms']:.1f}",
             f"**{one['overhead_ms']:.1f}** ({100 * one['overhead_share']:.1f}%)", str(many["sessions"]),
             f"{many['engine_tokens_per_s']:.1f}", f"{many['gateway_tokens_per_s']:.1f}",
             f"**{_x(many['gateway_over_engine'])}**"]]


class Table:
    def __init__(self, benchmarks: List[str], command: str, header: List[str],
                 rows: Callable[[dict], List[List[str]]]):
        self.benchmarks, self.command, self.header, self.rows = benchmarks, command, header, rows


STEP = "s / step (generate / score / train)"
TABLES: Dict[str, Table] = {
    "rl_smollm2": Table(["rl_smollm2"], "python benchmarks/bench_rl_smollm2.py",
                        ["algorithm", f"ours, {STEP}", f"TRL, {STEP}", "ours / TRL", "peak RSS GiB ours / TRL"],
                        _rl_smollm2),
    "rl_step": Table(["ppo", "grpo"], "python benchmarks/bench_rl_step.py --algo ppo|grpo --steps 12",
                     ["algorithm", f"ours, {STEP}", "TRL peer s / step", "ours / TRL", "update, of GEMM peak"],
                     _rl_step),
    "smollm2": Table(["smollm2"], "python benchmarks/bench_smollm2.py --without-kernels",
                     ["workload", "ours tokens/s", "transformers tokens/s", "ours / transformers",
                      "ours with our CPU kernels / without"], _smollm2),
    "cpu_ops": Table(["cpu_ops"], "python benchmarks/bench_cpu_ops.py",
                     ["operation", "shape", "Paddle ms", "torch ms", "Paddle / torch (time)", "our kernel ms",
                      "our kernel / torch (time)"], _cpu_ops),
    "machine_limits": Table(["machine_limits"], "python benchmarks/bench_machine_limits.py",
                            ["GEMM peak GFLOP/s", "bandwidth GB/s", "training step GFLOP/s", "its GEMMs alone",
                             "scoring GFLOP/s", "its GEMMs alone", "decode steps at batch 8, tokens/s of the bound", "their weight GEMMs alone"],
                            _machine_limits),
    "decode_only": Table(["decode_only"], "python benchmarks/bench_machine_limits.py --decode-only",
                         ["fused decoder tokens/s (of bound)", "model layers tokens/s (of bound)",
                          "weight GEMMs alone", "bound tokens/s"], _decode_only),
    "cpu_settings": Table(["cpu_settings"], "python benchmarks/bench_cpu_settings.py",
                          ["setting", "GEMM GFLOP/s", "x chosen", "decode GEMM GFLOP/s", "x chosen", "train tokens/s",
                           "x chosen", "spread", "rollout tokens/s", "x chosen"],
                          _cpu_settings),
    "rollout": Table(["rollout"], "python benchmarks/bench_rollout.py",
                     ["prompt", "batch", "KV cache eager", "KV cache static step", "no cache", "KV / no cache",
                      "static / eager", "same tokens"], _rollout),
    "speculative": Table(["speculative"], "python benchmarks/bench_speculative.py",
                         ["task", "batch", "new tokens", "plain tokens/s", "prompt lookup tokens/s", "speed-up",
                          "accepted per verify step", "drafted accepted", "same tokens"], _speculative),
    "speculative_rl": Table(["speculative_rl"], "python benchmarks/bench_speculative_rl.py", [
        "task", "decoding", "generated tokens", "generate tokens/s", "vs plain", "RL step s", "step speed-up"],
        _speculative_rl),
    "engine_width": Table(["engine_width"], "python benchmarks/bench_engine_width.py",
                          ["model", "slots", "prompt", "new tokens", "capacity", "ladder's last width",
                           "ladder tokens/s", "fixed width tokens/s", "speed-up", "same bits",
                           "engine (layers) / cache grown by concatenation"], _engine_width),
    "moe": Table(["moe"], "python benchmarks/bench_moe.py",
                 ["MoE against", "parameters M (MoE / dense)", "train step s", "MoE / dense step time",
                  "peak RSS MiB", "MoE / dense memory", "decode tokens/s", "MoE / dense decode"], _moe),
    "predict": Table(["predict"], "python benchmarks/bench_predict.py [--model DIR]",
                     ["model", "exported tokens/s", "dynamic tokens/s", "exported / dynamic", "same tokens"],
                     _predict),
    "async": Table(["async"], "python benchmarks/bench_async.py --steps 8",
                   ["run (2 processes)", "s / step", "vs synchronous", "trained tokens/s", "trainer waits (s)",
                    "trainer's scoring (s)"], _async),
    "async_env_wait": Table(["async_env_wait"], "python benchmarks/bench_async.py --steps 8 --env-wait 0.25",
                            ["run (2 processes), 3-turn episodes, 0.25 s a step", "s / step", "vs synchronous",
                             "trained tokens/s", "trainer waits (s)", "trainer's scoring (s)"], _async),
    "reward_server": Table(["reward_server"], "python benchmarks/bench_reward_server.py",
                           ["model", "batching", "requests/s at 1 / 8 / 32 clients", "p50 ms", "p99 ms"],
                           _reward_server),
    "lora_memory": Table(["lora_memory"], "python benchmarks/bench_lora_memory.py",
                         ["run", "peak RSS GiB", "s generate / score / train"], _lora_memory),
    "peak_memory": Table(["peak_memory_tiny", "peak_memory_smollm2"],
                         "python benchmarks/bench_peak_memory.py --model tiny|smollm2",
                         ["entry point", "model", "peak RSS MiB", "smallest address-space limit that finishes, MiB"],
                         _peak_memory),
    "episode_overlap": Table(["episode_overlap"], "python benchmarks/bench_episode_overlap.py",
                             ["variant", "generation s", "growth, in one episode's waits", "same bits"],
                             _episode_overlap),
    "tool_demo": Table(["tool_demo"], "bash examples/tool_demo.sh",
                       ["arm", "held-out accuracy after SFT", "after GRPO", "tool calls per question",
                        "SFT min wall / CPU", "GRPO min wall / CPU", "trained samples equal to the other arm's"],
                       _tool_demo),
    "distill_demo": Table(["distill_demo"], "bash examples/distill_demo.sh",
                          ["run", "held-out accuracy at its start", "at its end", "wall min", "CPU min"],
                          _distill_demo),
    "sharding_memory": Table(["sharding_memory"], "python benchmarks/bench_sharding_memory.py",
                             ["sharding", "peak RSS per rank, measured (GiB)", "predicted (GiB)", "error",
                              "weights held", "AdamW held", "weights, predicted"], _sharding_memory),
    "sandbox": Table(["sandbox"], "python benchmarks/bench_sandbox.py --calls 60",
                     ["`python -I -c pass` ms (median / p90)", "before the containment", "`audit-hook`", "`full`",
                      "full / before", "full / audit-hook", "calls/s from 4 threads / one after the other",
                      "kernel"], _sandbox),
    "grpo_reasoning": Table(["grpo_reasoning"], "bash examples/reasoning_demo.sh",
                            ["seed", "steps", "training min", "greedy pass@1, start -> end (95% CI)",
                             "gain (paired 95% CI)", "sampled pass@1 (n=8)", "sampled pass@1 gain (paired 95% CI)",
                             "sampled pass@8 (n=8)",
                             "transfer: basic_arithmetic greedy gain"], grpo_reasoning),
    "distill_chain_sum": Table(["distill_chain_sum"], "bash examples/distill_chain_sum.sh",
                               ["model or arm", "training min", "held-out greedy pass@1 (95% CI)",
                                "gain over the student (paired 95% CI)", "share of the teacher's gain",
                                "min to 80% of the teacher's gain"], distill_chain_sum),
    "curriculum_chain_sum": Table(["curriculum_chain_sum"], "bash examples/curriculum_chain_sum.sh",
                                  ["arm", "steps", "training min (median s a step)",
                                   "held-out sampled pass@1, start -> end (95% CI)", "gain (paired 95% CI)",
                                   "steps (min) to the plain arm's final gain",
                                   "zero-variance groups, by quarter of the run",
                                   "set aside / readmissions at the end"],
                                  curriculum_chain_sum),
    "main_demo_seeds": Table(["main_demo_seeds"], "bash examples/main_demo_seeds.sh",
                             ["policy or arm", "per seed (greedy gold reward)",
                              "over seeds and prompts (95% CI)", "difference (paired by prompt, 95% CI)"],
                             main_demo_seeds),
    "eval_harness": Table(["eval_harness"], "python benchmarks/bench_eval.py --model checkpoints/smollm2-135m-instruct",
                          ["model", "items x samples", "harness samples/s", "generate samples/s",
                           "harness / generate"], _eval_harness),
    "gateway": Table(["gateway"], "python benchmarks/bench_gateway.py --model checkpoints/smollm2-135m-instruct",
                     ["model", "new tokens a call (mean)", "one call, engine alone ms", "through the gateway ms",
                      "gateway overhead ms (share)", "streamed sessions at once", "engine alone tokens/s",
                      "through the gateway tokens/s", "gateway / engine"], _gateway),
    "multi_lora_serve": Table(["multi_lora_serve"], "python benchmarks/bench_multi_lora_serve.py", [
        "model", "adapters", "peak RSS MiB: base alone", "one server, all adapters", "one server per adapter, summed",
        "one / separate", "same greedy answers"], multi_lora_serve),
    "update_padding": Table(["update_padding"], "python benchmarks/bench_update_padding.py",
                            ["micro-batches", "s / update", "padding computed", "speed-up"], _update_padding),
}


def kept_runs(benchmark: str, extra: tuple = ()) -> List[record.Run]:
    """The latest run of `benchmark` per CPU model, and the runs named in `extra` (cited older ones)."""
    every = record.runs()
    chosen = [run for run in record.latest_per_cpu(every) if run.benchmark == benchmark]
    chosen += [run for run in every if run.json_name in extra and run not in chosen]
    return sorted(chosen, key=lambda run: run.stamp, reverse=True)


def render(name: str, extra: tuple = ()) -> str:
    """The table `name`: a row per kept run and line of its figures; `extra` names older runs a page cites."""
    table = TABLES[name]
    rows = []
    for benchmark in table.benchmarks:
        for run in kept_runs(benchmark, extra):
            prefix = [run.cpu or "not recorded", run.date, f"`{run.commit}`"]
            rows += [prefix + cells + [_file(run)] for cells in table.rows(run.record)]
    if not rows:
        record_flag = " --record" if table.command.startswith("python ") else ""
        return f"No recorded result yet: `{table.command}{record_flag}` writes one."
    text = _table(["CPU", "date", "commit"] + table.header + ["file (benchmarks/results/)"], rows)
    return text + ("\n\n" + COMMIT_NOTE if "*`" in text else "")
