"""The peer half of benchmarks/parity_trl.py; runs in the TRL venv (torch, CPU), never in ours.

    <peer python> benchmarks/parity_trl_peer.py JOBS.json

For each job: the same weights (our HF-layout checkpoint) in transformers' LlamaForCausalLM, TRL's own trainer
built on them (GRPOTrainer with the job's loss_type and beta, or RLOOTrainer), its `_compute_loss` on our saved
rollout, backward, the gradient norm, one SGD step, and the max abs difference to the weights our update wrote.
Prints one JSON line: {"trl", "torch", "transformers", "rows": [{"loss", "grad_norm", "max_abs_dw"}]}.
"""
import json
import sys

import torch
import transformers
import trl
from datasets import Dataset
from safetensors.torch import load_file
from transformers import AutoTokenizer


def reward(completions, **kwargs):  # never called: the rollout is given
    return [0.0 for _ in completions]


def build(job, model_dir, tokenizer, workdir):
    common = dict(output_dir=workdir, per_device_train_batch_size=job["num_generations"], gradient_accumulation_steps=1,
                  num_generations=job["num_generations"], max_completion_length=job["max_completion_length"],
                  beta=job["beta"], report_to=[], use_cpu=True, bf16=False, fp16=False, save_strategy="no",
                  disable_tqdm=True, learning_rate=job["lr"], epsilon=0.2, temperature=1.0)
    extra = job["trl_config"]
    data = Dataset.from_dict({"prompt": ["x"] * job["num_generations"]})
    if job["trainer"] == "rloo":
        args = trl.RLOOConfig(**common, **extra)
        return trl.RLOOTrainer(model=model_dir, reward_funcs=[reward], args=args, train_dataset=data,
                               processing_class=tokenizer)
    args = trl.GRPOConfig(loss_type=job["loss_type"], **common, **extra)
    return trl.GRPOTrainer(model=model_dir, reward_funcs=[reward], args=args, train_dataset=data,
                           processing_class=tokenizer)


def replay(job, rollout, tokenizer, workdir):
    torch.manual_seed(0)
    model_dir = job["model"]
    trainer = build(job, model_dir, tokenizer, workdir)
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    mask = rollout["completion_mask"]
    advantages = torch.tensor(job["ours"]["advantages"], dtype=torch.float32)  # [N]: our estimator's, per answer
    inputs = {key: rollout[key] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    inputs["advantages"] = advantages
    if job["trainer"] == "rloo":  # RLOO's ratio is per sequence, of summed log-probs
        inputs["old_logps"] = (rollout["old_per_token_logps"] * mask).sum(1)
    else:
        inputs["old_per_token_logps"] = rollout["old_per_token_logps"]
        inputs["ref_per_token_logps"] = rollout["ref_per_token_logps"]
        inputs["num_items_in_batch"] = mask.sum()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = [p.grad.double() for p in model.parameters() if p.grad is not None]
    norm = float(torch.sqrt(sum((g ** 2).sum() for g in grads)))
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= job["lr"] * p.grad
    ours = load_file(job["our_weights"])
    state = model.state_dict()
    diff = max(float((state[name].float() - ours[name].float()).abs().max()) for name in ours)
    return {"loss": float(loss), "grad_norm": norm, "max_abs_dw": diff}


def main():
    spec = json.load(open(sys.argv[1]))
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rollout = {key: value for key, value in load_file(spec["rollout"]).items()}
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    rows = [replay(job, rollout, tokenizer, spec["model"] + "-trl") for job in spec["jobs"]]
    print(json.dumps({"trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                      "rows": rows}))


if __name__ == "__main__":
    main()
