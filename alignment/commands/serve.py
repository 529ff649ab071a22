"""Serve a trained model to any OpenAI or Anthropic client: `POST /v1/chat/completions` (messages, tools, n, seed,
stop, logprobs, temperature, top_p, max_tokens, stream), `POST /v1/responses` (OpenAI Responses), `POST /v1/messages`
(Anthropic Messages) and `GET /v1/models`.

    alignment-serve --model outputs/tiny-grpo/policy [--port 8000] [--api-key KEY]
    # then: openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="KEY")
    #   or: anthropic.Anthropic(base_url="http://127.0.0.1:8000", api_key="KEY")

The model is an HF-layout checkpoint (a stage's output) or an export (its hf/ checkpoint). Listens on 127.0.0.1
unless --host says otherwise; give an API key (--api-key or ALIGNMENT_GATEWAY_KEY) when it listens beyond
loopback. Tool calls are parsed with a registered tool-call format (--tool-format, default hermes).
"""
from __future__ import annotations

import os
import sys

from alignment.fileio import write_text_atomic
from alignment.commands.tool_parser import ToolParser, positive_int


def parse_args(argv=None):
    p = ToolParser(__doc__)
    p.add_argument("--model", required=True, help="HF-layout checkpoint directory, or an export directory")
    p.add_argument("--name", help="the model's name in /v1/models and responses (default: the directory's name)")
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
    return args


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
    capacity = args.max_length or min(4096, model.config.max_position_embeddings)
    if args.host not in ("127.0.0.1", "::1", "localhost") and not args.api_key:
        print(f"warning: listening on {args.host} without an API key: anyone who can reach it can use it",
              file=sys.stderr)
    ready = (lambda url: write_text_atomic(args.port_file, url.rsplit(":", 1)[1])) if args.port_file else None
    try:
        serve(model, tokenizer, args.host, args.port, args.api_key, args.max_sequences, capacity,
              min(args.max_tokens, capacity - 1), args.tool_format,
              args.name or os.path.basename(os.path.normpath(args.model)), ready, args.prompt_lookup_num_tokens)
    except ValueError as err:  # the port cannot be bound
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
