"""Serve a reward model and/or judges over HTTP (PaddleNLP's `POST /` and OpenRLHF's `POST /get_reward`).

    python tools/reward_server.py --model outputs/smollm2-rm/model [--judge combined] [--port 8731]
    # then PPO: --use_rm_server true --reward_server http://127.0.0.1:8731

Listens on 127.0.0.1 unless --host says otherwise; give a bearer token (--token or REWARD_SERVER_TOKEN) when it
listens beyond loopback. The app, the queue and the validation are in alignment/rewards/server_app.py.
"""
from __future__ import annotations

import os
import sys

from alignment.commands.tool_parser import ToolParser, non_negative_number, positive_int, positive_number

from alignment.fileio import refuse_to_replace


def parse_args(argv=None):
    p = ToolParser(__doc__)
    p.add_argument("--model", help="score-model checkpoint (run_reward.py output; its normalizer and tokenizer too)")
    p.add_argument("--judge", action="append", default=[],
                   help="a reward function added to the score: registered name, module:function or file.py:function "
                        "(repeatable)")
    p.add_argument("--judge-weight", type=float, action="append", default=[], help="weight of each --judge (1.0)")
    p.add_listen_arguments(8731)
    p.add_argument("--token", default=os.environ.get("REWARD_SERVER_TOKEN"),
                   help="bearer token POST and /metrics need (default: env REWARD_SERVER_TOKEN)")
    p.add_argument("--max-batch", type=positive_int, default=32, help="rows per merged forward pass")
    p.add_argument("--max-wait-ms", type=non_negative_number, default=0.0,
                   help="how long a request waits for others to join its batch (0: it takes those already queued)")
    p.add_argument("--max-queue", type=positive_int, default=64, help="requests waiting before 503 + Retry-After")
    p.add_argument("--max-rows", type=positive_int, default=1024, help="rows per request (more: 413)")
    p.add_argument("--max-body-mb", type=positive_number, default=16.0, help="request body size limit (more: 413)")
    p.add_argument("--max-chars", type=positive_int, default=65536, help="characters per text (more: 413)")
    p.add_argument("--max-request-chars", type=positive_int, default=2 ** 20,
                   help="characters of all texts of one request (more: 413)")
    p.add_argument("--no-batching", action="store_true", help="score every request in a forward pass of its own")
    args = p.parse_args(argv)
    p.check_listen(args)
    if not args.model and not args.judge:
        p.error("give --model, --judge or both")
    if args.port_file:  # checked now: a server whose port file cannot appear would serve no client that waits on it
        folder = os.path.dirname(os.path.abspath(args.port_file))
        if not os.path.isdir(folder):
            p.error(f"--port-file {args.port_file}: its directory {folder} does not exist")
        if os.path.isdir(args.port_file):
            p.error(f"--port-file {args.port_file}: a directory, not a file")
        refuse_to_replace(args.port_file, False, "delete it first", ours=_holds_a_port)
    return args


def _holds_a_port(path: str) -> bool:
    """A port file an earlier server wrote (one number), which a restart may replace."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(16).strip().isdigit()
    except (OSError, UnicodeDecodeError):
        return False


def main(argv=None) -> None:
    from alignment.rewards.server_app import ServerLimits, load_scorer, serve

    args = parse_args(argv)
    if args.host not in ("127.0.0.1", "::1", "localhost") and not args.token:
        print(f"warning: listening on {args.host} without a token: anyone who can reach it can use it",
              file=sys.stderr)
    try:
        scorer = load_scorer(args.model, args.judge, args.judge_weight, args.max_batch)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    import paddle

    limits = ServerLimits(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue,
                          max_rows=args.max_rows, max_body_bytes=int(args.max_body_mb * 2 ** 20),
                          max_chars=args.max_chars, max_request_chars=args.max_request_chars,
                          batching=not args.no_batching, token=args.token)
    info = {"model": args.model, "judges": args.judge, "device": paddle.get_device()}
    serve(scorer, limits, info, args.host, args.port, args.port_file)

