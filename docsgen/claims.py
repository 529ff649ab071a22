"""The docs' claims checked against the repository (tests/test_docs_claims.py): every `--flag` is one some parser
takes, every argument key a key table or a `key: value` names is a field of an argument dataclass (or a PaddleNLP /
PaddleFormers key the parser maps), every repository path exists, no measured figure is typed outside a generated
part (docsgen/blocks.py), prose paragraphs start with a capital and end with punctuation, no page names a machine's
absolute or temporary path, and each peer library is named at one version. `python -m docsgen.claims` lists the
problems of docs/ and README.md."""
from __future__ import annotations

import ast
import contextlib
import dataclasses
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
    "visualdl": {"--logdir"},
}
# figures that are settings or assumptions, not measurements: (page, the text around the figure, why)
SETTING_FIGURES: Dict[tuple, str] = {}
PEERS = ("TRL", "transformers", "PaddleNLP", "PaddleFormers", "Paddle", "PaddlePaddle", "verl", "OpenRLHF", "torch",
         "PyTorch", "vLLM", "DeepSpeed", "MkDocs")
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
PEER_VERSION = re.compile(rf"\b({'|'.join(PEERS)}) v?(\d+\.\d+(?:\.\d+)*)\b")


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


def paragraphs(lines: List[Optional[str]]) -> Iterable[tuple]:
    """(first line number, text) of each prose paragraph: not a table, list, heading, admonition, image or HTML, not
    indented (list continuations, admonition bodies)."""
    start, block = 0, []
    for number, line in enumerate(lines + [""], 1):
        if line is None or not line.strip():
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
    if not text:
        return None
    if text[0].islower():
        return f"starts lowercase: {text[:60]!r}"
    end = text.rstrip(")]*_\"' ")
    if end and end[-1] not in ".:!?":
        return f"ends without punctuation: {text[-60:]!r}"
    return None


# ---- the checks ------------------------------------------------------------------------------------------------

def _path_exists(path: str) -> bool:
    path = path.rstrip(".,;:/")
    return os.path.exists(os.path.join(REPO, path))


def check_page(page: str, text: str, flags: Set[str], keys: Set[str], names: Set[str]) -> List[Problem]:
    """The problems of one page (`page` is its name in messages and the setting-figure list): a key table's keys
    (a table whose first column is headed `key`) must be argument keys, a `key: value` in code a key or a name the
    code reads."""
    problems = []
    raw = text.split("\n")
    prose = prose_lines(text)
    header_key = False
    for number, (line, shown) in enumerate(zip(raw, prose), 1):
        for flag in FLAG.findall(line):
            if flag not in flags:
                problems.append(Problem(page, number, "flag", f"{flag}: no parser takes it"))
        for key in KEY_VALUE.findall(line):
            if key not in keys and key not in names:
                problems.append(Problem(page, number, "key", f"{key}: no parser reads it"))
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if set(line) <= set("|-: "):
                pass
            elif number == 1 or not raw[number - 2].startswith("|"):
                header_key = cells[0].lower() == "key"
            elif header_key and shown is not None:
                for key in re.findall(r"`([a-z][a-z0-9_]*)`", cells[0]):
                    if key not in keys:
                        problems.append(Problem(page, number, "key", f"{key}: no argument dataclass has it"))
        for found in REPO_PATH.finditer(line):
            path, after = found.group(0), line[found.end():found.end() + 1]
            if not re.search(r"[<*{|.]", path + after.replace(".", "")) and not _path_exists(path):
                problems.append(Problem(page, number, "path", f"{path}: no such file or folder in the repository"))
        for found in MACHINE_PATH.finditer(line):
            problems.append(Problem(page, number, "machine-path", f"{line[found.start():found.start() + 30]!r}"))
        if shown is not None:
            for found in FIGURE.finditer(shown):
                context = shown[max(0, found.start() - 30):found.end() + 30].strip()
                if not any(p == page and phrase in line for p, phrase in SETTING_FIGURES):
                    problems.append(Problem(page, number, "figure", f"{found.group(0)!r} typed by hand "
                                                                     f"(in {context!r}): generate it from a result file"))
    for number, paragraph in paragraphs(prose):
        why = _paragraph_problem(paragraph)
        if why:
            problems.append(Problem(page, number, "paragraph", why))
    return problems


def peer_versions(texts: Dict[str, str]) -> List[Problem]:
    """A peer named at two versions (neither a prefix of the other) across the pages."""
    seen: Dict[str, Dict[str, tuple]] = {}
    for page, text in texts.items():
        for number, line in enumerate(text.split("\n"), 1):
            for peer, version in PEER_VERSION.findall(line):
                seen.setdefault(peer, {}).setdefault(version, (page, number))
    problems = []
    for peer, versions in seen.items():
        parts = sorted(versions, key=len)
        for i, short in enumerate(parts):
            for long in parts[i + 1:]:
                if not (long + ".").startswith(short + ".") and long != short:
                    page, number = versions[long]
                    other = versions[short]
                    problems.append(Problem(page, number, "version", f"{peer} {long} here, {peer} {short} at "
                                                                      f"{other[0]}:{other[1]}"))
    return problems


def pages() -> List[str]:
    return sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)) + \
        [os.path.join(REPO, "README.md")]


def check(texts: Dict[str, str]) -> List[Problem]:
    """The problems of the pages `texts` ({name: text})."""
    keys, flags, names = known_keys(), known_flags(), code_names()
    problems = [p for page, text in texts.items() for p in check_page(page, text, flags, keys, names)]
    return problems + peer_versions(texts)


def check_docs() -> List[Problem]:
    texts = {}
    for path in pages():
        with open(path, encoding="utf-8") as f:
            texts[os.path.relpath(path, REPO)] = f.read()
    return check(texts)


def main() -> int:
    problems = check_docs()
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    sys.exit(main())
