"""Processes under `python -m paddle.distributed.launch --nproc_per_node N ...` (gloo on CPU, NCCL on GPU).

Each data rank trains on its own slice of every global batch; gradients are averaged with all_reduce after
backward (explicitly, so models can be called through any method, not only DataParallel's forward); rank 0 writes
logs and checkpoints. With tensor / pipeline parallelism or sharding (alignment/parallel/layout.py) the processes
form fleet's hybrid groups: the ranks that hold parts of one model (its tensor slices and pipeline stages) are one
data rank. A plain `python ...` run is world size 1 and none of this does anything.
"""
from __future__ import annotations

import faulthandler
from typing import Dict, List

import paddle
import paddle.distributed as dist
from paddle import _C_ops

from alignment import cpu_kernels
from alignment.launcher import rank, store_address, world_size
from alignment.parallel.buckets import reduce_in_buckets
from alignment.parallel.stores import wait_until_listening

_hybrid = None  # fleet's HybridCommunicateGroup once init_distributed set up a hybrid layout
_trainers = None  # asynchronous RL (Layout.rollout > 0): the group of the training ranks; collectives here use it
_training_world = None  # the number of training ranks (None: every process trains)
_expert_groups = None  # expert parallelism: (this rank's expert-parallel group, its expert-data group or None)
STORE_WAIT_SECONDS = 900  # as long as init_parallel_env's own default wait (FLAGS_stop_check_timeout)


def is_main_process() -> bool:
    return rank() == 0


def init_distributed(layout=None) -> None:
    """Start the process groups once: fleet's hybrid groups when `layout` (topology.Layout) splits models or
    optimizer states, else plain data parallelism. Called by the entry points before any model is built."""
    if world_size() == 1 or dist.is_initialized():
        return
    faulthandler.enable(all_threads=True)  # a rank a signal kills prints its Python stacks, then Paddle's report
    _start_groups(layout)
    if not paddle.is_compiled_with_cuda():
        cpu_kernels.agree(_all_ranks_min)


def _all_ranks_min(values: List[int]) -> List[int]:
    tensor = paddle.to_tensor(values, dtype="int64")
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return tensor.tolist()


def _start_groups(layout) -> None:
    global _hybrid, _trainers, _training_world
    store = store_address()
    if rank() != 0 and store:  # a connect before rank 0 listens can connect to itself (stores.wait_until_listening)
        wait_until_listening(*store, STORE_WAIT_SECONDS)
    if layout is not None and layout.rollout:  # training ranks 0 .. world - 1, then the rollout ranks
        dist.init_parallel_env()
        _trainers = dist.new_group(list(range(layout.world)))
        dist.barrier()  # gloo: groups created back to back race without one (shared/notes)
        _training_world = layout.world
        return
    if layout is None or not layout.hybrid:
        dist.init_parallel_env()
        if layout is not None and layout.expert > 1:
            _start_expert_groups(layout.expert)
        return
    from paddle.distributed import fleet

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": layout.data, "mp_degree": layout.tensor, "pp_degree": layout.pipeline,
                               "sharding_degree": layout.sharding,
                               # isend/irecv between stages: gloo has no batched calc-stream p2p
                               "pp_configs": {"use_batch_p2p_comm": paddle.is_compiled_with_cuda(),
                                              # micro-batches of one step differ in length (each is padded
                                              # to its own longest row): shapes travel with every message
                                              "enable_dynamic_shape": True}}
    strategy.pipeline_configs = {"micro_batch_size": layout.micro_batch_size,
                                 "accumulate_steps": layout.accumulate_steps,
                                 "p2p_cache_shape": False,  # rollout lengths change from step to step
                                 # gloo has no partial send/recv (tensor-parallel ranks each sending a slice)
                                 "enable_partial_send_recv": paddle.is_compiled_with_cuda()}
    if not paddle.is_compiled_with_cuda():
        from alignment.parallel import cpu_standins

        cpu_standins.install()  # before fleet.init: one of the stand-ins is how gloo groups are created
    fleet.init(is_collective=True, strategy=strategy)
    _hybrid = fleet.get_hybrid_communicate_group()
    if layout.expert > 1:  # with pipelines or sharding stage1 (layout.plan refuses the other hybrid layouts)
        _start_expert_groups(layout.expert)


def _start_expert_groups(degree: int) -> None:
    """Expert-parallel groups of `degree` ranks, each splitting the experts among its ranks: consecutive ranks of
    one data-parallel line (the ranks that differ only in their data index: [0, 1], [2, 3] for degree 2 on 4
    processes; [0, 2], [1, 3] under sharding 2 or pipeline 2, fleet numbering ranks data-major). Expert-data groups
    of the ranks holding the same experts (the same place in their group and pipeline stage, any sharding index:
    [0, 2], [1, 3]; under sharding [0, 1], [2, 3]), over which those experts' gradients are averaged, so a sharding
    group's ranks hold the same experts and its optimizer's broadcasts stay among copies of one tensor. Every rank
    creates every group, in one order."""
    global _expert_groups
    if not paddle.is_compiled_with_cuda():
        from alignment.parallel import cpu_standins

        cpu_standins.install()  # a private rendezvous store per gloo group (groups created back to back)
    world, me = world_size(), rank()
    experts, holders = {}, {}  # key: ranks (ascending, so a group's rank is the place in it)
    for r in range(world):
        coord = _hybrid.topology().get_coord(r)._asdict() if _hybrid is not None else {"data": r}
        others = tuple((axis, index) for axis, index in coord.items() if axis not in ("data", "sharding"))
        experts.setdefault((others, coord.get("sharding", 0), coord["data"] // degree), []).append(r)
        holders.setdefault((others, coord["data"] % degree), []).append(r)
    groups = {key: dist.new_group(ranks) for key, ranks in experts.items()}
    data = {key: dist.new_group(ranks) for key, ranks in holders.items()} if world > degree else {}
    dist.barrier()
    mine = lambda table: next(key for key, ranks in table.items() if me in ranks)  # noqa: E731
    _expert_groups = (groups[mine(experts)], data[mine(holders)] if data else None)


def expert_parallel_group():
    """The group that splits each MoE layer's experts among its ranks (None without expert parallelism)."""
    return None if _expert_groups is None else _expert_groups[0]


def expert_parallel_degree() -> int:
    return 1 if _expert_groups is None else _expert_groups[0].nranks


def training_world() -> int:
    """The processes that train: all of them, or those that are not rollout ranks (asynchronous RL)."""
    return world_size() if _training_world is None else _training_world


def is_rollout_rank() -> bool:
    return _training_world is not None and rank() >= _training_world


def hybrid_group():
    """fleet's HybridCommunicateGroup of a hybrid layout (None for one process or plain data parallelism)."""
    return _hybrid


def data_world_size() -> int:
    """Processes that see different data: the world size divided by the tensor and pipeline degrees."""
    if _hybrid is None:
        return training_world()
    return _hybrid.get_data_parallel_world_size() * _hybrid.get_sharding_parallel_world_size()


def data_rank() -> int:
    if _hybrid is None:
        return rank()
    return _hybrid.get_data_parallel_rank() * _hybrid.get_sharding_parallel_world_size() + \
        _hybrid.get_sharding_parallel_rank()


def model_parallel_degree() -> int:
    """The tensor-parallel degree models built now are split by (1 without hybrid groups)."""
    return 1 if _hybrid is None else _hybrid.get_model_parallel_world_size()


def sharding_world_size() -> int:
    return 1 if _hybrid is None else _hybrid.get_sharding_parallel_world_size()


def is_data_leader() -> bool:
    """True on one rank per data rank (tensor-parallel rank 0 of the first pipeline stage): the one whose outputs
    count in gathered lists."""
    return _hybrid is None or (_hybrid.get_model_parallel_rank() == 0 and _hybrid.get_stage_id() == 0)


def _data_groups() -> list:
    if _hybrid is None:
        return [_trainers]  # the default group (every process), or the training ranks
    groups = [_hybrid.get_data_parallel_group(), _hybrid.get_sharding_parallel_group()]
    return [g for g in groups if g.nranks > 1]


def shard(indices, num_shards: int = None, index: int = None):
    """This data rank's part of a global batch of indices (strided, so shards differ by at most one item)."""
    num_shards = data_world_size() if num_shards is None else num_shards
    index = data_rank() if index is None else index
    return indices[index::num_shards]


def average_gradients(parameters) -> None:
    """All-reduce every gradient over the data ranks and divide by their number (no-op for one data rank), a
    bucket of gradients per collective (parallel/buckets.py). Every rank must hold the same gradients: an MoE
    expert no token of a rank chose still gets a zero one there (expert_parallel.idle_term)."""
    world = data_world_size()
    if world == 1:
        return
    held = [param for param in parameters if param.grad is not None]
    for expert in (False, True):  # an expert's gradient holds its expert-parallel group's tokens: summed over
        groups = _expert_data_groups() if expert else _data_groups()  # that expert's holders
        grads = [param.grad for param in held if bool(getattr(param, "expert_parallel", False)) == expert]
        reduce_in_buckets(grads, lambda flat, groups=groups: [dist.all_reduce(flat, group=g) for g in groups],
                          1.0 / world)


def _expert_data_groups() -> list:
    return [] if _expert_groups is None or _expert_groups[1] is None else [_expert_groups[1]]


def sum_over_data_ranks(tensor):
    """The element-wise sum of `tensor` over the data ranks (a new tensor; the tensor itself for one)."""
    if data_world_size() == 1:
        return tensor
    total = tensor.clone()
    for group in _data_groups():
        dist.all_reduce(total, group=group)
    return total


def share_of_data_ranks(local: float) -> float:
    """local * ranks / (sum of local over the data ranks): the factor that turns this rank's mean over its `local`
    items (tokens, pairs) into its share of the mean over every rank's items, once gradients are averaged over
    the data ranks. 1.0 for one data rank (a collective otherwise)."""
    ranks = data_world_size()
    if ranks == 1:
        return 1.0
    total = float(sum_over_data_ranks(paddle.to_tensor(float(local), dtype="float32")))
    return float(local) * ranks / max(total, 1e-12)


def step_shares(weights: List[float]) -> List[float]:
    """For the micro-batches of one optimizer step, each the mean of a loss over `weights[i]` units (tokens, or
    responses): the factors that turn each one's mean into its share of the mean over all of them on every data rank
    (gradients are averaged over the ranks): w_i * ranks / sum of w over the micro-batches and ranks; [1.0] for one
    micro-batch in one process."""
    if len(weights) == 1 and data_world_size() == 1:
        return [1.0]
    total = share_of_data_ranks(sum(weights))  # = sum * ranks / global sum
    return [w / max(sum(weights), 1e-12) * total for w in weights]


def grad_norm_squares(parameters, partial=None) -> float:
    """Sum of squared gradients of the whole model: slices of tensor-parallel parameters are summed over their
    group, replicated parameters counted once, pipeline stages added up. Call after average_gradients. One
    squared_l2_norm kernel per gradient (bitwise sum(square(g)); SmolLM2-135M 0.10 -> 0.03 s on 2 cores).
    `partial`: under sharding stages 2 and 3, the (parameter, gradient) pairs of which each sharding rank holds a
    part of its own (the gradients it owns; its slices), also summed over the sharding group (a list on every rank
    of such a run, empty or not)."""
    total = _squares([(param, param.grad) for param in parameters])
    if partial is not None and _hybrid is not None:
        held = _squares(partial)
        dist.all_reduce(held, group=_hybrid.get_sharding_parallel_group())
        total = total + held
    if _hybrid is not None and _hybrid.get_pipe_parallel_world_size() > 1:  # each stage holds its own layers
        dist.all_reduce(total, group=_hybrid.get_pipe_parallel_group())
    return float(total)


def _squares(pairs):
    """Sum of the squares of the gradients of (parameter, gradient) pairs, tensor-parallel slices summed over the
    model-parallel group (a collective there)."""
    split, whole, experts = [], [], []
    for param, grad in pairs:
        if grad is not None and not getattr(param, "tied_copy", False):  # a stage's copy of a tied table
            square = _C_ops.squared_l2_norm(grad if grad.dtype == paddle.float32 else grad.astype("float32"))
            (experts if getattr(param, "expert_parallel", False) else
             split if getattr(param, "is_distributed", False) else whole).append(square.reshape([]))
    total = paddle.add_n(whole) if whole else paddle.zeros([], "float32")
    if _expert_groups is not None:  # each rank of an expert-parallel group holds other experts
        part = paddle.add_n(experts) if experts else paddle.zeros([], "float32")
        dist.all_reduce(part, group=_expert_groups[0])
        if _hybrid is not None and _hybrid.get_model_parallel_world_size() > 1:  # and each of them in slices
            dist.all_reduce(part, group=_hybrid.get_model_parallel_group())
        total = total + part
    if _hybrid is not None and _hybrid.get_model_parallel_world_size() > 1:
        part = paddle.add_n(split) if split else paddle.zeros([], "float32")
        dist.all_reduce(part, group=_hybrid.get_model_parallel_group())
        total = total + part
    elif split:
        total = total + paddle.add_n(split)
    return total


def on_any_rank(flag: bool) -> bool:
    """Whether `flag` is true on any training rank (a collective when there are several)."""
    if training_world() == 1:
        return flag
    count = paddle.to_tensor(1.0 if flag else 0.0, dtype="float32")
    dist.all_reduce(count, group=_trainers)
    return float(count) > 0


def mean_over_ranks(metrics: Dict[str, float]) -> Dict[str, float]:
    """Average scalar metrics over ranks (same keys on every rank)."""
    if training_world() == 1 or not metrics:
        return metrics
    keys = sorted(metrics)
    values = paddle.to_tensor([float(metrics[k]) for k in keys], dtype="float64")
    dist.all_reduce(values, group=_trainers)
    return dict(zip(keys, (values / training_world()).numpy().tolist()))


def gather_lists(values: List) -> List:
    """Concatenate a Python list from every data rank, in rank order (tensor-parallel copies count once)."""
    if training_world() == 1:
        return list(values)
    gathered: List = []
    dist.all_gather_object(gathered, list(values) if is_data_leader() else [], group=_trainers)
    return [v for part in gathered for v in part]


def split_optimizer_states() -> bool:
    """True when ranks hold different optimizer states (tensor-parallel slices or sharding): one file per rank."""
    return _hybrid is not None and (_hybrid.get_model_parallel_world_size() > 1 or
                                    _hybrid.get_pipe_parallel_world_size() > 1 or
                                    _hybrid.get_sharding_parallel_world_size() > 1)


def layout_name() -> str:
    """The process layout optimizer files belong to ('' for one process or plain data parallelism)."""
    if _hybrid is None:
        return ""
    return (f"tp{_hybrid.get_model_parallel_world_size()}-pp{_hybrid.get_pipe_parallel_world_size()}-"
            f"sharding{_hybrid.get_sharding_parallel_world_size()}-dp{_hybrid.get_data_parallel_world_size()}")


def gather_objects(value) -> list:
    """[value of rank 0, value of rank 1, ...] on every rank."""
    if training_world() == 1:
        return [value]
    gathered: List = []
    dist.all_gather_object(gathered, value, group=_trainers)
    return gathered


def barrier() -> None:
    """Every training rank waits for the others (the rollout ranks of an asynchronous run do not take part)."""
    if training_world() > 1:
        dist.barrier(group=_trainers)


def barrier_all() -> None:
    """Every process of the launch waits for the others (asynchronous RL's training and rollout ranks)."""
    if world_size() > 1:
        dist.barrier()


def from_main_process(value):
    """Rank 0's `value` (any picklable object) on every rank."""
    if world_size() == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
