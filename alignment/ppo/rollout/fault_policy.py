"""The rollout fault policy (keys `episode_retries`, `max_failed_group_fraction`).

An episode whose environment (or a tool it runs) raises, or returns something outside the API, is played again
with a fresh environment, up to `episode_retries` more times. Each retry samples with its own seed, the row's seed
with the attempt appended ([draw seed, row of the global batch, attempt]: so (step, prompt, sample, attempt)), and
draws nothing from paddle's generator: a run and its resume retry the same episodes with the same numbers.

An episode still failing after its retries fails its whole group (every answer to that prompt): the group is
dropped before scoring, so the group advantages (GRPO, RLOO, ...) are computed over intact groups only, with no
survivors of a half-failed group biasing them (tinker-cookbook PR #497). The step goes on with the other groups;
`rollout/failed_groups` and `rollout/episode_retries` count the step's dropped groups and retried episodes, and the
rollout ledger records each dropped row with its error. When the failed fraction of a step's groups exceeds
`max_failed_group_fraction`, or no group is left, the run stops with one line naming the step and the first error.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from alignment.envs import EnvironmentFailure


class RolloutFaultLimit(EnvironmentFailure):
    """More of a step's groups failed than max_failed_group_fraction allows (or a layout that cannot drop one)."""


def attempt_seed(row_seed: Optional[Sequence[int]], attempt: int) -> Optional[List[int]]:
    """The sampling seed of a row's `attempt` (0: the first play, which keeps the row's own seed, so a run without
    faults samples what it always did); None (greedy) stays None."""
    if row_seed is None:
        return None
    return list(row_seed) if attempt == 0 else [*row_seed, attempt]


def play_with_retries(play: Callable[[List[int], int], list], count: int, retries: int) -> Tuple[list, List[int]]:
    """play(rows, attempt) -> one result per row of `rows`, each with an `error` attribute (None: it worked), for
    rows 0..count-1; the rows whose result failed are played again with attempt 1, 2, ... up to `retries` more
    times. -> (each row's last result, each row's number of retries)."""
    results, tries = [None] * count, [0] * count
    pending = list(range(count))
    for attempt in range(retries + 1):
        for row, result in zip(pending, play(pending, attempt)):
            results[row], tries[row] = result, attempt
        pending = [row for row in pending if results[row].error is not None]
        if not pending:
            break
    return results, tries


def failed_group_indices(errors: Sequence[Optional[str]], group_size: int) -> List[int]:
    """The groups (consecutive runs of group_size rows) holding a row whose error is not None."""
    return sorted({row // group_size for row, error in enumerate(errors) if error is not None})


def intact_rows(rows: int, group_size: int, failed_groups: Sequence[int]) -> List[int]:
    """The rows of every group not in failed_groups, in order."""
    dropped = set(failed_groups)
    return [row for row in range(rows) if row // group_size not in dropped]


@dataclasses.dataclass
class StepFaults:
    """One step's count over all its draws (dynamic sampling draws several), over every data rank."""
    groups: int = 0
    failed_groups: int = 0
    retries: int = 0
    first_error: Optional[str] = None
    episodes: int = 0
    failed_episodes: int = 0

    def add(self, groups: int, failed_groups: int, retries: int, first_error: Optional[str], episodes: int = 0,
            failed_episodes: int = 0) -> None:
        self.groups += groups
        self.failed_groups += failed_groups
        self.retries += retries
        self.first_error = self.first_error or first_error
        self.episodes += episodes
        self.failed_episodes += failed_episodes

    def metrics(self) -> dict:
        """rollout/failed_groups (groups dropped) and rollout/episode_retries (episodes played again): counts over
        the step; rollout/failed_episodes: the fraction of its episodes still failing after their retries."""
        return {"rollout/failed_groups": float(self.failed_groups), "rollout/episode_retries": float(self.retries),
                "rollout/failed_episodes": self.failed_episodes / max(self.episodes, 1)}

    def check(self, step: int, retries: int, max_fraction: float, left: int, layout_drops: str = "") -> None:
        """RolloutFaultLimit when the failed fraction of the step's groups exceeds max_fraction, when no group is
        left to train on (left: rows kept by this draw, over every rank), or when a group was dropped in a layout
        that cannot drop one (layout_drops says why); step: 1-based."""
        if not self.failed_groups:
            return
        fraction = self.failed_groups / max(self.groups, 1)
        said = (f"step {step}: {self.failed_groups} of {self.groups} prompt groups failed after {retries} "
                f"retries (key 'episode_retries')")
        first = f"; the first: {self.first_error}"
        if fraction > max_fraction:
            raise RolloutFaultLimit(f"{said}, a fraction of {fraction:.3g} > key 'max_failed_group_fraction' "
                                    f"{max_fraction:g}{first}")
        if left == 0:
            raise RolloutFaultLimit(f"{said}: no group is left to train on{first}")
        if layout_drops:
            raise RolloutFaultLimit(f"{said}: {layout_drops}{first}")


def drop_failed_groups(rollout, group_size: int, errors: Optional[Sequence[Optional[str]]] = None
                       ) -> Tuple[object, List[int], List[Optional[str]]]:
    """The rollout without the groups holding a failed row (errors[i] not None; default: the failed episodes',
    rollout.episodes[i]["error"]); -> (the kept rollout, or None when nothing is kept; the dropped rows; every
    row's error)."""
    if errors is None:
        errors = [episode.get("error") for episode in rollout.episodes] if rollout.episodes else [None] * len(rollout)
    errors = list(errors)
    failed = failed_group_indices(errors, group_size)
    if not failed:
        return rollout, [], errors
    kept = intact_rows(len(rollout), group_size, failed)
    dropped = sorted(set(range(len(rollout))) - set(kept))
    return (rollout.take(kept) if kept else None), dropped, errors


def fault_ledger_rows(step: int, rollout, dropped: Sequence[int], errors: Sequence[Optional[str]],
                      why: str = "episode failed") -> List[dict]:
    """Ledger rows of the dropped rows: {"step", "sample", "dropped": why (a row with its own error) or "group
    failed" (a sibling's), "error"}."""
    rows = []
    for i in dropped:
        failed = errors[i] is not None
        rows.append({"step": step, "sample": rollout.sample_ids[i] if rollout.sample_ids else None,
                     "dropped": why if failed else "group failed", **({"error": errors[i]} if failed else {})})
    return rows


def retries_of(rollout) -> int:
    """Retries the rollout's episodes took (episode records' "retries")."""
    return int(np.sum([episode.get("retries", 0) for episode in rollout.episodes])) if rollout.episodes else 0


class GroupFaults:
    """How a step draws its rollout (dynamic_sampling.step_rollouts' strategy, wrapped): the step's failed groups
    counted, its metrics given the rollout/* counts; the step's draws (sources.StepDraws) pass each drawn rollout
    through without_failed_groups, and the end rewards (scoring.EndRewards) ask the reward through rewarded.
    env_args None or single-turn: nothing dropped, no metrics. ledger: the run's ledger.Ledger or None."""

    def __init__(self, step_rollouts, env_args, pipelined: bool, group_size: int, ledger):
        self.step_rollouts, self.group_size, self.ledger = step_rollouts, group_size, ledger
        self.enabled = env_args is not None and env_args.multi_turn
        self.retries = env_args.episode_retries if self.enabled else 0
        self.max_fraction = env_args.max_failed_group_fraction if self.enabled else 1.0
        self.pipelined = pipelined
        self.step, self.drawing, self.drawing_step = StepFaults(), False, 0

    def __call__(self, step: int, draws):
        """The step's (rollout, (end rewards, parts) or None, metrics); a multi-turn step's rewards are computed
        here when the strategy left them to scoring, so a group the reward service fails on is dropped before
        anything is computed on it. step: the 0-based global step; draws: the trainer's sources.StepDraws."""
        self.step, self.drawing, self.drawing_step = StepFaults(), True, step
        try:
            rollout, rewards, metrics = self.step_rollouts(step, draws)
            if self.enabled and rollout is not None and rewards is None:
                rewards = draws.rewarded(rollout)
        finally:
            self.drawing = False
        return rollout, rewards, {**metrics, **(self.step.metrics() if self.enabled else {})}

    def without_failed_groups(self, step: int, rollout):
        """The drawn rollout without the groups of its failed episodes (the step's counts and the ledger updated)."""
        if not self.enabled:
            return rollout
        errors = [episode.get("error") for episode in rollout.episodes] if rollout.episodes else [None] * len(rollout)
        return self._dropped(step, rollout, errors, retries_of(rollout), len(rollout), "episode failed")

    def rewarded(self, reward, rollout):
        """reward(rollout): (end rewards [N], parts) (reward: the run's RewardComputer). While a multi-turn step
        draws, a reward service (the reward server, a served judge) that fails on the rollout past its own retries
        is asked again group by group; the groups it still fails on are dropped from the rollout in place and the
        rest scored together."""
        from alignment.rewards.remote import RewardServerError

        if not (self.enabled and self.drawing):
            return reward(rollout)
        try:
            return reward(rollout)
        except RewardServerError:
            pass
        group, errors = self.group_size, []
        for start in range(0, len(rollout), group):
            try:
                reward(rollout.take(list(range(start, start + group))))
                errors += [None] * group
            except RewardServerError as err:
                errors += [" ".join(str(err).split())] * group
        kept = self._dropped(self.drawing_step, rollout, errors, 0, 0, "reward failed")
        rollout.__dict__.update(kept.__dict__)  # in place: the strategy holding the rollout trains the kept rows
        return reward(rollout)

    def _dropped(self, step: int, rollout, errors, retries: int, rows: int, why: str):
        """The rollout without the groups holding an error; the step's counts (rows: rows drawn, 0 when already
        counted), the ledger and the limits updated and checked."""
        from alignment.parallel.distributed import data_world_size, gather_lists

        group = self.group_size
        kept, dropped, errors = drop_failed_groups(rollout, group, errors)
        first = next((error for error in errors if error is not None), None)
        counts = gather_lists([(rows // group, len(dropped) // group, retries, first, len(rollout) - len(dropped),
                                rows, sum(error is not None for error in errors))])  # every data rank's
        self.step.add(sum(c[0] for c in counts), sum(c[1] for c in counts), sum(c[2] for c in counts),
                      next((c[3] for c in counts if c[3] is not None), None), sum(c[5] for c in counts),
                      sum(c[6] for c in counts))
        if self.ledger is not None and any(c[1] for c in counts):  # every rank joins the gather
            self.ledger.write(gather_lists(fault_ledger_rows(step + 1, rollout, dropped, errors, why)))
        world = data_world_size()
        layout = (f"with {world} data-parallel ranks every rank must train as many rows, so a step cannot drop a "
                  f"group" if world > 1 else "with pipeline_parallel_degree > 1 a step's row count is fixed, so it "
                  "cannot drop a group" if self.pipelined else "")
        self.step.check(step + 1, self.retries, self.max_fraction, sum(c[4] for c in counts),
                        layout if any(c[1] for c in counts) else "")
        return kept
