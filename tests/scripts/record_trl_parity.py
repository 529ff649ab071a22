"""Record TRL's side of benchmarks/parity_trl.py once, for the default suite (issue 57): the replayed rollout and,
per recipe, the loss and gradient norm of TRL's own loss on it, with the TRL, torch and transformers versions. CI
then checks our side against these numbers without TRL installed (tests/benchmarks/test_parity_trl.py); the live
comparison stays a slow test for machines with the peer.

    python tests/scripts/record_trl_parity.py --python /tmp/trlv/bin/python [--output tests/fixtures/trl_parity.json]

The peer venv: `bash ../shared/peers/setup_trl_venv.sh /tmp/trlv` (TRL 1.12.0, torch CPU). The rollout (one GRPO
step's 8 answers on the tiny model) is stored as numbers, so the check does not depend on sampling repeating on
another CPU; the weights are make_tiny's (seeded) and the replay's "moved" weights are recomputed from them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
sys.path.insert(0, REPO)

ROLLOUT_TENSORS = ("input_ids", "attention_mask", "response_mask", "old_log_probs", "ref_log_probs", "end_rewards")


def rollout_to_json(rollout) -> dict:
    """The replayed rollout's numbers (float32 values round-trip exactly through JSON's doubles)."""
    return {"prompt_len": rollout.prompt_len, **{name: getattr(rollout, name).numpy().tolist()
                                                 for name in ROLLOUT_TENSORS}}


def rollout_from_json(data: dict):
    import numpy as np
    import paddle

    from alignment.ppo.rollout.rollout import Rollout

    dtypes = {"input_ids": "int64", "attention_mask": "int64"}
    tensors = {name: paddle.to_tensor(np.asarray(data[name], dtype=dtypes.get(name, "float32")))
               for name in ROLLOUT_TENSORS}
    n = tensors["input_ids"].shape[0]
    return Rollout(prompt_len=data["prompt_len"], prompts=[""] * n, completions=[""] * n, labels={}, **tensors)


def replay_weights(init_dir: str, rollout, workdir: str) -> str:
    """parity_trl's replay weights: one update (dapo recipe, lr 0.5) away from the sampler's, with its tokenizer."""
    import parity_trl

    moved = os.path.join(workdir, "moved")
    parity_trl.our_step(init_dir, rollout, parity_trl.RECIPES["dapo"][3], moved, lr=0.5)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(init_dir, name), moved)
    return moved


def recipe_parts(entry):
    """(trainer, loss_type, beta, our arguments, TRL overrides, on-policy) of a parity_trl.RECIPES entry."""
    trainer, loss_type, beta, recipe, *more = entry
    overrides, on_policy = (list(more) + [{}, False][len(more):])[:2]
    return trainer, loss_type, beta, recipe, overrides, on_policy


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the peer venv's python (TRL, torch CPU)")
    parser.add_argument("--output", default=os.path.join(REPO, "tests", "fixtures", "trl_parity.json"))
    args = parser.parse_args(argv)
    import parity_trl

    with tempfile.TemporaryDirectory(prefix="trl-parity-") as workdir:
        init_dir, rollout = parity_trl.one_rollout(workdir)
        record = {"rollout": rollout_to_json(rollout)}
        rollout = rollout_from_json(record["rollout"])  # what the check will replay, exactly
        parity_trl.save_replay(rollout, os.path.join(workdir, "rollout.safetensors"))
        moved = replay_weights(init_dir, rollout, workdir)
        jobs = []
        for name, entry in parity_trl.RECIPES.items():
            trainer, loss_type, beta, recipe, overrides, on_policy = recipe_parts(entry)
            out = os.path.join(workdir, "ours-" + name.replace(" ", "_").replace(".", ""))
            ours = parity_trl.our_step(init_dir if on_policy else moved, rollout, recipe, out)
            jobs.append({"name": name, "trainer": trainer, "loss_type": loss_type, "beta": beta, "ours": ours,
                         "model": init_dir if on_policy else moved, "trl_config": overrides,
                         "our_weights": os.path.join(out, "model.safetensors"), "lr": parity_trl.LR,
                         "max_completion_length": parity_trl.NEW_TOKENS, "num_generations": parity_trl.GROUP})
        spec = os.path.join(workdir, "jobs.json")
        with open(spec, "w") as f:
            json.dump({"model": moved, "rollout": os.path.join(workdir, "rollout.safetensors"), "jobs": jobs}, f)
        peer = subprocess.run([args.python, os.path.join(REPO, "benchmarks", "parity_trl_peer.py"), spec],
                              capture_output=True, text=True)
        if peer.returncode != 0:
            sys.exit(f"error: the peer run failed:\n{peer.stderr[-3000:]}")
        result = json.loads(peer.stdout.strip().splitlines()[-1])
    record.update({key: result[key] for key in ("trl", "torch", "transformers")})
    record["recorded_by"] = "python tests/scripts/record_trl_parity.py --python <TRL venv python>"
    record["rows"] = {job["name"]: {"loss_trl": row["loss"], "grad_norm_trl": row["grad_norm"],
                                    "loss_ours_when_recorded": job["ours"]["loss"],
                                    "grad_norm_ours_when_recorded": job["ours"]["grad_norm"]}
                      for job, row in zip(jobs, result["rows"])}
    with open(args.output, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"TRL {record['trl']}, torch {record['torch']}, transformers {record['transformers']}: "
          f"{len(record['rows'])} recipes -> {args.output}")
    return record


if __name__ == "__main__":
    main()
