"""A rollout rank of an asynchronous run (asynchronous.py): sample its rows of every prompt batch of the stream
with the policy version the schedule names, and post them to the training ranks. Each batch adds a line to
<output_dir>/rollout_rank<N>.jsonl: batch, version, and the wall-clock start / end of waiting for the weights,
sampling and posting (benchmarks/bench_async.py draws the timeline from it)."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Callable

import paddle

from alignment.launcher import rank
from alignment.models.weights_digest import weights_digest
from alignment.ppo.rollout import dynamic_sampling as ds
from alignment.ppo.asynchronous import wire
from alignment.ppo.asynchronous.asynchronous import VersionSchedule, WeightReceiver, sample_ids
from alignment.ppo.rollout.samplers import Draw
from alignment.training.batches import epoch_batches, skip_batches


@dataclasses.dataclass
class WorkerPlan:
    """What a rollout rank needs to know of the run: the prompt stream and its length, the sampler."""
    prompts: object  # PromptOnlyDataset (the training ranks' prompts, in the same order)
    prompt_batch: int  # prompts per global batch (per_device_prompt_batch_size x training data ranks)
    group: int  # num_return_sequences
    seed: int
    drop_last: bool
    min_size: int  # the training data ranks (a batch never has fewer prompts)
    temperature: float  # behaviour log-probs are taken at the sampling temperature
    output_dir: str  # where rollout_rank<N>.jsonl (this rank's timeline: one line per batch) goes
    schedule: VersionSchedule  # which version samples which batch (and token), as the training ranks read it


def run_rollout_worker(plan: WorkerPlan, actor, tokenizer, sampler: Callable, gen_config, mailbox, layout) -> int:
    """Sample and post every batch from the published first one to the end; -> batches posted."""
    sender, senders = rank() - layout.world, layout.rollout
    first = mailbox.first_batch(sender)  # the posted counter counts stream positions from there
    schedule = plan.schedule
    receiver = WeightReceiver(actor, schedule.versions_needed(first // schedule.per_step), mailbox)
    receiver.start()
    batches = epoch_batches(len(plan.prompts), plan.prompt_batch, plan.seed, min_size=plan.min_size,
                            drop_last=plan.drop_last)
    skip_batches(batches, first)
    current, posted = None, 0
    digests = {}  # version -> the digest of the weights loaded as it (taken once per sync)

    def load(version: int) -> None:
        nonlocal current
        receiver.apply(version, actor)
        digests[version], current = weights_digest(actor), version

    def move_on(step: int, tokens: int) -> bool:
        """Partial rollouts: before the forward that draws new token `tokens`, the version the schedule names;
        -> whether the weights changed."""
        version = schedule.token_version(step, tokens)
        if version == current:
            return False
        load(version)
        return True
    actor.eval()
    timeline = open(os.path.join(plan.output_dir, f"rollout_rank{rank()}.jsonl"), "a", encoding="utf-8")
    for batch_index in range(first, schedule.total_steps * schedule.per_step):
        step, attempt = divmod(batch_index, schedule.per_step)  # the step that trains it, and which of its batches
        version = schedule.version_for(step)
        times = {"batch": batch_index, "version": version, "wait_start": time.time()}
        if version != current:
            load(version)
        times["sample_start"] = time.time()
        batch = next(batches)
        positions = list(range(len(batch)))[sender::senders]
        seed = ds.generation_seed(plan.seed, step, attempt)
        paddle.seed(seed)  # the synchronous trainer's seed for this generation batch
        items = [plan.prompts[int(batch[p])] for p in positions]
        between_tokens = functools.partial(move_on, step) if schedule.segment else None
        rollout = sampler(actor, tokenizer, gen_config, Draw(items, plan.group, False, positions, len(batch), seed,
                                                              plan.temperature, between_tokens))
        rollout.behaviour_log_probs, rollout.old_log_probs = rollout.old_log_probs, None
        rollout.versions = [version] * len(rollout)
        rollout.weight_digests = [digests[version]] * len(rollout)  # partial rollouts: the starting version's
        rollout.sampled_by = [f"rollout rank {rank()}"] * len(rollout)
        if schedule.segment:  # [N, R]: every row's token t was drawn by the same version
            tags = [schedule.token_version(step, t) for t in range(rollout.response_mask.shape[1])]
            rollout.token_versions = paddle.to_tensor([tags] * len(rollout), dtype="int64")
            times["versions"] = sorted(set(tags))
        rollout.sample_ids = sample_ids(batch_index, batch, positions, plan.group)
        times["post_start"] = time.time()
        mailbox.put(sender, batch_index, wire.rollout_to_json(rollout))
        times["post_end"] = time.time()
        timeline.write(json.dumps(times) + "\n")
        timeline.flush()
        posted += 1
    timeline.close()
    receiver.join()
    mailbox.wait_for("async/done", 1)  # the training ranks' end (gloo's barrier would time out waiting for it)
    return posted
