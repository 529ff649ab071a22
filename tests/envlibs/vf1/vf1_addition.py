"""A verifiers 0.4 (v1 API) taskset for the adapter tests, a top-level module as verifiers loads one (this folder
on sys.path, and on PYTHONPATH for its tool server, which runs as `python -m vf1_addition`): "What is a + b?",
scored by `exact` (the last reply is the sum) and `brief` (weight 0.5: one over the assistant turns), with the
metric `reply_chars`, and stopped (`@vf.stop`) once a reply says "give up"; `use_tools` gives it a shared `add`
tool served over MCP; `task.breaks_on`: scoring raises for the task of that answer."""
import verifiers.v1 as vf


class AdditionData(vf.TaskData):
    answer: int


class AddTools(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class AdditionTaskConfig(vf.TaskConfig):
    breaks_on: int | None = None


class AdditionTask(vf.Task[AdditionData, vf.State, AdditionTaskConfig]):
    @vf.reward
    async def exact(self, trace: vf.Trace) -> float:
        if self.config.breaks_on == self.data.answer:
            raise RuntimeError("the scoring broke")
        return float(trace.last_reply == str(self.data.answer))

    @vf.reward(weight=0.5)
    async def brief(self, trace: vf.Trace) -> float:
        return 1.0 / max(1, len(trace.assistant_messages))

    @vf.stop
    async def gave_up(self, trace: vf.Trace) -> bool:
        return "give up" in trace.last_reply

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class AdditionConfig(vf.TasksetConfig):
    use_tools: bool = False
    task: AdditionTaskConfig = AdditionTaskConfig()
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class AdditionTaskset(vf.Taskset[AdditionTask, AdditionConfig]):
    def load(self):
        return [AdditionTask(AdditionData(prompt=f"What is {a} + {b}?", answer=a + b,
                                          system_prompt="Answer with the number."), self.config.task)
                for a, b in ((2, 3), (40, 2))]

    @classmethod
    def toolsets(cls, config):
        return [AddTools(config.tools)] if config.use_tools else []


__all__ = ["AdditionTaskset"]

if __name__ == "__main__":
    AddTools.run()
