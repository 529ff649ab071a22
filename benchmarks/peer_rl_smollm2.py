#!/usr/bin/env python
"""TRL's side of benchmarks/bench_rl_smollm2.py: GRPOTrainer or the experimental PPOTrainer (TRL <= 1.12) on the
plan the main script writes (checkpoints, prompts in step order, shape, optimizer settings). Run by the TRL venv's
python with torch's default threads:

    /tmp/trlv/bin/python benchmarks/peer_rl_smollm2.py --plan /tmp/bench_rl_smollm2/plan_grpo.json

Phase times per step: generate = TRL's generation call (GRPO `_generate`, PPO `batch_generation`); score = the rest
of GRPO's `_generate_and_score_completions` (reference log-probs, rule rewards, advantages) / PPO's rollout block
after generation (reference, value and reward forwards, rewards, GAE) up to its first forward with gradients;
train = the rest of the step, to the `on_step_end` callback (loss, backward, optimizer, TRL's logging). Each step
also records the process's minor page faults (first touches of memory it had not used before). Prints
`SIDE {json}` last.
"""
import argparse
import hashlib
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PHASES = ("generate_s", "score_s", "train_s", "step_s")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_DISABLED": "true",
           "TOKENIZERS_PARALLELISM": "false"}


# --- shared with bench_rl_smollm2.py (importing this module imports neither torch nor paddle) ---------------------
def ids_digest(rows) -> str:
    """A short hash of the prompts' token ids: both sides print it, so a template difference shows."""
    return hashlib.sha256(json.dumps([list(map(int, r)) for r in rows]).encode()).hexdigest()[:16]


def peak_rss_gib() -> float:
    """This process's RSS high-water mark (VmHWM)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024 ** 2
    return float("nan")


def minor_faults() -> int:
    """Minor page faults of this process so far: each is a first touch of a 4 KiB page (fresh heap or mmap), which
    costs microseconds on a VM; counted per step, they show which steps still grow their memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def summarize(rows, warmup: int) -> dict:
    """Medians of each phase over the steps after warmup, and the per-step lists (with page faults)."""
    measured = rows[warmup:] or rows
    out = {f"{k}_median": round(statistics.median(r[k] for r in measured), 3) for k in PHASES}
    out.update({k: [round(r[k], 3) for r in rows] for k in PHASES})
    out["page_faults"] = [r["page_faults"] for r in rows]
    return out


# --- TRL's side ------------------------------------------------------------------------------------------------------
class Phases:
    """Per-step marks: generation start/end, the first gradient forward, the step's end."""

    def __init__(self):
        self.rows, self.mark, self.current, self.faults = [], time.perf_counter(), {}, minor_faults()

    def timed(self, fn, key):
        def wrapper(*a, **k):
            start = time.perf_counter()
            out = fn(*a, **k)
            self.current[key] = self.current.get(key, 0.0) + time.perf_counter() - start
            self.current.setdefault(f"{key}_end", time.perf_counter())
            return out
        return wrapper

    def callback(self):
        from transformers import TrainerCallback

        phases = self

        class StepEnd(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                phases.mark, phases.faults = time.perf_counter(), minor_faults()

            def on_step_end(self, args, state, control, **kw):
                phases.end_step()

        return StepEnd()

    def end_step(self):
        now, c = time.perf_counter(), self.current
        step = now - self.mark
        if "train_start" in c:  # PPO: score = generation end -> first gradient forward
            row = {"generate_s": c["generate"], "score_s": c["train_start"] - c["generate_end"],
                   "train_s": now - c["train_start"]}
        else:  # GRPO: score = generate-and-score minus generate
            row = {"generate_s": c["generate"], "score_s": c["generate_and_score"] - c["generate"],
                   "train_s": step - c["generate_and_score"]}
        faults = minor_faults()
        row.update(step_s=step, new_tokens=c.get("new_tokens"), page_faults=faults - self.faults)
        self.rows.append(row)
        print(f"TRL step {len(self.rows)}: {step:.2f}s  generate {row['generate_s']:.2f}  score {row['score_s']:.2f}"
              f"  train {row['train_s']:.2f}  new tokens {row['new_tokens']}  page faults {row['page_faults']}",
              flush=True)
        self.mark, self.current, self.faults = now, {}, faults


def tokenizer_for(plan):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(plan["model"])
    # SmolLM2's pad is <|im_end|>, which its chat template puts in every prompt; TRL's PPO derives attention masks
    # from pad ids, so both runs pad with <|endoftext|> instead (no prompt contains it)
    tok.pad_token = "<|endoftext|>"
    tok.padding_side = "left"  # as our prompts are padded (TRL's PPO collator pads on the tokenizer's side)
    return tok


def prompt_ids(tok, plan):
    texts = [tok.apply_chat_template([{"role": "user", "content": p["input"]}], tokenize=False,
                                     add_generation_prompt=True) for p in plan["prompts"]]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def common_config(plan, **extra):
    return dict(output_dir=plan["output_dir"] + "-trl", learning_rate=plan["learning_rate"],
                lr_scheduler_type="constant", adam_beta1=plan["adam_beta1"], adam_beta2=plan["adam_beta2"],
                adam_epsilon=plan["adam_epsilon"], weight_decay=plan["weight_decay"], temperature=plan["temperature"],
                logging_steps=1, save_strategy="no", report_to=[], seed=plan["seed"], bf16=False, fp16=False,
                use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                # TRL defaults to True (recomputing activations in backward); ours keeps them: the same work
                gradient_checkpointing=plan["peer_gradient_checkpointing"], **extra)


def run_grpo(plan, tok, phases):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, os.path.dirname(HERE))
    from alignment.rewards.rules import accuracy, format_reward  # pure Python: the rule rewards our side runs

    def accuracy_reward(prompts, completions, answer, **kw):
        return accuracy(None, [c[0]["content"] for c in completions], answer=answer)

    def format_reward_fn(prompts, completions, **kw):
        return format_reward(None, [c[0]["content"] for c in completions])

    rollouts = plan["prompts_per_step"] * plan["answers_per_prompt"]
    config = GRPOConfig(
        per_device_train_batch_size=plan["micro_batch"], gradient_accumulation_steps=rollouts // plan["micro_batch"],
        num_generations=plan["answers_per_prompt"], max_completion_length=plan["new_tokens"], num_iterations=1,
        beta=plan["kl_coeff"], epsilon=plan["clip_range_ratio"], max_grad_norm=plan["max_grad_norm"], top_p=1.0,
        top_k=0, generation_kwargs={"min_new_tokens": plan["new_tokens"]}, reward_weights=plan["reward_weights"],
        shuffle_dataset=False, log_completions=False, **common_config(plan, max_steps=plan["steps"]))
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p["input"]}], "answer": p["answer"]}
                                 for p in plan["prompts"]])
    trainer = GRPOTrainer(model=plan["model"], reward_funcs=[accuracy_reward, format_reward_fn], args=config,
                          train_dataset=dataset, processing_class=tok, callbacks=[phases.callback()])
    generate = trainer._generate

    def counted(prompts):
        out = generate(prompts)
        phases.current["new_tokens"] = sorted({len(ids) for ids in out[1]})  # (prompt_ids, completion_ids, ...)
        return out

    trainer._generate = phases.timed(counted, "generate")
    trainer._generate_and_score_completions = phases.timed(trainer._generate_and_score_completions,
                                                           "generate_and_score")
    trainer.train()
    return trainer


def run_ppo(plan, tok, phases):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    try:
        import trl.experimental.ppo.ppo_trainer as ppo_mod
        from trl.experimental.ppo import PPOConfig, PPOTrainer
    except ImportError as err:
        raise SystemExit(f"this TRL has no PPO trainer ({err}): TRL removed it after 1.12") from err

    n = plan["prompts_per_step"]
    config = PPOConfig(
        per_device_train_batch_size=plan["micro_batch"], gradient_accumulation_steps=1, num_mini_batches=1,
        num_ppo_epochs=1, total_episodes=n * plan["steps"], response_length=plan["new_tokens"],
        local_rollout_forward_batch_size=n, num_sample_generations=0, stop_token=None, missing_eos_penalty=None,
        kl_coef=plan["kl_coeff"], kl_estimator=plan["kl_estimator"], cliprange=plan["clip_range_ratio"],
        cliprange_value=plan["clip_range_value"], gamma=plan["gamma"], lam=plan["gae_lambda"],
        **common_config(plan, max_grad_norm=plan["max_grad_norm"]))
    dataset = Dataset.from_dict({"input_ids": prompt_ids(tok, plan)})
    policy = AutoModelForCausalLM.from_pretrained(plan["model"], dtype=torch.float32)
    reward, value = (AutoModelForSequenceClassification.from_pretrained(plan["reward_model"], num_labels=1,
                                                                         dtype=torch.float32) for _ in range(2))
    for model in (policy, reward, value):
        model.config.pad_token_id = tok.pad_token_id
    generation, forward = ppo_mod.batch_generation, ppo_mod.forward

    def generate(model, queries, batch, pad_id, generation_config):
        generation_config.min_new_tokens = plan["new_tokens"]  # eos blocked until then, as on our side
        generation_config.eos_token_id = tok.eos_token_id
        out = generation(model, queries, batch, pad_id, generation_config)
        phases.current["new_tokens"] = [int(out[0].shape[1] - queries.shape[1])]
        return out

    def first_gradient_forward(*a, **k):
        if torch.is_grad_enabled():
            phases.current.setdefault("train_start", time.perf_counter())
        return forward(*a, **k)

    ppo_mod.batch_generation = phases.timed(generate, "generate")
    ppo_mod.forward = first_gradient_forward
    trainer = PPOTrainer(args=config, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                         value_model=value, train_dataset=dataset, eval_dataset=dataset.select(range(n)),
                         callbacks=[phases.callback()])
    trainer.train()
    return trainer


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", required=True, help="the JSON plan bench_rl_smollm2.py writes")
    args = p.parse_args()
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    with open(args.plan, encoding="utf-8") as f:
        plan = json.load(f)
    import torch
    import transformers
    import trl

    tok = tokenizer_for(plan)
    phases = Phases()
    trainer = (run_grpo if plan["algo"] == "grpo" else run_ppo)(plan, tok, phases)
    result = summarize(phases.rows, plan["warmup"])
    result.update(side="trl", peak_rss_gib=round(peak_rss_gib(), 3), prompt_ids=ids_digest(prompt_ids(tok, plan)),
                  response_tokens=[r["new_tokens"] for r in phases.rows], torch_threads=torch.get_num_threads(),
                  optimizer=type(trainer.optimizer).__name__ + (" fused" if trainer.args.optim.endswith("fused")
                                                                 else ""),
                  versions={"torch": torch.__version__, "transformers": transformers.__version__,
                            "trl": trl.__version__})
    print("SIDE " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
