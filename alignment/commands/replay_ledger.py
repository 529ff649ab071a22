"""What a run's policy saw when: a report of its rollout ledger (<output_dir>/ledger/, alignment/ppo/ledger.py).

    python tools/replay_ledger.py OUTPUT_DIR [--steps 10]

Prints one line per step (samples trained, the policy versions that sampled them, staleness, mean reward, samples
dynamic sampling drew and dropped), then checks the ledger as a whole: every sample ("batch:row:prompt") trained
(or dropped) exactly once, the prompt stream's batches
contiguous from the first (none lost), each batch complete (the same number of rows). Exits 1 when a check fails,
naming the samples.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Dict, List

from alignment.ppo.ledger import read_ledger
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
    args = parser.parse_args(argv)
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
