"""The PaddleNLP / PaddleFormers key tables of docs/paddlenlp.md, made from `alignment/config/paddlenlp_table.py`
and `paddleformers_table.py` (the tables the argument parser applies), so the page cannot drift from the code."""
from __future__ import annotations

from typing import Dict

from alignment.config import paddleformers_table, paddlenlp, paddlenlp_table
from alignment.config.paddlenlp_table import ALIAS, NOTICE, REFUSE, Rule

KIND = {ALIAS: "honoured as", NOTICE: "accepted (notice)", REFUSE: "refused"}
# a value and the other keys that make a value-dependent note speak (a recompute granularity with recompute on, ...)
PROBE = {"recompute": True, "critic_recompute": True, "tensor_parallel_degree": 2, "max_length": 128}


def note_text(rule: Rule) -> str:
    """The rule's note; a note that depends on the value is shown for a placeholder value `VALUE`."""
    if not callable(rule.note):
        return rule.note
    try:
        text = rule.note("VALUE", PROBE)
    except (TypeError, ValueError):
        text = None
    return f"depends on the value, e.g. {text}" if text else "depends on the value"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(rules: Dict[str, Rule]) -> str:
    lines = ["| key | kind | our key | what happens |", "| --- | --- | --- | --- |"]
    for key in sorted(rules, key=lambda k: (list(KIND).index(rules[k].kind), k)):
        rule = rules[key]
        target = f"`{rule.target}`" if rule.target else ""
        lines.append(f"| `{key}` | {KIND[rule.kind]} | {target} | {_cell(note_text(rule))} |")
    return "\n".join(lines)


def paddlenlp_keys() -> str:
    return table(paddlenlp_table.TABLE)


def paddleformers_keys() -> str:
    return table(paddleformers_table.TABLE)


def counts() -> str:
    kinds = paddlenlp.kinds()
    return (f"Of the {len(paddlenlp.TABLE)} keys of PaddleNLP and PaddleFormers that are not already ours, "
            f"{kinds[ALIAS]} are honoured under our names, {kinds[NOTICE]} accepted (when the value asks for something "
            f"this toolkit does not do, one `notice:` line on rank 0 says why that changes nothing here or what runs "
            f"instead) and {kinds[REFUSE]} refused when their value would change results (the error names the key "
            f"and the alternative).")
