"""The configuration reference (docs/reference/config.md) and the extension classes (docs/reference/extending.md),
made from the code when the pages are generated: every argument dataclass of alignment/config with the stages whose
parser takes it (read by running each stage's entry point up to its parse), every key's type, default and help text
(what `--help` prints), its allowed values (a range, a choice tuple, or the names a registry holds now), and the
PaddleNLP / PaddleFormers keys the parser honours as it; then each registry's base class, its module and the first
paragraph of its docstring. Reading the stages and registries imports paddle."""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import pkgutil
import re
import typing
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from unittest import mock

# the stage commands (pyproject.toml [project.scripts]) and the entry point whose main() parses their arguments
STAGES = {"alignment-sft": "alignment.sft.run_sft", "alignment-rm": "alignment.rm.run_reward",
          "alignment-ppo": "alignment.ppo.run_ppo", "alignment-distill": "alignment.ppo.run_distill",
          "alignment-dpo": "alignment.dpo.run_dpo", "alignment-kto": "alignment.dpo.run_kto"}
# the modules that register the built-in entries of the registries (alignment/config/registry.py's table)
BUILTINS = ("alignment.ppo.rl_math.registrations", "alignment.dpo.losses", "alignment.data", "alignment.envs",
            "alignment.envs.adapters", "alignment.rewards.judges", "alignment.rewards.rules",
            "alignment.rewards.judge_parsers", "alignment.evaluation.tasks", "alignment.training.trackers")
# classes users build or subclass that are no registry's base class
OTHER_CLASSES = ("alignment.envs.tools.Tool", "alignment.envs.sandbox.runner.SandboxLimits")


def _registry(name: str, where: Optional[Callable[[type], bool]] = None) -> Callable[[], List[str]]:
    def names() -> List[str]:
        from alignment.config import registry
        return registered(getattr(registry, name), where)
    names.registry = name
    return names


def _choices(module: str, name: str) -> Callable[[], List[str]]:
    return lambda: [value for value in getattr(importlib.import_module(module), name)]


CHOICES = "alignment.config.choices"
# the keys that name a registry entry or one of a few values, as "Class.key" (a subclass's keys find their base's)
ALLOWED: Dict[str, Callable[[], List[str]]] = {
    "TrainingArguments.lr_scheduler_type": _choices(CHOICES, "LR_SCHEDULERS"),
    "TrainingArguments.sharding": _choices(CHOICES, "SHARDING_STAGES"),
    "TrainingArguments.report_to": _registry("TRACKERS"),
    "TrainingArguments.wandb_mode": _choices("alignment.config.training", "WANDB_MODES"),
    "TrainingArguments.fp16_opt_level": lambda: ["O1", "O2"],  # TrainingArguments.validate
    "DataArguments.train_datasets": _registry("DATASETS"),
    "DataArguments.eval_datasets": _registry("DATASETS"),
    "DataArguments.chat_template": lambda: [None, "none"],  # DataArguments.validate
    "PPODataArguments.ptx_datasets": _registry("DATASETS"),
    "PPOArguments.advantage_estimator": _registry("ADVANTAGE_ESTIMATORS"),
    "PPOArguments.policy_loss_mode": _registry("POLICY_LOSSES"),
    "PPOArguments.kl_estimator": _registry("KL_ESTIMATORS", lambda kl: not kl.loss_only),
    "PPOArguments.kl_loss_estimator": _registry("KL_ESTIMATORS"),
    "PPOArguments.loss_agg_mode": _choices(CHOICES, "LOSS_AGG_MODES"),
    "PPOArguments.reward_funcs": _registry("REWARD_FUNCTIONS"),
    "PPOArguments.gold_judge": _registry("REWARD_FUNCTIONS"),
    "PPOArguments.critic_lr_scheduler_type": _choices(CHOICES, "LR_SCHEDULERS"),
    "PPOArguments.rollout_decode": _choices(CHOICES, "ROLLOUT_DECODES"),
    "PPOArguments.eval_mode": _choices(CHOICES, "EVAL_MODES"),
    "PPOArguments.offload_level": _choices(CHOICES, "OFFLOAD_LEVELS"),
    "DistillArguments.distill_loss": _registry("DISTILL_LOSSES"),
    "EnvironmentArguments.environment": _registry("ENVIRONMENTS"),
    "EnvironmentArguments.episode_schedule": _choices(CHOICES, "EPISODE_SCHEDULES"),
    "EvaluationArguments.eval_tasks": _registry("EVAL_TASKS"),
    "MonitorArguments.monitor_action": _choices("alignment.config.monitors", "MONITOR_ACTIONS"),
    "DPOArguments.loss_type": _registry("PREFERENCE_LOSSES"),
    "KTOArguments.loss_type": _registry("PREFERENCE_LOSSES", lambda loss: not loss.paired),
    "RewardArguments.loss_type": _choices(CHOICES, "REWARD_LOSS_TYPES"),
    "RewardArguments.normalizer_type": _choices(CHOICES, "NORMALIZER_TYPES"),
}
# what names the entries of the registries no argument key names
NAMED_BY = {"TOOL_CALL_FORMATS": "`environment_args` `{\"format\": NAME}`",
            "JUDGE_PARSERS": "a model judge's `parser`"}
SIGNS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


# ---- what the code holds ----------------------------------------------------------------------------------------

def load_builtins() -> None:
    for module in BUILTINS:
        importlib.import_module(module)


def registered(registry, where: Optional[Callable[[type], bool]] = None) -> List[str]:
    """The registry's built-in names, sorted (entries of tests and users' modules, registered in this process, are
    left out: the page shows what a fresh run has)."""
    load_builtins()
    return sorted(name for name, entry in registry.classes.items()
                  if entry.__module__.startswith("alignment.") and (where is None or where(entry)))


@functools.lru_cache(maxsize=1)
def stage_classes() -> Dict[str, Tuple[type, ...]]:
    """{command: the argument classes its parser takes}, read by running each entry point's main() up to the call
    that parses (alignment/training/setup.py's parse_arguments), which records its classes instead."""
    from alignment.training import setup

    class Parsed(Exception):
        pass

    found = {}
    for command, module in STAGES.items():
        def record(argv, *dataclass_types, command=command):
            found[command] = dataclass_types
            raise Parsed
        with mock.patch.object(setup, "parse_arguments", record):
            try:
                importlib.import_module(module).main([])
            except Parsed:
                pass
    return found


def argument_classes() -> List[type]:
    """Every argument dataclass of alignment/config: the stages' in the order they first take them, then any
    other (no stage takes it)."""
    import alignment.config as config

    defined = []
    for module in pkgutil.iter_modules(config.__path__):
        name = f"alignment.config.{module.name}"
        defined += [value for value in vars(importlib.import_module(name)).values()
                    if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == name]
    taken = list(dict.fromkeys(cls for classes in stage_classes().values() for cls in classes))
    mixins = [cls for cls in defined if cls not in taken and any(issubclass(t, cls) for t in taken)]
    ordered = []
    for cls in taken:  # a mixin (a base no stage takes itself) just before the first class built on it
        ordered += [m for m in mixins if m in cls.__mro__ and m not in ordered] + [cls]
    ordered = list(dict.fromkeys(ordered + sorted(defined, key=lambda cls: cls.__name__)))
    return [cls for cls in ordered if cls in defined]


def own_fields(cls: type) -> List[dataclasses.Field]:
    """The fields a class adds or redefines (a different default or help) over its argument-class bases."""
    bases = {f.name: f for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
    return [f for f in dataclasses.fields(cls) if f.name not in bases or
            (_default(f), f.metadata.get("help")) != (_default(bases[f.name]), bases[f.name].metadata.get("help"))]


def aliases() -> Dict[str, List[str]]:
    """{our key: the PaddleNLP / PaddleFormers keys honoured as it (alignment/config/paddlenlp_table.py, ...)}."""
    from alignment.config import paddleformers_table, paddlenlp_table

    found: Dict[str, List[str]] = {}
    for table, whose in ((paddlenlp_table.TABLE, ""), (paddleformers_table.TABLE, " (PaddleFormers)")):
        for key, rule in sorted(table.items()):
            if rule.kind == paddlenlp_table.ALIAS and rule.target:
                found.setdefault(rule.target, []).append(f"`{key}`{whose}")
    return found


def allowed_values(cls: type, key: str) -> Optional[List]:
    for base in cls.__mro__:
        names = ALLOWED.get(f"{base.__name__}.{key}")
        if names is not None:
            return names()
    return None


# ---- the tables -------------------------------------------------------------------------------------------------

def text(value: str) -> str:
    """Code's text (a help text, a docstring) as Markdown that shows it as written: outside its `code` spans,
    characters Markdown would read are escaped and dunder names quoted; rST's roles and `::` become Markdown."""
    value = re.sub(r":\w+:`", "`", " ".join(value.replace("``", "`").split()))
    parts = value.split("`")
    for i in range(0, len(parts), 2):  # the parts outside code spans
        part = re.sub(r"[\\*{}]", lambda m: "\\" + m.group(0), parts[i]).replace("<", "&lt;")
        parts[i] = re.sub(r"(?<!\w)(__\w+__)", r"`\1`", part)
    value = "`".join(parts)
    return value[:-2] + "." if value.endswith("::") else value


def cell(value: str) -> str:
    return text(value).replace("|", "\\|")


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def _code(value) -> str:
    return "`null`" if value is None else f"`{json.dumps(value) if not isinstance(value, str) else value}`"


def allowed_cell(cls: type, f: dataclasses.Field) -> str:
    bounds = [f"{SIGNS[kind]} {bound}" for kind, bound in f.metadata.get("range", {}).items()]
    parts = [", ".join(bounds)] if bounds else []
    names = allowed_values(cls, f.name)
    if names is not None:
        parts.append(", ".join(_code(name) for name in names))
    return "; ".join(parts)


def key_row(cls: type, f: dataclasses.Field, hints: dict, alias: Dict[str, List[str]]) -> str:
    from alignment.config.parser import _readable_type  # the type as --help names it

    default = _default(f)
    default = "required" if default is dataclasses.MISSING else f"`{json.dumps(default)}`"
    return (f"| `{f.name}` | {cell(_readable_type(hints[f.name]))} | {cell(default)} | {allowed_cell(cls, f)} | "
            f"{cell(f.metadata.get('help', ''))} | {', '.join(alias.get(f.name, []))} |")


HEADER = ["| key | type | default | allowed | help | PaddleNLP / PaddleFormers key |",
          "| --- | --- | --- | --- | --- | --- |"]


def class_section(cls: type, alias: Dict[str, List[str]]) -> List[str]:
    takes = [f"`{command}`" for command, classes in stage_classes().items() if cls in classes] or [
        f"`{command}`" for command, classes in stage_classes().items()  # a mixin: the stages of its classes
        if any(issubclass(taken, cls) for taken in classes)]
    module = cls.__module__.replace(".", "/") + ".py"
    doc = " ".join((cls.__doc__ or "").split())
    lines = ["", f"## {cls.__name__}", "", f"{text(doc)} Defined in `{module}`; taken by "
             f"{', '.join(takes) if takes else 'no stage'}."]
    fields, hints = own_fields(cls), typing.get_type_hints(cls)
    base = next((b for b in cls.__mro__[1:] if dataclasses.is_dataclass(b)), None)
    if base is not None:
        lines.append(f"Its other {len(dataclasses.fields(cls)) - len(fields)} keys are those of "
                     f"[{base.__name__}](#{base.__name__.lower()}); the keys it adds or changes:")
    sections, started = cls.__dict__.get("HELP_SECTIONS", {}), False  # --help's headings, by their first key
    for f in fields:
        if f.name in sections or not started:
            lines += (["", f"### {sections[f.name]}", ""] if f.name in sections else [""]) + HEADER
            started = True
        lines.append(key_row(cls, f, hints, alias))
    return lines


def key_reference() -> str:
    """The stages' table, then one section per argument class with a table of its keys (split by its --help
    sections)."""
    classes, alias = argument_classes(), aliases()
    lines = ["| command | entry point | argument classes |", "| --- | --- | --- |"]
    for command, taken in stage_classes().items():
        path = STAGES[command].replace(".", "/") + ".py"
        lines.append(f"| `{command}` | `{path}` | " +
                     ", ".join(f"[{cls.__name__}](#{cls.__name__.lower()})" for cls in taken) + " |")
    for cls in classes:
        lines += class_section(cls, alias)
    return "\n".join(lines)


# ---- the extension classes --------------------------------------------------------------------------------------

def first_paragraph(cls: type) -> str:
    """The first paragraph of the class's own docstring (not one inherited or made by dataclasses), else of its
    module's."""
    doc = cls.__dict__.get("__doc__") or ""
    if not doc or doc.startswith(cls.__name__ + "("):
        doc = "Its module's docstring: " + (inspect.getmodule(cls).__doc__ or "").strip()
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def family_bases() -> List[type]:
    """The base class of every registry family (a class given `registry=` in its bases), in the package."""
    from alignment.config.registry import Registered

    load_builtins()
    found, todo = [], list(Registered.__subclasses__())
    while todo:
        cls = todo.pop(0)
        if "REGISTRY" in cls.__dict__ and cls.__module__.startswith("alignment.") and cls not in found:
            found.append(cls)
        todo += cls.__subclasses__()
    return sorted(found, key=lambda cls: cls.__name__)


def _keys_naming(registry_name: str) -> List[str]:
    return sorted({name.split(".")[1] for name, names in ALLOWED.items()
                   if getattr(names, "registry", None) == registry_name})


def registries() -> str:
    """One row a registry: what extends it, the argument keys that name its entries, its built-in names."""
    from alignment.config import registry as module

    bases = {cls.REGISTRY: cls for cls in family_bases()}
    lines = ["| registry | extend it with | named by | built in |", "| --- | --- | --- | --- |"]
    for name, value in vars(module).items():
        if isinstance(value, module.Registry):
            base = bases.get(value)
            how = (f"a subclass of [{base.__name__}](#{base.__name__.lower()}) with a `NAME`" if base else
                   f"a function decorated `@{name}.function(NAME)`")
            keys = ", ".join(f"`{key}`" for key in _keys_naming(name)) or NAMED_BY.get(name, "")
            lines.append(f"| `{name}` | {how} | {keys} | {', '.join(_code(n) for n in registered(value))} |")
    return "\n".join(lines)


def _section(cls: type) -> List[str]:
    import alignment

    module = inspect.getmodule(cls).__name__
    where = f"`{module}.{cls.__name__}` (`{module.replace('.', '/')}.py`)"
    if cls.__name__ in alignment.__all__:
        where = f"`from alignment import {cls.__name__}`; defined in {where}"
    return ["", f"## {cls.__name__}", "", where, "", text(first_paragraph(cls))]


def extension_classes() -> str:
    """A section per registry base class, then the other classes users build, each with its module and the first
    paragraph of its docstring."""
    lines = []
    for cls in family_bases():
        lines += _section(cls)
    lines += ["", "## Other classes users build"]
    for path in OTHER_CLASSES:
        module, name = path.rsplit(".", 1)
        lines += [line.replace("## ", "### ", 1) if line.startswith("## ") else line
                  for line in _section(getattr(importlib.import_module(module), name))]
    return "\n".join(lines).strip("\n")


GENERATORS = {"key-reference": key_reference, "registries": registries, "extension-classes": extension_classes}

