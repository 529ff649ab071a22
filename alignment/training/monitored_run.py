"""The trainer mixin that runs the monitors (alignment/training/monitors.py) after every step and writes the run
report (alignment/training/run_report.py) at the end."""
from __future__ import annotations

from typing import Dict

from alignment.training.monitors import RunMonitors, describe
from alignment.training.run_report import write_report


class MonitoredRun:
    """A trainer mixin (before Trainer in the bases): the run monitors after every step, monitor_action on their
    events, and report.md at the end of the run (alignment/training/run_report.py)."""

    monitor_state = None  # a resumed checkpoint's

    def start_monitors(self, monitor_args) -> None:
        """After resume_if_asked: a resumed run keeps the events of the steps it keeps and the monitors' history."""
        from alignment.config.monitors import MonitorArguments
        from alignment.parallel.distributed import is_main_process

        self.monitors = RunMonitors(monitor_args or MonitorArguments(), self.args.output_dir, is_main_process())
        self.monitors.start_fresh(self.global_step)
        if self.monitor_state is not None:
            self.monitors.load_state_dict(self.monitor_state)

    def trainer_state(self) -> dict:
        return {**super().trainer_state(), "monitors": self.monitors.state_dict()}

    def load_trainer_state(self, state: dict) -> None:
        super().load_trainer_state(state)
        self.monitor_state = state.get("monitors")

    def after_step(self, metrics: Dict[str, float]) -> None:
        """monitor_action on this step's events (the same on every rank: the metrics are averaged over ranks): warn
        prints one line per event; checkpoint also saves a step checkpoint; stop logs the step, saves, writes the
        report and ends the run with one line (TrainingStopped: exit 1)."""
        from alignment.training.guard import TrainingStopped

        events, action = self.monitors.observe(self.global_step, metrics), self.monitors.args.monitor_action
        if not events:
            return
        if self.monitors.writes:
            for event in events:
                print(f"warning: {describe(event)} (monitor_action: {action})")
        if action == "checkpoint":
            self.save_step_checkpoint()
        elif action == "stop":
            self.logger.log(self.global_step, self.log_row(self.window), echo=None)  # the step's row, logged
            self.window = []
            self.save_step_checkpoint()
            self.write_report()
            raise TrainingStopped(f"{describe(events[0])} (monitor_action: stop); step {self.global_step} is saved "
                                  f"under {self.args.output_dir}; report.md there lists the events")

    def finished(self, results: Dict[str, dict]) -> None:
        super().finished(results)
        self.write_report()

    def write_report(self) -> None:
        """report.md and its plots in output_dir (rank 0; not for benchmark runs, which save nothing)."""
        if self.monitors.writes and not self.args.benchmark:
            write_report(self.args.output_dir)
