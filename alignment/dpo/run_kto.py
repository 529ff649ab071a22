"""KTO (Kahneman-Tversky optimisation) on unpaired feedback, as PaddleNLP's llm/alignment/kto/run_kto.py runs it:
its argument files (llm/config/llama/kto_argument.json: beta, desirable_weight, undesirable_weight) and its KTO
rows ({"src", "tgt", "response": [answer], "sort": [1 | 0]}) train KTO here, never another loss.

    python alignment/dpo/run_kto.py kto_argument.json [--key value ...]
"""
from __future__ import annotations

import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment import entry  # noqa: E402  first: this CPU's settings before paddle is imported (alignment/entry.py)

from alignment.config.dpo import KTOArguments  # noqa: E402
from alignment.dpo.stage import train  # noqa: E402


def main(argv=None) -> dict:
    return train(argv, KTOArguments)


if __name__ == "__main__":
    entry.run(main)
