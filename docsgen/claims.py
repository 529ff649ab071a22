"""The docs' claims checked against the repository (tests/docs/test_docs_claims.py): every `--flag` is one some parser
takes, every argument key a key table or a `key: value` names is a field of an argument dataclass (or a PaddleNLP /
PaddleFormers key the parser maps), every repository path exists, no measured figure is typed outside a generated
part (docsgen/blocks.py), prose paragraphs start with a capital and end with punctuation, no page names a machine's
absolute or temporary path, and each peer library is named at one version. `python -m docsgen.claims` lists the
problems of docs/ and README.md."""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import glob
import importlib
import io
import os
import pkgutil
import re
import sys
from typing import Dict, Iterable, List, NamedTuple, Optional, Set

from docsgen.runnable import REPO

# the flags of other programs that the docs' commands show, by program
FOREIGN_FLAGS = {
    "paddle.distributed.launch": {"--nproc_per_node", "--ips", "--host", "--devices"},
    "pip": {"--no-deps", "--dry-run", "--no-build-isolation"},
    "python -m venv": {"--system-site-packages"},
    "pytest": {"--strict-markers"},
    "mkdocs": {"--strict"},
    "docker": {"--rm", "--network", "--memory", "--pids-limit", "--read-only", "--tmpfs", "--workdir", "--cap-drop",
               "--security-opt", "--user", "--runtime"},
    "systemd-run": {"--user", "--scope"},
    "prlimit": {"--as"},
    "visualdl": {"--logdir"},
    "tensorboard": {"--logdir"},
    "mlflow ui": {"--backend-store-uri"},  # docs/trackers.md
}
# text the checks let through, each with why (a test fails when an entry no longer matches): a figure that is a
# setting, a limit or an input, not a measurement; a machine path that is a path inside the sandbox or container
ALLOWED: Dict[str, str] = {
    "bootstrap 95% CIs": "CONFIDENCE, the evaluation harness's interval (alignment/evaluation/metrics.py)",
    "percentile-bootstrap 95% confidence interval": "CONFIDENCE of alignment/evaluation/metrics.py",
    "at most 1 MiB": "MAX_ARGUMENT_FILE_BYTES, the argument file's size limit (alignment/config/argument_file.py)",
    "up to 2 s": "how long the sandbox's parent waits for the namespace to empty (alignment/envs/sandbox/runner.py)",
    "1 GiB as 64 files of 16 MiB": "the input of a containment test",
    "`disk_bytes` (64 MiB)": "SandboxLimits.disk_bytes' default",
    "2 GB allocation": "the input of a containment test",
    "(0.5 s, doubled each round up to 16 s": "reward_server_backoff's default and MAX_BACKOFF (alignment/rewards)",
    "to the back for 10 s": "DOWN_FOR (alignment/rewards/remote.py)",
    "and a 10x": "the overload the reward-server benchmark sends (10 x --max-queue requests)",
    "at 5x its learning rate": "examples/overoptimization_tiny.sh's learning rate against config/tiny's",
    "on 8 x 80 GB": "the layout planner's input in the example",
    "waits 0.25 s": "the episode-overlap benchmark's environment latency",
    "`disk_bytes` on `/tmp`": "the sandbox's own mount point, inside the sandbox",
    "`/tmp/work` (also `HOME`)": "the working directory inside the sandbox",
    '"--tmpfs", "/tmp:size=64m", "--workdir", "/tmp"': "paths inside the throwaway container of the example",
}
# flags the docs show being refused (they name flags no parser takes on purpose)
REFUSED_FLAGS = {"--mod": "not read as --model: flags are never abbreviated (docs/export.md)",
                 "--cachekv_int8_type": "one of PaddleNLP's flags refused as unknown (docs/export.md)"}
PEERS = ("TRL", "transformers", "PaddleNLP", "PaddleFormers", "verl", "OpenRLHF", "torch", "PyTorch", "vLLM",
         "DeepSpeed")  # the libraries the docs compare with or stand in for (Paddle is the platform, not a peer)
ROOTS = ("alignment", "benchmarks", "config", "data", "docs", "docsgen", "examples", "tests", "tools")

FENCE = re.compile(r"^[ \t]*(```|~~~)")
GENERATED = re.compile(r"<!-- generated: .*?<!-- end generated -->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
INLINE_CODE = re.compile(r"`(?:[^`\n]|\n(?![ \t]*\n))+`")
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
FLAG = re.compile(r"(?<![\w-])--[a-zA-Z][\w-]*")
KEY_VALUE = re.compile(r"`([a-z][a-z0-9_]*): [^`]+`")
REPO_PATH = re.compile(rf"(?<![\w./-])(?:{'|'.join(ROOTS)})/[\w./-]*")
UNITS = r"ns|µs|us|ms|s|sec|seconds?|min|minutes?|h|hours?|days?|[KMGT]i?B|[KMGT]?FLOP/s|tokens?/s|requests/s|calls/s|steps?/s"
FIGURE = re.compile(rf"(?<![\w.])\d+(?:[.,]\d+)*(?: (?:{UNITS})(?![\w/])|[KMGT]i?B\b|\s?%|x(?!\w))")
MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:tmp|root|home|work)(?:/|\b)")
PEER_VERSION = re.compile(rf"\b({'|'.join(PEERS)}|{'|'.join(p.lower() for p in PEERS)})(?: v?|==)(\d+\.\d+(?:\.\d+)*)\b")


class Problem(NamedTuple):
    page: str
    line: int
    kind: str  # flag | key | path | figure | paragraph | machine-path | version
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.kind}: {self.text}"


# ---- what the code knows --------------------------------------------------------------------------------------

def argument_keys() -> Set[str]:
    """Every field of every argument dataclass in alignment/config."""
    import alignment.config as config

    keys = set()
    for module in pkgutil.iter_modules(config.__path__):
        for value in vars(importlib.import_module(f"alignment.config.{module.name}")).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value):
                keys |= {f.name for f in dataclasses.fields(value)}
    return keys


def known_keys() -> Set[str]:
    """Argument-file keys the parser takes: our fields and the PaddleNLP / PaddleFormers keys it maps."""
    from alignment.config import paddleformers_table, paddlenlp_table

    return argument_keys() | set(paddlenlp_table.TABLE) | set(paddleformers_table.TABLE)


def _help_flags(main) -> Set[str]:
    """The long flags of a command's parser, read from its --help (the parsers are built inside main())."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(["--help"])
        except SystemExit:
            pass
    flags = set()
    for line in out.getvalue().splitlines():
        if re.match(r"^  -", line):
            flags |= set(FLAG.findall(re.split(r"\s{2,}", line.strip())[0]))
    return flags


def _literal_flags(path: str) -> Set[str]:
    """The strings of a file that are a flag and nothing else (`add_argument("--steps")`, `"--debug" in argv`):
    tools/, benchmarks/, examples/ build their own parsers."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and re.fullmatch(r"--[a-zA-Z][\w-]*", node.value)}


def known_flags() -> Set[str]:
    import alignment.commands as commands

    """Flags some parser takes: the commands' (read from their --help; `--key-name` and `--key_name` are one flag
    there, alignment/commands/tool_parser.py), every argument key as `--key_name` or `--key-name`, the flags the other programs of the
    repository read, and FOREIGN_FLAGS."""
    flags = {"--help"} | {f"--{spelling}" for key in known_keys() for spelling in (key, key.replace("_", "-"))}
    flags |= {flag for program in FOREIGN_FLAGS.values() for flag in program}
    for module in pkgutil.iter_modules(commands.__path__):
        main = getattr(importlib.import_module(f"alignment.commands.{module.name}"), "main", None)
        if main is not None:
            flags |= {spelling for flag in _help_flags(main)
                      for spelling in (flag, "--" + flag[2:].replace("-", "_"))}
    for folder in ("alignment", "tools", "benchmarks", "examples", "docsgen", os.path.join("tests", "scripts")):
        for path in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True):
            flags |= _literal_flags(path)
    return flags


def code_names() -> Set[str]:
    """The names the package's code reads as keys: its identifier-like string constants and its classes' fields
    (the `key: value` of a judge file, an environment's row, a request: not only argument files)."""
    names = set()
    for path in glob.glob(os.path.join(REPO, "alignment", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.add(node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


# ---- reading a page --------------------------------------------------------------------------------------------

def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))


def prose_lines(text: str) -> List[Optional[str]]:
    """The page's lines with code blocks, generated parts and HTML comments as None, inline code (which may run over
    a line break) and link targets blanked: what a reader takes as the page's own sentences and table cells."""
    text = GENERATED.sub(lambda m: _blank(m).replace(" ", "\x01"), text)  # \x01: a line of a generated part
    text = COMMENT.sub(_blank, text)
    raw = text.split("\n")
    code, fenced = [], False
    for line in raw:
        fence = bool(FENCE.match(line))
        code.append(fence or fenced or (bool(line) and set(line) <= {"\x01"}) or line.lstrip().startswith("--8<--"))
        fenced = fenced != fence
    prose = "\n".join("" if is_code else line for line, is_code in zip(raw, code))
    prose = LINK_TARGET.sub(_blank, INLINE_CODE.sub(_blank, prose)).replace("\x01", " ")
    return [None if is_code else line for line, is_code in zip(prose.split("\n"), code)]


def paragraphs(lines: List[Optional[str]], raw: List[str]) -> Iterable[tuple]:
    """(first line number, text) of each prose paragraph (a blank line of the page ends one): not a table, list,
    heading, admonition, image or HTML, not indented (list continuations, admonition bodies)."""
    start, block = 0, []
    for number, (line, original) in enumerate(zip(lines + [""], raw + [""]), 1):
        if line is None or not original.strip():
            if block and _is_prose(block[0]):
                yield start, " ".join(part.strip() for part in block)
            block = []
            continue
        if not block:
            start = number
        block.append(line)


def _is_prose(first: str) -> bool:
    stripped = first.strip()
    return not (first[:1].isspace() or re.match(r"([-*+]|\d+[.)])\s|#|\||!!!|\?\?\?|!\[|<|:::", stripped))


def _paragraph_problem(text: str) -> Optional[str]:
    text = text.strip()
    if text and text[0].islower():
        return f"starts lowercase: {text[:60]!r}"
    end = text.rstrip(")]*_\"' ")
    if end and end[-1] not in ".:!?":
        return f"ends without punctuation: {text[-60:]!r}"
    return None


# ---- the checks ------------------------------------------------------------------------------------------------

class Known(NamedTuple):
    flags: Set[str]
    keys: Set[str]   # argument-file keys
    names: Set[str]  # every key the code reads


@functools.lru_cache(maxsize=1)
def known() -> Known:
    return Known(known_flags(), known_keys(), known_keys() | code_names())


def _allowed(line: str, start: int, end: int, used: Set[str]) -> bool:
    """Whether an ALLOWED phrase of the line covers [start, end); marks the phrase used."""
    for phrase in ALLOWED:
        at = line.find(phrase)
        while at >= 0:
            if at <= start and end <= at + len(phrase):
                used.add(phrase)
                return True
            at = line.find(phrase, at + 1)
    return False


def _key_table_keys(line: str, previous: str, state: dict) -> List[str]:
    """The backticked names of the first cell of a table row whose table's first column is headed `key`."""
    if not line.startswith("|") or set(line) <= set("|-: "):
        return []
    first = line.strip().strip("|").split("|")[0].strip()
    if not previous.startswith("|"):
        state["key"] = first.lower() == "key"
        return []
    return re.findall(r"`([a-z][a-z0-9_]*)`", first) if state.get("key") else []


def check_page(page: str, text: str, used: Optional[Set[str]] = None) -> List[Problem]:
    """The problems of one page (`page` is its name in messages). `used` collects the ALLOWED phrases it used."""
    flags, keys, names = known()
    used = set() if used is None else used
    problems = []
    raw, prose, table = text.split("\n"), prose_lines(text), {}
    for number, (line, shown) in enumerate(zip(raw, prose), 1):
        def problem(kind: str, what: str) -> None:
            problems.append(Problem(page, number, kind, what))

        for flag in FLAG.findall(line):
            if flag not in flags and flag not in REFUSED_FLAGS:
                problem("flag", f"{flag}: no parser takes it")
        for key in KEY_VALUE.findall(line):
            if key not in names:
                problem("key", f"{key}: no parser reads it")
        for key in _key_table_keys(line, raw[number - 2] if number > 1 else "", table):
            if key not in keys and shown is not None:
                problem("key", f"{key}: in a key table, but no argument dataclass has it")
        for found in REPO_PATH.finditer(line):
            path, after = found.group(0), line[found.end():found.end() + 1]
            if not re.search(r"[<*{|]|\.\.\.", path + after) and not os.path.exists(os.path.join(REPO, path.rstrip(".,;:"))):
                problem("path", f"{path}: no such file or folder in the repository")
        for found in MACHINE_PATH.finditer(line):
            if not _allowed(line, found.start(), found.end(), used):
                problem("machine-path", f"{line[found.start():found.start() + 30]!r}: name it with a variable or "
                                        f"a path relative to the repository")
        for found in FIGURE.finditer(shown or ""):
            if not _allowed(line, found.start(), found.end(), used):
                context = shown[max(0, found.start() - 30):found.end() + 30].strip()
                problem("figure", f"{found.group(0)!r} typed by hand (in {context!r}): generate it from a result "
                                  f"file (<!-- generated: results ... -->)")
    for number, paragraph in paragraphs(prose, raw):
        why = _paragraph_problem(paragraph)
        if why:
            problems.append(Problem(page, number, "paragraph", why))
    return problems


def peer_versions(texts: Dict[str, str]) -> List[Problem]:
    """A peer named at two versions (neither a prefix of the other) across the pages."""
    canonical = {peer.lower(): peer for peer in PEERS}
    seen: Dict[str, Dict[str, tuple]] = {}
    for page, text in texts.items():
        for number, line in enumerate(text.split("\n"), 1):
            for peer, version in PEER_VERSION.findall(line):
                seen.setdefault(canonical[peer.lower()], {}).setdefault(version, (page, number))
    problems = []
    for peer, versions in seen.items():
        ordered = sorted(versions, key=len)
        for i, short in enumerate(ordered):
            for long in ordered[i + 1:]:
                if not (long + ".").startswith(short + "."):
                    other = versions[short]
                    problems.append(Problem(*versions[long], "version",
                                            f"{peer} {long} here, {peer} {short} at {other[0]}:{other[1]}"))
    return problems


def check(texts: Dict[str, str], used: Optional[Set[str]] = None) -> List[Problem]:
    """The problems of the pages `texts` ({name: text})."""
    used = set() if used is None else used
    return [p for page, text in texts.items() for p in check_page(page, text, used)] + peer_versions(texts)


def pages() -> List[str]:
    return sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)) + \
        [os.path.join(REPO, "README.md")]


def check_docs() -> List[Problem]:
    """The problems of docs/ and README.md, and every ALLOWED phrase none of them uses (the list stays tight)."""
    texts = {}
    for path in pages():
        with open(path, encoding="utf-8") as f:
            texts[os.path.relpath(path, REPO)] = f.read()
    used: Set[str] = set()
    problems = check(texts, used)
    return problems + [Problem("docsgen/claims.py", 0, "allowed", f"{phrase!r} is allowed but no page has it")
                       for phrase in ALLOWED if phrase not in used]


def main() -> int:
    problems = check_docs()
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    sys.exit(main())
