"""Episodes that overlap: how much a slow environment adds to a multi-turn rollout's generation time.

    python benchmarks/bench_episode_overlap.py [--episodes 16] [--turns 3] [--wait 0.25] [--jitter 0.5]

The tiny LLaMA of tools/make_tiny.py plays `--episodes` episodes of `--turns` turns (up to 12 sampled tokens a
turn, so turns end at different steps) against an environment whose every step waits `--wait` seconds
(times a factor in [1 - jitter, 1 + jitter] fixed per row and turn: a remote tool or game server), with each
schedule of envs/multiturn.py and the environment pool at its default size, one at a time (`workers 1`: what a
rollout did before steps overlapped), and as an `async def` environment. Each variant's generation time is set
against the same rollout without waits; the target is growth <= 2 x one episode's waits (turns x wait). Every
variant's trajectories are compared with the no-wait run's, token for token and log-prob for log-prob.
Writes episode_overlap_<stamp>.json (benchmarks/record.py: --results-dir, --record, --no-save).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

from alignment.envs import Environment, StepResult  # noqa: E402


class Waiting(Environment):
    """`turns` turns; each step waits wait x factor(row, turn) seconds, then answers "go on (k)"."""

    def __init__(self, turns: int, wait: float, jitter: float):
        self.turns, self.wait, self.jitter = turns, wait, jitter

    def reset(self, row):
        self.row, self.k = row["id"], 0
        return [{"role": "user", "content": f"Count with me, episode {row['id']}."}]

    def seconds(self) -> float:
        factor = 1.0 + self.jitter * (2.0 * ((self.row * 7 + self.k * 13) % 11) / 10.0 - 1.0)
        return self.wait * factor

    def answer(self):
        self.k += 1
        if self.k >= self.turns:
            return StepResult([], 1.0, True)
        return StepResult([{"role": "user", "content": f"go on ({self.k})"}], 0.0, False)

    def step(self, text):
        time.sleep(self.seconds())
        return self.answer()


class AsyncWaiting(Waiting):
    async def step(self, text):
        await asyncio.sleep(self.seconds())
        return self.answer()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--wait", type=float, default=0.25)
    p.add_argument("--jitter", type=float, default=0.5)
    from benchmarks import record

    record.add_arguments(p)
    args = p.parse_args(argv)

    import numpy as np
    import paddle

    from alignment.commands import make_tiny
    from alignment.envs.multiturn import multi_turn_rollout
    from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer

    model_dir = make_tiny.main(["--output", os.path.join(tempfile.mkdtemp(), "tiny")])
    model = LlamaForCausalLM.from_pretrained(model_dir)
    model.eval()
    tokenizer = Tokenizer.from_pretrained(model_dir)
    config = GenerationConfig(max_new_tokens=12, temperature=1.0, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    rows = [{"id": i} for i in range(args.episodes)]
    seeds = [[1, i] for i in range(args.episodes)]

    def run(env_class, wait, **kwargs):
        envs = [env_class(args.turns, wait, args.jitter) for _ in rows]
        start = time.perf_counter()
        out = multi_turn_rollout(model, tokenizer, envs, rows, config, args.turns, 256, max_length=320,
                                 row_seeds=seeds, **kwargs)
        return time.perf_counter() - start, out

    run(Waiting, 0.0)  # warm-up
    variants = {"no waits": (Waiting, 0.0, {}), "continuous": (Waiting, args.wait, {}),
                "lockstep": (Waiting, args.wait, {"schedule": "lockstep"}),
                "async def, continuous": (AsyncWaiting, args.wait, {}),
                "one at a time (workers 1)": (Waiting, args.wait, {"workers": 1})}
    results, reference = {}, None
    for name, (env_class, wait, kwargs) in variants.items():
        seconds, trajectories = run(env_class, wait, **kwargs)
        same = reference is None or all(a.input_ids == b.input_ids and a.log_probs == b.log_probs
                                        for a, b in zip(trajectories, reference))
        reference = reference or trajectories
        results[name] = {"seconds": seconds, "same_bits_as_no_waits": same}
        print(f"{name:28s} {seconds:7.2f} s  same bits as without waits: {same}", flush=True)
    episode_waits = args.turns * args.wait
    base = results["no waits"]["seconds"]
    for name, r in results.items():
        r["growth_over_episode_waits"] = (r["seconds"] - base) / episode_waits
    turns = [t.num_turns for t in reference]
    report = {"episodes": args.episodes, "turns": args.turns, "wait": args.wait, "jitter": args.jitter,
              "one_episode_waits_s": episode_waits, "turns_played": float(np.mean(turns)),
              "tokens_sampled": int(sum(sum(t.action_mask) for t in reference)), "variants": results,
              "target": "growth <= 2 x one episode's waits", "paddle": paddle.__version__}
    print(f"\none episode's waits: {episode_waits:.2f} s; growth over the no-wait run, in episodes' waits:")
    for name, r in results.items():
        print(f"  {name:28s} {r['growth_over_episode_waits']:6.2f}x")
    print(describe_machine(machine_facts()))
    if not args.no_save:
        record.save("episode_overlap", report, record.results_dir(args))
    return report


if __name__ == "__main__":
    main()
