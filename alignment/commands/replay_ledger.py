"""What a run's policy saw when: a report of its rollout ledger (<output_dir>/ledger/, alignment/ppo/rollout/ledger.py).

    python tools/replay_ledger.py OUTPUT_DIR [--steps 10]
    python tools/replay_ledger.py OUTPUT_DIR --train --step K --output DIR [--checkpoint CHECKPOINT_DIR]

The report prints one line per step (samples trained, the policy versions that sampled them, staleness, mean
reward, samples dynamic sampling drew and dropped), then checks the ledger as a whole: every sample
("batch:row:prompt") trained (or dropped) exactly once, the prompt stream's batches contiguous from the first (none
lost), each batch complete (the same number of rows). Exits 1 when a check fails, naming the samples.

--train replays step K's update from the ledger alone (alignment/ppo/replay_step.py): the run's trainer is rebuilt
from its args.json and the checkpoint of step K - 1 (OUTPUT_DIR/checkpoint-<K-1>, or --checkpoint; the run's start
for K = 1), fed the ledger's samples and end rewards of step K (nothing is sampled or scored) and stepped once. DIR
receives the trained models (policy/, and value/ with a critic) and replay.json (the step's metrics, each model's
weights digest). Where the run kept the weights after step K (checkpoint-K, or its final models when K was its last
step) and logged step K alone (logging_steps 1), both are compared: exits 1 when a tensor or a metric differs.
Replays one-process synchronous runs (asynchronous, parallel, multi-turn, teacher, dynamic-sampling, ptx,
rollout_log_probs, mask_truncated_responses and LoRA-dropout runs are refused in one line, naming the key);
relative paths in args.json are read from the current directory.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Dict, List

from alignment.ppo.rollout.ledger import read_ledger
from alignment.commands.tool_parser import ToolParser, positive_int


def ledger_checks(rows: List[dict]) -> Dict[str, list]:
    """{"twice": sample ids trained more than once, "lost_batches": batch indices missing between the first and
    the last, "short_batches": batches with fewer rows than the fullest}."""
    ids = [row["sample"] for row in rows if row.get("sample")]
    twice = sorted(sample for sample, count in Counter(ids).items() if count > 1)
    per_batch = Counter(int(sample.split(":")[0]) for sample in set(ids))
    batches = sorted(per_batch)
    lost = sorted(set(range(batches[0], batches[-1] + 1)) - set(batches)) if batches else []
    full = max(per_batch.values()) if per_batch else 0
    short = sorted(b for b, count in per_batch.items() if count < full)
    return {"twice": twice, "lost_batches": lost, "short_batches": short}


def step_lines(rows: List[dict], limit: int) -> List[str]:
    by_step, dropped = defaultdict(list), Counter(row["step"] for row in rows if "dropped" in row)
    for row in rows:
        if "dropped" not in row:
            by_step[row["step"]].append(row)
    lines = []
    for step in sorted(by_step)[:limit]:
        group = by_step[step]
        versions = sorted({row["version"] for row in group})
        staleness = sum(step - 1 - row["version"] for row in group) / len(group)
        reward = sum(row["reward"] for row in group) / len(group)
        lines.append(f"step {step}: {len(group)} samples, versions {versions}, staleness {staleness:.2f}, "
                     f"mean reward {reward:.4f}" + (f", {dropped[step]} drawn and dropped" if dropped[step] else ""))
    return lines


def main(argv=None) -> int:
    parser = ToolParser(__doc__)
    parser.add_argument("output_dir")
    parser.add_argument("--steps", type=positive_int, default=10, help="show the first this many steps")
    parser.add_argument("--train", action="store_true", help="replay step --step's update (see above)")
    parser.add_argument("--step", type=positive_int, help="--train: the step to replay (1-based, as metrics.jsonl)")
    parser.add_argument("--checkpoint", help="--train: the checkpoint of step K - 1 (default: the run's)")
    parser.add_argument("--output", help="--train: a new directory for the replayed models and replay.json")
    args = parser.parse_args(argv)
    if args.train:
        return replay_train(parser, args)
    if args.step is not None or args.checkpoint is not None or args.output is not None:
        parser.error("--step, --checkpoint and --output go with --train")
    rows = read_ledger(args.output_dir)
    steps = sorted({row["step"] for row in rows})
    dropped = sum("dropped" in row for row in rows)
    print(f"{len(rows) - dropped} trained samples over {len(steps)} steps"
          + (f" ({steps[0]}-{steps[-1]})" if steps else "") + (f"; {dropped} drawn and dropped" if dropped else ""))
    print("\n".join(step_lines(rows, args.steps)))
    checks = ledger_checks(rows)
    for name, bad in checks.items():
        print(f"{name}: {'none' if not bad else ', '.join(map(str, bad[:20]))}")
    return 1 if any(checks.values()) else 0


def replay_train(parser, args) -> int:
    if args.step is None or args.output is None:
        parser.error("--train needs --step K and --output DIR")
    from alignment.cpu_env import apply_cpu_defaults

    apply_cpu_defaults()  # the run's thread settings: the same sums in the same order
    from alignment.exits import install_signal_handlers
    from alignment.ppo.replay_step import check_replay, replay_step

    plan = check_replay(args.output_dir, args.step, args.output, args.checkpoint)  # nothing written before
    install_signal_handlers()  # paddle's import replaced them
    report = replay_step(plan)
    print(f"step {plan.step} replayed from {plan.checkpoint or 'the run start'} -> {args.output}")
    differs = bool(report["differing_metrics"])
    for name, weights in report["weights"].items():
        bad = weights["differing_tensors"]
        differs = differs or bool(bad)
        verdict = "no weights of the run after the step to compare with" if bad is None else \
            "equal to the run's, bit for bit" if not bad else f"{len(bad)} tensors differ from the run's: {bad[:5]}"
        print(f"{name}: sha256 {weights['sha256'][:16]}; {verdict}")
    if report["logged_metrics"] is None:
        print("metrics: the run logged no row of this step alone (logging_steps 1 keeps one per step)")
    else:
        differing = report["differing_metrics"]
        print(f"metrics: {len(report['metrics'])} replayed, "
              + (f"differing from the run's: {', '.join(differing)}" if differing else "equal to the run's"))
    return 1 if differs else 0
