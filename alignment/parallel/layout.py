"""The process layout of a run: tensor x pipeline x sharding x data parallel, on fleet's hybrid communicate groups.

    world size = tensor_parallel_degree x pipeline_parallel_degree x sharding_parallel_degree x data-parallel degree

Ranks in one tensor-parallel group hold slices of the same model and see the same data; sharding and data-parallel
ranks see different data (sharding also splits the optimizer states among its ranks, stage 2 the gradients too,
stage 3 the parameters too: alignment/training/sharding.py). Expert parallelism (expert_parallel_degree, MoE
models) splits each sparse layer's experts over groups of that many data ranks, which exchange tokens
(alignment/parallel/expert_parallel.py); it divides the data-parallel degree, and a group takes ranks that differ
only in their data index (so a sharding group's ranks hold the same experts, a pipeline stage's experts are split
among that stage's ranks, and a tensor-parallel index's ranks split the experts' slices). Everything is checked
by `plan()` before any model is loaded, so a wrong layout fails in a second with the keys to change.
"""
from __future__ import annotations

import dataclasses

from alignment.config.choices import SHARDING_STAGES


@dataclasses.dataclass(frozen=True)
class Layout:
    world: int = 1
    tensor: int = 1
    pipeline: int = 1
    sharding: int = 1
    stage: str = ""  # "" | stage1 | stage2 | stage3
    micro_batch_size: int = 1  # pipeline: rows per micro-batch (per_device_train_batch_size)
    accumulate_steps: int = 1  # pipeline: micro-batches per optimizer step (gradient_accumulation_steps)
    rollout: int = 0  # asynchronous RL: ranks world .. world + rollout - 1 generate; `world` ranks train
    expert: int = 1  # expert_parallel_degree: data ranks that split each MoE layer's experts among them

    @property
    def processes(self) -> int:
        """Every process of the launch: the training ranks and the rollout ranks."""
        return self.world + self.rollout

    @property
    def data(self) -> int:
        """Data-parallel degree (ranks of one sharding group count once)."""
        return self.world // (self.tensor * self.pipeline * self.sharding)

    @property
    def hybrid(self) -> bool:
        """True when fleet's hybrid groups are needed (anything beyond plain data parallelism)."""
        return self.tensor > 1 or self.pipeline > 1 or self.sharding > 1

    def describe(self) -> str:
        return (f"world {self.world} = tensor {self.tensor} x pipeline {self.pipeline} x sharding {self.sharding}"
                f"{' (' + self.stage + ')' if self.stage else ''} x data {self.data}"
                f"{f', experts split over {self.expert}' if self.expert > 1 else ''}"
                f"{f' training, + {self.rollout} rollout' if self.rollout else ''}")


def plan(args, world: int) -> Layout:
    """The layout the training arguments ask for over `world` processes, or a ValueError naming the keys."""
    tp, pp = args.tensor_parallel_degree, args.pipeline_parallel_degree
    words = args.sharding.split()
    stage = words[0] if words else ""
    if stage not in SHARDING_STAGES or len(words) > 1:
        if "offload" in words[1:]:
            raise ValueError(f"key 'sharding' {args.sharding!r}: Paddle's sharding offload is not used here (PaddleNLP "
                             "warns it is not supported with hybrid parallelism); remove 'offload' (PPO-family runs "
                             "offload the sharded optimizer states with offload_level 'optimizer')")
        raise ValueError(f"key 'sharding' must be one of {SHARDING_STAGES[1:]} or empty, got {args.sharding!r}")
    expert = getattr(args, "expert_parallel_degree", 1)
    if expert > 1 and stage not in ("", "stage1"):
        raise ValueError(f"key 'expert_parallel_degree' {expert} runs with data, tensor and pipeline parallelism "
                         "and sharding stage1 (not built with sharding stage2/3 yet); set sharding to '' or 'stage1'")
    if world % (tp * pp):
        raise ValueError(f"tensor_parallel_degree {tp} x pipeline_parallel_degree {pp} does not divide the world "
                         f"size {world} (processes started by paddle.distributed.launch)")
    sharding = args.sharding_parallel_degree
    if stage and sharding == -1:
        sharding = world // (tp * pp)  # PaddleNLP's default: every rank left over joins the sharding group
    elif not stage:
        if sharding not in (-1, 1):
            raise ValueError(f"key 'sharding_parallel_degree' is {sharding} but key 'sharding' is empty; set sharding "
                             "to stage1/stage2/stage3 or the degree to 1")
        sharding = 1
    if sharding < 1 or world % (tp * pp * sharding):
        raise ValueError(f"tensor_parallel_degree {tp} x pipeline_parallel_degree {pp} x sharding_parallel_degree "
                         f"{sharding} does not divide the world size {world}")
    if stage in ("stage2", "stage3") and sharding > 1:
        if pp > 1:
            raise ValueError(f"key 'sharding' {stage!r} with pipeline_parallel_degree {pp}: pipeline parallelism "
                             "is not compatible with sharding stage2 or stage3 (as in PaddleNLP); use stage1")
        if args.fp16:
            raise ValueError(f"key 'sharding' {stage!r} with fp16: the loss scaling of sharding stage2/3 is not "
                             "built; use bf16, or sharding stage1")
    data = world // (tp * pp * sharding)
    if expert > 1 and data % expert:  # each expert-parallel group within one line of data-parallel ranks
        raise ValueError(f"key 'expert_parallel_degree' {expert} does not divide the data-parallel degree {data} "
                         "(processes started by paddle.distributed.launch / the tensor, pipeline and sharding "
                         "degrees)")
    return Layout(world, tp, pp, sharding, stage, micro_batch_size=args.per_device_train_batch_size,
                  accumulate_steps=args.gradient_accumulation_steps, expert=expert)
