"""Generate text with an exported static model through paddle.inference (greedy; no training code involved).

    python tools/predict.py --model exported/smollm2-ppo --prompt "Write a short cheerful reply: I got the job!"
        [--max-new-tokens 32] [--raw]

Loads <model>/inference/model.json + model.pdiparams with paddle.inference, wraps the prompt in the checkpoint's
chat template (unless --raw), and decodes greedily: each step right-pads the sequence to the graph's fixed width,
reads the logits at the last token and appends the argmax, until an end-of-turn token or --max-new-tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported


def load_predictor(model_dir: str):
    """(predictor, export info) for an exported model directory."""
    from paddle import inference

    folder = os.path.join(model_dir, "inference")
    info_file = os.path.join(folder, "export.json")
    if not os.path.exists(info_file):
        raise FileNotFoundError(f"{model_dir}: no inference/export.json (export it with tools/export_model.py)")
    info = json.load(open(info_file, encoding="utf-8"))
    config = inference.Config(os.path.join(folder, "model.json"), os.path.join(folder, "model.pdiparams"))
    config.disable_gpu()
    # measured: with oneDNN's passes the CPU predictor returned all-zero logits for this graph (paddle 3.3.1);
    # the plain CPU kernels match the dynamic model (max |diff| 4e-7)
    config.disable_mkldnn()
    config.disable_glog_info()
    config.set_cpu_math_library_num_threads(int(os.environ.get("MKL_NUM_THREADS", "2")))
    return inference.create_predictor(config), info


def greedy_tokens(predictor, info: dict, prompt_ids, max_new_tokens: int):
    """Greedy continuation token ids of one prompt (stops after an eos id, which is included)."""
    import numpy as np

    width = info["max_length"]
    if len(prompt_ids) >= width:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the exported graph holds {width}")
    ids, new = list(prompt_ids), []
    eos = set(info["eos_token_ids"] or [])
    inputs = {name: predictor.get_input_handle(name) for name in predictor.get_input_names()}
    output = predictor.get_output_handle(predictor.get_output_names()[0])
    while len(new) < max_new_tokens and len(ids) < width:
        batch = np.zeros((info["batch_size"], width), dtype="int64")
        batch[0, : len(ids)] = ids
        inputs["input_ids"].copy_from_cpu(batch)
        inputs["last_index"].copy_from_cpu(np.full((info["batch_size"],), len(ids) - 1, dtype="int64"))
        predictor.run()
        token = int(output.copy_to_cpu()[0].argmax())
        ids.append(token)
        new.append(token)
        if token in eos:
            break
    return new


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a directory written by tools/export_model.py")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    args = p.parse_args(argv)
    from alignment.models import Tokenizer

    try:
        predictor, info = load_predictor(args.model)
        tokenizer = Tokenizer.from_pretrained(os.path.join(args.model, "hf"))
        text = args.prompt if args.raw else tokenizer.apply_chat_template(tokenizer.chat_messages(args.prompt))
        new = greedy_tokens(predictor, info, tokenizer.encode(text, add_special_tokens=True), args.max_new_tokens)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    answer = tokenizer.decode([t for t in new if t not in set(info["eos_token_ids"] or [])])
    print(answer)
    return answer


if __name__ == "__main__":
    main()
