"""Multi-turn RL arguments: which environment answers the policy's turns, and the episode's limits."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from alignment.config.choices import EPISODE_SCHEDULES
from alignment.config.parser import field
from alignment.config.ppo import PPOArguments
from alignment.config.registry import ADVANTAGE_ESTIMATORS


@dataclasses.dataclass
class EnvironmentArguments:
    """Multi-turn rollouts (alignment/envs): the policy takes a turn, an environment answers (tool results,
    feedback, a reward), the policy goes on. Only the policy's own tokens are trained on."""
    HELP_SECTIONS = {"environment": "Multi-turn environments and tools"}

    environment: Optional[str] = field(None, help="A registered environment (alignment/envs: 'tools' = the row's "
                                                  "prompt answered with tools, ending at the first turn without a "
                                                  "tool call; or a user one's NAME from user_env_modules); null = "
                                                  "single-turn rollouts.")
    environment_args: Dict[str, Any] = field({}, help="Keyword arguments of the environment's constructor, e.g. "
                                                      "{\"tools\": [\"calculator\", \"python\"]} for 'tools' "
                                                      "(tool names, or 'module:function' / 'file.py:function'); "
                                                      "\"python_sandbox\": {\"containment\": \"best-effort\"} "
                                                      "runs the python tool where the kernel cannot fully contain "
                                                      "it (docs/agentic/sandbox.md).")
    user_env_modules: List[str] = field([], help="Python files or dotted modules imported before the run, so the "
                                                 "environments (and tools) they define register.")
    max_turns: int = field(4, ge=1, help="Assistant turns per episode; an episode still going after them is cut "
                                         "(logged as env/truncated).")
    max_trajectory_tokens: Optional[int] = field(None, ge=1, help="Tokens after the prompt per episode (the "
                                                                  "policy's turns, observations and template "
                                                                  "text); null = what max_length leaves. "
                                                                  "max_new_tokens caps each turn.")
    env_reward_weight: float = field(1.0, help="Weight of the environment's reward (summed over the episode's "
                                               "turns) in the end reward, beside the reward model / server and "
                                               "reward_funcs, which score the final assistant message.")
    env_workers: int = field(16, ge=1, help="Environment steps (and resets, and so tool calls) run at once, in "
                                             "threads; async environments are awaited on one event loop.")
    episode_schedule: str = field("continuous", help="When a row whose environment has answered goes back to "
                                                     "decoding: 'continuous' at once, while the others decode; "
                                                     "'lockstep' once every row of the turn has ended and been "
                                                     "answered. The same tokens and log-probs either way.")
    agent: Optional[str] = field(None, help="An agent program to train instead of an environment: 'module:function' "
                                            "or 'file.py:function', called once per episode as "
                                            "function(base_url, api_key, row) (or async def) with an "
                                            "OpenAI-compatible endpoint whose every call the policy being trained "
                                            "samples; it returns the episode's reward (weighted like an "
                                            "environment's by env_reward_weight), or None for 0. "
                                            "environment_args may name the tool-call format: {\"format\": ...}.")
    agent_timeout: float = field(300.0, gt=0, help="Seconds an agent may take for one episode; one that takes longer "
                                                   "fails that episode (retried, then its group dropped: "
                                                   "episode_retries).")
    max_agent_error_fraction: float = field(0.5, ge=0, le=1, help="The fraction of a step's episodes whose agent may "
                                                                  "raise or time out after its retries; above it "
                                                                  "the run stops, naming the agent and its first "
                                                                  "error.")
    episode_retries: int = field(2, ge=0, help="Times an episode whose environment (or a tool it runs, or an agent "
                                               "program) raises, breaks the environment API or times out is played "
                                               "again, each time with a fresh environment (session) and its own "
                                               "seed; one still failing drops its whole group (every answer to "
                                               "that prompt) from the step, counted in rollout/failed_groups "
                                               "(docs/trust.md).")
    max_failed_group_fraction: float = field(0.5, ge=0, le=1, help="The fraction of a step's prompt groups that may "
                                                                   "be dropped for failed episodes; above it the "
                                                                   "run stops, naming the step and the first "
                                                                   "error.")
    per_turn_rewards: bool = field(False, help="Place each turn's environment reward on that turn's last token "
                                               "instead of adding the episode's sum at its end: for the estimators "
                                               "that read per-token rewards (their token_level_rewards, "
                                               "alignment/ppo/rl_math/estimators.py); the group estimators use the sum "
                                               "either way.")

    @property
    def multi_turn(self) -> bool:
        """Episodes of several turns: an environment's, or an agent program's."""
        return self.environment is not None or self.agent is not None

    def validate_with(self, *others) -> None:
        """Refuse what multi-turn rollouts do not do, naming the key."""
        ppo_args = next(other for other in others if isinstance(other, PPOArguments))
        if self.episode_schedule not in EPISODE_SCHEDULES:
            raise ValueError(f"key 'episode_schedule' must be one of {EPISODE_SCHEDULES}, got "
                             f"{self.episode_schedule!r}")
        if not self.multi_turn:
            for key in ("environment_args", "user_env_modules", "per_turn_rewards"):
                if getattr(self, key):
                    raise ValueError(f"key '{key}' is set but 'environment' is null (single-turn rollouts)")
            return
        if self.agent is not None:
            if self.environment is not None:
                raise ValueError("keys 'agent' and 'environment' are both set: an episode is played by one of them")
            if ":" not in self.agent:
                raise ValueError(f"key 'agent' must be 'module:function' or 'file.py:function', got {self.agent!r}")
            unknown = sorted(set(self.environment_args) - {"format"})
            if unknown:
                raise ValueError(f"key 'environment_args': with 'agent' only 'format' (the tool-call format) is "
                                 f"read, got {unknown}")
        if ppo_args.rollout_decode == "static":
            raise ValueError("key 'rollout_decode' 'static': multi-turn rollouts ('environment') decode eagerly "
                             "with the cache carried across turns; set it to 'eager'")
        if ppo_args.enable_overlong_reward_buffer:
            raise ValueError("key 'enable_overlong_reward_buffer' counts one response's length; with "
                             "'environment' cap turns with max_new_tokens and episodes with max_trajectory_tokens")
        if self.per_turn_rewards and ppo_args.normalize_reward:
            raise ValueError("key 'per_turn_rewards' with 'normalize_reward': per-turn rewards are not normalised; "
                             "set one of them to false")
        if self.per_turn_rewards and not ppo_args.estimator.token_level_rewards:
            token_level = ADVANTAGE_ESTIMATORS.names(where=lambda estimator: estimator.token_level_rewards)
            raise ValueError(f"key 'per_turn_rewards': advantage_estimator {ppo_args.advantage_estimator!r} uses one "
                             f"reward per episode; per-turn rewards need one of {', '.join(token_level)}")
