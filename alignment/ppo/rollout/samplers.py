"""How the trainer samples a rollout, as a strategy (like critic.py's): `SingleTurn` (one answer per prompt,
rollout.py) or `Episodes` (multi-turn episodes with an environment, episodes.py). The trainer asks neither which
one it has nor how long a turn may be.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import paddle

from alignment.models.generation import GenerationConfig
from alignment.models.static_decode import StaticDecoder
from alignment.parallel.distributed import gather_objects
from alignment.ppo.rollout.drafts import draft_for
from alignment.ppo.rollout.episodes import env_metric_names, episode_metrics, sample_episodes
from alignment.ppo.rollout.rollout import Rollout, sample_rollout


@dataclasses.dataclass
class Draw:
    """What one call samples: items [prompt items], n answers each (1 when greedy), the items' places in the
    step's global batch (positions of `total`; None: a one-process batch), the generation seed of the draw (per-row
    seeds derive from it), and the temperature to take old log-probs from the sampling pass at (None: not)."""
    items: Sequence[Mapping]
    n: int
    greedy: bool = False
    positions: Optional[List[int]] = None
    total: Optional[int] = None
    seed: int = 0
    log_prob_temperature: Optional[float] = None
    between_tokens: Optional[Callable[[int], bool]] = None  # partial rollouts: moves the weights on (generate)


class SingleTurn:
    """One response per row, at most max_new_tokens (or what max_length leaves after the longest prompt)."""

    def __init__(self, ppo, max_length: int, collate_prompts: Callable, keep_experts: bool = False, draft=None):
        self.ppo, self.max_length, self.collate = ppo, max_length, collate_prompts
        self.static_decoders = {}  # rollout_decode static: compiled decode steps per generating model
        self.keep_experts = keep_experts  # MoE routing replay: each token's experts on the rollout
        self.draft = draft  # speculative decoding with a draft model (drafts.py; None: none)

    def config(self, base: GenerationConfig, draw: Draw) -> GenerationConfig:
        budget = self.max_length - max(len(item["input_ids"]) for item in draw.items)
        longest = min(budget, self.ppo.max_new_tokens or budget)
        config = dataclasses.replace(base, max_new_tokens=longest, min_new_tokens=min(self.ppo.min_new_tokens,
                                                                                      longest))
        return dataclasses.replace(config, do_sample=False, repetition_penalty=1.0) if draw.greedy else config

    def __call__(self, actor, tokenizer, base: GenerationConfig, draw: Draw) -> Rollout:
        static = None
        if self.ppo.rollout_decode == "static":  # one decoder per model object (the actor, or its whole copy)
            if id(actor) not in self.static_decoders:
                self.static_decoders[id(actor)] = StaticDecoder(actor)
            static = self.static_decoders[id(actor)]
        return sample_rollout(actor, tokenizer, draw.items, self.config(base, draw), draw.n, self.collate,
                              draw.positions, draw.total, static, draw.log_prob_temperature, draw.between_tokens,
                              self.keep_experts, draft_for(self.draft, actor))

    @staticmethod
    def metrics(rollout) -> dict:
        return {}


class Episodes(SingleTurn):
    """A multi-turn episode per row with the environment `env_args` names; max_new_tokens (or max_length) caps
    each turn, max_trajectory_tokens and max_length the episode. Each row samples with its own seed (the draw's
    seed and the row's place in the global batch), so any split of the batch over processes gives the same
    episodes. An episode still failing after its retries is kept with its error (the trainer drops its group;
    an evaluation scores its empty answer)."""

    def __init__(self, ppo, max_length: int, collate_prompts: Callable, env_args, keep_experts: bool = False,
                 draft=None):
        super().__init__(ppo, max_length, collate_prompts, keep_experts, draft)
        self.env_args = env_args

    def config(self, base: GenerationConfig, draw: Draw) -> GenerationConfig:
        turn = min(self.max_length, self.ppo.max_new_tokens or self.max_length)
        config = dataclasses.replace(base, max_new_tokens=turn, min_new_tokens=min(self.ppo.min_new_tokens, turn))
        return dataclasses.replace(config, do_sample=False, repetition_penalty=1.0) if draw.greedy else config

    def __call__(self, actor, tokenizer, base: GenerationConfig, draw: Draw) -> Rollout:
        seeds = None
        if not draw.greedy:
            positions = range(len(draw.items)) if draw.positions is None else draw.positions
            seeds = [[draw.seed, p * draw.n + s] for p in positions for s in range(draw.n)]
        return sample_episodes(actor, tokenizer, draw.items, self.config(base, draw), self.env_args,
                               self.max_length, draw.n, seeds, draw.log_prob_temperature, keep_failed=True,
                               keep_experts=self.keep_experts, draft=draft_for(self.draft, actor))

    @staticmethod
    def metrics(rollout) -> dict:
        """env/* means of this rank's episodes; the environments' own metric names agreed over the training ranks
        (their means are averaged over ranks key by key)."""
        names = sorted({name for part in gather_objects(env_metric_names(rollout.episodes)) for name in part})
        return episode_metrics(rollout.episodes, "env/", names)


class PolicySampler:
    """The policy sampling rollouts: a collaborator the trainer builds once and hands to the rollout sources
    (sources.py) and the evaluation. It holds the model that generates (the actor, or its whole copy refreshed to
    the step's weights: eval_mode single, pipeline, sharded parameters), the sampling strategy (SingleTurn or
    Episodes, or GKD's mix of one with off-policy answers), the generation settings and the draw's seed; and the
    generate phase around a draw: the progress bar with the last generation speed, offload and precision."""

    def __init__(self, actor, whole_copy, strategy, tokenizer, gen_config: GenerationConfig, ppo,
                 log_probs_from_sampling: bool, phase: Callable, offload, generating_models: Sequence, precision):
        self.actor, self.whole_copy, self.strategy = actor, whole_copy, strategy
        self.tokenizer, self.gen_config, self.ppo = tokenizer, gen_config, ppo
        self.log_probs_from_sampling = log_probs_from_sampling  # the trainer takes old log-probs from the draw
        self.show_phase, self.offload, self.precision = phase, offload, precision
        self.generating_models = list(generating_models)  # the actor and what samples with it (seq_kd's teacher)
        self.seed = 0  # the draw's generation seed (dynamic_sampling.generation_seed)
        self.speed: Dict[str, str] = {}  # the last rollout's tokens/s, shown on the progress bar

    def model(self, version: int):
        """The model that generates and scores at policy version `version` (the trained actor, or its copy)."""
        if self.whole_copy is None:
            return self.actor
        return self.whole_copy.refreshed(self.actor, version=version)

    def seed_draw(self, seed: int) -> None:
        self.seed = seed
        paddle.seed(seed)

    @contextlib.contextmanager
    def generating(self, attempt: int):
        """The generate phase of a step's draw `attempt` (0-based)."""
        self.show_phase(phase="generate", **({"try": str(attempt + 1)} if attempt else {}), **self.speed)
        with self.offload.phase("generate", self.generating_models), self.precision.autocast():
            yield

    def sample(self, items, version: int, greedy: bool = False, positions=None, total=None) -> Rollout:
        """Responses (or multi-turn episodes) to the prompt items, num_return_sequences each when sampling, one
        each when greedy; positions / total: the items' places in the step's global batch (see sample_rollout)."""
        from_sampling = self.log_probs_from_sampling and not greedy
        draw = Draw(items, 1 if greedy else self.ppo.num_return_sequences, greedy, positions, total, self.seed,
                    self.ppo.temperature if from_sampling else None)
        return self.strategy(self.model(version), self.tokenizer, self.gen_config, draw)

    def metrics(self, rollout) -> dict:
        return self.strategy.metrics(rollout)


def rollout_generation_config(ppo, actor, tokenizer) -> GenerationConfig:
    """The rollouts' sampler settings; each draw sets max_new_tokens (SingleTurn.config / Episodes.config)."""
    return GenerationConfig(max_new_tokens=1, do_sample=True, temperature=ppo.temperature, top_p=ppo.top_p,
                            top_k=ppo.top_k, repetition_penalty=ppo.repetition_penalty,
                            prompt_lookup_num_tokens=ppo.prompt_lookup_num_tokens,
                            num_assistant_tokens=ppo.num_assistant_tokens if ppo.draft_key else 0,
                            eos_token_id=actor.config.eos_token_ids or tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
