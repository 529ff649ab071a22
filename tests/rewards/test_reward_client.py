"""The reward-server client (alignment/rewards/remote.py) against a scripted stub server in a thread: retries with
backoff and Retry-After, wrong answers rejected naming the URL, timeouts, fail-over between URLs, unreachable
servers. Every wait has a deadline."""
import http.server
import json
import socket
import threading
import time

import pytest

from alignment.rewards.remote import RewardServerClient, RewardServerError

def valid(body):
    scores = [float(len(r)) for r in body["response"]]
    return 200, json.dumps({"error_code": 0, "error_msg": "Success", "score": scores})


class Stub:
    """An HTTP server on 127.0.0.1 in a thread; request k is answered by script[k](body) (the last one repeats)
    -> (status, text[, headers[, delay seconds]])."""

    def __init__(self, *script):
        stub = self
        self.script, self.seen = list(script), 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                step = stub.script[min(stub.seen, len(stub.script) - 1)]
                stub.seen += 1
                answer = step(body)
                status, text, headers, delay = (*answer, *({}, 0)[len(answer) - 2:])
                time.sleep(delay)
                try:
                    self.send_response(status)
                    for key, value in {"Content-Type": "application/json", **headers}.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(text.encode())
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def do_GET(self):  # like PaddleNLP's server: no /health
                self.send_error(404)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def dead_url():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def client_for(*urls, **kwargs):
    waits = []
    kwargs = {"retries": 3, "backoff": 0.1, "timeout": 5, "sleep": waits.append, **kwargs}
    return RewardServerClient(list(urls), **kwargs), waits


def paddle_failure(body):  # PaddleNLP's server reports an exception as error_code 500 with zero scores
    return 200, json.dumps({"error_code": 500, "error_msg": "boom", "score": [0.0] * len(body["response"])})


def test_client_retries_5xx_with_exponential_backoff_and_honours_retry_after():
    stub = Stub(lambda body: (500, "{}"), paddle_failure, lambda body: (503, "{}", {"Retry-After": "3"}), valid)
    client, waits = client_for(stub.url)
    scores, retries = client.scores(["p", "q"], ["ab", "abc"])
    stub.close()
    assert scores.tolist() == [2.0, 3.0] and retries == 3 and stub.seen == 4
    assert waits == [0.1, 0.2, 3.0]  # doubling, then the server's Retry-After


@pytest.mark.parametrize("text, fragment", [
    ('{"score": [1.0', "the response is not JSON"),
    ('{"error_code": 0, "score": [1.0]}', "1 scores for 2 rows"),
    ('{"error_code": 0, "score": [NaN, 1.0]}', "score 0 is nan"),
    ('{"error_code": 0, "score": [1.0, Infinity]}', "score 1 is inf"),
    ('{"error_code": 0, "score": [1.0, 1e400]}', "score 1 is inf"),
    ('{"error_code": 0, "score": [1%s, 1.0]}' % ("0" * 400), "score 0 is 1000000000"),
    ('{"error_code": 0, "score": [null, 1.0]}', "score 0 is None, not a number"),
    ('{"error_code": 0, "score": ["0.5", 1.0]}', "score 0 is '0.5', not a number"),
    ('{"error_code": 0, "scores": [1.0, 2.0]}', "no 'score' list"),
    ('{"error_code": 3, "error_msg": "bad src"}', "error_code 3: bad src"),
])
def test_client_rejects_a_wrong_answer_at_once_naming_the_url(text, fragment):
    stub = Stub(lambda body: (200, text))
    client, waits = client_for(stub.url)
    with pytest.raises(RewardServerError) as info:
        client.scores(["p", "q"], ["a", "b"])
    stub.close()
    assert stub.url in str(info.value) and fragment in str(info.value) and "\n" not in str(info.value)
    assert stub.seen == 1 and waits == []  # not retried: the same server would say the same


def test_client_timeout_is_retried_and_then_reported():
    stub = Stub(lambda body: (*valid(body), {}, 1.0), valid)
    client, _ = client_for(stub.url, timeout=0.3)
    scores, retries = client.scores(["p"], ["abc"])
    assert scores.tolist() == [3.0] and retries == 1
    stub.script = [lambda body: (*valid(body), {}, 1.0)]
    client, _ = client_for(stub.url, timeout=0.3, retries=1)
    with pytest.raises(RewardServerError, match=r"unreachable after 2 attempts.*no answer within 0.3 s"):
        client.scores(["p"], ["abc"])
    stub.close()


def test_two_urls_one_down_fail_over_without_waiting_and_chunks_spread():
    stub, down = Stub(valid), dead_url()
    client, waits = client_for(down, stub.url)
    assert [client.scores(["p"], ["ab"])[1] for _ in range(3)] == [1, 0, 0]  # the dead URL goes to the back
    assert waits == []
    client, waits = client_for(down, stub.url, batch_size=2)
    scores, _ = client.scores(["p"] * 5, ["a", "bb", "ccc", "dddd", "eeeee"])
    assert scores.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0] and waits == []
    stub.close()


def test_unreachable_servers_give_one_line_naming_every_url():
    urls = [dead_url(), dead_url()]
    client, waits = client_for(*urls, retries=3)
    with pytest.raises(RewardServerError) as info:
        client.scores(["p"], ["a"])
    message = str(info.value)
    assert "unreachable after 4 attempts" in message and all(url in message for url in urls)
    assert "ConnectError" in message and "\n" not in message and waits == [0.1]  # one full round failed
