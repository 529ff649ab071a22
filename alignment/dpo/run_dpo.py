"""Offline preference optimisation (DPO, IPO, cDPO, hinge, SimPO, PaddleNLP's dpop / kto_pair / sppo_hard /
nca_pair / or, KTO as loss_type kto) on preference pairs or unpaired feedback.

    python alignment/dpo/run_dpo.py config/tiny/dpo_argument.json [--key value ...]
"""
from __future__ import annotations

import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment import entry  # noqa: E402  first: this CPU's settings before paddle is imported (alignment/entry.py)

from alignment.config.dpo import DPOArguments  # noqa: E402
from alignment.dpo.stage import train  # noqa: E402


def main(argv=None) -> dict:
    return train(argv, DPOArguments)


if __name__ == "__main__":
    entry.run(main)
