"""Online parity against TRL on identical inputs (issue 37): one GRPO step's rollout from our trainer (tiny LLaMA,
one prompt x 8 answers, so no left padding), replayed through TRL's GRPOTrainer / RLOOTrainer loss on the same
weights in the peer venv, and through our update; one row per recipe / loss type. The replayed weights are one
update away from the sampler's (as in a second update epoch): ratios off 1, some clipped, a KL to the reference.

    python benchmarks/parity_trl.py --python /tmp/trlv/bin/python [--workdir /tmp/parity_trl]

Per row: both losses, both gradient norms (before clipping), the max abs difference of the weights after one SGD
step (lr 1e-2, so it is 1e-2 x the largest gradient difference) and the relative differences of loss and gradient
norm. The peer side is benchmarks/parity_trl_peer.py; files cross the process boundary as safetensors and JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# recipe: (TRL trainer, TRL loss_type, beta, our PPOArguments[, TRL config overrides, replay at the sampler's weights])
K3 = dict(kl_in_loss=True, kl_estimator="k3", kl_coeff=0.04)
NO_IS_KL = {"use_bias_correction_kl": False}
RECIPES = {
    "grpo": ("grpo", "grpo", 0.0, dict(advantage_estimator="grpo", loss_agg_mode="seq-mean-token-mean")),
    "grpo b.04 k3": ("grpo", "grpo", 0.04, dict(advantage_estimator="grpo", loss_agg_mode="seq-mean-token-mean", **K3)),
    "grpo b.04 k3 noIS": ("grpo", "grpo", 0.04, dict(advantage_estimator="grpo", loss_agg_mode="seq-mean-token-mean",
                                                      **K3), NO_IS_KL),
    "dr_grpo": ("grpo", "dr_grpo", 0.0, dict(advantage_estimator="dr_grpo", loss_agg_mode="seq-mean-token-sum-norm")),
    "dr_grpo b.04 k3": ("grpo", "dr_grpo", 0.04, dict(advantage_estimator="dr_grpo", **K3,
                                                       loss_agg_mode="seq-mean-token-sum-norm")),
    "dr_grpo b.04 k3 noIS": ("grpo", "dr_grpo", 0.04, dict(advantage_estimator="dr_grpo", **K3,
                                                            loss_agg_mode="seq-mean-token-sum-norm"), NO_IS_KL),
    "dapo": ("grpo", "dapo", 0.0, dict(advantage_estimator="grpo", loss_agg_mode="token-mean")),
    "dapo b.04 k3": ("grpo", "dapo", 0.04, dict(advantage_estimator="grpo", loss_agg_mode="token-mean", **K3)),
    "dapo b.04 k3 noIS": ("grpo", "dapo", 0.04, dict(advantage_estimator="grpo", loss_agg_mode="token-mean", **K3),
                          NO_IS_KL),
    "rloo": ("rloo", None, 0.0, dict(advantage_estimator="rloo", loss_agg_mode="seq-mean-token-sum")),
    "rloo on-policy": ("rloo", None, 0.0, dict(advantage_estimator="rloo", loss_agg_mode="seq-mean-token-sum"), {},
                       True),
}
GROUP, NEW_TOKENS, LR = 8, 12, 1e-2


def one_rollout(workdir: str):
    """Our trainer's first GRPO step on the tiny model: its scored rollout (before the update) and the initial
    weights, saved as the step saw them."""
    from alignment.commands import make_tiny
    from alignment.ppo import run_ppo
    from alignment.ppo.ppo_trainer import PPOTrainer

    model = make_tiny.main(["--output", os.path.join(workdir, "init")])
    prompts = os.path.join(workdir, "prompts.jsonl")
    with open(prompts, "w") as f:
        f.write(json.dumps({"prompt": "Write a short cheerful reply to this message.\n\nI got the job!"}) + "\n")
    seen, update = {}, PPOTrainer.update

    def keep(self, rollout):  # the scored rollout is what we replay; no update here
        seen["rollout"] = rollout
        return {}

    PPOTrainer.update = keep
    try:
        run_ppo.main([os.path.join(REPO, "config", "tiny", "grpo_argument.json"), "--actor_model_name_or_path", model,
                      "--output_dir", os.path.join(workdir, "ours-run"),
                      "--train_datasets", f"prompt-only:1.0:{prompts}",
                      "--eval_datasets", "", "--max_steps", "1", "--per_device_prompt_batch_size", "1",
                      "--num_return_sequences", str(GROUP), "--max_new_tokens", str(NEW_TOKENS),
                      "--min_new_tokens", "2", "--reward_funcs", "combined", "--kl_in_loss", "false",
                      "--update_iters", "2", "--disable_tqdm", "--seed", "3",
                      "--overwrite_output_dir", "true"])  # update_iters 2: old log-probs scored
    finally:
        PPOTrainer.update = update
    return model, seen["rollout"]


def our_step(model_dir, rollout, recipe: dict, out_dir: str, lr: float = LR) -> dict:
    """One optimizer step of our update (run_update with PPOTrainer.actor_step, one micro-batch) on the rollout
    under `recipe`'s arguments: loss, gradient norm, weights after one SGD step saved to out_dir."""
    import functools

    import numpy as np
    import paddle

    from alignment.config.ppo import PPOArguments
    from alignment.config.training import TrainingArguments
    from alignment.models import LlamaForCausalLM
    from alignment.ppo.learner.critic import make_critic
    from alignment.ppo.learner.ptx import NoPtx
    from alignment.ppo.learner.routing_replay import OwnRouting
    from alignment.ppo.teacher.teacher import NoTeacher
    from alignment.ppo.ppo_trainer import PPOTrainer
    from alignment.ppo.learner.update import EagerMicroBatches, run_update
    from alignment.training.precision import Precision

    ppo = PPOArguments(num_return_sequences=GROUP, max_new_tokens=NEW_TOKENS, clip_range_ratio=0.2, **recipe)
    ppo.validate()
    rollout.advantages, _ = ppo.estimator()(rollout, ppo, lambda t: t)
    actor = LlamaForCausalLM.from_pretrained(model_dir)
    optimizer = paddle.optimizer.SGD(learning_rate=lr, parameters=actor.parameters())
    trainer = types.SimpleNamespace(ppo=ppo, actor=actor, precision=Precision(TrainingArguments()), ptx=NoPtx(),
                                    policy=types.SimpleNamespace(optimizer=optimizer), global_step=0,
                                    sampler_gap=None, teacher=NoTeacher(), routing=OwnRouting(actor))
    norms = []

    def optimizer_step():
        norms.append(float(sum(float((p.grad.astype("float64") ** 2).sum()) for p in actor.parameters()
                               if p.grad is not None)) ** 0.5)
        optimizer.step()
        optimizer.clear_grad()

    args = TrainingArguments(per_device_train_batch_size=len(rollout), gradient_accumulation_steps=1)
    runner = EagerMicroBatches(functools.partial(PPOTrainer.actor_step, trainer), make_critic(None, 5.0), ppo)
    stats = run_update(rollout, runner, optimizer_step, np.random.default_rng(0), ppo, args)
    actor.save_pretrained(out_dir)
    return {"loss": stats["actor_loss"], "grad_norm": norms[0],
            "advantages": rollout.advantages[:, 0].numpy().tolist()}


def save_replay(rollout, path: str) -> None:
    """The rollout in TRL's layout: prompt_ids / prompt_mask [N, P] (left-padded), completion_ids /
    completion_mask [N, R], old and reference per-token log-probs [N, R]; safetensors."""
    import numpy as np
    from safetensors.numpy import save_file

    p = rollout.prompt_len
    ids, mask = rollout.input_ids.numpy(), rollout.attention_mask.numpy()
    tensors = {"prompt_ids": ids[:, :p], "prompt_mask": mask[:, :p], "completion_ids": ids[:, p:],
               "completion_mask": rollout.response_mask.numpy().astype("int64"),
               "old_per_token_logps": rollout.old_log_probs.numpy(),
               "ref_per_token_logps": rollout.ref_log_probs.numpy()}
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path)  # column slices are not contiguous


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the peer venv's python (TRL 1.12, torch CPU)")
    parser.add_argument("--workdir", default="/tmp/parity_trl")
    args = parser.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    init_dir, rollout = one_rollout(args.workdir)
    save_replay(rollout, os.path.join(args.workdir, "rollout.safetensors"))
    # the replay's weights: one update away from the sampler's (a second update epoch), so ratios are off 1, some
    # clip, and the KL to the reference is not 0
    model_dir = os.path.join(args.workdir, "moved")
    our_step(init_dir, rollout, RECIPES["dapo"][3], model_dir, lr=0.5)
    import shutil
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(init_dir, name), model_dir)
    jobs = []
    for name, (trainer, loss_type, beta, recipe, *more) in RECIPES.items():
        overrides, on_policy = (more + [{}, False])[:2] if len(more) < 2 else more
        weights = init_dir if on_policy else model_dir
        out = os.path.join(args.workdir, "ours-" + name.replace(" ", "_").replace(".", ""))
        ours = our_step(weights, rollout, recipe, out)
        jobs.append({"name": name, "trainer": trainer, "loss_type": loss_type, "beta": beta, "ours": ours,
                     "model": weights, "trl_config": overrides,
                     "our_weights": os.path.join(out, "model.safetensors"), "lr": LR,
                     "max_completion_length": NEW_TOKENS, "num_generations": GROUP})
    spec = os.path.join(args.workdir, "jobs.json")
    with open(spec, "w") as f:
        json.dump({"model": model_dir, "rollout": os.path.join(args.workdir, "rollout.safetensors"), "jobs": jobs}, f)
    peer = subprocess.run([args.python, os.path.join(REPO, "benchmarks", "parity_trl_peer.py"), spec],
                          capture_output=True, text=True)
    if peer.returncode != 0:
        sys.exit(f"error: the peer run failed:\n{peer.stderr[-3000:]}")
    result = json.loads(peer.stdout.strip().splitlines()[-1])
    print(f"TRL {result['trl']}, torch {result['torch']}, transformers {result['transformers']}; "
          f"{len(rollout)} answers of <= {NEW_TOKENS} tokens to one prompt; one SGD step, lr {LR}")
    header = f"{'recipe':<22}{'loss ours':>13}{'loss TRL':>13}{'abs':>9}{'rel':>9}{'|g| ours':>10}{'|g| TRL':>10}" \
             f"{'rel':>9}{'max|dW|':>9}"
    print(header)
    rows = []
    for job, peer_row in zip(jobs, result["rows"]):
        ours, theirs = job["ours"], peer_row
        rel_loss = abs(ours["loss"] - theirs["loss"]) / max(abs(theirs["loss"]), 1e-12)
        rel_norm = abs(ours["grad_norm"] - theirs["grad_norm"]) / max(theirs["grad_norm"], 1e-12)
        rows.append({"recipe": job["name"], "loss_ours": ours["loss"], "loss_trl": theirs["loss"], "rel_loss": rel_loss,
                     "grad_norm_ours": ours["grad_norm"], "grad_norm_trl": theirs["grad_norm"],
                     "rel_grad_norm": rel_norm,
                     "max_abs_dw": theirs["max_abs_dw"]})
        print(f"{job['name']:<22}{ours['loss']:>13.6g}{theirs['loss']:>13.6g}{abs(ours['loss'] - theirs['loss']):>9.1e}"
              f"{rel_loss:>9.1e}{ours['grad_norm']:>10.5g}{theirs['grad_norm']:>10.5g}{rel_norm:>9.1e}"
              f"{theirs['max_abs_dw']:>9.1e}")
    print("RESULT " + json.dumps({"trl": result["trl"], "rows": rows}))
    return rows


if __name__ == "__main__":
    main()
