"""Asynchronous RL: rollout ranks sample the next prompt batches while the training ranks train.

    python -m paddle.distributed.launch --nproc_per_node 2 alignment/ppo/run_ppo.py ARGS --rollout_ranks 1 \
        --max_staleness 1

The schedule is fixed, so a run is reproducible and resumes exactly: training step g (0-based) trains prompt batch g
of the stream, sampled by policy version max(0, g - k), k = max_staleness, where version v is the weights after v
training steps. With k = 0 every batch waits for the current weights (the synchronous run's numbers); with k >= 1
the rollout ranks sample batch g + 1 .. g + k while step g trains.

Weights: at the start of step g the first training rank sends version g, when some batch still to be sampled
needs it, to every rollout rank over Paddle's send/recv (a header [version, crc32, size] and the trainable
parameters as one flat float32 tensor; the receiver checks the checksum). A rollout rank receives the versions in
a thread of its own, so sampling goes on while a transfer waits. The receiver posts its recv only once the mailbox
says version g is on its way to it: gloo gives up on a recv that waits 30 s, and a training step may take longer.
Rollouts: rollout rank r samples rows r, r + R, ... of each global prompt batch (R rollout ranks; each row with
its own random numbers, so the split does not change a token) and puts the rows, as JSON (wire.py), into a
mailbox: a ring of k + 2 slots in a TCPStore served by training rank 0. A rank never gets more than k + 1 batches
ahead of the training ranks. Training ranks take batch g at step g; each keeps its data shard.
Partial rollouts (partial_rollout_tokens S > 0, k >= 2): token t of batch g is drawn by version
min(max(g - k, g - 1), g - k + t // S) (token_version): the generation loads the next version between two decode
steps every S tokens and keeps the KV cache of the earlier tokens (PipelineRL's in-flight weight updates, Piche et
al. 2025, arXiv 2509.19128), never past version g - 1. Each token is tagged with its version (Rollout.token_versions,
the ledger) and the off-policy correction weighs each token by its own. The switch points are token positions, not
arrival times, so the schedule stays fixed and a resumed run regenerates a cut-off generation exactly.
Checkpoints: the batches sampled but not yet trained (at most k) are taken from the mailbox into the trainer state;
the resumed run trains them first and its rollout ranks start at the batch after them, receiving the version they
need from the training ranks (they never read checkpoints).
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Dict, List, Optional

import numpy as np
import paddle
import paddle.distributed as dist

from alignment.launcher import rank
from alignment.ppo.asynchronous import wire
from alignment.ppo.rollout.rollout import Rollout, concat_rollouts

POLL_SECONDS = 0.005


def version_for(batch: int, staleness: int) -> int:
    """The policy version that samples prompt batch `batch`."""
    return max(0, batch - staleness)


def token_version(batch: int, token: int, staleness: int, segment: int = 0) -> int:
    """The version that samples new token `token` (0-based) of batch `batch`: version_for(batch); with partial
    rollouts (segment > 0 tokens) one version newer every `segment` tokens, up to batch - 1 (version `batch`
    would make the batch wait for the step before the one that trains it: the synchronous schedule)."""
    start = version_for(batch, staleness)
    return min(max(start, batch - 1), start + token // segment) if segment else start


def versions_needed(first_batch: int, total: int, staleness: int, segment: int = 0, max_tokens: int = 1) -> List[int]:
    """The versions the rollout ranks need to sample batches first_batch .. total - 1 (responses of at most
    `max_tokens` new tokens), in order."""
    return sorted({v for b in range(first_batch, total) for v in range(
        version_for(b, staleness), token_version(b, max_tokens - 1, staleness, segment) + 1)})


@dataclasses.dataclass(frozen=True)
class VersionSchedule:
    """An asynchronous run's fixed schedule, the one object the training ranks (RolloutSource) and the rollout ranks
    (rollout_worker.py) read: `staleness` k (batch g sampled by version max(0, g - k)), the run's `total_steps`,
    partial rollouts' `segment` (partial_rollout_tokens; 0: off) and the longest response `max_tokens` (the versions
    they may need), and the prompt batches sampled for each step `per_step` (dynamic sampling's max_gen_batches)."""
    staleness: int
    total_steps: int
    segment: int = 0
    max_tokens: int = 1
    per_step: int = 1

    def version_for(self, batch: int) -> int:
        return version_for(batch, self.staleness)

    def token_version(self, batch: int, token: int) -> int:
        return token_version(batch, token, self.staleness, self.segment)

    def versions_needed(self, first_batch: int) -> List[int]:
        return versions_needed(first_batch, self.total_steps, self.staleness, self.segment, self.max_tokens)


def weights_key(receiver: int) -> str:
    """The mailbox counter of the versions sent to rollout rank `receiver`."""
    return f"async/weights_sent/{receiver}"


def sample_ids(batch_index: int, batch, positions, group: int) -> List[str]:
    """"batch:row:prompt" of each row sampled for `positions` of global prompt batch `batch_index` (`batch`: its
    dataset indices): where the row stands in the stream and which prompt it answers."""
    return [f"{batch_index}:{p * group + s}:{int(batch[p])}" for p in positions for s in range(group)]


class Mailbox:
    """Slots in a TCPStore of training rank 0 (alignment/parallel/stores.py), one ring per rollout rank.

    A rollout rank calls it from two threads (sampling, and the WeightReceiver), and a TCPStore client is one
    socket with no lock of its own: two threads' requests interleave and one gets the other's answer (measured:
    the receiver read the "posted" counter as the weights announcement and waited on a transfer never sent, until
    gloo's 30 s timeout). Every call goes through `self.lock`."""

    def __init__(self, store, slots: int):
        self.store, self.slots = store, slots
        self.lock = threading.Lock()

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            return int(self.store.add(key, amount))

    def count(self, key: str) -> int:
        return self.add(key, 0)

    def set(self, key: str, text: str) -> None:
        with self.lock:
            self.store.set(key, text)

    def get(self, key: str) -> str:
        """The value of a key already set (a get of a missing key would block holding the lock)."""
        with self.lock:
            return bytes(self.store.get(key)).decode("utf-8")

    def wait_until(self, ready) -> None:
        while not ready():
            time.sleep(POLL_SECONDS)

    def put(self, sender: int, batch: int, text: str) -> None:
        """Rollout rank `sender` posts batch `batch` once the slot it takes is free (trained or taken)."""
        self.wait_until(lambda: batch - self.count("async/taken") < self.slots)
        self.set(f"async/{sender}/{batch % self.slots}", text)
        self.add(f"async/{sender}/posted", 1)

    def take(self, sender: int, batch: int) -> str:
        self.wait_until(lambda: self.count(f"async/{sender}/posted") > batch)
        return self.get(f"async/{sender}/{batch % self.slots}")

    def mark_taken(self) -> None:
        self.add("async/taken", 1)

    def publish_start(self, first_batch: int) -> None:
        self.add("async/taken", first_batch - self.count("async/taken"))  # the stream's earlier batches
        self.set("async/start", str(first_batch))
        self.add("async/started", 1)

    def first_batch(self, sender: int) -> int:
        """The stream position the run (re)starts at; rollout rank `sender` starts its posted counter there."""
        self.wait_until(lambda: self.count("async/started") > 0)
        first = int(self.get("async/start"))
        self.add(f"async/{sender}/posted", first)
        return first

    def announce(self, key: str) -> None:
        self.add(key, 1)

    def wait_for(self, key: str, count: int) -> None:
        self.wait_until(lambda: self.count(key) >= count)


STORE_SECONDS = 3600  # a blocking get waits this long (a lost rank is the watchdog's: lost_rank_timeout)


def open_mailbox(layout, staleness: int, per_step: int = 1, timeout: int = STORE_SECONDS) -> Mailbox:
    """Every process of an asynchronous launch calls this once: training rank 0 serves the store."""
    from paddle.base import core

    from alignment.launcher import endpoints
    from alignment.parallel.stores import rank_zero_store

    host = endpoints()[0].rsplit(":", 1)[0] if endpoints() else "127.0.0.1"
    store = rank_zero_store(rank(), "/alignment/async_mailbox", host, core.create_or_get_global_tcp_store(),
                            timeout)
    return Mailbox(store, (staleness + 2) * per_step)


HOLD_VARIABLE = "ALIGNMENT_HOLD_WEIGHT_SYNC"


def hold_mid_transfer(version: int) -> None:
    """With ALIGNMENT_HOLD_WEIGHT_SYNC=VERSION:PATH (tests/ppo/test_async_runs.py), the sender of that version stops
    between the header and the weights, creates PATH and waits to be killed: a kill during a weight transfer."""
    held, _, path = os.environ.get(HOLD_VARIABLE, "").partition(":")
    if held == str(version) and path:
        open(path, "w").close()
        time.sleep(600)


SKIP_VARIABLE = "ALIGNMENT_SKIP_WEIGHT_SYNC"


def skips_sync(version: int) -> bool:
    """With ALIGNMENT_SKIP_WEIGHT_SYNC=VERSION (tests/ppo/test_weights_digest.py), a rollout rank receives that version
    and never loads it: a sampler that silently keeps older weights, which the training ranks' check must catch."""
    return os.environ.get(SKIP_VARIABLE, "") == str(version)


class RolloutSource:
    """The training ranks' side: weights out at the start of each step, the step's rollout in."""

    def __init__(self, mailbox: Mailbox, layout, schedule: VersionSchedule):
        self.mailbox, self.layout, self.schedule = mailbox, layout, schedule
        self.per_step = schedule.per_step
        self.buffer: Dict[int, List[str]] = {}  # batch -> the rollout ranks' JSON parts, taken ahead (checkpoints)
        self.needed: List[int] = []
        self.sent = set()

    def start(self, step: int) -> None:
        """Before the first step (fresh, or resumed at `step` with the buffer restored)."""
        first = step * self.per_step + len(self.buffer)  # the buffer holds whole steps
        self.needed = self.schedule.versions_needed(first // self.per_step)
        if rank() == 0:
            self.mailbox.publish_start(first)

    def send_weights(self, step: int, model) -> float:
        """Version `step` to every rollout rank, once, when one still needs it; -> seconds spent (0 otherwise)."""
        if step not in self.needed or step in self.sent or rank() != 0:
            return 0.0
        self.sent.add(step)
        begin = time.perf_counter()
        header, flat = wire.pack_weights(model, step)
        for receiver in range(self.layout.world, self.layout.processes):
            self.mailbox.announce(weights_key(receiver))  # just before its send: the receiver's recv waits <= 30 s
            dist.send(header, dst=receiver)
            hold_mid_transfer(step)
            dist.send(flat, dst=receiver)
        return time.perf_counter() - begin

    def parts(self, batch: int) -> List[str]:
        """The rollout ranks' JSON parts of `batch`: sampled ahead into the buffer, or taken from the mailbox."""
        if batch in self.buffer:
            return self.buffer.pop(batch)
        parts = [self.mailbox.take(sender, batch) for sender in range(self.layout.rollout)]
        self.after_take(batch)
        return parts

    def rollout(self, step: int, attempt: int, pad_id: int) -> Rollout:
        """The whole global prompt batch `attempt` of step `step`, rows in stream order (every training rank gets
        all of it)."""
        batch = step * self.per_step + attempt
        whole = concat_rollouts([wire.rollout_from_json(text) for text in self.parts(batch)], pad_id)
        order = np.argsort([int(sid.split(":")[1]) for sid in whole.sample_ids], kind="stable")
        return whole if (order == np.arange(len(order))).all() else whole.take(order.tolist())

    def after_take(self, batch: int) -> None:
        from alignment.parallel.distributed import barrier

        barrier()  # every training rank has read the slots before they are freed
        if rank() == 0:
            self.mailbox.mark_taken()

    def unused(self, step: int, attempts: int) -> List[str]:
        """Dynamic sampling: take the batches of `step` after the first `attempts` (never scored: the step kept
        enough groups before them) out of the way; -> their sample ids."""
        texts = [text for b in range(step * self.per_step + attempts, (step + 1) * self.per_step)
                 for text in self.parts(b)]
        return [sample for text in texts for sample in wire.sample_ids_from_json(text)]

    def drain(self, next_step: int, model) -> None:
        """Take every batch sampled ahead (those of steps next_step .. next_step + k - 1) into the buffer. Version
        next_step goes out first: with partial rollouts the last of these batches ends with it."""
        self.send_weights(next_step, model)
        last = min(next_step + self.schedule.staleness, self.schedule.total_steps)
        for batch in range(next_step * self.per_step, last * self.per_step):
            if batch not in self.buffer:
                self.buffer[batch] = self.parts(batch)

    def state_dict(self) -> dict:
        return {"buffer": {str(b): parts for b, parts in self.buffer.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.buffer = {int(b): list(parts) for b, parts in state["buffer"].items()}


class WeightReceiver(threading.Thread):
    """A rollout rank's thread receiving the versions it needs, in order, into `versions`."""

    def __init__(self, model, needed: List[int], mailbox: Mailbox):
        super().__init__(daemon=True)
        self.count, self.needed, self.mailbox = wire.weight_count(model), list(needed), mailbox
        self.versions: Dict[int, tuple] = {}
        self.ready = threading.Condition()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            for sent, _ in enumerate(self.needed, 1):
                self.mailbox.wait_for(weights_key(rank()), sent)
                header = paddle.zeros([3], dtype="int64")
                dist.recv(header, src=0)
                flat = paddle.zeros([int(header[2])], dtype="float32")
                dist.recv(flat, src=0)
                with self.ready:
                    self.versions[int(header[0])] = (header, flat)
                    self.ready.notify_all()
        except BaseException as err:  # surfaced by the main thread's next wait
            with self.ready:
                self.error = err
                self.ready.notify_all()

    def apply(self, version: int, model) -> None:
        """Wait for `version`, check and load it into `model`, forget the older ones."""
        with self.ready:
            self.ready.wait_for(lambda: version in self.versions or self.error is not None)
            if self.error is not None:
                raise RuntimeError(f"rollout rank {rank()}: receiving policy weights failed: {self.error}")
            header, flat = self.versions.pop(version)
            for old in [v for v in self.versions if v < version]:
                del self.versions[old]
        if not skips_sync(version):
            wire.unpack_weights(model, header, flat)
