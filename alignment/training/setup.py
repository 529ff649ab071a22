"""The skeleton every entry point (alignment/<stage>/run_*.py) shares: arguments parsed once with the process
layout they ask for, processes started, inputs read, the models loaded (the one trained, frozen ones, the
reference), clean failures and the run's last lines. Each run_*.py keeps only what its stage does differently."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
import traceback
from typing import Dict, Optional

from alignment import launcher
from alignment.exits import Interrupted, debug_on, one_line, out_of_memory, out_of_threads, signal_of
from alignment.config.parser import ArgumentError, ArgumentParser, to_dict
from alignment.config.training import TrainingArguments
from alignment.data import MixedRawDataset, import_user_modules
from alignment.parallel.layout import Layout, plan
from alignment.training.trackers import check_trackers, dashboards

_STARTED = time.monotonic()  # imported first thing by every entry point: the stage's wall time starts here


@contextlib.contextmanager
def user_errors():
    """Turn the errors of loading user inputs (missing paths, bad files, bad values) into a one-line exit."""
    try:
        yield
    except (OSError, ValueError) as err:  # DataFormatError and ArgumentError are ValueErrors
        fail(_described(err))
    except MemoryError as err:
        fail(out_of_memory(err))


@contextlib.contextmanager
def training_stops(trainer=None):
    """A run that stops itself on purpose (TrainingStopped: e.g. NaN/inf steps) or cannot write (OSError: e.g. a
    full disk) exits 1 with a one-line message; SIGTERM / SIGINT (alignment/exits.py) exit 143 / 130 with one line
    saying at which step, and which checkpoint is intact."""
    from safetensors import SafetensorError

    from alignment.training.guard import TrainingStopped

    try:
        yield
    except TrainingStopped as err:
        fail(err, code=1)
    except (MemoryError, RuntimeError) as err:  # too little memory (a thread's stack too) for what the arguments ask
        if not isinstance(err, MemoryError) and not out_of_threads(err):
            raise
        fail(f"{one_line(err)}; {interrupted_at(trainer)}")
    except (OSError, SafetensorError) as err:  # a full disk, an unwritable directory: what was saved is intact
        fail(f"{_described(err)}; checkpoints completed before this are intact (resume_from_checkpoint: auto)",
             code=1)
    except (Interrupted, KeyboardInterrupt) as stop:
        signum = signal_of(stop)
        where = f" at step {trainer.global_step}" if trainer is not None else ""
        fail(interrupted_at(trainer), code=128 + signum, prefix=f"stopped by {signal.Signals(signum).name}{where}; ")


def interrupted_at(trainer) -> str:
    """Which checkpoint a resume continues from (the one `latest` names: complete, as every checkpoint is)."""
    from alignment.training.checkpointing import LATEST

    if trainer is None:
        return "checkpoints completed before this are intact"
    pointer = os.path.join(trainer.args.output_dir, LATEST)
    if not os.path.exists(pointer):
        return "no checkpoint was written yet (save_steps)"
    with open(pointer, encoding="utf-8", errors="replace") as f:
        name = f.read().strip()
    return (f"the last complete checkpoint, {os.path.join(trainer.args.output_dir, name)}, is intact "
            "(resume_from_checkpoint: auto continues from it)")


def _described(err: Exception) -> str:
    """An OSError as 'path: reason' (the str() of some omits the path); other errors as they are."""
    if isinstance(err, OSError) and err.strerror and not isinstance(err, FileNotFoundError):
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return str(err)


def fail(error, code: int = 2, prefix: str = "error: ") -> None:
    """Exit non-zero with a one-line message (the traceback too under --debug / ALIGNMENT_DEBUG=1); output_dirs
    this run made and left empty are removed, and its lock files with them."""
    from alignment.training.output_dir import release_output_dirs_after_failure

    if debug_on() and sys.exc_info()[0] is not None:
        traceback.print_exc()
    print(f"{prefix}{' '.join(str(error).split())}", file=sys.stderr)
    release_output_dirs_after_failure()
    raise SystemExit(code)


def program_name(argv0: str = None) -> str:
    """How this run was started, for usage lines: 'python alignment/ppo/run_ppo.py', 'python -m alignment.ppo' or
    a console command ('alignment-ppo')."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) == "__main__.py":
        return f"python -m alignment.{os.path.basename(os.path.dirname(os.path.abspath(argv0)))}"
    if argv0.endswith(".py"):
        return f"python {os.path.relpath(argv0)}"
    return os.path.basename(argv0)


def beside(path, base_dir: str):
    """A relative path that names nothing from the working directory but something beside the argument file
    becomes that; every other path stays as written (PaddleNLP's files are written for the working directory)."""
    if not isinstance(path, str) or not path or os.path.isabs(path) or os.path.exists(path):
        return path
    candidate = os.path.join(base_dir, path)
    return candidate if os.path.exists(candidate) else path


def paths_beside_the_file(instance, base_dir: str) -> None:
    """Resolve the model paths (`*_name_or_path`, `*_path`) and dataset paths (`*_datasets`) of one parsed
    argument class with `beside`."""
    from alignment.data.raw import parse_dataset_specs

    for name, value in vars(instance).items():
        if value and (name.endswith("_name_or_path") or name.endswith("_path")):
            setattr(instance, name, beside(value, base_dir))
        elif value and name.endswith("_datasets"):
            specs = parse_dataset_specs(value)
            if any(beside(spec.path, base_dir) != spec.path for spec in specs):
                setattr(instance, name, [f"{s.name}:{s.proportion}:{beside(s.path, base_dir)}" if s.path
                                         else f"{s.name}:{s.proportion}" for s in specs])


@dataclasses.dataclass(frozen=True)
class Invocation:
    """What one start of an entry point asks for besides its argument classes, worked out once when parsing."""
    effective: Dict[str, object]  # the effective arguments, as args.json holds them (tokens masked)
    layout: Layout  # the processes the training arguments ask for under this launch
    argument_dir: Optional[str]  # the argument file's directory (relative user_dataset_modules start there)


def parse_arguments(argv, *dataclass_types):
    """Parse an argument file + flags into the dataclasses, plan the process layout they ask for under this launch
    and print the effective configuration.

    Returns (instances..., Invocation); exits with a one-line message on bad arguments.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = ArgumentParser(*dataclass_types)
    try:
        instances = parser.parse_args(argv, prog=program_name())
    except ArgumentError as err:
        fail(err)
    rollout = sum(getattr(instance, "rollout_ranks", 0) for instance in instances)  # asynchronous RL's generators
    try:  # the degrees against the launch, before any model loads
        if rollout and rollout >= launcher.world_size():
            raise ValueError(f"key 'rollout_ranks' {rollout} leaves no training rank among the "
                             f"{launcher.world_size()} processes started by paddle.distributed.launch")
        train_args = next(i for i in instances if isinstance(i, TrainingArguments))
        check_trackers(train_args)  # an unknown tracker or a missing package: before any work
        layout = plan(train_args, launcher.world_size() - rollout)
        if rollout and layout.hybrid:
            raise ValueError("key 'rollout_ranks': the training ranks of an asynchronous run are plain data "
                             "parallel for now; set tensor_parallel_degree, pipeline_parallel_degree to 1 and "
                             "sharding to ''")
        offload = set().union(*(getattr(instance, "offload_levels", frozenset()) for instance in instances))
        if layout.stage == "stage2" and layout.sharding > 1 and "train_model" in offload:
            raise ValueError("key 'offload_level' 'train_model' with sharding stage2: Paddle keeps each rank's "
                             "parameters as views into fused buffers, which moving them would detach; use stage3 "
                             "(its slices move) or leave train_model out")
        layout = dataclasses.replace(layout, rollout=rollout)
    except ValueError as err:
        fail(f"{parser.source}: {err}")
    argument_dir = os.path.dirname(os.path.abspath(argv[0])) if argv and not argv[0].startswith("-") else None
    if argument_dir is not None:
        for instance in instances:
            paths_beside_the_file(instance, argument_dir)
    effective = {key: ("<set>" if value and key.endswith("_token") else value)  # secrets stay out of logs
                 for key, value in to_dict(*instances).items()}
    if launcher.speaks_for_all():
        print("effective arguments:\n" + json.dumps(effective, indent=2, sort_keys=True, default=str))
    return (*instances, Invocation(effective, layout, argument_dir))


def start_processes(train_args, layout: Layout) -> None:
    """Start the process groups `layout` asks for (fleet's hybrid groups for tensor / pipeline parallelism or
    sharding), before any model is built: models built afterwards are split accordingly. Then claim output_dir
    for this run (alignment/training/output_dir.py) and seed every random number generator."""
    from alignment.cpu_env import describe, share_cores
    from alignment.parallel.distributed import (from_main_process, init_distributed, is_main_process,
                                                is_rollout_rank, rank)
    from alignment.parallel.watchdog import start_watchdog
    from alignment.training.batches import set_seed
    from alignment.training.output_dir import claim_output_dir

    init_distributed(layout)
    if layout.rollout and not is_rollout_rank():  # the rollout ranks beside it mostly wait for weights
        share_cores(sum(1 for r in launcher.ranks_on_host() if r < layout.world))
    if is_main_process():
        print(describe())
    problem = None
    if is_main_process():
        try:
            claim_output_dir(train_args)
        except ValueError as err:
            problem = str(err)
    problem = from_main_process(problem)  # every rank stops at once, not at its first collective
    if problem:
        fail(ValueError(problem))
    if layout.processes > 1:
        start_watchdog(rank(), layout.processes, train_args.lost_rank_timeout)
        print(f"processes: {layout.describe()}")
    set_seed(train_args.seed)


@contextlib.contextmanager
def started(train_args, run: Invocation):
    """Start the processes (`start_processes`); inside, errors of loading user inputs are a one-line exit."""
    start_processes(train_args, run.layout)
    with user_errors():
        yield


def load_inputs(tokenizer_path: str, data_args, seed: int, run: Invocation):
    """(tokenizer, train raw dataset, eval raw dataset or None): what every stage reads first (`load_raw`)."""
    from alignment.models import Tokenizer

    tokenizer = template_as_asked(Tokenizer.from_pretrained(tokenizer_path), data_args)
    return (tokenizer, *load_raw(data_args, seed, run.argument_dir))


def template_as_asked(tokenizer, data_args):
    """The tokenizer with the template `chat_template` asks for: 'none' (PaddleNLP's value; validated) renders
    conversations as their raw text (prompts already templated), null keeps the tokenizer's own."""
    from alignment.models.tokenizer import NO_TEMPLATE

    if tokenizer is not None and data_args.chat_template is not None:
        tokenizer.chat_template = NO_TEMPLATE
    return tokenizer


def _model_classes(head: str):
    """(config class, model class) of a model head: 'causal' (a language model) or 'score' (reward model, critic)."""
    from alignment.models import LlamaConfig, LlamaForCausalLM
    from alignment.models.score_model import ScoreConfig, ScoreModel

    return {"causal": (LlamaConfig, LlamaForCausalLM), "score": (ScoreConfig, ScoreModel)}[head]


def load_trained_model(head: str, path: str, layout: Layout, lora_args, pipe_loss=None, trainable=(), **config):
    """The model a stage trains, from the checkpoint at `path`: this rank's pipeline stage (ending in `pipe_loss`)
    when the layout has pipeline stages, else the whole model with LoRA adapters when `lora_args.lora` is on
    (`trainable`: what trains besides the adapters). The arguments' validation refuses LoRA with pipelines."""
    from alignment.models.lora import with_lora
    from alignment.models.moe import held_experts
    from alignment.wrappers.pipeline import load_pipeline_model

    if getattr(lora_args, "lora_adapters", None):  # several adapters a run: the SFT and RL stages
        raise ValueError("key 'lora_adapters' is for SFT and RL: this stage trains one adapter a run ('lora': true)")
    config_class, model_class = _model_classes(head)
    model = load_pipeline_model(config_class, path, head, layout.pipeline, pipe_loss, **config) \
        if layout.pipeline > 1 else with_lora(model_class.from_pretrained(path, **config), lora_args, trainable)
    if held := held_experts(model):  # every rank's log says which experts it trains
        print(f"rank {launcher.rank()}: {held}")
    return model


def load_frozen_model(head: str, path: str):
    """A model that only scores (a reference, a reward model): evaluation mode, no gradients."""
    model = _model_classes(head)[1].from_pretrained(path)
    model.eval()
    for param in model.parameters():
        param.stop_gradient = True
    return model


def reference_model(policy, lora_args, policy_path: str, own_path: Optional[str] = None):
    """The frozen reference of a policy started from `policy_path`: with LoRA on the policy and no reference of its
    own, the policy itself (its base weights, adapters off: no second copy of the model), else a frozen copy of
    `own_path` or `policy_path`."""
    if lora_args.lora and not own_path:
        return policy
    return load_frozen_model("causal", own_path or policy_path)


def datasets_line(unit: str, train, evaluation) -> str:
    """'train: 12 pairs {stats}; eval: 4 pairs {stats}' (no eval part without eval data)."""
    return f"train: {len(train)} {unit} {train.stats}" + (
        f"; eval: {len(evaluation)} {unit} {evaluation.stats}" if evaluation is not None else "")


def load_raw(data_args, seed: int, argument_dir: Optional[str]):
    """(train, eval or None) raw datasets from the argument specs; user modules are imported first (relative
    paths from `argument_dir`). Bad specs or files raise DataFormatError / FileNotFoundError / ValueError: call it
    inside `user_errors()`."""
    import_user_modules(data_args.user_dataset_modules, base_dir=argument_dir)
    options = data_args.dataset_options()
    train = MixedRawDataset(data_args.train_datasets, seed=seed, options=options)
    evaluation = MixedRawDataset(data_args.eval_datasets, seed=seed, options=options) if data_args.eval_datasets \
        else None
    for name, dataset in (("train", train), ("eval", evaluation)):
        if dataset is not None:
            print(f"{name} data: " + ", ".join(f"{s.name} {s.selected}/{s.available}" for s in dataset.sources))
    return train, evaluation


def wall_time(seconds: float) -> str:
    """3725.4 -> '1h 02m 05s', 65 -> '1m 05s', 4.2 -> '4.2s'."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def where_to_look(train_args) -> str:
    """The stage's last lines: its wall time and how to look at its curves."""
    out = train_args.output_dir
    lines = [f"wall time: {wall_time(time.monotonic() - _STARTED)}",
             f"curves: python tools/plot_run.py {out}  (metrics: {os.path.join(out, 'metrics.jsonl')})"]
    return "\n".join(lines + dashboards(train_args))


def benchmark_ended(train_args, stage: str) -> bool:
    """benchmark: true (training/benchmark.py): the run saved nothing and printed its [timelog] lines; say so and
    end the processes (then True: the entry point returns)."""
    if not train_args.benchmark:
        return False
    print(f"\n{stage} benchmark done: nothing evaluated or saved (benchmark: true)")
    end_processes(train_args)
    return True


def end_processes(train_args=None) -> None:
    """The last call of an entry point: rank 0 prints the wall time and where to look (`where_to_look`). A
    multi-process run ends here on every rank together (a barrier), marks itself done for the lost-rank watchdog,
    flushes its output and leaves without the interpreter's teardown: on the CPU build, gloo's and the TCP stores'
    destructors crashed a rank now and then (-11) after a complete run, once the other ranks were gone, and the
    launcher then failed the whole job. One process returns normally."""
    from alignment.parallel.distributed import barrier_all, is_main_process, world_size
    from alignment.parallel.watchdog import stop_watchdog

    if train_args is not None and is_main_process():
        print(where_to_look(train_args))
    if world_size() <= 1:
        return
    barrier_all()
    stop_watchdog()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
