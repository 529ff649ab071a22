"""Benchmark results as data: every benchmark writes `<benchmark>_<YYYYMMDD-HHMMSS>.json` through `save()`, with the
same header (benchmark, UTC date, commit, the machine of `alignment.cpu_env.machine_facts()`, command line) beside
its figures. Where: `add_arguments()` gives every benchmark `--results-dir DIR` (default `default_results_dir()`,
outside the repository), `--record` (into `benchmarks/results/`, the files the docs' tables are made from: run
`python -m docsgen` after) and `--no-save`; `results_dir(args)` resolves them. `runs()` reads a directory back, files
of older formats included, and `files_to_keep()` is the retention rule `tests/benchmarks/test_results_retention.py`
enforces on benchmarks/results/: the latest run of each benchmark per CPU model, plus every file a documentation page
(docs/, README.md) names. No paddle import: the docs build reads these files."""
from __future__ import annotations

import datetime
import glob
import json
import os
import re
import sys
from typing import Dict, Iterable, List, NamedTuple, Optional

from alignment.provenance import git_commit  # noqa: F401  (the header's commit; benchmarks import it from here)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
# <benchmark>_<YYYYMMDD>[-<HHMM[SS]>][-<tag>].<ext>: the stamp sorts runs of one benchmark in time
NAME = re.compile(r"^(?P<benchmark>[a-z0-9_-]+?)_(?P<day>\d{8})(?:-(?P<time>\d{4,6}))?(?:-(?P<tag>[a-z][a-z0-9-]*))?"
                  r"\.(?P<ext>json|md|png)$")
CITED = re.compile(r"[a-z0-9_-]+_\d{8}(?:-\d{4,6})?(?:-[a-z][a-z0-9-]*)?\.(?:json|md|png)|[a-z0-9_-]+\.(?:md|jsonl)")


def stamp() -> str:
    """The UTC time a run's files are named by (YYYYMMDD-HHMMSS)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")


def default_results_dir() -> str:
    """Where a run's files go unless told otherwise: `bench-results/` in the toolkit's cache folder
    ($ALIGNMENT_CACHE_DIR, else $XDG_CACHE_HOME/alignment, else ~/.cache/alignment), outside the repository, so a
    user's run leaves benchmarks/results/ and the docs built from it as they were."""
    from alignment import mkl_path

    return os.path.join(os.path.dirname(mkl_path.cache_file()), "bench-results")


def add_arguments(parser) -> None:
    """A benchmark's choice of where its files go: --results-dir DIR, --record or --no-save (one of them)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--results-dir", default=None,
                       help="directory for the result files (default: bench-results/ in the toolkit's cache folder, "
                            "$ALIGNMENT_CACHE_DIR or $XDG_CACHE_HOME/alignment or ~/.cache/alignment)")
    where.add_argument("--record", action="store_true",
                       help="write into benchmarks/results/ for the docs' tables (then run python -m docsgen)")
    where.add_argument("--no-save", action="store_true", help="write no result file")


def results_dir(args) -> str:
    """The directory `add_arguments()`'s flags name: benchmarks/results/ with --record, else --results-dir or the
    default."""
    return RESULTS if args.record else (args.results_dir or default_results_dir())


def save(benchmark: str, figures: dict, results_dir: Optional[str] = None, machine: Optional[dict] = None,
         when: Optional[str] = None) -> str:
    """Write one run's figures with the header every result carries, as `<benchmark>_<when>.json` in `results_dir`
    (default `default_results_dir()`; `when` from `stamp()`, given when the run's other files share it); returns
    the path."""
    from alignment.cpu_env import machine_facts

    results_dir = results_dir or default_results_dir()
    when = when or stamp()
    date = datetime.datetime.strptime(when, "%Y%m%d-%H%M%S").strftime("%Y-%m-%d %H:%M UTC")
    record = {"benchmark": benchmark, "date": date, "commit": git_commit(),
              "machine": machine if machine is not None else machine_facts(),
              "command": " ".join(["python", os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]), **figures}
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, f"{benchmark}_{when}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    recorded = os.path.abspath(results_dir) == os.path.abspath(RESULTS)
    print(f"wrote {os.path.relpath(path, REPO) if recorded else path}" +
          ("; python -m docsgen brings the docs' tables up to date" if recorded else ""))
    return path


class Run(NamedTuple):
    benchmark: str
    stamp: str              # YYYYMMDD-HHMMSS (missing digits as 0), for ordering
    files: List[str]        # the run's file names (json, md, png)
    record: Optional[dict]  # the JSON, when there is one

    @property
    def machine(self) -> Optional[dict]:
        record = self.record or {}
        machine = record.get("machine") or (record.get("result") or {}).get("machine")
        return machine if isinstance(machine, dict) and machine.get("model") and machine.get("family") else None

    @property
    def cpu(self) -> Optional[str]:
        """The CPU model with its family and model numbers; None when the run did not record them (a VM names Zen 4
        and Zen 5 both "AMD EPYC", so a model name alone does not say which CPU ran it)."""
        machine = self.machine
        return None if machine is None else f"{machine['model']}, family {machine['family']} model " \
                                             f"{machine.get('model_number', '?')}"

    @property
    def date(self) -> str:
        if self.record and self.record.get("date"):
            return self.record["date"]
        day, time = self.stamp.split("-")
        return f"{day[:4]}-{day[4:6]}-{day[6:]} {time[:2]}:{time[2:4]} UTC"

    @property
    def commit(self) -> str:
        """The recorded commit; for runs written before `save()` existed, the commit that added the file, marked *."""
        record = self.record or {}
        if record.get("commit"):
            return record["commit"]
        return f"{record['added_in']}*" if record.get("added_in") else "not recorded"

    @property
    def json_name(self) -> Optional[str]:
        return next((name for name in self.files if name.endswith(".json")), None)


def parse_name(name: str) -> Optional[dict]:
    found = NAME.match(name)
    return found.groupdict() if found else None


def runs(results_dir: str = RESULTS) -> List[Run]:
    """Every run in the directory (files of one benchmark and stamp grouped), oldest first."""
    groups: Dict[tuple, List[str]] = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*"))):
        parts = parse_name(os.path.basename(path))
        if parts is None:
            continue
        stamp = f"{parts['day']}-{(parts['time'] or '').ljust(6, '0')}"
        groups.setdefault((parts["benchmark"], stamp, parts["tag"] or ""), []).append(os.path.basename(path))
    found = []
    for (benchmark, stamp, _), files in groups.items():
        name = next((f for f in files if f.endswith(".json")), None)
        record = None
        if name:
            with open(os.path.join(results_dir, name), encoding="utf-8") as f:
                record = json.load(f)
        found.append(Run(benchmark, stamp, files, record))
    return sorted(found, key=lambda run: (run.benchmark, run.stamp))


def latest_per_cpu(all_runs: Iterable[Run]) -> List[Run]:
    """The newest run of each benchmark on each CPU model that recorded its CPU."""
    latest: Dict[tuple, Run] = {}
    for run in all_runs:
        if run.cpu is not None and run.record is not None:
            key = (run.benchmark, run.cpu)
            if key not in latest or run.stamp >= latest[key].stamp:
                latest[key] = run
    return sorted(latest.values(), key=lambda run: (run.benchmark, run.stamp))


def doc_files(repo: str = REPO) -> List[str]:
    """The pages whose citations of result files keep those files: docs/**/*.md, README.md, benchmarks/README.md."""
    pages = glob.glob(os.path.join(repo, "docs", "**", "*.md"), recursive=True)
    return sorted(pages + [p for p in (os.path.join(repo, "README.md"), os.path.join(repo, "benchmarks", "README.md"))
                           if os.path.exists(p)])


def cited(repo: str = REPO, results_dir: str = RESULTS) -> set:
    """Result files a page names (by file name)."""
    present = set(os.listdir(results_dir))
    names = set()
    for page in doc_files(repo):
        with open(page, encoding="utf-8") as f:
            names |= set(CITED.findall(f.read())) & present
    return names


def files_to_keep(repo: str = REPO, results_dir: str = RESULTS) -> set:
    """The retention rule: every file of the latest run of each benchmark per CPU model, and every cited file."""
    keep = {name for run in latest_per_cpu(runs(results_dir)) for name in run.files}
    return keep | cited(repo, results_dir)
