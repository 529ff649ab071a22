"""Start-up cost of one python-tool call (alignment/envs/sandbox/runner.py), before and after the containment of
issue 52.

    python benchmarks/bench_sandbox.py [--calls 40] [--threads 4] [--results-dir DIR | --record | --no-save]

Variants, run round-robin (one call of each per round, so load drifts hit them alike), each call
`run_python("print(sum(range(1000)))")` with default limits:
  bare        `sys.executable -I -c pass`, a subprocess start (the floor)
  before      the sandbox of commit BASELINE (user + network namespace only), loaded from git
  audit-hook  containment "audit-hook" (rlimits + the audit hook)
  full        containment "full" (every layer)
Then the full containment from --threads threads at once (the overlap of several calls): calls per second against
the same calls one after the other. Prints medians / p90 in ms and the ratios full / before, full / audit-hook (what
the layers cost: same parent code) and full / bare. "before" waited with Popen.wait(timeout), whose sleeps grow to
50 ms, so its times cluster just above 63.5 or 113.5 ms (the sums of those sleeps) whatever the child took.
Writes sandbox_<timestamp>.json (CPU, date, commit, every call's seconds; benchmarks/record.py).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
BASELINE = "ded7fd9"  # the last commit before issue 52's containment
CODE = "print(sum(range(1000)))"

from alignment.cpu_env import describe_machine, machine_facts  # noqa: E402
from alignment.envs.sandbox.runner import SandboxLimits, run_python  # noqa: E402


def baseline_sandbox(directory: str):
    """The sandbox module as it was at BASELINE (its runner is a string inside it), imported from `directory`."""
    source = subprocess.run(["git", "-C", REPO, "show", f"{BASELINE}:alignment/envs/sandbox/runner.py"],
                            capture_output=True, text=True, check=True).stdout
    with open(os.path.join(directory, "baseline_sandbox.py"), "w") as f:
        f.write(source)
    sys.path.insert(0, directory)
    try:
        return importlib.import_module("baseline_sandbox")
    finally:
        sys.path.remove(directory)


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def summary(seconds) -> dict:
    ordered = sorted(seconds)
    return {"median_ms": 1e3 * statistics.median(ordered), "p90_ms": 1e3 * ordered[math.ceil(0.9 * len(ordered)) - 1],
            "calls": len(ordered)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--threads", type=int, default=4)
    from benchmarks import record

    record.add_arguments(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as directory:
        old = baseline_sandbox(directory)  # stays imported once its file is gone
    full, weak = SandboxLimits(), SandboxLimits(containment="audit-hook")

    def checked(result):
        assert result.returncode == 0 and result.stdout == "499500\n", result
        return result

    variants = {
        "bare": lambda: subprocess.run([sys.executable, "-I", "-c", "pass"], check=True),
        "before": lambda: checked(old.run_python(CODE, old.SandboxLimits())),
        "audit-hook": lambda: checked(run_python(CODE, weak)),
        "full": lambda: checked(run_python(CODE, full)),
    }
    layers = checked(run_python(CODE, full)).layers
    for call in variants.values():  # warm the page cache
        call()
    seconds = {name: [] for name in variants}
    for _ in range(args.calls):
        for name, call in variants.items():
            seconds[name].append(timed(call))
    serial = timed(lambda: [variants["full"]() for _ in range(args.calls)])
    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        concurrent_s = timed(lambda: list(pool.map(lambda _: variants["full"](), range(args.calls))))
    stats = {name: summary(values) for name, values in seconds.items()}
    result = {
        "baseline_commit": BASELINE, "machine": machine_facts(), "kernel": os.uname().release,
        "python": sys.version.split()[0], "layers": list(layers), "calls_per_variant": args.calls,
        "stats": stats,
        "full_over_before": stats["full"]["median_ms"] / stats["before"]["median_ms"],
        "full_over_bare": stats["full"]["median_ms"] / stats["bare"]["median_ms"],
        "full_over_audit_hook": stats["full"]["median_ms"] / stats["audit-hook"]["median_ms"],
        "threads": args.threads, "serial_calls_per_s": args.calls / serial,
        "concurrent_calls_per_s": args.calls / concurrent_s, "seconds": seconds,
        "load_average": os.getloadavg(),
    }
    print(describe_machine(result["machine"]))
    print(f"kernel {result['kernel']}, python {result['python']}; full containment layers: {', '.join(layers)}")
    for name, stat in stats.items():
        print(f"  {name:<11} median {stat['median_ms']:7.1f} ms   p90 {stat['p90_ms']:7.1f} ms")
    print(f"  full / before {result['full_over_before']:.2f}x, full / audit-hook {result['full_over_audit_hook']:.2f}x "
          f"(the layers' own cost), full / bare {result['full_over_bare']:.2f}x; "
          f"{args.threads} threads: {result['concurrent_calls_per_s']:.1f} calls/s vs "
          f"{result['serial_calls_per_s']:.1f} one after the other")
    if not args.no_save:
        record.save("sandbox", {key: value for key, value in result.items() if key != "machine"},
                    record.results_dir(args), machine=result["machine"])
    return result


if __name__ == "__main__":
    main()
