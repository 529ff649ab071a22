"""alignment-eval against an OpenAI-compatible endpoint (a scripted server on loopback): single-turn items,
episodes of a user environment played through chat turns, an endpoint that dies mid-run (one line, a rerun
resumes to the uninterrupted result), and the bad inputs of the command line (exit 2, one line, nothing written)."""
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from alignment.commands import evaluate as cli
from alignment.exits import run_program
from tests.helpers import REPO

GUESS = os.path.join(REPO, "examples", "guess_number_env.py")
SUM = re.compile(r"Calculate (\d+) ([+-]) (\d+)")


def scripted_answer(messages, seed):
    """Right on even seeds, wrong on odd ones (the harness's seed for run seed 0 is item * 1009 + sample, so each
    item's two samples hold one of each); the guessing game by bisection on the environment's hints."""
    first = messages[0]["content"]
    found = SUM.search(first)
    if found:
        a, op, b = int(found.group(1)), found.group(2), int(found.group(3))
        value = a + b if op == "+" else a - b
        return f"<answer>{value + seed % 2}</answer>"
    low, high = 1, 100
    for said, hint in zip(messages[1::2], messages[2::2]):
        guess = int(said["content"])
        low, high = (guess + 1, high) if hint["content"] == "Higher." else (low, guess - 1)
    return str((low + high) // 2)


class Server:
    def __init__(self, die_after=None):
        owner, self.calls = self, 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.reply({"data": [{"id": "scripted"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.calls += 1
                if die_after is not None and owner.calls > die_after:
                    # stop listening too: a request connecting after this is refused at once (a listening socket
                    # nobody accepts on would hold it until the client's timeout)
                    threading.Thread(target=owner.close).start()
                    self.close_connection = True
                    return
                text = scripted_answer(body["messages"], body["seed"])
                self.reply({"choices": [{"message": {"role": "assistant", "content": text},
                                         "finish_reason": "stop"}], "usage": {"completion_tokens": 3}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def items(out):
    with open(os.path.join(out, "items.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_endpoint_items_scored_by_the_task(tmp_path):
    server = Server()
    try:
        result = cli.main(["--endpoint", server.url, "--task", "basic_arithmetic", "--n", "2", "--limit", "6",
                           "--output-dir", str(tmp_path)])
    finally:
        server.close()
    summary = result["basic_arithmetic"]
    assert summary["pass@1"]["mean"] == 0.5 and summary["pass@2"]["mean"] == 1.0  # one right of two per item
    assert summary["maj@2"]["mean"] == pytest.approx(sum(r["index"] % 2 == 0 for r in items(
        tmp_path / "basic_arithmetic")) / 6)  # the tie goes to the first sample: right on even items


def test_endpoint_plays_episodes_of_the_environment(tmp_path):
    data = tmp_path / "secrets.jsonl"
    data.write_text("".join(json.dumps({"prompt": "guess", "answer": str(s)}) + "\n" for s in (50, 25, 88, 1)))
    server = Server()
    try:
        cli.main(["--endpoint", server.url, "--dataset", f"prompt-only:1.0:{data}", "--reward-funcs", "",
                  "--environment", "guess-number", "--task-module", GUESS, "--max-turns", "8",
                  "--output-dir", str(tmp_path / "out")])
    finally:
        server.close()
    (folder,) = os.listdir(tmp_path / "out")
    rewards = [r["samples"][0]["reward"] for r in items(tmp_path / "out" / folder)]
    # bisection of 1-100: 50 at once; 25 after one wrong guess (50); 88 after two (50, 75); 1 after five (-0.1 each)
    assert rewards == pytest.approx([1.0, 0.9, 0.8, 0.5])


def test_endpoint_dying_mid_run_stops_in_one_line_and_a_rerun_resumes(tmp_path, capsys):
    args = ["--task", "basic_arithmetic", "--n", "2", "--limit", "8", "--batch-size", "4"]
    whole = Server()
    try:
        cli.main(["--endpoint", whole.url, *args, "--output-dir", str(tmp_path / "whole")])
    finally:
        whole.close()
    dying = Server(die_after=9)
    code = run_program(lambda: cli.main(["--endpoint", dying.url, *args, "--output-dir", str(tmp_path / "cut")]),
                       uses_paddle=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len([line for line in err if line.startswith("error:")]) == 1
    assert "endpoint" in err[-1] and "Traceback" not in "\n".join(err)
    assert len(items(tmp_path / "cut" / "basic_arithmetic")) == 4  # the two batches of two items done before
    again = Server()
    try:
        cli.main(["--endpoint", again.url, *args, "--output-dir", str(tmp_path / "cut")])
    finally:
        again.close()
    assert again.calls == 8  # the last two batches only
    ours = items(tmp_path / "cut" / "basic_arithmetic")
    assert [r["samples"] for r in ours] == [r["samples"] for r in items(tmp_path / "whole" / "basic_arithmetic")]


@pytest.mark.parametrize("argv,fragment", [
    (["--model", "{tmp}/missing", "--task", "basic_arithmetic"], "missing: no such checkpoint directory"),
    (["--model", "{tmp}", "--task", "basic_arithmetic"], "no config.json"),
    (["--model", "{model}", "--task", "no_such_task"], "unknown evaluation task 'no_such_task'"),
    (["--endpoint", "http://127.0.0.1:9/v1", "--task", "basic_arithmetic"], "--endpoint http://127.0.0.1:9/v1"),
    (["--model", "{model}", "--task", "basic_arithmetic", "--n", "4", "--temperature", "0"], "greedy decoding"),
    (["--model", "{model}"], "give --task"),
    (["--compare", "{tmp}", "{tmp}"], "not an evaluation directory"),
    (["--model", "{model}", "--task", "basic_arithmetic", "--n", "0"], "--n"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(argv, fragment, tiny_model_dir, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path, model=tiny_model_dir) for a in argv] + ["--output-dir", str(tmp_path / "out")]
    before = sorted(os.listdir(tmp_path))
    code = run_program(lambda: cli.main(argv), uses_paddle=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and fragment in err[0], err
    assert sorted(os.listdir(tmp_path)) == before


def test_alignment_serve_as_the_endpoint_answers_as_the_checkpoint(tiny_model_dir, tmp_path):
    """Greedy through `alignment-serve` (the gateway, the same decode engine behind HTTP) gives the local
    evaluation's completions and rewards, item by item."""
    import subprocess
    import sys
    import time

    port = tmp_path / "port"
    server = subprocess.Popen([sys.executable, os.path.join(REPO, "tools", "serve.py"), "--model", tiny_model_dir,
                               "--port", "0", "--port-file", str(port), "--api-key", "k", "--name", "tiny"],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not port.exists() and server.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert port.exists(), server.stderr.read() if server.poll() is not None else "no port"
        common = ["--task", "chain_sum", "--limit", "6", "--max-new-tokens", "12"]
        cli.main(["--endpoint", f"http://127.0.0.1:{port.read_text().strip()}/v1", "--endpoint-model", "tiny",
                  "--endpoint-api-key", "k", *common, "--output-dir", str(tmp_path / "served")])
    finally:
        server.terminate()
        server.wait(timeout=30)
    cli.main(["--model", tiny_model_dir, *common, "--output-dir", str(tmp_path / "local")])
    served, local = items(tmp_path / "served" / "chain_sum"), items(tmp_path / "local" / "chain_sum")
    assert [[(s["completion"], s["reward"]) for s in r["samples"]] for r in served] == \
        [[(s["completion"], s["reward"]) for s in r["samples"]] for r in local]
