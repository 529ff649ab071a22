"""Rows of the learning demos' result tables (docsgen/results_tables.py): figures with their 95% CIs, each a field
of a result file."""
from __future__ import annotations

from typing import List


def ci(v: dict, sign: str = "") -> str:
    return f"{v['mean']:{sign}.3f} [{v['low']:{sign}.3f}, {v['high']:{sign}.3f}]"


def grpo_reasoning(r: dict) -> List[List[str]]:
    rows = []
    for seed in r["seeds"]:
        first, last, gain = seed["points"][0], seed["points"][-1], seed["gain"]
        sampled = [f"{ci(first[k])} -> {ci(last[k])}" if k in first and k in last else "-"
                   for k in ("sampled_pass@1", "sampled_pass@8")]
        sampled_gain = ci(gain["sampled_pass@1"], "+") if "sampled_pass@1" in gain else "-"
        transfer = ci(gain["transfer_greedy"], "+") if "transfer_greedy" in gain else "-"
        rows.append([str(seed["seed"]), str(last["step"]), f"{last['train_minutes']:.1f}",
                     f"{ci(first['greedy'])} -> **{ci(last['greedy'])}**", f"**{ci(gain['greedy'], '+')}**",
                     sampled[0], f"**{sampled_gain}**", sampled[1], transfer])
    before = r.get("before_sft")
    if before:  # the instruct model, before the SFT on worked solutions that GRPO starts from
        sampled = [ci(before[k]) if k in before else "-" for k in ("sampled_pass@1", "sampled_pass@8")]
        rows.append(["instruct model, before SFT", "-", "-", ci(before["greedy"]), "-", sampled[0], "-", sampled[1],
                     "-"])
    return rows


def distill_chain_sum(r: dict) -> List[List[str]]:
    reach = f"minutes_to_{int(r['share'] * 100)}pct_of_teacher_gain"
    rows = [["student (the start of every arm)", "-", ci(r["student"]), "-", "-", "-"],
            ["teacher", "-", ci(r["teacher"]), f"**{ci(r['teacher_gain'], '+')}**", "1.00", "-"]]
    for name, result in r["arms"].items():
        last = result["curve"][-1]
        share = last["share_of_teacher_gain"]
        rows.append([name, f"{last['minutes']:.1f}", "-", f"**{ci(last['gain'], '+')}**",
                     "-" if share is None else f"{share:.2f}",
                     "not reached" if result[reach] is None else f"{result[reach]:.1f}"])
    return rows


def main_demo_seeds(r: dict) -> List[List[str]]:
    rows = [["SFT (the start of both arms)", "-", ci(r["start"]["gold"]), "-"]]
    for arm in r["arms"]:
        runs = ", ".join(f"{run['seed']}: {run['gold']['mean']:.3f}" for run in arm["runs"])
        rows.append([arm["arm"], runs, f"**{ci(arm['over_seeds'])}**", "-"])
    for d in r["differences"]:
        rows.append([d["arms"], "-", "-", f"**{ci(d, '+')}**" + (" (the arms' intervals overlap)"
                                                                   if d["intervals_overlap"] else "")])
    return rows


def curriculum_chain_sum(r: dict) -> List[List[str]]:
    rows = []
    for name, result in r["arms"].items():
        first, last = result["curve"][0], result["curve"][-1]
        pool = result["pool_at_end"]
        steps, minutes = result["steps_to_plain_final_gain"], result["minutes_to_plain_final_gain"]
        rows.append([name, str(last["step"]), f"{last['minutes']:.1f} ({result['median_step_seconds']:.1f})",
                     f"{ci(first['pass@1'])} -> {ci(last['pass@1'])}",
                     f"**{ci(last['gain'], '+')}**", "not reached" if steps is None else f"{steps} ({minutes:.1f})",
                     " / ".join(f"{v:.2f}" for v in result["zero_variance_groups_by_quarter"]),
                     f"{pool['curriculum/set_aside']:.0f} / {pool['curriculum/readmissions']:.0f}" if pool else "-"])
    d = r["curriculum_minus_plain_at_end"]
    rows.append(["curriculum - plain, at the end (paired)", "-", "-", "-", f"**{ci(d, '+')}**", "-", "-", "-"])
    return rows
