"""PaddleNLP's command line for tools/predict.py and tools/export_model.py (llm/predict/predictor.py and
llm/predict/export_model.py parse `PredictorArgument` with PdArgumentParser): its flag names as aliases of ours, its
booleans (`--inference_model`, `--inference_model 1`, `--block_attn true`), its decoding keys, and one stderr line
for each flag that has nothing to do here (PaddleNLP's fused inference model and block attention: our exported
program is the one inference model)."""
from __future__ import annotations

import argparse
import sys

TRUE, FALSE = ("1", "true", "yes", "y", "t"), ("0", "false", "no", "n", "f")
DTYPES = ("float32", "float16", "bfloat16")
# the flags PaddleNLP's tools take that change nothing here: (flag, why)
NO_OPS = {
    "inference_model": "our exported program (KV cache, dynamic batch and length) is the one inference model",
    "block_attn": "the KV cache grows per call; there are no attention blocks to size",
}
EXPORT_NO_OPS = {
    "src_length": "the exported program takes any prompt length up to max_position_embeddings",
    "max_length": "the exported program decodes any length up to max_position_embeddings",
    "batch_size": "the exported program takes any batch size",
}


def flag_bool(text: str) -> bool:
    """PaddleNLP's bool flags: `--flag`, `--flag 1`, `--flag false`."""
    if text.lower() in TRUE:
        return True
    if text.lower() in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"must be true or false (1 or 0), got {text!r}")


def add_bool(parser, name: str, help: str) -> None:
    parser.add_argument(f"--{name}", type=flag_bool, nargs="?", const=True, default=False, help=help)


def add_no_ops(parser, flags: dict) -> None:
    for name, why in flags.items():
        if name in NO_OPS:
            add_bool(parser, name, f"PaddleNLP's flag, accepted with a notice: {why}")
        else:
            parser.add_argument(f"--{name}", type=int, default=None, help=f"PaddleNLP's flag, accepted with a "
                                f"notice: {why}")


def notice_no_ops(args, flags: dict, tool: str) -> None:
    """One stderr line per no-op flag that was given (true or a value)."""
    for name, why in flags.items():
        if getattr(args, name) not in (None, False):
            print(f"notice: {tool}: --{name} has no effect: {why}", file=sys.stderr)


def check_dtype(asked: str, actual: str, what: str) -> None:
    """--dtype must name the dtype the weights have (we do not convert them)."""
    if asked is not None and asked != actual:
        raise ValueError(f"--dtype {asked}: {what} is {actual} (converting weights is not built; pass "
                         f"--dtype {actual} or leave it out)")


STRATEGIES = ("greedy_search", "sampling", "beam_search")
PADDLENLP_SAMPLING = {"temperature": 0.95, "top_k": 0, "top_p": 0.7}  # PredictorArgument's defaults
OUR_SAMPLING = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}  # --do-sample's
OFF = {"temperature": (1.0,), "top_k": (0, 1), "top_p": (1.0,)}  # values that leave greedy search unchanged


def decoding(args) -> tuple:
    """(do_sample, {temperature, top_k, top_p}, notice or None) from --do-sample, --decode_strategy and the sampling
    flags; ValueError for a contradiction. --do-sample samples with our defaults for the unset values;
    --decode_strategy sampling with PaddleNLP's (temperature 0.95, top_p 0.7, top_k 0); no strategy and a sampling
    flag samples as PaddleNLP does (its default strategy is sampling), with PaddleNLP's defaults and a notice.
    Greedy search with a sampling value that would change anything is refused (PaddleNLP ignores it silently)."""
    given = {k: getattr(args, k) for k in OFF if getattr(args, k) is not None}
    strategy = args.decode_strategy
    if strategy == "beam_search":
        raise ValueError("--decode_strategy beam_search is not built here; use greedy_search or sampling")
    if args.do_sample and strategy == "greedy_search":
        raise ValueError("--do-sample contradicts --decode_strategy greedy_search; give one of them")
    if strategy == "greedy_search" or (strategy is None and not args.do_sample and not given):
        for key, value in given.items():
            if value not in OFF[key]:
                raise ValueError(f"--{key} {value} is a sampling option and greedy search does not sample; drop it "
                                 f"or use --decode_strategy sampling")
        return False, dict(OUR_SAMPLING), None
    if args.do_sample:
        return True, {**OUR_SAMPLING, **given}, None
    values = {**PADDLENLP_SAMPLING, **given}
    notice = None
    if strategy is None:
        flags = ", ".join(f"--{k}" for k in given)
        notice = (f"notice: predict: {flags} without --do-sample or --decode_strategy: sampling, as PaddleNLP does "
                  f"(temperature {values['temperature']}, top_k {values['top_k']}, top_p {values['top_p']})")
    return True, values, notice
