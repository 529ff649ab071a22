"""A smaller student with the teacher's tokenizer: a checkpoint with every other decoder layer dropped.

    python examples/distill_demo/drop_layers.py --model checkpoints/smollm2-135m-instruct \
        --output checkpoints/smollm2-135m-half [--keep-every 2] [--overwrite]

Keeps layers 0, k, 2k, ... (SmolLM2-135M: 15 of 30), the embeddings, final norm and head, and the tokenizer;
the result loads as any checkpoint (fewer layers in config.json).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--keep-every", type=int, default=2)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if os.path.exists(args.output) and not args.overwrite:
        parser.error(f"--output {args.output} exists (--overwrite replaces it)")

    from alignment.models import LlamaForCausalLM
    from alignment.models.draft_model import layer_dropped

    model = LlamaForCausalLM.from_pretrained(args.model)
    kept = list(range(0, model.config.num_hidden_layers, args.keep_every))
    student = layer_dropped(model, args.keep_every)  # also speculative decoding's draft model (draft_model.py)
    if os.path.exists(args.output):
        shutil.rmtree(args.output)
    student.save_pretrained(args.output, tokenizer_dir=args.model)
    print(f"{args.model}: kept layers {kept} of {model.config.num_hidden_layers} -> {args.output} "
          f"({student.num_parameters() / 1e6:.1f}M parameters, from {model.num_parameters() / 1e6:.1f}M)")
    return args.output


if __name__ == "__main__":
    main()
