"""Generated parts of the pages: a part sits between `<!-- generated: NAME ARGS -->` and `<!-- end generated -->`
in docs/**/*.md or README.md, and `regenerate()` replaces what is between with the generator's output. A test and
the MkDocs hook (docsgen/hooks.py) fail when a page's parts differ from what the code and result files give."""
from __future__ import annotations

import glob
import os
import re
from typing import Callable, Dict, List, Tuple

from benchmarks import record
from docsgen import model_matrix, paddlenlp_keys, results_tables, targets

REPO = record.REPO
BLOCK = re.compile(r"(<!-- generated: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def headline() -> str:
    """README's small results table: each figure from a result file, linked to the page that explains it."""
    rows = []
    perf = "docs/performance.md"
    # a run may measure one algorithm: each figure from the newest kept run (latest or cited) that has it
    smollm2_runs = results_tables.kept_runs("rl_smollm2", tuple(record.cited()))
    for algo in ("grpo", "ppo"):
        for run in smollm2_runs:
            ratio = results_tables.rl_smollm2_ratio(run.record, algo)
            if ratio is not None:
                rows.append([f"{algo.upper()} step on SmolLM2-135M, our time / TRL's",
                             f"[**{ratio:.2f}x**]({perf}#whole-rl-steps-on-smollm2-135m-against-trl)", run])
                break
    for algo in ("ppo", "grpo"):
        for run in results_tables.kept_runs(algo)[:1]:
            ratio = results_tables.small_shape_ratio(run.record, run.machine)
            if ratio is not None:
                rows.append([f"{algo.upper()} step, TRL's small test shape, our time / TRL's",
                             f"[**{ratio:.2f}x**]({perf}#rl-steps-on-trls-small-test-shape)", run])
    for run in results_tables.kept_runs("smollm2")[:1]:
        train = results_tables.smollm2_ratio(run.record, "train_step")
        rows.append(["SmolLM2-135M training tokens/s, ours / transformers",
                     f"[**{train:.2f}x**]({perf}#smollm2-135m-against-transformers)", run])
    for run in results_tables.kept_runs("grpo_reasoning")[:1]:
        for key, name in (("sampled_pass@1", "pass@1 (8 samples at temperature 1)"), ("greedy", "greedy pass@1")):
            seeds = [s for s in run.record["seeds"] if key in s["gain"]]
            if not seeds:
                continue
            gains = " / ".join(f"{s['gain'][key]['mean']:+.2f} [{s['gain'][key]['low']:+.2f}, "
                               f"{s['gain'][key]['high']:+.2f}]" for s in seeds)
            which = ", ".join(str(s["seed"]) for s in seeds)
            link = "docs/recipes/grpo.md#verifiable-rewards-on-smollm2-held-out-pass1-over-training"
            rows.append([f"GRPO on SmolLM2-135M, held-out chain-sum {name} gain, seeds {which} (95% CI)",
                         f"[**{gains}**]({link})", run])
    for run in results_tables.kept_runs("main_demo_seeds")[:1]:
        arms = run.record["arms"]
        figure = " / ".join(f"{a['arm']} {a['over_seeds']['mean']:.2f} [{a['over_seeds']['low']:.2f}, "
                            f"{a['over_seeds']['high']:.2f}]" for a in arms)
        if any(d["intervals_overlap"] for d in run.record["differences"]):
            figure += ": the intervals overlap"
        seeds = ", ".join(str(r["seed"]) for r in arms[0]["runs"])
        link = "docs/getting-started/index.md#the-smollm2-demo-the-main-job"
        rows.append([f"Main demo, held-out gold reward over seeds {seeds} and prompts (95% CI)",
                     f"[**{figure}**]({link})", run])
    lines = ["| measure | figure | CPU, date, commit |", "| --- | ---: | --- |"]
    lines += [f"| {what} | {figure} | {run.cpu}, {run.date}, `{run.commit}` |" for what, figure, run in rows]
    return "\n".join(lines)


GENERATORS: Dict[str, Callable[..., str]] = {
    "paddlenlp-keys": paddlenlp_keys.paddlenlp_keys,
    "paddleformers-keys": paddlenlp_keys.paddleformers_keys,
    "paddlenlp-counts": paddlenlp_keys.counts,
    "results": lambda name, *extra: results_tables.render(name, tuple(extra)),
    "headline": headline,
    "model-matrix": model_matrix.model_matrix,
    "targets": targets.targets_table,
}


def generate(spec: str) -> str:
    name, *args = spec.split()
    if name not in GENERATORS:
        raise KeyError(f"unknown generated part {name!r}; known: {', '.join(GENERATORS)}")
    return GENERATORS[name](*args)


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + generate(m.group("spec")).rstrip("\n") + "\n" + m.group(4), text)


def pages() -> List[str]:
    return sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)) + \
        [os.path.join(REPO, "README.md")]


def stale() -> List[Tuple[str, str]]:
    """(page, part) for every generated part whose text differs from what its generator gives now."""
    found = []
    for page in pages():
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for match in BLOCK.finditer(text):
            if match.group("body").rstrip("\n") != generate(match.group("spec")).rstrip("\n"):
                found.append((os.path.relpath(page, REPO), match.group("spec")))
    return found


def rewrite() -> List[str]:
    """Regenerate every page's parts in place; returns the pages changed."""
    changed = []
    for page in pages():
        with open(page, encoding="utf-8") as f:
            text = f.read()
        new = regenerate(text)
        if new != text:
            with open(page, "w", encoding="utf-8") as f:
                f.write(new)
            changed.append(os.path.relpath(page, REPO))
    return changed
