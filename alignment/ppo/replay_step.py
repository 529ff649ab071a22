"""Replay one training step of a PPO-family run from its rollout ledger: no generation, no reward calls.

`check_replay` reads and checks everything first (the run's args.json, the ledger's rows of step k, the checkpoint
of step k - 1) and writes nothing; `replay_step` then rebuilds the trainer from the run's arguments (stage.py's
`build_trainer`, resumed from that checkpoint, or freshly built for step 1), rebuilds step k's batch from the
ledger's token ids and end rewards, runs the step's update and saves the models it trained.

What is read and what is recomputed. The ledger's `reward` is the end reward the step's advantages were computed
from (after normalize_reward's running statistics and the overlong penalty), so it is read, and nothing scores
again. The old and reference log-probs, the critic's old values and the advantages are recomputed, by the
trainer's own code from the checkpoint's weights, as the step computed them: storing them per token would grow
the ledger several times over, and recomputing is what shows the update is a function of the ledger and the
checkpoint alone. The step's batch is laid out as the sampler laid it out (left-padded prompts, responses padded
after their end), so every forward pass sees the same shapes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from typing import Dict, List, Optional

import numpy as np

from alignment.inputs import json_lines, read_json_object
from alignment.ppo.rollout.ledger import file_for, read_ledger

ONE_PROCESS = "local engine of rank 0"  # sampled_by of every row of a one-process synchronous run


@dataclasses.dataclass
class ReplayPlan:
    run_dir: str
    step: int
    rows: List[dict]  # the ledger's trained rows of the step, in the step's order
    values: Dict[str, object]  # the run's arguments (args.json), with the replay's output_dir and checkpoint
    instances: tuple  # them parsed into stage.py's argument classes
    checkpoint: Optional[str]  # the checkpoint of step - 1; None: the run's start (step 1)
    output_dir: str


def check_replay(run_dir: str, step: int, output_dir: str, checkpoint: Optional[str] = None) -> ReplayPlan:
    """Everything the replay reads, checked; a ValueError / FileNotFoundError naming the file or key otherwise.
    Nothing is written."""
    args_path = os.path.join(run_dir, "args.json")
    if not os.path.isfile(args_path):
        raise FileNotFoundError(f"{args_path}: no such file (the run's arguments; is {run_dir} a run's output_dir?)")
    values = read_json_object(args_path, "arguments file")
    rows = read_ledger(run_dir)
    trained = [row for row in rows if row["step"] == step and "dropped" not in row]
    ledger_file = os.path.join(run_dir, "ledger", file_for(step))
    if not trained:
        steps = sorted({row["step"] for row in rows if "dropped" not in row})
        held = f"steps {steps[0]}-{steps[-1]}" if steps else "no trained step"
        raise ValueError(f"{os.path.join(run_dir, 'ledger')}: no trained samples of step {step} (it holds {held})")
    for row in trained:
        if "prompt_ids" not in row:
            raise ValueError(f"{ledger_file}: step {step}'s rows have no 'prompt_ids' (a ledger written before "
                             "replays were possible); only ledgers of runs of this version can be replayed")
        for key in ("prompt_ids", "response_ids", "policy_token"):
            if not isinstance(row.get(key), list) or not all(type(v) is int and v >= 0 for v in row[key]):
                raise ValueError(f"{ledger_file}: sample {row.get('sample')} of step {step}: key {key!r} is not a "
                                 "list of token ids")
        if not isinstance(row.get("reward"), (int, float)) or isinstance(row["reward"], bool):
            raise ValueError(f"{ledger_file}: sample {row.get('sample')} of step {step}: no number at key 'reward'")
    if os.path.abspath(output_dir) == os.path.abspath(run_dir) or (
            os.path.exists(output_dir) and (not os.path.isdir(output_dir) or os.listdir(output_dir))):
        raise ValueError(f"--output {output_dir}: give a new or empty directory (not the run's own)")
    before = _checkpoint_before(run_dir, step, checkpoint)
    values, instances = _replay_arguments(values, args_path, output_dir, before)
    _check_supported(instances, trained, args_path, ledger_file)
    return ReplayPlan(run_dir, step, trained, values, instances, before, output_dir)


def _replay_arguments(values: dict, args_path: str, output_dir: str, checkpoint: Optional[str]):
    """The run's arguments, writing only to the replay's output_dir and resuming from `checkpoint`, no reward
    server asked and no ledger kept, parsed (ArgumentError names args.json). -> (values, instances)"""
    from alignment.config.parser import ArgumentParser
    from alignment.ppo.rl_math import registrations  # noqa: F401  what the arguments name, before they are parsed
    from alignment.ppo.stage import argument_classes

    replayed = {**values, "output_dir": output_dir, "resume_from_checkpoint": checkpoint, "rollout_ledger": False,
                "report_to": [], "disable_tqdm": True, "overwrite_output_dir": False, "use_rm_server": False}
    instances = ArgumentParser(*argument_classes()).parse_dict(replayed, args_path)
    if values.get("use_rm_server"):  # the server's model stays unloaded; its path still initialises the critic
        instances = (instances[0].for_reward_server(), *instances[1:])
    return replayed, instances


def _check_supported(instances: tuple, rows: List[dict], args_path: str, ledger_file: str) -> None:
    """Refuse, naming the key, the runs a one-process replay cannot redo exactly."""
    _, data, ppo, distill, env, asynchronous, lora, _, _, train = instances
    refused = [("rollout_ranks", asynchronous.rollout_ranks, "asynchronous runs (rollout ranks sampled the batch)"),
               ("tensor_parallel_degree", train.tensor_parallel_degree > 1, "tensor parallel runs"),
               ("pipeline_parallel_degree", train.pipeline_parallel_degree > 1, "pipeline parallel runs"),
               ("sharding", train.sharding, "sharded runs"),
               ("environment", env.environment, "multi-turn episodes (their observations are not in the ledger)"),
               ("agent", env.agent, "agent programs' episodes"),
               ("teacher_model_name_or_path", distill.distills, "runs with a teacher"),
               ("rollout_log_probs", ppo.rollout_log_probs, "the sampler's log-probs (they are not in the ledger)"),
               ("dynamic_sampling", ppo.dynamic_sampling, "dynamic sampling"),
               ("mask_truncated_responses", ppo.mask_truncated_responses, "masked truncated responses"),
               ("ptx_datasets", data.ptx_datasets, "a ptx term"),
               ("lora_dropout", (lora.lora or ppo.critic_lora) and lora.lora_dropout > 0,
                "dropout (its random numbers come after the sampling the replay skips)")]
    for key, is_set, what in refused:
        if is_set:
            value = next(getattr(i, key) for i in instances if hasattr(i, key))
            raise ValueError(f"{args_path}: key {key!r} is {value!r}; the replay does not cover {what}")
    others = sorted({row.get("sampled_by") for row in rows} - {ONE_PROCESS, None})
    if others:
        raise ValueError(f"{ledger_file}: the step was sampled by {others[0]!r}; the replay covers one-process runs")
    for row in rows:
        marks = set(row["policy_token"])
        if len(row["policy_token"]) != len(row["response_ids"]) or marks - {1}:
            raise ValueError(f"{ledger_file}: sample {row.get('sample')} is not one single-turn response "
                             "(its policy_token marks differ from its response tokens)")


def _checkpoint_before(run_dir: str, step: int, checkpoint: Optional[str]) -> Optional[str]:
    from alignment.training.checkpointing import STATE_FILE, verify_checkpoint

    if step == 1 and checkpoint is None:
        return None  # the run's start: the trainer is built as the run built it
    path = checkpoint or os.path.join(run_dir, f"checkpoint-{step - 1}")
    state_file = os.path.join(path, STATE_FILE)
    if not os.path.isfile(state_file):
        raise FileNotFoundError(f"{state_file}: no checkpoint of step {step - 1} (the replay of step {step} starts "
                                "from it; the run saves one every save_steps, save_total_limit keeps the newest)")
    state = read_json_object(state_file, "trainer state")
    if state.get("global_step") != step - 1:
        raise ValueError(f"{state_file}: key 'global_step' is {state.get('global_step')!r}, not {step - 1} (the step "
                         "before the one replayed)")
    if state.get("layout"):
        raise ValueError(f"{state_file}: key 'layout' is {state['layout']!r}; the replay covers one-process runs")
    problem = verify_checkpoint(path)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return path


def build_replay_trainer(plan: ReplayPlan):
    """The run's trainer, built from its arguments as the run built it (plan.values), resumed from the checkpoint
    of step k - 1."""
    from alignment.parallel.layout import plan as plan_layout
    from alignment.ppo.stage import build_trainer
    from alignment.training.setup import Invocation

    layout = plan_layout(plan.instances[-1], 1)
    trainer, _ = build_trainer((*plan.instances, Invocation(plan.values, layout, None)))
    if trainer.global_step != plan.step - 1:
        raise ValueError(f"{plan.checkpoint}: resumed at step {trainer.global_step}, not {plan.step - 1}")
    return trainer


def ledger_rollout(rows: List[dict], prompt_pad: int, response_pad: int):
    """The step's batch as the sampler built it (rollout.py's layout) from the ledger's rows."""
    import paddle

    from alignment.ppo.rollout.rollout import Rollout

    width_p = max(len(row["prompt_ids"]) for row in rows)
    width_r = max(len(row["response_ids"]) for row in rows)
    n = len(rows)
    ids = np.full([n, width_p + width_r], response_pad, dtype="int64")
    attention = np.zeros([n, width_p + width_r], dtype="int64")
    response_mask = np.zeros([n, width_r], dtype="float32")
    for i, row in enumerate(rows):
        p, r = len(row["prompt_ids"]), len(row["response_ids"])
        ids[i, :width_p - p] = prompt_pad
        ids[i, width_p - p: width_p] = row["prompt_ids"]
        ids[i, width_p: width_p + r] = row["response_ids"]
        attention[i, width_p - p: width_p + r] = 1
        response_mask[i, :r] = 1  # a single-turn response: every token is the policy's
    return Rollout(input_ids=paddle.to_tensor(ids), attention_mask=paddle.to_tensor(attention),
                   response_mask=paddle.to_tensor(response_mask), prompt_len=width_p,
                   prompts=[row["prompt"] for row in rows], completions=[""] * n, labels={},
                   sample_ids=[row["sample"] for row in rows],  # versions: none, as a synchronous step's
                   experts=ledger_experts(rows, width_p, width_r))


def ledger_experts(rows: List[dict], width_p: int, width_r: int):
    """MoE routing replay: the rows' recorded experts laid out as ledger_rollout's columns [n, P + R, layers, k]
    (-1 where nothing was recorded); None when the rows hold none. ValueError naming the sample whose record does
    not cover its tokens."""
    import paddle

    if "experts" not in rows[0]:
        return None
    first = np.asarray(rows[0]["experts"], dtype="int64")
    out = np.full([len(rows), width_p + width_r, *first.shape[1:]], -1, dtype="int64")
    for i, row in enumerate(rows):
        p, r = len(row["prompt_ids"]), len(row["response_ids"])
        experts = np.asarray(row.get("experts", []), dtype="int64")
        if experts.shape != (p + r, *first.shape[1:]):
            raise ValueError(f"ledger sample {row['sample']}: 'experts' has shape {list(experts.shape)}, expected "
                             f"{[p + r, *first.shape[1:]]} (one [layers][k] entry per prompt and response token)")
        out[i, width_p - p: width_p + r] = experts
    return paddle.to_tensor(out)


def replay_update(trainer, rows: List[dict]) -> Dict[str, float]:
    """PPOTrainer.training_step after its rollout and rewards: score (old and reference log-probs, old values),
    advantages and the update, on the ledger's batch and end rewards. -> the step's metrics that do not come from
    sampling or rewards; global_step counts the step."""
    import paddle

    from alignment.parallel.distributed import mean_over_ranks
    from alignment.ppo.rollout import scoring

    trainer.start_data_streams()
    rollout = ledger_rollout(rows, trainer.tokenizer.pad_token_id, trainer.gen_config.pad_token_id)
    trainer.rollouts.before_step(trainer.global_step, trainer.actor)
    metrics: Dict[str, float] = {}
    with trainer.offload.phase("score", [trainer.actor, trainer.reference, trainer.critic.model]), \
            trainer.precision.autocast():
        metrics.update(trainer.score_log_probs(rollout))
        rollout.old_values = trainer.critic.old_values(rollout, version=trainer.global_step)
        rollout.end_rewards = paddle.to_tensor([row["reward"] for row in rows], dtype="float32")
        ended = scoring.ended_responses(rollout, trainer.gen_config.eos_ids)
        metrics.update(scoring.length_metrics(rollout.response_mask.sum(axis=1), ended))
    if not trainer.critic.values_in_update:
        metrics.update(trainer.compute_advantages(rollout))
    with trainer.offload.phase("train", [trainer.actor, trainer.critic.model], trainer.offload.optimizers):
        metrics.update(trainer.update(rollout))
    metrics["skipped_steps"] = float(trainer.guard.skipped)
    trainer.global_step += 1
    return mean_over_ranks(metrics)


def replay_step(plan: ReplayPlan) -> dict:
    """Replay the planned step: output_dir/<model>/ holds the models it trained, output_dir/replay.json the step's
    metrics, each model's weights digest and how they compare with what the run recorded for the step."""
    from alignment.training.output_dir import release_output_dir

    existed = os.path.isdir(plan.output_dir)  # and empty (check_replay)
    try:
        return _replayed(plan)
    except BaseException:  # a model that no longer loads, an interrupt: no half-written output_dir
        release_output_dir(plan.output_dir)
        for name in os.listdir(plan.output_dir) if os.path.isdir(plan.output_dir) else ():
            path = os.path.join(plan.output_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        if not existed and os.path.isdir(plan.output_dir):
            os.rmdir(plan.output_dir)
        raise
    finally:
        release_output_dir(plan.output_dir)


def _replayed(plan: ReplayPlan) -> dict:
    from safetensors.numpy import load_file

    trainer = build_replay_trainer(plan)
    metrics = replay_update(trainer, plan.rows)
    with trainer.whole_models():
        trainer.save(plan.output_dir)
    report = {"step": plan.step, "checkpoint": plan.checkpoint, "metrics": metrics, "weights": {}}
    for name in trainer.trained:
        replayed = load_file(os.path.join(plan.output_dir, name, "model.safetensors"))
        recorded = _recorded_weights(plan, name)
        report["weights"][name] = {
            "sha256": _digest(replayed), "recorded": recorded,
            "differing_tensors": None if recorded is None else _differing(replayed, load_file(recorded))}
    report["logged_metrics"], report["differing_metrics"] = _compare_metrics(plan, metrics)
    with open(os.path.join(plan.output_dir, "replay.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    return report


def _recorded_weights(plan: ReplayPlan, name: str) -> Optional[str]:
    """The run's weights after the step: its checkpoint, or its final models when the step was the last."""
    candidates = [os.path.join(plan.run_dir, f"checkpoint-{plan.step}", name, "model.safetensors")]
    last = int(plan.values.get("max_steps") or 0)
    if plan.step == last and not plan.values.get("load_best_model_at_end"):
        candidates.append(os.path.join(plan.run_dir, name, "model.safetensors"))
    return next((path for path in candidates if os.path.isfile(path)), None)


def _digest(tensors: Dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for key in sorted(tensors):
        digest.update(key.encode() + str(tensors[key].dtype).encode() + np.ascontiguousarray(tensors[key]).tobytes())
    return digest.hexdigest()


def _differing(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> List[str]:
    return sorted(k for k in set(a) | set(b) if k not in a or k not in b or not np.array_equal(a[k], b[k]))


def _compare_metrics(plan: ReplayPlan, metrics: Dict[str, float]):
    """(the run's logged row of the step or None, the replayed keys whose values differ from it). A row is the
    step's own only with logging_steps 1; timings are not compared."""
    path = os.path.join(plan.run_dir, "metrics.jsonl")
    if plan.values.get("logging_steps") != 1 or not os.path.isfile(path):
        return None, []
    logged = next((row for _, row in json_lines(path, "metrics file") if row.get("step") == plan.step), None)
    if logged is None:
        return None, []
    return logged, sorted(k for k, v in metrics.items() if not k.startswith("time/") and logged.get(k) != v)
