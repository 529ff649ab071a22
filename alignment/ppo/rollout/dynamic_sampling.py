"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476), the loop around dapo.groups_with_reward_spread.

A step needs `target` prompt groups (per_device_prompt_batch_size prompts x num_return_sequences responses). It
draws the next prompt batch of the data stream, generates and rewards it, keeps the groups whose rewards are not
all equal (a group of equal rewards has zero group advantage: it teaches nothing), and repeats with the next
batch until `target` groups are kept or `max_gen_batches` batches were drawn (0 = no bound, as verl's
max_num_gen_batches). The kept groups are then cut to exactly `target`, in generation order (verl and PaddleNLP
truncate the same way), and only they are scored (old / reference log-probs) and trained on.

When the bound is reached first (verl and PaddleNLP stop the run with an error there), the step trains on the
groups it kept (`dynamic_sampling/filled` < 1), or, when it kept none, makes no update at all
(`dynamic_sampling/skipped_update` 1); the prompts drawn are used up either way.

Each generation batch is sampled with noise seeded by (seed, step, try), and every batch drawn counts in the
data-stream position a checkpoint stores, so a resumed run draws and samples the same batches. The keep decision
is made on the rewards of the whole global batch; the kept rows are not moved between processes, so only one
data-parallel process is supported (tensor parallelism, which shares the rows, is fine).

Asynchronous runs (rollout_ranks > 0) need a bound: the rollout ranks sample max_gen_batches prompt batches for
every step ahead of time (by the step's version, with the seeds above), the step keeps groups from them in order
exactly as here, and the batches it does not reach are dropped unscored; so a step always uses up max_gen_batches
prompt batches of the stream, where a synchronous step uses up only those it drew. The rollout ledger records each
row not trained with why ("no reward spread", "over target", "not needed").
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import paddle

from alignment.ppo.rl_math import dapo
from alignment.ppo.rollout.rollout import concat_rollouts
from alignment.training.trainer import mean_rows

PLAIN_SEED_STRIDE = 1_000_003  # the first try of a step uses the plain trainer's seed, seed + stride x (step + 1)


@dataclasses.dataclass
class Sampled:
    """What one step's dynamic sampling kept."""
    parts: List[Tuple[object, np.ndarray]]  # (a generation batch's payload, its kept rows [k_i * G] ascending)
    gen_batches: int  # generation batches drawn
    kept_groups: int  # groups trained on: min(target, spread_groups)
    spread_groups: int  # groups whose rewards differ, over all generation batches (before the cut to target)
    generated_groups: int  # groups generated
    dropped: List[Tuple[object, np.ndarray, str]] = dataclasses.field(default_factory=list)  # (payload, rows, why)

    def metrics(self, target: int) -> Dict[str, float]:
        return {"dynamic_sampling/gen_batches": float(self.gen_batches),
                "dynamic_sampling/kept_groups_frac": self.spread_groups / max(self.generated_groups, 1),
                "dynamic_sampling/filled": self.kept_groups / target,
                "dynamic_sampling/skipped_update": float(self.kept_groups == 0)}


def accumulate(draw: Callable[[int], Tuple[object, Sequence[float]]], group_size: int, target: int,
               max_gen_batches: int) -> Sampled:
    """Call draw(try) -> (payload, rewards [P_i * G], group by group) for try = 0, 1, ... until `target` groups
    with reward spread are kept or `max_gen_batches` tries were made (<= 0: no bound); the groups are kept in
    generation order and the last try's cut so that exactly min(target, groups with spread) are kept."""
    if target < 1:
        raise ValueError(f"dynamic sampling needs a target of at least one group, got {target}")
    parts, dropped, kept, spread, generated, tries = [], [], 0, 0, 0, 0
    while kept < target and (max_gen_batches <= 0 or tries < max_gen_batches):
        payload, rewards = draw(tries)
        tries += 1
        mask = dapo.groups_with_reward_spread(np.asarray(rewards, dtype="float64"), group_size).numpy()  # [P_i]
        groups = np.flatnonzero(mask)  # [s_i]
        generated, spread = generated + len(mask), spread + len(groups)
        take = groups[: target - kept]  # [k_i]
        for why, chosen in (("no reward spread", np.flatnonzero(~mask)), ("over target", groups[len(take):])):
            if len(chosen):
                dropped.append((payload, group_rows(chosen, group_size), why))
        if len(take):
            parts.append((payload, group_rows(take, group_size)))
            kept += len(take)
    return Sampled(parts, tries, kept, spread, generated, dropped)


def group_rows(groups: np.ndarray, group_size: int) -> np.ndarray:
    """The rows [n * G] of groups [n] (a group's rows are contiguous)."""
    return (groups[:, None] * group_size + np.arange(group_size)[None]).reshape([-1])


def kept_rollout(sampled: Sampled, pad_id: int):
    """The kept rows of every generation batch as one rollout, with (their end rewards [N], the reward parts
    averaged over the generation batches); (None, None) when no group was kept. Payloads are (rollout,
    end rewards [N_i], parts) per generation batch."""
    if not sampled.parts:
        return None, None
    rollout = concat_rollouts([r.take(rows.tolist()) for (r, _, _), rows in sampled.parts], pad_id)
    rewards = paddle.concat([paddle.gather(w, paddle.to_tensor(rows)) for (_, w, _), rows in sampled.parts])  # [N]
    return rollout, (rewards, mean_rows([parts for (_, _, parts), _ in sampled.parts]))


def generation_seed(seed: int, step: int, attempt: int) -> int:
    """The sampling seed of generation batch `attempt` of step `step` (0-based global step before the update): try
    0 is the plain trainer's, so dynamic sampling that keeps every group of its first batch samples the same
    rollout; later tries get independent seeds from a SeedSequence of (seed, step, try)."""
    if attempt == 0:
        return seed + PLAIN_SEED_STRIDE * (step + 1)
    return int(np.random.SeedSequence([seed, step + 1, attempt]).generate_state(1)[0] % (2 ** 31 - 1))


def check_layout(ppo, data_world: int, pipelined: bool) -> None:
    """The layouts dynamic sampling and the curriculum run in: one data-parallel process (tensor parallel allowed),
    no pipeline."""
    key = "dynamic_sampling" if ppo.dynamic_sampling else "curriculum" if ppo.curriculum else None
    if key and data_world > 1:
        raise ValueError(f"key '{key}' runs with one data-parallel process only (this layout has "
                         f"{data_world} data-parallel / sharding ranks): groups are read in one process's batch "
                         f"order. Use tensor_parallel_degree for several processes, or set {key} false")
    if key and pipelined:
        raise ValueError(f"key '{key}' does not run with pipeline_parallel_degree > 1 (a step's row "
                         f"count may vary); use tensor_parallel_degree, or set {key} false")


class OneBatch:
    """A step trains the next prompt batch as drawn: (rollout, end rewards None (scored later), metrics {})."""

    def __call__(self, step: int, draws):
        """draws: the trainer's sources.StepDraws."""
        return draws.draw(step, attempt=0), None, {}


class KeptGroups:
    """Dynamic sampling: the kept groups as one rollout (None: none kept), their (end rewards [N], reward parts
    averaged over the generation batches) and the dynamic_sampling/* metrics; every row drawn and not kept goes
    to the ledger with why (ledger: the run's ledger.Ledger or None)."""

    def __init__(self, ppo, ledger, pad_id: int):
        self.ppo, self.ledger, self.pad_id = ppo, ledger, pad_id

    def __call__(self, step: int, draws):
        """draws: the trainer's sources.StepDraws."""
        from alignment.parallel.distributed import gather_lists
        from alignment.ppo.rollout.ledger import dropped_rows

        def draw(attempt):
            rollout = draws.draw(step, attempt)
            rewards, parts = draws.rewarded(rollout)
            every = gather_lists(rewards.numpy().tolist())  # one data rank: every row (the leader's under tp)
            return (rollout, rewards, parts), every

        ppo = self.ppo
        target = ppo.per_device_prompt_batch_size
        sampled = accumulate(draw, ppo.num_return_sequences, target, ppo.max_gen_batches)
        unused = draws.unused(step, sampled.gen_batches)
        if self.ledger is not None:  # every sample drawn and not trained, with why (the report accounts for it)
            self.ledger.write(dropped_rows(step + 1, sampled.dropped, unused))
        return (*kept_rollout(sampled, self.pad_id), sampled.metrics(target))


def step_rollouts(ppo, prompts, ledger, pad_id: int):
    """How a step draws its rollout: KeptGroups with dynamic_sampling, curriculum.SetAsideFlat with curriculum
    (recording each group's reward spread in the prompt pool of `prompts`, the trainer's PromptStream), else
    OneBatch. Each is called with (step, the trainer's sources.StepDraws)."""
    from alignment.ppo.rollout.curriculum import SetAsideFlat

    if ppo.dynamic_sampling:
        return KeptGroups(ppo, ledger, pad_id)
    return SetAsideFlat(prompts, ppo.num_return_sequences) if ppo.curriculum else OneBatch()
