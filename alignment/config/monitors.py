"""Run monitors: the thresholds of the per-step checks (alignment/training/monitors.py) and what a firing one does."""
from __future__ import annotations

import dataclasses

from alignment.config.parser import field

MONITOR_ACTIONS = ("warn", "checkpoint", "stop")


@dataclasses.dataclass
class MonitorArguments:
    """Per-step instability monitors of the PPO family; events go to <output_dir>/monitor_events.jsonl and
    report.md (docs/trust.md)."""
    HELP_SECTIONS = {"monitor_action": "Monitors and the run report"}

    monitor_action: str = field("warn", help=f"What a monitor that fires does, one of {MONITOR_ACTIONS}: 'warn' "
                                             "prints one line; 'checkpoint' also saves a step checkpoint; 'stop' "
                                             "saves one, writes report.md and ends the run (exit 1) with one line "
                                             "naming the monitor, step and value.")
    monitor_baseline_steps: int = field(3, ge=1, help="Steps whose mean is the baseline of the relative monitors "
                                                      "(entropy collapse, length drift); they cannot fire before "
                                                      "it is complete.")
    monitor_window: int = field(8, ge=2, help="Steps the trend monitors look back: reward hacking compares the mean "
                                              "of the window's second half with its first half; KL spike averages "
                                              "the previous this many steps.")
    monitor_entropy_collapse: float = field(0.25, ge=0, le=1, help="Entropy collapse: fires when the step's "
                                                                   "entropy is below this fraction of its baseline; "
                                                                   "0 = off.")
    monitor_kl_spike: float = field(5.0, ge=0, help="KL spike: fires when kl exceeds this many times the mean of the "
                                                    "previous monitor_window steps (and monitor_kl_floor); it cannot "
                                                    "fire before that window is complete; 0 = off.")
    monitor_kl_floor: float = field(0.05, ge=0, help="KL spike and acceleration ignore a kl below this (nats): a "
                                                     "policy next to its reference has a near-0 KL whose ratios "
                                                     "mean nothing.")
    monitor_kl_acceleration: float = field(1.0, ge=0, help="KL acceleration: fires when the KL's second difference "
                                                           "kl[t] - 2 kl[t-1] + kl[t-2] exceeds this (nats); 0 = "
                                                           "off.")
    monitor_length_drift: float = field(0.5, ge=0, help="Response-length drift: fires when response_length differs "
                                                        "from its baseline by more than this fraction of it (0.5: "
                                                        "below half or above 1.5x); 0 = off.")
    monitor_clip_fraction: float = field(0.3, ge=0, le=1, help="Clip fraction: fires when clip_frac (tokens whose "
                                                               "ratio was clipped) exceeds this; 0 = off.")
    monitor_zero_variance_groups: float = field(0.9, ge=0, le=1, help="Zero-variance groups: fires when more than "
                                                                      "this fraction of the step's groups have equal "
                                                                      "rewards (they teach a group estimator "
                                                                      "nothing); needs num_return_sequences >= 2; "
                                                                      "0 = off.")
    monitor_reward_hacking: float = field(0.1, ge=0, help="Reward hacking: fires when reward/mean rose by more than "
                                                          "this over monitor_window steps while the held-out "
                                                          "signal (gold_reward/mean, else eval/gold_reward, else "
                                                          "eval/reward) stayed flat or fell; 0 = off.")

    def validate(self) -> None:
        if self.monitor_action not in MONITOR_ACTIONS:
            raise ValueError(f"key 'monitor_action' must be one of {MONITOR_ACTIONS}, got {self.monitor_action!r}")
