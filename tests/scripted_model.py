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
