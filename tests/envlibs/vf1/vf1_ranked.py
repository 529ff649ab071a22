"""The addition taskset with an environment that judges an episode's traces together (finalize: the best reply
of n attempts scores 1): a group-level reward, which the adapter refuses at load."""
import verifiers.v1 as vf
from vf1_addition import AdditionTaskset


class RankedConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class RankedEnv(vf.Env[RankedConfig]):
    async def run(self, task, agents):
        for _ in range(2):
            await agents.agent.run(task)

    async def finalize(self, task, episode):
        top = max(trace.reward for trace in episode.traces)
        for trace in episode.traces:
            trace.record_reward("best", float(trace.reward == top))


__all__ = ["AdditionTaskset", "RankedEnv"]
