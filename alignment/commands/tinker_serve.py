"""Serve the Tinker training API (the `tinker` SDK's ServiceClient, TrainingClient and SamplingClient) on this
project's Paddle LLaMA with LoRA: forward_backward with cross_entropy / importance_sampling / ppo, optim_step
(Adam), save_state / load_state, sampling clients on saved weights. docs/tinker.md has the details.

    alignment-tinker-serve --base-model tiny=outputs/tiny-sft/model --checkpoints outputs/tinker [--port 8100]
    # then: tinker.ServiceClient(base_url="http://127.0.0.1:8100", api_key="tml-...")
    #       .create_lora_training_client(base_model="tiny", rank=8)

--base-model NAME=DIR (repeatable) names an HF-layout checkpoint; clients pass NAME as base_model. The API key
(--api-key or TINKER_API_KEY) must start with "tml-", as the SDK requires. Listens on 127.0.0.1 unless --host
says otherwise.
"""
from __future__ import annotations

import os
import sys

from alignment.commands.tool_parser import ToolParser, positive_int
from alignment.fileio import write_text_atomic


def base_model_spec(text: str):
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--base-model {text!r}: give NAME=DIR")
    return name, path


def parse_args(argv=None):
    p = ToolParser(__doc__)
    p.add_argument("--base-model", action="append", required=True, metavar="NAME=DIR",
                   help="a base model clients may train on: its name and HF-layout checkpoint (repeatable)")
    p.add_argument("--checkpoints", required=True, help="directory for save_state / sampler checkpoints")
    p.add_listen_arguments(8100)
    p.add_argument("--api-key", default=os.environ.get("TINKER_API_KEY"),
                   help="the key clients send (X-API-Key); starts with 'tml-' (default: env TINKER_API_KEY)")
    p.add_argument("--lora-alpha", type=float, default=32.0, help="LoRA alpha of every adapter (scale alpha / rank)")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="max_tokens of a sample request without one")
    p.add_argument("--max-length", type=positive_int, help="tokens per datum or sampled sequence (default: the "
                                                           "model's max_position_embeddings, at most 4096)")
    args = p.parse_args(argv)
    p.check_listen(args)
    if not args.api_key:
        p.error("give --api-key or set TINKER_API_KEY (the SDK sends one with every request)")
    if not args.api_key.startswith("tml-"):
        p.error("--api-key must start with 'tml-' (the tinker SDK refuses other keys)")
    try:
        args.base_model = dict(base_model_spec(spec) for spec in args.base_model)
    except ValueError as err:
        p.error(str(err))
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from alignment.inference.exported_model import checkpoint_dir
    from alignment.models import LlamaConfig
    from alignment.tinker_service.http import TinkerServer, serve_forever
    from alignment.tinker_service.service import TinkerService
    from alignment.tinker_service.training import BaseModel

    bases = {}
    for name, path in args.base_model.items():
        folder = checkpoint_dir(path)
        if not os.path.isfile(os.path.join(folder, "config.json")):
            print(f"error: --base-model {name}={path}: no HF-layout checkpoint (config.json) there or in its hf/",
                  file=sys.stderr)
            raise SystemExit(2)
        limit = min(4096, LlamaConfig.from_pretrained(folder).max_position_embeddings)
        bases[name] = BaseModel(name, os.path.abspath(folder), min(args.max_length or limit, limit))
    service = TinkerService(bases, os.path.abspath(args.checkpoints), args.lora_alpha, args.max_tokens)
    try:
        server = TinkerServer(service, args.api_key, args.host, args.port)
    except OSError as err:  # the port cannot be bound
        print(f"error: --host {args.host} --port {args.port}: {err}", file=sys.stderr)
        raise SystemExit(2)
    print(f"tinker service listening on {server.base_url} (base models: {', '.join(bases)})", flush=True)
    serve_forever(server, (lambda url: write_text_atomic(args.port_file, url.rsplit(":", 1)[1]))
                  if args.port_file else None)
