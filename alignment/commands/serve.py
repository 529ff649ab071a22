"""Serve a trained model to any OpenAI or Anthropic client: `POST /v1/chat/completions` (messages, tools, n, seed,
stop, logprobs, temperature, top_p, max_tokens, stream), `POST /v1/responses` (OpenAI Responses), `POST /v1/messages`
(Anthropic Messages) and `GET /v1/models`.

    alignment-serve --model outputs/tiny-grpo/policy [--port 8000] [--api-key KEY]
    # then: openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="KEY")
    #   or: anthropic.Anthropic(base_url="http://127.0.0.1:8000", api_key="KEY")
    alignment-serve --model BASE --adapter math=outputs/math-lora --adapter chat=outputs/chat-lora

With --adapter (repeatable), LoRA adapters in PEFT's layout are served on one copy of the base model: a request's
`model` names the base (--name) or an adapter, and requests of different adapters share decode steps.

The model is an HF-layout checkpoint (a stage's output) or an export (its hf/ checkpoint). Listens on 127.0.0.1
unless --host says otherwise; give an API key (--api-key or ALIGNMENT_GATEWAY_KEY) when it listens beyond
loopback. Tool calls are parsed with a registered tool-call format (--tool-format, default hermes).
"""
from __future__ import annotations

import argparse
import os
import sys

from alignment.fileio import write_text_atomic
from alignment.commands.tool_parser import ToolParser, positive_int


def adapter_spec(text: str):
    """NAME=DIR of --adapter -> (name, directory)."""
    name, sep, folder = text.partition("=")
    if not sep or not name.strip() or not folder:
        raise argparse.ArgumentTypeError(f"expected NAME=DIRECTORY (an adapter's name and its directory), got "
                                         f"{text!r}")
    return name.strip(), folder


def parse_args(argv=None):
    p = ToolParser(__doc__)
    p.add_argument("--model", required=True, help="HF-layout checkpoint directory, or an export directory")
    p.add_argument("--name", help="the model's name in /v1/models and responses (default: the directory's name)")
    p.add_argument("--adapter", type=adapter_spec, action="append", default=[], metavar="NAME=DIR",
                   help="a LoRA adapter directory (PEFT layout) served as model NAME on the base; repeatable")
    p.add_listen_arguments(8000)
    p.add_argument("--api-key", default=os.environ.get("ALIGNMENT_GATEWAY_KEY"),
                   help="bearer key every request needs (default: env ALIGNMENT_GATEWAY_KEY; none: no key)")
    p.add_argument("--max-sequences", type=positive_int, default=8, help="sequences sampled at once (n counts each)")
    p.add_argument("--max-length", type=positive_int, help="tokens per sequence, prompt included (default: the "
                                                           "model's max_position_embeddings, at most 4096)")
    p.add_argument("--max-tokens", type=positive_int, default=512, help="default and largest max_tokens of a request")
    p.add_argument("--tool-format", default="hermes", help="registered tool-call format (alignment/envs/formats.py)")
    p.add_argument("--prompt-lookup-num-tokens", type=int, default=0,
                   help="speculative decoding: draft up to this many tokens by prompt lookup, verified in one "
                        "forward (the same tokens greedy, the same distribution sampled; 0 = off)")
    args = p.parse_args(argv)
    if args.max_length is not None and args.max_length < 2:
        p.error("--max-length must be >= 2")
    if args.prompt_lookup_num_tokens < 0:
        p.error("--prompt-lookup-num-tokens must be >= 0")
    p.check_listen(args)
    names = [name for name, _ in args.adapter]
    for name in names:
        if names.count(name) > 1 or name == served_name(args):
            p.error(f"argument --adapter: the name {name!r} is given twice (the base is served as "
                    f"{served_name(args)!r})")
    return args


def served_name(args) -> str:
    return args.name or os.path.basename(os.path.normpath(args.model))


def load_served_adapters(model, specs) -> None:
    """The --adapter directories on `model` (multi_lora.py); a directory that is missing or does not fit the base
    is one error line naming the flag and the directory, exit 2."""
    from alignment.models.multi_lora import AdapterError, load_adapters

    for name, folder in specs:
        if not os.path.isdir(folder):
            print(f"error: --adapter {name}={folder}: no such directory", file=sys.stderr)
            raise SystemExit(2)
    try:
        load_adapters(model, dict(specs))
    except AdapterError as err:
        print(f"error: --adapter {err.name}={err.path}: {err}", file=sys.stderr)
        raise SystemExit(2)


def main(argv=None) -> None:
    args = parse_args(argv)
    from alignment.envs.formats import ToolCallFormat

    if args.tool_format not in ToolCallFormat.registered_names():
        print(f"error: --tool-format {args.tool_format!r} is not registered; registered: "
              f"{', '.join(ToolCallFormat.registered_names())}", file=sys.stderr)
        raise SystemExit(2)
    from alignment.gateway.serving import serve
    from alignment.inference.exported_model import checkpoint_dir
    from alignment.models import LlamaForCausalLM, Tokenizer

    folder = checkpoint_dir(args.model)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        print(f"error: --model {args.model}: no HF-layout checkpoint (config.json) there or in its hf/",
              file=sys.stderr)
        raise SystemExit(2)
    model, tokenizer = LlamaForCausalLM.from_pretrained(folder), Tokenizer.from_pretrained(folder)
    model.eval()
    load_served_adapters(model, args.adapter)
    capacity = args.max_length or min(4096, model.config.max_position_embeddings)
    if args.host not in ("127.0.0.1", "::1", "localhost") and not args.api_key:
        print(f"warning: listening on {args.host} without an API key: anyone who can reach it can use it",
              file=sys.stderr)
    ready = (lambda url: write_text_atomic(args.port_file, url.rsplit(":", 1)[1])) if args.port_file else None
    try:
        serve(model, tokenizer, args.host, args.port, args.api_key, args.max_sequences, capacity,
              min(args.max_tokens, capacity - 1), args.tool_format,
              served_name(args), ready, args.prompt_lookup_num_tokens)
    except ValueError as err:  # the port cannot be bound
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
