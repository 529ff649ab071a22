"""The configuration reference (docs/reference/config.md) lists every key of every argument dataclass of
alignment/config under its class, with its allowed values and PaddleNLP / PaddleFormers aliases, and the extension
classes page (docs/reference/extending.md) every registry and its base class; both are current (their generated
parts equal what docsgen/key_reference.py makes from the code now)."""
import dataclasses
import importlib
import os
import pkgutil
import re

import pytest

import alignment.config as config
from docsgen import blocks, key_reference
from tests.helpers import REPO

CONFIG = os.path.join(REPO, "docs", "reference", "config.md")
EXTENDING = os.path.join(REPO, "docs", "reference", "extending.md")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def argument_classes():
    """Every dataclass defined in a module of alignment/config (found here, not by the generator)."""
    found = []
    for module in pkgutil.iter_modules(config.__path__):
        name = f"alignment.config.{module.name}"
        found += [value for value in vars(importlib.import_module(name)).values()
                  if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == name]
    return found


def sections(text):
    """{heading of a `## ` section: {first-cell key: the row}} of a page."""
    found, current = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            current = found.setdefault(line[3:].strip(), {})
        elif current is not None and line.startswith("| `"):
            current[line.split("`")[1]] = line
    return found


def _same(a, b):
    return (a.default, a.metadata.get("help")) == (b.default, b.metadata.get("help")) and \
        (a.default_factory is dataclasses.MISSING) == (b.default_factory is dataclasses.MISSING)


def missing_keys(text, classes):
    """'Class.key' of every key not in the page: a key is in its class's section, or (inherited unchanged) in the
    section of a base class with the same default and help."""
    rows, missing = sections(text), []
    for cls in classes:
        for field in dataclasses.fields(cls):
            homes = [cls] + [base for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) and any(
                f.name == field.name and _same(f, field) for f in dataclasses.fields(base))]
            if not any(field.name in rows.get(home.__name__, {}) for home in homes):
                missing.append(f"{cls.__name__}.{field.name}")
    return missing


def row(text, cls_name, key):
    return sections(text)[cls_name][key]


def test_every_key_of_every_argument_class_is_in_the_reference():
    classes = argument_classes()
    assert len(classes) >= 15, "the argument classes were not found"
    assert missing_keys(read(CONFIG), classes) == []


def test_a_missing_key_is_found():
    text = read(CONFIG)
    without = "\n".join(line for line in text.splitlines() if not line.startswith("| `kl_coeff` |"))
    assert sorted(missing_keys(without, argument_classes())) == ["DistillPPOArguments.kl_coeff", "PPOArguments.kl_coeff"]
    without = "\n".join(line for line in text.splitlines() if not line.startswith("| `seed` |"))
    assert missing_keys(without, argument_classes()) == ["TrainingArguments.seed"]


def test_the_reference_pages_are_current():
    stale = [(page, part) for page, part in blocks.stale() if page.startswith("docs/reference/")]
    assert stale == [], "run python -m docsgen"
    for page, parts in ((CONFIG, {"key-reference"}), (EXTENDING, {"registries", "extension-classes"})):
        assert {m.group("spec") for m in blocks.BLOCK.finditer(read(page))} == parts


def test_every_stage_command_and_its_classes_are_listed():
    stages = key_reference.stage_classes()
    assert set(stages) == set(key_reference.STAGES)
    taken = {base for classes in stages.values() for cls in classes for base in cls.__mro__}  # mixins too
    assert set(argument_classes()) <= taken, "an argument class no stage takes"
    text = read(CONFIG)
    for command, classes in stages.items():
        line = next(line for line in text.splitlines() if line.startswith(f"| `{command}` |"))
        assert [name for name in re.findall(r"\[(\w+)\]", line)] == [cls.__name__ for cls in classes]


def test_allowed_values_are_the_registries_and_choices():
    from alignment.config.choices import LR_SCHEDULERS
    from alignment.config.registry import ADVANTAGE_ESTIMATORS, PREFERENCE_LOSSES

    text = read(CONFIG)
    estimators = key_reference.registered(ADVANTAGE_ESTIMATORS)
    assert {"gae", "grpo", "rloo", "reinforce_plus_plus"} <= set(estimators)
    assert ", ".join(f"`{name}`" for name in estimators) in row(text, "PPOArguments", "advantage_estimator")
    assert ", ".join(f"`{name}`" for name in LR_SCHEDULERS) in row(text, "TrainingArguments", "lr_scheduler_type")
    assert "`sigmoid`" in row(text, "DPOArguments", "loss_type")  # one key, two classes, two sets of values
    assert "| `sequence-wise`, `token-wise` |" in row(text, "RewardArguments", "loss_type")
    unpaired = [name for name in key_reference.registered(PREFERENCE_LOSSES) if not PREFERENCE_LOSSES[name].paired]
    assert f"| {', '.join(f'`{n}`' for n in unpaired)} |" in row(text, "KTOArguments", "loss_type")
    assert "| >= 0, < 1 |" in row(text, "TrainingArguments", "adam_beta1")
    fields = {(cls.__name__, f.name) for cls in argument_classes() for f in dataclasses.fields(cls)}
    assert not [name for name in key_reference.ALLOWED if tuple(name.split(".")) not in fields]


def test_entries_registered_outside_the_package_are_not_shown():
    from alignment.config.registry import ADVANTAGE_ESTIMATORS
    from alignment.ppo.rl_math.estimators import AdvantageEstimator

    before = key_reference.registered(ADVANTAGE_ESTIMATORS)
    try:
        class Halved(AdvantageEstimator):  # noqa: F841  (registers itself)
            NAME = "halved_for_the_docs_test"
        assert "halved_for_the_docs_test" in ADVANTAGE_ESTIMATORS
        assert key_reference.registered(ADVANTAGE_ESTIMATORS) == before
    finally:
        ADVANTAGE_ESTIMATORS.classes.pop("halved_for_the_docs_test", None)


def test_the_paddlenlp_and_paddleformers_aliases_are_shown_with_our_key():
    from alignment.config import paddleformers_table, paddlenlp_table

    text = read(CONFIG)
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    for table in (paddlenlp_table.TABLE, paddleformers_table.TABLE):
        for key, rule in table.items():
            if rule.kind == paddlenlp_table.ALIAS:
                ours = [line for line in rows if line.startswith(f"| `{rule.target}` |")]
                assert ours and all(f"`{key}`" in line.rsplit("|", 2)[1] for line in ours), (key, rule.target)
    assert "`rollout_n`" in row(text, "PPOArguments", "num_return_sequences")


@pytest.mark.parametrize("name, path", [
    ("Environment", "alignment/envs/base.py"), ("RawDataset", "alignment/data/raw.py"),
    ("PreferenceLoss", "alignment/dpo/losses.py"), ("DistillLoss", "alignment/ppo/rl_math/distill.py"),
    ("JudgeParser", "alignment/rewards/judge_parsers.py"), ("ToolCallFormat", "alignment/envs/formats.py"),
    ("AdvantageEstimator", "alignment/ppo/rl_math/estimators.py"), ("PolicyLoss", "alignment/ppo/rl_math/losses.py"),
    ("KLEstimator", "alignment/ppo/rl_math/kl.py"), ("EvalTask", "alignment/evaluation/tasks.py"),
    ("SandboxLimits", "alignment/envs/sandbox/runner.py"), ("Tool", "alignment/envs/tools.py")])
def test_the_extension_classes_page_names_each_class_its_module_and_docstring(name, path):
    import alignment

    text = read(EXTENDING)
    public = f"`from alignment import {name}`; defined in " if name in alignment.__all__ else ""
    match = re.search(rf"^##+ {name}\n\n{re.escape(public)}`[\w.]+\.{name}` \(`{re.escape(path)}`\)\n\n(.+)$",
                      text, re.M)
    assert match, name
    assert os.path.exists(os.path.join(REPO, path))
    assert len(match.group(1)) > 40 and "Base of a family's base class" not in match.group(1)


def test_every_registry_has_a_row_naming_its_base_class():
    from alignment.config import registry

    text = read(EXTENDING)
    names = [name for name, value in vars(registry).items() if isinstance(value, registry.Registry)]
    assert len(names) >= 11
    for name in names:
        assert re.search(rf"^\| `{name}` \| a (subclass of \[\w+\]|function decorated)", text, re.M), name
