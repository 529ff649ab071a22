"""The trainer's proof that every trained sample came from the weights it claims: each sampler (the local engine, a
rollout rank; the gateway and multi-turn episodes sample through them with the same model) stamps its rows with the
digest of the weights it sampled with (models/weights_digest.py) and who it is; the trainer records the digest of
each policy version at the start of the step that trains with it, and checks every batch before scoring it.

A row passes when its version is within `max_staleness` of the step's and its digest is that version's. Otherwise
the run stops with one line (StaleWeights, a ValueError: exit 2) naming the sampler, the sample and the versions:
- a digest equal to the base model's while the trainer has LoRA adapters: the adapter never reached the sampler
  (caught at the first step, since the adapters are part of every version's digest, their zero start included);
- a digest of another version, or of no version at all: the sampler skipped a weight sync or loaded other weights;
- a version older than max_staleness allows.
Rows GKD trains off-policy on purpose (the dataset's answers, or the teacher's with seq_kd: distill_sampler.py)
carry a digest starting "off-policy:" (the teacher's weights digest after it) and are not checked.
The digests of the versions in the window travel in the trainer state, so a resumed run checks the batches it
sampled ahead. A row whose version the trainer never saw (a checkpoint written before digests were recorded) is
not checked.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from alignment.models.weights_digest import StaleWeights, base_digest, weights_digest

OFF_POLICY = "off-policy:"  # the digest prefix of rows no policy version sampled (distill_sampler.py)


def row_problem(known: Dict[int, str], base: Optional[str], step: int, staleness: int, version: int,
                digest: Optional[str], who: str, sample: str) -> Optional[str]:
    """Why the row `sample` sampled by `who` with weights `digest`, claiming `version`, cannot be trained at step
    `step` (versions step - staleness .. step allowed; known: version -> digest; base: the digest of the model
    without its LoRA adapters, None without LoRA); None when it can."""
    oldest = max(0, step - staleness)
    where = f"{who}: sample {sample} (policy version {version}, trained at step {step})"
    if version < oldest:
        return f"{where} is older than the versions {oldest}..{step} key 'max_staleness' {staleness} allows"
    if digest is None:
        return f"{where} carries no weights digest; every sampler records the digest of the weights it used"
    if digest.startswith(OFF_POLICY):  # GKD's dataset or teacher answers: not the policy's samples by design
        return None
    if base is not None and digest == base:
        return (f"{where} was sampled without the LoRA adapter: its weights digest {digest[:12]} is the base "
                f"model's; the adapter never reached the sampler")
    if version not in known or digest == known[version]:
        return None
    matches = [v for v, d in known.items() if d == digest]
    if matches:
        return (f"{where} was sampled with policy version {matches[0]}'s weights (digest {digest[:12]}), not "
                f"version {version}'s: the sampler skipped a weight sync")
    return (f"{where} was sampled with weights (digest {digest[:12]}) that are no policy version in "
            f"{oldest}..{step} (version {version}'s digest is {known[version][:12]}): the sampler skipped a weight "
            f"sync or loaded other weights")


def stamp(rollout, digest: str, who: str) -> None:
    """Record on every row of `rollout` the digest of the weights that sampled it and who sampled it (unless a
    sampler stamped it already: GKD's off-policy rows, distill_sampler.py)."""
    if rollout.weight_digests is None:
        rollout.weight_digests, rollout.sampled_by = [digest] * len(rollout), [who] * len(rollout)


class WeightsCheck:
    """The digests of the policy versions a step may train samples of, and the check of each batch."""

    def __init__(self, staleness: int = 0):
        self.staleness = staleness
        self.known: Dict[int, str] = {}
        self.base: Optional[str] = None
        self.base_known = False

    def record(self, version: int, model) -> str:
        """The digest of `model` as version `version` (once per version); versions older than the window go."""
        if not self.base_known:  # the frozen base: once per run
            self.base, self.base_known = base_digest(model), True
        if version not in self.known:
            self.known[version] = weights_digest(model)
        for old in [v for v in self.known if v < version - self.staleness]:
            del self.known[old]
        return self.known[version]

    def check(self, rollout, step: int) -> None:
        """StaleWeights naming the first row of `rollout` trained at `step` that fails (row_problem)."""
        count = len(rollout)
        versions: List[int] = rollout.versions or [step] * count
        digests = rollout.weight_digests or [None] * count
        samplers = rollout.sampled_by or ["a sampler"] * count
        samples = rollout.sample_ids or [str(i) for i in range(count)]
        for version, digest, who, sample in zip(versions, digests, samplers, samples):
            problem = row_problem(self.known, self.base, step, self.staleness, int(version), digest, who, sample)
            if problem is not None:
                raise StaleWeights(problem)

    def state_dict(self) -> dict:
        return {"weight_digests": {str(v): d for v, d in self.known.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.known = {int(v): str(d) for v, d in state.get("weight_digests", {}).items()}
