"""Registries of what users extend, one pattern for all: a family is a base class
`class Family(Registered, registry=SOME_REGISTRY)`, and a subclass that sets `NAME` (and optionally `ALIASES`) in
its own body registers itself under that name::

    class Halved(AdvantageEstimator):      # alignment/ppo/rl_math/estimators.py has the family and the built-ins
        NAME = "halved"
        def __call__(self, rollout, ppo, reduce_sum): ...

The registries are plain Python, so the arguments validate names (and read a class's traits, e.g. whether an
estimator needs a critic) without the framework. The classes live with the paddle code that runs them:

    ADVANTAGE_ESTIMATORS  advantage_estimator   alignment/ppo/rl_math/estimators.py
    POLICY_LOSSES         policy_loss_mode      alignment/ppo/rl_math/losses.py
    KL_ESTIMATORS         kl_estimator, kl_loss_estimator   alignment/ppo/rl_math/kl.py
    ENVIRONMENTS          (multi-turn rollouts)             alignment/envs/base.py
    TOOL_CALL_FORMATS     (multi-turn rollouts)             alignment/envs/formats.py
    DISTILL_LOSSES        distill_loss                      alignment/ppo/rl_math/distill.py
    PREFERENCE_LOSSES     loss_type (DPO family, KTO)       alignment/dpo/losses.py
    JUDGE_PARSERS         (a model judge's `parser`)        alignment/rewards/judge_parsers.py
    REWARD_FUNCTIONS      reward_funcs, gold_judge          alignment/rewards/judges.py, rules.py
    DATASETS              train_datasets, eval_datasets     alignment/data/raw.py, builtin.py, paddlenlp_files.py
    EVAL_TASKS            eval_tasks, alignment-eval --task  alignment/evaluation/tasks.py
    TRACKERS              report_to                         alignment/training/trackers/

A registry of functions (reward functions: `fn(prompts, completions, **labels)`) takes them by decorator, under
the name they are written as::

    @REWARD_FUNCTIONS.function("sentiment")
    def sentiment(prompts, completions, **labels): ...

A stage imports its built-ins before it parses its arguments (alignment/ppo/rl_math/registrations.py,
alignment/dpo/losses.py); a user's class registers when its module is imported.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar, Dict, List, Optional


class Registry:
    """name -> class (or function) for one family; `what` names the family in messages."""

    def __init__(self, what: str, forbidden: str = ","):
        self.what = what
        self.forbidden = forbidden  # characters a name may not hold (a list separator, a path's ':')
        self.classes: Dict[str, Any] = {}

    def register(self, cls: type) -> None:
        """Register a class under its NAME and its ALIASES (both read from its own body); every name is checked
        before any registers, so a class refused registers under none."""
        aliases = cls.__dict__.get("ALIASES", ())
        if isinstance(aliases, str):
            raise TypeError(f"{cls.__qualname__}.ALIASES must be a tuple of names, not a string")
        names = (cls.__dict__["NAME"], *aliases)
        for name in names:
            self._check(name, cls)
        for name in names:
            self.classes[name] = cls

    def function(self, name: str) -> Callable[[Callable], Callable]:
        """A decorator registering a function as `name`; it returns the function unchanged."""
        def register(fn: Callable) -> Callable:
            self.add(name, fn)
            return fn
        return register

    def add(self, name: str, entry) -> None:
        """Register a class or function as `name`; a name another module's entry holds is refused."""
        self._check(name, entry)
        self.classes[name] = entry  # a reloaded module redefines the same class: it replaces itself

    def _check(self, name: str, entry) -> None:
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(f"{entry.__qualname__}: invalid {self.what} name {name!r}")
        if any(char in name for char in self.forbidden):
            raise ValueError(f"{entry.__qualname__}: {self.what} name {name!r} may not contain "
                             f"{' or '.join(repr(char) for char in self.forbidden)}")
        existing = self.classes.get(name)
        if existing is not None and (existing.__module__, existing.__qualname__) != (entry.__module__,
                                                                                     entry.__qualname__):
            raise ValueError(f"{self.what} {name!r} is already registered by {existing.__module__}."
                             f"{existing.__qualname__}; cannot register {entry.__module__}.{entry.__qualname__}")

    def names(self, where: Optional[Callable[[type], bool]] = None) -> List[str]:
        """The registered names (of the entries `where` accepts), in the order they registered."""
        return [name for name, cls in self.classes.items() if where is None or where(cls)]

    def lookup(self, name: str) -> type:
        """The class registered as `name`; a one-line ValueError listing the registered names otherwise."""
        try:
            return self.classes[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.what} {name!r}; registered: {', '.join(sorted(self.classes))}") from None

    def __contains__(self, name) -> bool:
        return name in self.classes

    def __getitem__(self, name: str) -> type:
        return self.classes[name]

    def check(self, key: str, name, where: Optional[Callable[[type], bool]] = None) -> None:
        """ValueError naming argument `key` unless `name` is registered (and `where` accepts its class)."""
        if name not in self.classes or (where is not None and not where(self.classes[name])):
            raise ValueError(f"key {key!r} must be one of {self.names(where)}, got {name!r}")


class Registered:
    """Base of a family's base class; see the module docstring."""

    NAME: ClassVar[str]
    REGISTRY: ClassVar[Registry]

    def __init_subclass__(cls, registry: Optional[Registry] = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if registry is not None:
            cls.REGISTRY = registry
        if "NAME" in cls.__dict__:
            cls.REGISTRY.register(cls)

    @classmethod
    def lookup(cls, name: str) -> type:
        return cls.REGISTRY.lookup(name)

    @classmethod
    def registered_names(cls) -> List[str]:
        return sorted(cls.REGISTRY.classes)


ADVANTAGE_ESTIMATORS = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator")
ENVIRONMENTS = Registry("environment")
TOOL_CALL_FORMATS = Registry("tool-call format")
DISTILL_LOSSES = Registry("distillation loss")
PREFERENCE_LOSSES = Registry("preference loss")
JUDGE_PARSERS = Registry("judge parser")
REWARD_FUNCTIONS = Registry("reward function")
DATASETS = Registry("dataset", forbidden=":,")  # ':' separates a dataset's name from its path in specs
EVAL_TASKS = Registry("evaluation task", forbidden=":,")  # ',' separates eval_tasks, ':' a file task's path
TRACKERS = Registry("tracker", forbidden=", ")  # report_to lists them separated by commas or spaces
