"""Update-phase time with and without padding removal: PPO's actor and critic forward/backward + AdamW over one
rollout batch in micro-batches, where responses have different lengths (as with eos stops).

    python benchmarks/bench_update_padding.py [--rollouts 64] [--micro-batch 8] [--repeats 3]

A random-init LLaMA of the peer benchmark's shape (hidden 256, intermediate 1024, 4 layers, vocab 8000) as actor
and critic; prompts of 8-48 tokens (left-padded), responses of 4-96 tokens (right-padded), drawn from a seeded RNG.
Ways to cut the rollout into micro-batches of --micro-batch rows: shuffled and padded to the whole rollout's width
(before), trimmed (Rollout.trimmed: no column that is padding in every row; what pipeline stages get), grouped by
length then trimmed, and grouped by length then packed (Rollout.packed: every row starts at column 0; the
default). Prints seconds per update, the share of computed token positions that are padding, and the speed-ups
against "before" measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    from benchmarks import record

    record.add_arguments(p)
    args = p.parse_args(argv)

    import numpy as np
    import paddle

    from alignment.models import LlamaConfig, LlamaForCausalLM
    from alignment.models.score_model import ScoreConfig, ScoreModel
    from alignment.ppo.rl_math import algorithms as rl
    from alignment.ppo.rl_math import surrogate
    from alignment.ppo.rollout.rollout import Rollout, critic_values, response_log_probs, update_order

    shape = dict(vocab_size=8000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
    paddle.seed(0)
    actor, critic = LlamaForCausalLM(LlamaConfig(**shape)), ScoreModel(ScoreConfig(**shape, score_type="critic"))
    opt = paddle.optimizer.AdamW(1e-5, parameters=actor.parameters() + critic.parameters())
    rng = np.random.default_rng(0)
    n, prompt_width, response_width = args.rollouts, 48, 96
    prompt_lens, response_lens = rng.integers(8, prompt_width + 1, n), rng.integers(4, response_width + 1, n)
    ids = paddle.to_tensor(rng.integers(4, 8000, (n, prompt_width + response_width)))
    attention = np.zeros((n, prompt_width + response_width), "int64")
    response = np.zeros((n, response_width), "float32")
    for row in range(n):
        attention[row, prompt_width - prompt_lens[row]: prompt_width + response_lens[row]] = 1
        response[row, : response_lens[row]] = 1
    per_token = paddle.to_tensor(rng.normal(size=(n, response_width)).astype("float32"))
    batch = Rollout(ids, paddle.to_tensor(attention), paddle.to_tensor(response), prompt_width, [], [], {},
                    old_log_probs=per_token * 0 - 9.0, advantages=per_token, old_values=per_token,
                    returns=per_token)

    def update(order, layout: str):
        positions = 0
        for start in range(0, n, args.micro_batch):
            micro = batch.select(paddle.to_tensor(order[start: start + args.micro_batch]))
            micro = {"padded": micro, "trimmed": micro.trimmed(), "packed": micro.packed()}[layout]
            positions += int(np.prod(micro.input_ids.shape))
            log_probs, _ = response_log_probs(actor, micro.input_ids, micro.attention_mask, micro.prompt_len,
                                              response_index=micro.response_index)
            ratio, _ = surrogate.token_ratio(log_probs, micro.old_log_probs, micro.response_mask)
            loss = surrogate.clipped_policy_loss(ratio, micro.advantages, micro.response_mask, 0.2, 0.2)
            values = critic_values(critic, micro.input_ids, micro.attention_mask, micro.prompt_len,
                                   micro.response_index)
            loss = loss + rl.critic_loss(values, micro.old_values, micro.returns, micro.response_mask, 5.0)
            loss.backward()
            opt.step()
            opt.clear_grad()
        return positions

    real = int(attention.sum())
    ways = {"padded to the rollout (before)": (False, "padded"), "trimmed": (False, "trimmed"),
            "grouped by length + trimmed (pipeline stages)": (True, "trimmed"),
            "grouped by length + packed (default)": (True, "packed")}
    lengths = prompt_lens + response_lens
    results = {}
    for name, (grouped, layout) in ways.items():
        best, positions = float("inf"), 0
        for repeat in range(args.repeats + 1):  # the first pass warms up
            order = update_order(np.random.default_rng(repeat), lengths, args.micro_batch, grouped)
            start = time.perf_counter()
            positions = update(order, layout)
            if repeat:
                best = min(best, time.perf_counter() - start)
        results[name] = {"sec": best, "padding": 1 - real / positions}
    base = results["padded to the rollout (before)"]["sec"]
    print(f"| micro-batches of {args.micro_batch} from {n} rollouts | s / update | padding computed | speed-up |")
    print("| --- | ---: | ---: | ---: |")
    for name, r in results.items():
        print(f"| {name} | {r['sec']:.3f} | {r['padding']:.0%} | {base / r['sec']:.2f}x |")
    if not args.no_save:
        record.save("update_padding", {"rollouts": args.rollouts, "micro_batch": args.micro_batch, "ways": results},
                    record.results_dir(args))
    return results


if __name__ == "__main__":
    main()
