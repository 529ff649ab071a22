"""The allowed values of the choice keys, in one place: argument validation reads them here, and the modules that
act on a choice (the RL math, the optimizer, offload) take their names from here too, so a name cannot be accepted
by the parser and unknown to the code, or the other way round. Plain Python, no imports. What users extend
(advantage estimators, policy losses, KL estimators, preference losses, reward functions) is named in registries
instead (registry.py)."""

LR_SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")
SHARDING_STAGES = ("", "stage1", "stage2", "stage3")

EVAL_MODES = (None, "single", "tensor_parallel")
ROLLOUT_DECODES = ("eager", "static")
MOE_ROUTING_REPLAYS = ("none", "rollout")  # ppo/learner/routing_replay.py REPLAYS
EPISODE_SCHEDULES = ("continuous", "lockstep")  # envs/multiturn.py SCHEDULES
OFFLOAD_LEVELS = ("freeze_model", "optimizer", "train_model")

REWARD_LOSS_TYPES = ("sequence-wise", "token-wise")
NORMALIZER_TYPES = ("RunningMeanStd", "ExponentialMovingAverage", "Identity")

# verl's `loss_agg_mode` values (verl/trainer/ppo/core_algos.py agg_loss); semantics in ppo/algorithms.aggregate_loss
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def parse_offload_levels(value: str) -> frozenset:
    """'freeze_model optimizer' -> {'freeze_model', 'optimizer'}; an unknown word is an error naming the key."""
    words = frozenset(value.replace(",", " ").split())
    unknown = sorted(words - set(OFFLOAD_LEVELS))
    if unknown:
        raise ValueError(f"key 'offload_level': unknown level(s) {unknown}; use any of {list(OFFLOAD_LEVELS)}, "
                         "space-separated, or ''")
    return words
