"""Peak resident memory of each entry point for two steps, on the tiny model or on SmolLM2-135M-Instruct.

    python benchmarks/bench_peak_memory.py --model tiny|smollm2 [--steps 2] [--only sft,grpo,...]
        [--address-space] [--results-dir DIR | --record | --no-save]

Runs each entry point of ENTRY_POINTS in a child process with its argument file from config/tiny/ or
config/smollm2/ (max lengths and batch sizes as there), the model paths pointing at the one model, `--steps` steps,
no evaluation and its output in a temporary directory, and reports the child's peak resident memory: the kernel's
ru_maxrss from os.wait4 (the largest resident set of the child and of any process it waited for). The tiny model is
tools/make_tiny.py's, built into the temporary directory; --model smollm2 takes checkpoints/smollm2-135m-instruct
(or --smollm2-dir) as actor, reference, reward-model initialisation and teacher. No stage needs an earlier stage's
output: PPO scores with the reward function `combined` instead of a trained reward model (so one model fewer than
the demo's PPO holds) and its critic starts from the actor; distillation's teacher is the model itself; evaluation
decodes the first 64 items of basic_arithmetic in batches of 32 (two batches).

With --address-space it also finds, for each entry point, the smallest address-space limit (`ulimit -v`) under
which the run still finishes: bisection to 64 MiB between the peak RSS and a limit that passes (runs that fail or
take 10 times the unlimited run's time count as not finishing). Writes peak_memory_<model>_<stamp>.json (header
of benchmarks/record.py).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import List, NamedTuple, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from alignment.commands.tool_parser import ToolParser, positive_int  # noqa: E402
from benchmarks import record  # noqa: E402


class EntryPoint(NamedTuple):
    name: str
    program: str                # relative to the checkout
    argument_file: str          # "" for a program without one; {config}: the model set's config folder
    flags: tuple                # {model}, {steps}, {output}, {distill}: filled in by command()
    leaves: str = "metrics.jsonl"  # the file a finished run leaves in its output (metrics: one row a step)


STAGE = ("--max_steps", "{steps}", "--eval_datasets", "", "--eval_steps", "0", "--save_steps", "0",
         "--logging_steps", "1", "--disable_tqdm", "--output_dir", "{output}")
ENTRY_POINTS = (
    EntryPoint("sft", "alignment/sft/run_sft.py", "{config}/sft_argument.json",
               ("--model_name_or_path", "{model}", *STAGE)),
    EntryPoint("reward model", "alignment/rm/run_reward.py", "{config}/rm_argument.json",
               ("--model_name_or_path", "{model}", *STAGE)),
    EntryPoint("dpo", "alignment/dpo/run_dpo.py", "{config}/dpo_argument.json",
               ("--model_name_or_path", "{model}", *STAGE)),
    EntryPoint("kto", "alignment/dpo/run_kto.py", "{config}/dpo_argument.json",
               ("--model_name_or_path", "{model}", "--loss_type", "kto", *STAGE)),
    EntryPoint("ppo (gae, critic)", "alignment/ppo/run_ppo.py", "{config}/ppo_argument.json",
               ("--actor_model_name_or_path", "{model}", "--reward_model_name_or_path", "", "--reward_funcs",
                "combined", *STAGE)),
    EntryPoint("grpo", "alignment/ppo/run_ppo.py", "{config}/grpo_argument.json",
               ("--actor_model_name_or_path", "{model}", *STAGE)),
    EntryPoint("distill", "alignment/ppo/run_distill.py", "{config}/{distill}",
               ("--actor_model_name_or_path", "{model}", "--teacher_model_name_or_path", "{model}", *STAGE)),
    EntryPoint("evaluate", "tools/evaluate.py", "",
               ("--model", "{model}", "--task", "basic_arithmetic", "--limit", "64", "--batch-size", "32",
                "--output-dir", "{output}"), leaves="basic_arithmetic/summary.json"),
)
# the argument folder and the distillation file of each model set (config/smollm2/ has no plain distillation file)
MODEL_SETS = {
    "tiny": {"name": "tiny (tools/make_tiny.py)", "config": "config/tiny", "distill": "distill_argument.json"},
    "smollm2": {"name": "SmolLM2-135M-Instruct", "config": "config/smollm2",
                "distill": "distill_chain_sum_argument.json"},
}
RESOLUTION_MIB = 64


class ChildRun(NamedTuple):
    exit_code: int
    peak_rss_mib: float
    seconds: float
    last_line: str              # the last line the child wrote (its `error: ...` line when it failed)


# The child is started by this small spawner, not forked from the benchmark: a process's ru_maxrss starts from the
# resident set of the process it was forked from (exec keeps the pre-exec image's high-water mark), so a child of a
# large parent (pytest with paddle loaded, say) would report at least the parent's size. The spawner (python -S,
# a few MiB) forks the child, applies the address-space limit to it alone and writes its ru_maxrss (KiB on Linux)
# and exit code to a file.
SPAWNER = r"""
import os, resource, sys
report, limit, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
pid = os.fork()
if pid == 0:
    try:
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        os.execv(argv[0], argv)
    except BaseException as error:
        sys.stderr.write(f"{argv[0]}: {error}\n")
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as f:
    f.write(f"{usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}")
"""


def run_child(command: List[str], log: str, address_space_mib: Optional[int] = None,
              timeout: Optional[float] = None) -> ChildRun:
    """Run `command` from the checkout, its output into `log`, optionally under an address-space limit (as
    `ulimit -v`) and killed after `timeout` seconds; its exit code (-9 when killed) and peak RSS."""
    report = log + ".rusage"
    limit = (address_space_mib or 0) << 20
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-S", "-c", SPAWNER, report, str(limit), *command], cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # its own process group: a kill reaches the child too
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:  # timed out, or the benchmark itself was stopped
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.monotonic() - start
    maxrss_kib, exit_code = (int(word) for word in open(report).read().split()) if os.path.exists(report) \
        else (0, proc.returncode)  # no report: the spawner was killed
    with open(log, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return ChildRun(exit_code, maxrss_kib / 1024, seconds, lines[-1] if lines else "")


def measured(name: str, command: List[str], log: str) -> ChildRun:
    """run_child, stopping the benchmark with one line when the child fails."""
    run = run_child(command, log)
    if run.exit_code != 0:
        raise SystemExit(f"error: {name} exited with {run.exit_code}: {run.last_line[:400]}")
    return run


def check_finished(entry: EntryPoint, output: str, steps: int) -> None:
    """An exit code of 0 is not enough: the run must have left its output, and a stage its `steps` steps."""
    path = os.path.join(output, entry.leaves)
    if not os.path.isfile(path):
        raise SystemExit(f"error: {entry.name} exited with 0 but left no {entry.leaves}")
    if entry.leaves == "metrics.jsonl":
        with open(path) as f:
            last = json.loads(f.readlines()[-1])["step"]
        if last != steps:
            raise SystemExit(f"error: {entry.name} stopped at step {last} of {steps}")


def command(entry: EntryPoint, model_set: str, model: str, steps: int, output: str) -> List[str]:
    fill = dict(MODEL_SETS[model_set], model=model, steps=steps, output=output)
    program = [sys.executable, os.path.join(REPO, entry.program)]
    if entry.argument_file:
        program.append(os.path.join(REPO, entry.argument_file.format(**fill)))
    return program + [flag.format(**fill) for flag in entry.flags]


def smallest_address_space(entry: EntryPoint, build, work: str, unlimited: ChildRun) -> Optional[int]:
    """The smallest address-space limit (MiB, to RESOLUTION_MIB) under which `entry` finishes; None if not even
    64 GiB does. `build(output)` gives its command line."""
    attempts = iter(range(1000))

    def finishes(limit_mib: int) -> bool:
        output = os.path.join(work, f"{entry.name.split()[0]}-{next(attempts)}")
        run = run_child(build(output), output + ".log", limit_mib, timeout=10 * unlimited.seconds + 60)
        print(f"  ulimit -v {limit_mib << 10}: {'finishes' if run.exit_code == 0 else run.last_line[:160]}",
              flush=True)
        return run.exit_code == 0

    low = int(unlimited.peak_rss_mib) // RESOLUTION_MIB * RESOLUTION_MIB  # below its peak RSS no run finishes
    high = max(4096, 4 * low)
    while not finishes(high):
        low, high = high, 2 * high
        if high > 65536:
            return None
    while high - low > RESOLUTION_MIB:
        middle = (low + high) // 2 // RESOLUTION_MIB * RESOLUTION_MIB
        low, high = (low, middle) if finishes(middle) else (middle, high)
    return high


def tiny_model(work: str) -> str:
    path = os.path.join(work, "tiny")
    measured("make_tiny", [sys.executable, os.path.join(REPO, "tools", "make_tiny.py"), "--output", path],
             path + ".log")
    return path


def chosen_entries(only: str, parser) -> List[EntryPoint]:
    if not only:
        return list(ENTRY_POINTS)
    names = {entry.name.split()[0]: entry for entry in ENTRY_POINTS}
    unknown = [name for name in only.split(",") if name not in names]
    if unknown:
        parser.error(f"--only: unknown entry point {', '.join(unknown)}; known: {', '.join(names)}")
    return [names[name] for name in only.split(",")]


def main(argv=None) -> dict:
    p = ToolParser(__doc__)
    p.add_argument("--model", required=True, choices=sorted(MODEL_SETS))
    p.add_argument("--steps", type=positive_int, default=2)
    p.add_argument("--only", default="", help="comma-separated entry points (first word of a name: sft,ppo,...)")
    p.add_argument("--address-space", action="store_true",
                   help="also find each entry point's smallest ulimit -v that finishes (bisection: many runs)")
    p.add_argument("--smollm2-dir", default=os.path.join(REPO, "checkpoints", "smollm2-135m-instruct"))
    record.add_arguments(p)
    args = p.parse_args(argv)
    entries = chosen_entries(args.only, p)
    if args.model == "smollm2" and not os.path.isfile(os.path.join(args.smollm2_dir, "config.json")):
        p.error(f"--smollm2-dir {args.smollm2_dir}: no config.json (a SmolLM2-135M-Instruct checkpoint)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="peak-memory-") as work:
        model = tiny_model(work) if args.model == "tiny" else os.path.abspath(args.smollm2_dir)
        for entry in entries:
            def build(output, entry=entry):
                return command(entry, args.model, model, args.steps, output)

            output = os.path.join(work, entry.name.split()[0])
            run = measured(entry.name, build(output), output + ".log")
            check_finished(entry, output, args.steps)
            shown = command(entry, args.model, "TINY_MODEL" if args.model == "tiny" else model, args.steps, "OUT")
            row = {"entry_point": entry.name, "program": entry.program, "peak_rss_mib": round(run.peak_rss_mib, 1),
                   "command": " ".join(os.path.relpath(part, REPO) if part.startswith(REPO) else part or '""'
                                       for part in shown[1:])}
            print(f"{entry.name}: peak RSS {run.peak_rss_mib:.0f} MiB ({run.seconds:.0f} s)", flush=True)
            if args.address_space:
                row["smallest_address_space_mib"] = smallest_address_space(entry, build, work, run)
                limit = row["smallest_address_space_mib"]
                print(f"{entry.name}: the smallest address-space limit that finishes: " +
                      ("none up to 64 GiB" if limit is None else f"{limit} MiB (ulimit -v {limit << 10})"), flush=True)
            rows.append(row)
    print("\n| entry point | model | peak RSS MiB |\n| --- | --- | ---: |")
    for row in rows:
        print(f"| {row['entry_point']} | {MODEL_SETS[args.model]['name']} | {row['peak_rss_mib']:.0f} |")
    result = {"model": args.model, "model_name": MODEL_SETS[args.model]["name"], "steps": args.steps,
              "address_space_resolution_mib": RESOLUTION_MIB if args.address_space else None, "rows": rows}
    if not args.no_save:
        record.save(f"peak_memory_{args.model}", result, record.results_dir(args))
    return result


if __name__ == "__main__":
    main()
