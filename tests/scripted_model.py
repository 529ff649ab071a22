"""A test double for the policy: the tiny model with its logits replaced by a script (a random model never writes a
tool call). Its own module, so tests that share it import no test module (whose environments would register
twice)."""
import paddle


class Scripted:
    """The tiny model with each forward's logits replaced by a one-hot of the next scripted token (a test double
    passed in place of the model: the random tiny model never writes a tool call). Forward i of a one-row rollout
    predicts token i of the script (one prefill, then one step per token, then one prefill per observation)."""

    def __init__(self, model, script):
        self.model, self.config, self.script, self.calls = model, model.config, script, 0

    def __call__(self, input_ids, **kwargs):
        out = self.model(input_ids, **kwargs)
        token = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        logits = paddle.full_like(out.logits, -1e4)
        logits[:, :, token] = 0.0
        return out._replace(logits=logits)


def agent_session(play, scripted, tokenizer, fmt, config, row, budget, max_length):
    """The gateway session of one episode that the agent program `play` plays against `scripted` (a Scripted
    model) through a gateway served on 127.0.0.1: its `sample` is the episode's trajectory."""
    import threading

    from alignment.gateway.app import GatewayServer, create_app
    from alignment.gateway.backend import Gateway

    gateway = Gateway(scripted, tokenizer, 1, max_length, fmt, lambda request: (config, 1.0))
    session = gateway.open_session("s", None, budget)
    server = GatewayServer(create_app(gateway, "k"))
    done = threading.Event()
    threading.Thread(target=lambda: (play(f"{server.base_url}/sessions/s/v1", "k", row), done.set()),
                     daemon=True).start()
    gateway.pump(done.is_set)
    server.stop()
    return session
