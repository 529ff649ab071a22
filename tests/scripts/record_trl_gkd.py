"""Records TRL's GKD loss (GKDTrainer.generalized_jsd_loss) and its gradient for one batch of logits, every beta and
temperature of the grid, into tests/fixtures/trl_gkd.json; tests/ppo/test_distill_losses.py checks our losses against
it.

Run with the real TRL (torch; not installable beside paddle), e.g. the peer venv of /work/shared/peers:

    /tmp/trlv/bin/python tests/scripts/record_trl_gkd.py [--out tests/fixtures/trl_gkd.json] [--check]

--check prints the largest relative difference to the fixture instead of writing it (the slow test runs this).
The batch: 3 rows x 5 positions x 11 vocabulary entries of float64 logits (numpy seed 0, scale 3), labels -100 on
some positions and on the whole last row (an all-masked row), as TRL's loss takes them.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import trl
from trl.experimental.gkd import GKDTrainer

BETAS = (0.0, 0.1, 0.5, 0.9, 1.0)
TEMPERATURES = (0.5, 1.0, 2.0)
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "fixtures", "trl_gkd.json")


def batch():
    rng = np.random.default_rng(0)
    student = rng.normal(0, 3, (3, 5, 11))
    teacher = rng.normal(0, 3, (3, 5, 11))
    labels = rng.integers(0, 11, (3, 5))
    labels[0, 0] = labels[1, 3] = -100
    labels[2] = -100
    return student, teacher, labels


def record():
    student, teacher, labels = batch()
    cases = []
    for beta in BETAS:
        for temperature in TEMPERATURES:
            logits = torch.tensor(student, dtype=torch.float64, requires_grad=True)
            loss = GKDTrainer.generalized_jsd_loss(logits, torch.tensor(teacher, dtype=torch.float64),
                                                   labels=torch.tensor(labels), beta=beta, temperature=temperature)
            loss.backward()
            cases.append({"beta": beta, "temperature": temperature, "loss": loss.item(),
                          "grad": logits.grad.numpy().tolist()})
    return {"trl_version": trl.__version__, "torch_version": torch.__version__,
            "function": "trl.experimental.gkd.GKDTrainer.generalized_jsd_loss (reduction batchmean)",
            "student_logits": student.tolist(), "teacher_logits": teacher.tolist(), "labels": labels.tolist(),
            "cases": cases}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=FIXTURE)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    data = record()
    if not args.check:
        with open(args.out, "w") as f:
            json.dump(data, f)
        print(f"wrote {args.out}: TRL {data['trl_version']}, {len(data['cases'])} cases")
        return 0
    with open(args.out) as f:
        fixture = json.load(f)
    worst = 0.0
    for live, kept in zip(data["cases"], fixture["cases"]):
        worst = max(worst, abs(live["loss"] - kept["loss"]) / abs(kept["loss"]),
                    float(np.abs(np.subtract(live["grad"], kept["grad"])).max() / np.abs(kept["grad"]).max()))
    print(json.dumps({"trl_version": data["trl_version"], "max_relative_difference": worst}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
