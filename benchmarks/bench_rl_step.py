#!/usr/bin/env python
"""Time one PPO or GRPO step of our PPOTrainer on the TRL peer's shape (benchmarks/README.md), fully offline.

    python benchmarks/bench_rl_step.py --algo ppo  --steps 12 [--warmup 1]
    python benchmarks/bench_rl_step.py --algo grpo --steps 12 [--warmup 1]

Everything is built locally from config: a byte-level BPE tokenizer (vocab 8000) trained with `tokenizers` on
generated template text, a random-init LLaMA policy (hidden 256, intermediate 1024, 4 layers, 4 heads, 4 kv heads,
vocab 8000: 8.29M parameters, fp32) and random-init reward and value ScoreModels of the same config (1-output head).
(benchmarks/peer_shape.py). They are saved to a temp dir and loaded the way alignment/ppo/run_ppo.py does; PPOTrainer
is constructed directly and its own training_step() (rollout -> score -> advantages -> update) runs in a loop; the
phase times are the trainer's time/generate, time/score, time/train metrics.

`--steps N` is the total number of steps; the first `--warmup` steps (default 1) are excluded from the medians, so
`--steps 12` is directly comparable with the peer's `median_step_s_excl_first` (the median of steps 2-12).
The last line printed is `RESULT {json}`. A Markdown table, a JSON file and a PNG chart are written as
`<algo>_<timestamp>.*` (benchmarks/record.py: --results-dir, --record, --no-save).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import platform
import pstats
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from report import write_reports  # noqa: E402

from benchmarks import record  # noqa: E402

from alignment.cpu_env import apply_cpu_defaults, machine_facts  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

from peer_shape import MODEL_SHAPE, VOCAB_SIZE, build_checkpoints, build_tokenizer, prompt_texts  # noqa: E402


# --- arguments ----------------------------------------------------------------------------------------------------
def make_arguments(args, paths: dict, output_dir: str):
    """(model, data, ppo, training) argument dataclasses for the peer's settings (see docs/performance/benchmarks.md for the differences)."""
    from alignment.config.parser import ArgumentParser, to_dict
    from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
    from alignment.config.training import TrainingArguments

    ppo = args.algo == "ppo"
    model_args = PPOModelArguments(actor_model_name_or_path=paths["policy"],
                                   reward_model_name_or_path=paths["reward"],
                                   reward_critic_model_name_or_path=paths["value"] if ppo else None)
    data_args = PPODataArguments(train_datasets="(in-memory benchmark prompts)",
                                 max_length=MODEL_SHAPE["max_position_embeddings"])
    ppo_args = PPOArguments(
        advantage_estimator="gae" if ppo else "grpo",
        per_device_prompt_batch_size=args.batch if ppo else args.batch // args.grpo_generations,
        num_return_sequences=1 if ppo else args.grpo_generations,
        max_new_tokens=args.resp_len,
        temperature=args.temperature if args.temperature else (0.7 if ppo else 1.0),  # TRL PPOConfig / GRPOConfig
        top_p=1.0, top_k=0, repetition_penalty=1.0,
        update_iters=args.ppo_epochs if ppo else 1,  # GRPO: TRL num_iterations=1
        kl_coeff=0.05 if ppo else args.grpo_beta,  # TRL PPOConfig.kl_coef / GRPOConfig.beta
        kl_estimator="k1" if ppo else "k3",  # TRL PPO kl_estimator k1 (in the reward); GRPO k3 in the loss
        kl_in_loss=not ppo,
        clip_range_ratio=0.2,  # TRL cliprange / epsilon
        clip_range_value=0.2,  # TRL cliprange_value
        clip_range_score=1e6,  # TRL does not clip reward-model scores
        gamma=1.0, gae_lambda=0.95, normalize_reward=False, normalize_advantage=True,
        critic_learning_rate=args.learning_rate, critic_lr_scheduler_type="linear",
        # TRL's PPO takes the old log-probs from the generation logits; --recompute-old-log-probs: our default
        rollout_log_probs=not args.recompute_old_log_probs,
    )
    train_args = TrainingArguments(
        output_dir=output_dir, seed=args.seed, max_steps=args.steps,
        per_device_train_batch_size=args.batch,  # PPO: 1 mini-batch of 16; GRPO: 16 completions in one pass
        gradient_accumulation_steps=1, learning_rate=args.learning_rate, lr_scheduler_type="linear",
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,  # HF TrainingArguments defaults
        # TRL PPO steps the optimizer without clipping; GRPOTrainer (HF Trainer loop) clips at 1.0
        max_grad_norm=args.max_grad_norm if args.max_grad_norm >= 0 else (0.0 if ppo else 1.0),
        logging_steps=1, do_eval=False, disable_tqdm=True,
    )
    classes = (PPOModelArguments, PPODataArguments, PPOArguments, TrainingArguments)
    settings = to_dict(model_args, data_args, ppo_args, train_args)
    return ArgumentParser(*classes).parse_dict(settings, "benchmark settings")  # the checks an argument file gets


# --- measurements -------------------------------------------------------------------------------------------------
def matmul_peak_gflops(sizes=(1024, 2048), seconds: float = 1.5) -> dict:
    """Best fp32 paddle.matmul throughput (GFLOP/s, 2 n^3 per product) over a timed loop per size."""
    import paddle

    out = {}
    for n in sizes:
        a, b = paddle.randn([n, n], dtype="float32"), paddle.randn([n, n], dtype="float32")
        float(paddle.matmul(a, b)[0, 0])  # warm-up
        best, deadline, reps = math.inf, time.perf_counter() + seconds, 0
        while reps < 3 or time.perf_counter() < deadline:
            t = time.perf_counter()
            float(paddle.matmul(a, b)[0, 0])  # reading an element makes sure the product is done
            best = min(best, time.perf_counter() - t)
            reps += 1
        out[n] = 2.0 * n ** 3 / best / 1e9
    return out


def machine_load() -> dict:
    try:
        load1, load5, load15 = os.getloadavg()
    except OSError:
        return {}
    return {"loadavg_1m": round(load1, 2), "loadavg_5m": round(load5, 2), "loadavg_15m": round(load15, 2),
            "cpu_count": os.cpu_count()}


def median(values):
    return statistics.median(values) if values else float("nan")


def record_rollouts(trainer) -> list:
    """The rollouts the trainer makes, in order (the rows report their shapes)."""
    made, make = [], trainer.policy_sampler.sample

    def recording(*args, **kwargs):
        made.append(make(*args, **kwargs))
        return made[-1]

    trainer.policy_sampler.sample = recording
    return made


def run(args):
    """(result dict, per-step rows)."""
    import numpy as np
    import paddle

    from alignment.config.data import LoRAArguments
    from alignment.data.tokenized import collate_prompts
    from alignment.ppo.run_ppo import build_models
    from alignment.ppo.ppo_trainer import PolicyModels, PPOTrainer, PromptData
    from alignment.rewards.scoring import RewardComputer
    from alignment.training.batches import set_seed

    load_before = machine_load()
    peak = matmul_peak_gflops(args.peak_sizes)
    peak_gflops = max(peak.values())
    print("fp32 matmul peak: " + ", ".join(f"{n}^3 {g:.1f} GFLOP/s" for n, g in peak.items()), flush=True)

    work = args.workdir or tempfile.mkdtemp(prefix="bench_rl_step_")
    try:
        t = time.perf_counter()
        tokenizer = build_tokenizer(os.path.join(work, "tokenizer"))
        print(f"tokenizer: vocab {tokenizer.vocab_size} trained in {time.perf_counter() - t:.1f}s", flush=True)
        paths = build_checkpoints(tokenizer, os.path.join(work, "models"), args.seed)
        model_args, data_args, ppo_args, train_args = make_arguments(args, paths, os.path.join(work, "run"))
        set_seed(args.seed)
        actor, reference, critic, reward_model, reward_tokenizer = build_models(model_args, ppo_args, LoRAArguments(), train_args)
        reward = RewardComputer(reward_model, reward_tokenizer, tokenizer, ppo_args.reward_funcs,
                                ppo_args.reward_weights, ppo_args.clip_range_score)
        assert not reward.retokenize, "reward model and policy share the tokenizer: no re-tokenization expected"
        actor_params = actor.num_parameters()
        critic_params = sum(int(p.numel()) for p in critic.parameters()) if critic is not None else 0
        reward_params = sum(int(p.numel()) for p in reward_model.parameters())
        print(f"policy {actor_params / 1e6:.2f}M params; reward {reward_params / 1e6:.2f}M; "
              f"value {critic_params / 1e6:.2f}M" if critic is not None else
              f"policy {actor_params / 1e6:.2f}M params; reward {reward_params / 1e6:.2f}M; no value model (GRPO)",
              flush=True)
        items = [{"input_ids": tokenizer.encode(text), "prompt": text, "answer": None} for text in prompt_texts()]
        lengths = [len(item["input_ids"]) for item in items]
        print(f"prompts: {len(items)}, {min(lengths)}-{max(lengths)} tokens (mean {np.mean(lengths):.1f})", flush=True)
        trainer = PPOTrainer(ppo_args, train_args, data_args, PolicyModels(actor, reference, critic, reward),
                             PromptData(items, None, lambda rows: collate_prompts(rows, tokenizer.pad_token_id)),
                             tokenizer)

        stride_flag = paddle.get_flags(["FLAGS_use_stride_kernel"])
        if args.stride_kernel == "on":
            paddle.set_flags({"FLAGS_use_stride_kernel": True})
        trainer.start_data_streams()
        rows, profiler, rollouts = [], None, record_rollouts(trainer)
        for step in range(args.steps):
            if args.profile and step == args.warmup:
                profiler = cProfile.Profile()
                profiler.enable()
            t0 = time.perf_counter()
            metrics = trainer.training_step()  # the trainer's own step: rollout -> score -> advantages -> update
            total = time.perf_counter() - t0
            trainer.global_step += 1
            rollout = rollouts.pop()
            n, width = rollout.input_ids.shape
            row = {"step": step + 1, "total_s": total, "generate_s": metrics["time/generate"],
                   "score_s": metrics["time/score"], "train_s": metrics["time/train"], "rollouts": int(n),
                   "prompt_width": int(rollout.prompt_len), "response_len": float(metrics["response_length"]),
                   "seq_width": int(width), "reward": float(metrics["reward/mean"]), "kl": float(metrics["kl"])}
            rows.append(row)
            print(f"step {row['step']:>3}{' (warmup)' if step < args.warmup else '':9}: {row['total_s']:.3f}s  "
                  f"generate {row['generate_s']:.3f}  score {row['score_s']:.3f}  train {row['train_s']:.3f}  "
                  f"[{n} x ({row['prompt_width']}+{row['response_len']:.0f})] reward {row['reward']:+.3f} "
                  f"kl {row['kl']:.4f}", flush=True)
        paddle.set_flags(stride_flag)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
            pstats.Stats(args.profile).sort_stats("cumulative").print_stats(25)
    finally:
        if not args.workdir and not args.keep_workdir:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"tokenizer, checkpoints and trainer output kept in {work}", flush=True)
    short = [r["step"] for r in rows if r["response_len"] != args.resp_len]
    if short:
        print(f"WARNING: steps {short} generated fewer than {args.resp_len} tokens per response", flush=True)
    load_after = machine_load()

    measured = rows[args.warmup:] or rows
    med = {key: median([r[key] for r in measured]) for key in ("total_s", "generate_s", "score_s", "train_s")}
    # Update-phase work: passes = update_iters x micro-batches; each pass runs forward+backward on every token of
    # the micro-batch (padded prompt + response). FLOPs = 6 x params x tokens per pass x passes, for the policy and
    # (PPO) the value model.
    n_rollouts = measured[0]["rollouts"]
    micro_batches = math.ceil(n_rollouts / train_args.per_device_train_batch_size)
    passes = ppo_args.update_iters * micro_batches
    tokens_per_pass = statistics.mean(r["rollouts"] * r["seq_width"] for r in measured) / micro_batches
    update_tokens = tokens_per_pass * passes
    update_flops = 6.0 * (actor_params + critic_params) * update_tokens
    # A tighter count of the matmul work: embedding tables are lookups, and our LM head runs on the response
    # positions only: 6 x (params - embeddings - LM head) x tokens + 6 x LM head x response tokens.
    table = VOCAB_SIZE * MODEL_SHAPE["hidden_size"]
    response_tokens = n_rollouts * args.resp_len * ppo_args.update_iters
    matmul_flops = 6.0 * ((actor_params - 2 * table) + (critic_params - table if critic_params else 0)) * \
        update_tokens + 6.0 * table * response_tokens
    train_tokens_per_s = update_tokens / med["train_s"]
    update_gflops_per_s = update_flops / med["train_s"] / 1e9
    result = {
        "algo": args.algo,
        "variant": "default" if args.stride_kernel == "default" else "stride-kernel-on",
        "sec_per_step_median": round(med["total_s"], 4),
        "samples_per_sec": round(n_rollouts / med["total_s"], 2),
        "median_step_s_excl_first": round(med["total_s"], 4) if args.warmup == 1 else None,
        "steps": args.steps, "warmup": args.warmup,
        "step_times_s": [round(r["total_s"], 3) for r in rows],
        "first_step_s": round(rows[0]["total_s"], 3),
        "mean_step_s_after_warmup": round(statistics.mean(r["total_s"] for r in measured), 4),
        "min_step_s": round(min(r["total_s"] for r in measured), 4),
        "samples_per_step": n_rollouts,
        "generate_s_median": round(med["generate_s"], 4),
        "score_s_median": round(med["score_s"], 4),
        "train_s_median": round(med["train_s"], 4),
        "generate_s": [round(r["generate_s"], 3) for r in rows],
        "score_s": [round(r["score_s"], 3) for r in rows],
        "train_s": [round(r["train_s"], 3) for r in rows],
        "decode_ms_per_token": round(1000 * med["generate_s"] / args.resp_len, 2),
        "prompt_width_mean": round(statistics.mean(r["prompt_width"] for r in measured), 2),
        "response_len": args.resp_len,
        "update_passes": passes,
        "update_tokens_per_step": int(update_tokens),
        "train_tokens_per_s": round(train_tokens_per_s, 1),
        "update_flops_per_step": update_flops,
        "update_gflops_per_s": round(update_gflops_per_s, 2),
        "matmul_peak_gflops": round(peak_gflops, 2),
        "matmul_peak_by_size": {str(n): round(g, 2) for n, g in peak.items()},
        "update_fraction_of_peak": round(update_gflops_per_s / peak_gflops, 4),
        "update_matmul_flops_per_step": matmul_flops,
        "update_matmul_fraction_of_peak": round(matmul_flops / med["train_s"] / 1e9 / peak_gflops, 4),
        "params": {"policy": actor_params, "value": critic_params, "reward": reward_params},
        "settings": {
            "prompts_per_step": ppo_args.per_device_prompt_batch_size,
            "completions_per_prompt": ppo_args.num_return_sequences, "update_iters": ppo_args.update_iters,
            "micro_batch": train_args.per_device_train_batch_size, "temperature": ppo_args.temperature,
            "learning_rate": train_args.learning_rate, "kl_coeff": ppo_args.kl_coeff,
            "kl_estimator": ppo_args.kl_estimator, "kl_in_loss": ppo_args.kl_in_loss,
            "rollout_log_probs": ppo_args.rollout_log_probs,
            "max_grad_norm": train_args.max_grad_norm},
        "load_before": load_before, "load_after": load_after, "machine": machine_facts(),
        "env": {"python": platform.python_version(), "paddle": paddle.__version__,  # thread settings: "machine"
                "FLAGS_use_stride_kernel (timed steps)": bool(paddle.get_flags(["FLAGS_use_stride_kernel"])[
                    "FLAGS_use_stride_kernel"]) if args.stride_kernel == "default" else True},
    }
    return result, rows


# --- reports ------------------------------------------------------------------------------------------------------
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", choices=["ppo", "grpo"], required=True)
    p.add_argument("--steps", type=int, default=12, help="total steps, warmup included")
    p.add_argument("--warmup", type=int, default=1, help="first steps left out of the medians")
    p.add_argument("--batch", type=int, default=16, help="rollouts per step (GRPO: prompts x completions)")
    p.add_argument("--resp-len", type=int, default=32)
    p.add_argument("--ppo-epochs", type=int, default=4)
    p.add_argument("--grpo-generations", type=int, default=4)
    p.add_argument("--grpo-beta", type=float, default=0.04)
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = TRL's default (PPO 0.7, GRPO 1.0)")
    p.add_argument("--max-grad-norm", type=float, default=-1.0,
                   help="-1 = as TRL: PPO no clipping (0), GRPO 1.0")
    p.add_argument("--recompute-old-log-probs", action="store_true",
                   help="PPO: score the rollout with a second actor pass (rollout_log_probs false, the toolkit's "
                        "default) instead of taking the old log-probs from the sampling pass as TRL does")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peak-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 2048])
    record.add_arguments(p)
    p.add_argument("--workdir", default=None, help="keep the tokenizer/models here instead of a temp dir")
    p.add_argument("--keep-workdir", action="store_true")
    p.add_argument("--profile", default=None, help="cProfile the steps after warmup into this .prof file")
    p.add_argument("--stride-kernel", choices=["default", "on"], default="default",
                   help="experiment: 'on' sets paddle's FLAGS_use_stride_kernel to True (Paddle's own default) for "
                        "the timed steps, undoing alignment's CPU default (off: transpose and slicing copy with the "
                        "dense kernels instead of making strided views whose later contiguous copy is slow on CPU); "
                        "'default' leaves the setting of the environment alone")
    args = p.parse_args(argv)
    if args.steps <= args.warmup:
        p.error("--steps must be larger than --warmup")
    if args.algo == "grpo" and args.batch % args.grpo_generations:
        p.error("--batch must be a multiple of --grpo-generations")

    result, rows = run(args)
    if not args.no_save:
        for path in write_reports(result, rows, record.results_dir(args)):
            shown = os.path.relpath(path, REPO)
            print(f"wrote {path if shown.startswith('..') else shown}", flush=True)
    print("RESULT " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
