"""PaddleNLP's argument files, read as they are: every key of PaddleNLP's `TrainingArguments` (with the LLM
model switches its `llmmetaclass` adds) and of its RLHF (`llm/alignment/ppo`, `paddlenlp/rl`), reward-model and DPO
argument classes is known here. `translate()` runs before the parser converts values; each PaddleNLP key is

    alias    honoured: its value moves to our key of the same meaning (rollout_n -> num_return_sequences), converted
             where PaddleNLP counts differently (rl_algorithm, evaluation_strategy, global_batch_size, ...)
    notice   accepted; when its value asks for something this toolkit does not do, one line says why that changes
             nothing here (a fused kernel, a communication switch) or what runs instead
    refuse   its value would change results and cannot be honoured: an error naming the key and the alternative

A value that asks for nothing (false, "", -1, null, PaddleNLP's no-op default) is accepted silently. Keys that are
already ours (learning_rate, bf16, ...) are not in the table; a few of them take PaddleNLP's spellings of their
values (-1 degrees, null limits, "O0", space-separated op lists, `use_fusemt: 1`), see `OWN_VALUES`.
A PaddleNLP key given together with our key of the same meaning and a different value is an error naming both.
Plain Python: no framework imports (alignment.config is the bottom layer).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Tuple

from alignment.config import paddleformers_table, paddlenlp_table
from alignment.config.paddlenlp_table import ALIAS, NOTICE, REFUSE, RL_ALGORITHMS
from alignment.config.paddlenlp_values import (as_flag, as_number, asks_nothing, data_world_size, get_int, get_set,
                                               one_epoch, same_value)

TABLE = {**paddlenlp_table.TABLE, **paddleformers_table.TABLE}  # PaddleNLP's keys, and PaddleFormers' renames

# --- keys that are ours, written PaddleNLP's way --------------------------------------------------------------------

def _own_degree(ctx, key, value):
    if as_number(value) == -1:
        ctx.values[key] = 1  # PaddleNLP's "not used"


def _own_unset_limit(ctx, key, value):
    if value is None or (isinstance(value, str) and not value.strip()):
        ctx.values[key] = 0  # PaddleNLP's null save_total_limit: keep all


def _own_unset(ctx, key, value):
    if value is None or (isinstance(value, str) and not value.strip()):
        del ctx.values[key]  # PaddleNLP's null eval_steps: our default (and evaluation_strategy) decide


def _own_op_list(ctx, key, value):
    if isinstance(value, str) and not value.strip().startswith("["):
        ctx.values[key] = [op for op in value.replace(",", " ").split() if op]  # "reduce_sum softmax ..."


def _own_opt_level(ctx, key, value):
    if isinstance(value, str) and value.strip().upper() == "O0":
        ctx.values[key] = "O1"
        amp = [k for k in ("bf16", "fp16") if as_flag(ctx.src.get(k, False))]
        for k in amp:
            ctx.values[k] = False
        if amp:
            ctx.notice(key, f"O0 is float32: {' and '.join(amp)} mixed precision is off")


def _own_sharding(ctx, key, value):
    stage = str(value).strip()
    if stage not in ("stage2", "stage3"):
        return
    if get_int(ctx.src, "sharding_parallel_degree", -1) == 1:  # PaddleNLP: "sharding_parallel_degree=1 means no
        ctx.values[key] = ""                                   # sharding"
        ctx.notice(key, f"{stage!r} with sharding_parallel_degree 1 shards nothing; the run is unsharded "
                        "(PaddleNLP does the same)")


def _own_fusemt(ctx, key, value):
    if as_flag(value):
        ctx.values[key] = False
        ctx.notice(key, TABLE["use_fusemt"].note)


def _own_report_to(ctx, key, value):
    """PaddleNLP's and HF's spellings -> a list of tracker names: null -> PaddleNLP's default (VisualDL), 'none'
    -> [], a comma- or space-separated string -> its names (the trackers' registry checks them at the start)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        ctx.values[key] = ["visualdl"]
        return
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = json.loads(value)  # a JSON list on the command line
        except ValueError:
            return  # the parser names the bad JSON
    names = value if isinstance(value, list) else str(value).replace(",", " ").split()
    names = [str(name).strip().lower() for name in names if str(name).strip()]
    ctx.values[key] = [] if names == ["none"] else names


def _own_reward_server(ctx, key, value):
    if as_flag(ctx.src.get("use_rm_server")) is False and not asks_nothing(value):
        del ctx.values[key]  # PaddleNLP files keep the address with use_rm_server false
        ctx.notice(key, f"use_rm_server is false, so {value!r} is not used")


def _own_ptx_coeff(ctx, key, value):
    if (as_number(value) or 0) > 0 and asks_nothing(ctx.src.get("ptx_datasets")):
        ctx.values[key] = 0.0  # PaddleNLP trains the ptx loss only when there is ptx data
        ctx.notice(key, f"{value} weighs a ptx loss on ptx_datasets, and none are given: no ptx loss is trained "
                        "(PaddleNLP skips it too)")


def _own_best_model(ctx, key, value):
    if as_flag(value) and str(ctx.src.get("evaluation_strategy", "")).strip().lower() == "no":
        ctx.values[key] = False  # PaddleNLP accepts it with evaluation and save strategies 'no': nothing to pick
        ctx.notice(key, "evaluation_strategy 'no' evaluates nothing during training, so there is no best model to "
                        "keep: the final model is the last step's (as in PaddleNLP)")


OWN_VALUES: Dict[str, Callable] = {
    "tensor_parallel_degree": _own_degree, "pipeline_parallel_degree": _own_degree,
    "save_total_limit": _own_unset_limit, "eval_steps": _own_unset,
    "amp_custom_white_list": _own_op_list, "amp_custom_black_list": _own_op_list,
    "fp16_opt_level": _own_opt_level, "sharding": _own_sharding, "use_fusemt": _own_fusemt,
    "report_to": _own_report_to, "reward_server": _own_reward_server, "ptx_coeff": _own_ptx_coeff,
    "load_best_model_at_end": _own_best_model,
}


# --- the keys PaddleNLP computes from others ------------------------------------------------------------------------

STRATEGIES = ("no", "steps", "epoch")


def _rl_algorithm(ctx, key, value):
    name = str(value).strip().lower()
    if name not in RL_ALGORITHMS:
        return ctx.problem(key, f"must be one of {list(RL_ALGORITHMS)}, got {value!r}")
    if not ctx.alias(key, "advantage_estimator", RL_ALGORITHMS[name]) or name != "grpo":
        return
    # PaddleNLP's grpo: no KL in the reward (use_kl_in_reward is false; the KL is kl_loss_coeff's loss term), and
    # normalize_reward / normalize_advantage are switched off
    for flag_key, off in (("kl_coeff", 0.0), ("normalize_reward", False), ("normalize_advantage", False)):
        given = ctx.src.get(flag_key)
        ctx.values[flag_key] = off
        if given is not None and not asks_nothing(given):
            ctx.notice(flag_key, f"PaddleNLP's grpo does not use {flag_key} {given!r}; it is set to {off} "
                                 "(rl_algorithm grpo)")


def _strategy(target: str):
    def handle(ctx, key, value):
        name = str(value).strip().lower()
        if name not in STRATEGIES:
            return ctx.problem(key, f"must be one of {list(STRATEGIES)}, got {value!r}")
        given = ctx.src.get(target)
        if name == "steps":
            steps = given if as_number(given) else (
                get_set(ctx.src, "logging_steps", 10) if target == "eval_steps" else 500)  # PaddleNLP's fallbacks
            ctx.values[target] = steps
        else:
            ctx.values[target] = 0
            if name == "epoch" and not one_epoch(ctx.src):
                what = "evaluates" if target == "eval_steps" else "saves step checkpoints"
                ctx.notice(key, f"this toolkit {what} every {target} steps, not per epoch: only at the end of this "
                                f"run (set {target} to the steps of one epoch)")
        ctx.origin[target] = key
    return handle


def _global_batch(ctx, key, value):
    number, world = as_number(value), data_world_size(ctx.src)
    if number is None or number < 1 or not number.is_integer():
        return ctx.problem(key, f"must be a positive integer, got {value!r}")
    if number % world:
        return ctx.problem(key, f"{int(number)} prompts do not divide over {world} data-parallel processes")
    ctx.alias(key, "per_device_prompt_batch_size", int(number) // world)


def _global_mini_batch(ctx, key, value):
    number = as_number(value)
    if number is None or not number.is_integer() or number == 0 or number < -1:
        return ctx.problem(key, f"must be a positive integer or -1, got {value!r}")
    if number == -1:
        number = as_number(get_set(ctx.src, "global_batch_size", 8)) or 8  # PaddleNLP: -1 = global_batch_size
    n = get_int(ctx.src, "rollout_n", get_int(ctx.src, "num_return_sequences", 1))
    steps = int(number) * n * get_int(ctx.src, "update_iters", 1) // max(
        get_int(ctx.src, "per_device_train_batch_size", 8), 1) // data_world_size(ctx.src)
    ctx.alias(key, "gradient_accumulation_steps", max(steps, 1))  # PaddleNLP's formula, at least 1


def _rule_reward(ctx, key, value):
    if not as_flag(value):
        return
    if not ctx.alias(key, "reward_funcs", ["gsm8k"]):
        return
    # PaddleNLP scores with the rule when use_rule_reward is true, before asking a reward model or server
    for other in ("use_rm_server", "reward_server", "reward_model_name_or_path"):
        if not asks_nothing(ctx.values.get(other)):
            ctx.notice(other, f"use_rule_reward is true, so the gsm8k rule reward scores and {other} "
                              f"{ctx.values.pop(other)!r} is not used (as in PaddleNLP)")


SPECIAL: Dict[str, Callable] = {
    "rl_algorithm": _rl_algorithm, "use_rule_reward": _rule_reward, "evaluation_strategy": _strategy("eval_steps"),
    "save_strategy": _strategy("save_steps"), "global_batch_size": _global_batch,
    "global_mini_batch_size": _global_mini_batch, "mini_batch_size": _global_mini_batch,
    **paddleformers_table.SPECIAL,
}


# --- translation ----------------------------------------------------------------------------------------------------

class _Context:
    def __init__(self, values: dict, known):
        self.src, self.values, self.known = dict(values), dict(values), set(known)
        self.notices: List[str] = []
        self.problems: List[str] = []
        self.origin: Dict[str, str] = {}  # our key -> the PaddleNLP key that set it

    def notice(self, key: str, text: str) -> None:
        line = f"notice: key {key!r}: {text}"
        if line not in self.notices:
            self.notices.append(line)

    def problem(self, key: str, text: str) -> None:
        self.problems.append(f"key {key!r}: {text}")

    def alias(self, key: str, target: str, value) -> bool:
        """Set our key `target` from PaddleNLP's `key`; False (and a problem) when that contradicts another key."""
        if target not in self.known:
            self.problem(key, f"PaddleNLP's name for {target!r}, which this stage does not take")
            return False
        other = target if target in self.src else self.origin.get(target)
        given = self.src.get(target) if other == target else self.values.get(target)
        if other and other != key and not same_value(given, (value,)):
            self.problems.append(f"keys {key!r} and {other!r} both set {target!r}, to {value!r} and {given!r}; "
                                 "give one of them")
            return False
        self.values[target] = value
        self.origin[target] = key
        return True


def translate(values: Dict[str, Any], known) -> Tuple[Dict[str, Any], List[str], List[str], Dict[str, str]]:
    """PaddleNLP's keys in `values` -> ours. `known`: the keys the parser's dataclasses define. Returns (values for
    the parser, notice lines, problems, {our key: the PaddleNLP key that set it})."""
    ctx = _Context(values, known)
    for key, fix in OWN_VALUES.items():
        if key in ctx.known and key in ctx.values:
            fix(ctx, key, ctx.values[key])
    for key in [k for k in values if k in TABLE and k not in ctx.known]:
        rule, value = TABLE[key], ctx.values.pop(key)
        if key in SPECIAL:
            SPECIAL[key](ctx, key, value)
        elif rule.kind == ALIAS or (rule.target and rule.target in ctx.known):
            if rule.inert is None or not rule.inert(value, ctx.src):
                ctx.alias(key, rule.target, value)
        elif not (rule.inert or asks_nothing)(value, ctx.src):
            text = rule.note(value, ctx.src) if callable(rule.note) else rule.note
            if text and rule.kind == REFUSE:
                ctx.problem(key, text)
            elif text:
                ctx.notice(key, text)
    return ctx.values, ctx.notices, ctx.problems, ctx.origin


MODIFIERS = ("evaluation_strategy", "save_strategy")  # they qualify eval_steps / save_steps rather than replace them


def same_setting(key: str) -> set:
    """The keys that set the same thing as `key` (our key and its PaddleNLP names): a --flag for one of them
    replaces the others given in the argument file (--eval_steps replaces evaluation_strategy, not the reverse)."""
    if key in MODIFIERS:
        return {key}
    target = TABLE[key].target if key in TABLE and TABLE[key].kind == ALIAS else key
    return {target} | {k for k, rule in TABLE.items() if rule.kind == ALIAS and rule.target == target}


def kinds() -> Dict[str, int]:
    """How many PaddleNLP keys are honoured (aliases), noticed and refused (the docs table counts: docs/paddlenlp.md)."""
    counts = {ALIAS: 0, NOTICE: 0, REFUSE: 0}
    for rule in TABLE.values():
        counts[rule.kind] += 1
    return counts
