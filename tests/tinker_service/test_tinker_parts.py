"""The parts of the Tinker-compatible service that need no SDK: the built-in losses (alignment/tinker_service/losses.py)
against values worked by hand, the protobuf codec (wire.py) on bytes laid out by hand, and the futures the SDK
polls (service.py)."""
import math
import struct
import threading

import numpy as np
import paddle
import pytest

from alignment.tinker_service import wire
from alignment.tinker_service.losses import LOSSES, LossInputError
from alignment.tinker_service.service import TinkerService
from alignment.tinker_service.training import UserError

LOGP = [math.log(0.5), math.log(0.25)]  # the model's log-probs of two target tokens


def loss(name, inputs, config=None):
    return float(LOSSES[name](paddle.to_tensor(LOGP, "float32"), inputs, config or {}))


def test_cross_entropy_is_the_weighted_sum_of_negative_log_probs():
    assert loss("cross_entropy", {"weights": np.array([0.0, 2.0])}) == pytest.approx(2 * math.log(4), rel=1e-6)
    assert loss("cross_entropy", {}) == pytest.approx(math.log(2) + math.log(4), rel=1e-6)  # weights default 1
    with pytest.raises(LossInputError, match="3 values for 2"):
        loss("cross_entropy", {"weights": np.ones(3)})


def test_importance_sampling_and_ppo_sum_over_tokens():
    # the sampler gave the tokens 0.25 and 0.5: ratios 2 and 0.5
    inputs = {"logprobs": np.log([0.25, 0.5]), "advantages": np.array([1.0, -1.0])}
    assert loss("importance_sampling", inputs) == pytest.approx(-(2 * 1 + 0.5 * -1), rel=1e-6)
    # ppo: min(2 * 1, 1.2 * 1) = 1.2 and min(0.5 * -1, 0.8 * -1) = -0.8
    assert loss("ppo", inputs) == pytest.approx(-(1.2 - 0.8), rel=1e-6)
    # clip range [0.4, 3]: nothing clipped, the importance-sampling loss
    assert loss("ppo", inputs, {"clip_low_threshold": 0.4, "clip_high_threshold": 3.0}) == pytest.approx(-1.5)
    with pytest.raises(LossInputError, match="advantages"):
        loss("ppo", {"logprobs": np.zeros(2)})


def varint(n):
    out = b""
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return out


def ld(number, payload):  # a length-delimited field
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_a_forward_backward_request_decodes_from_hand_laid_bytes():
    tokens = ld(1, ld(1, np.array([3, 300], np.int32).tobytes()))  # Chunk { encoded_text { tokens } }
    tensor = ld(1, np.array([1.0, 0.5], np.float32).tobytes()) + varint(3 << 3) + varint(1) + ld(4, varint(2))
    datum = ld(1, tokens) + ld(2, ld(1, b"weights") + ld(2, tensor))
    config = ld(1, b"clip_low_threshold") + varint(2 << 3 | 1) + struct.pack("<d", 0.7)
    body = ld(1, b"m:train:0") + varint(2 << 3) + varint(5) + ld(3, datum) + ld(4, b"ppo") + ld(5, config)
    request = wire.decode_forward_backward(body)
    assert (request.model_id, request.seq_id, request.loss_fn, request.forward_only) == ("m:train:0", 5, "ppo", False)
    assert request.data[0].tokens == [3, 300] and request.loss_fn_config == {"clip_low_threshold": 0.7}
    np.testing.assert_array_equal(request.data[0].inputs["weights"], [1.0, 0.5])
    with pytest.raises(wire.WireError, match="truncated"):
        wire.decode_forward_backward(body[:-3])


def test_outputs_encode_per_datum_arrays_with_byte_offsets():
    out = wire.fields(wire.encode_forward_backward_output({"logprobs": [np.zeros(2), np.ones(1)]}, {"loss:sum": 2.5}))
    record = wire.fields(out[2][0])
    entry = wire.fields(record[2][0])
    batched = wire.fields(entry[2][0])
    assert bytes(entry[1][0]) == b"logprobs" and record[3] == [2]
    assert np.frombuffer(batched[2][0], np.int64).tolist() == [0, 8, 12]  # datum i is bytes offsets[i]:[i+1]
    assert struct.unpack("<d", wire.fields(out[3][0])[2][0])[0] == 2.5


def test_futures_answer_try_again_until_their_job_is_done_and_keep_its_error(tmp_path):
    service = TinkerService({}, str(tmp_path))
    release = threading.Event()
    slow = service.run_future(lambda: release.wait(30) and ("json", {"metrics": {}}), "m")
    quick = service.run_future(lambda: ("json", {"done": True}))  # queued behind the slow one
    assert service.retrieve(slow["request_id"], wait=0.05)[1]["type"] == "try_again"
    assert service.retrieve(quick["request_id"], wait=0.05)[1]["type"] == "try_again"  # jobs run in order
    release.set()
    assert service.retrieve(slow["request_id"]) == ("json", {"metrics": {}})
    assert service.retrieve(quick["request_id"]) == ("json", {"done": True})

    def refuse():
        raise UserError("no such thing")

    failed = service.run_future(refuse)
    assert service.retrieve(failed["request_id"]) == ("json", {"error": "no such thing", "category": "user"})
    assert service.retrieve("unknown") is None


def test_checkpoint_paths_and_sessions_cannot_leave_the_checkpoint_folder(tmp_path):
    service = TinkerService({}, str(tmp_path / "checkpoints"))
    (tmp_path / "weights" / "x").mkdir(parents=True)  # what tinker://../weights/x would reach
    for path in ("tinker://../weights/x", "tinker://a/weights/..", "tinker://a/other/x", "/etc/passwd"):
        with pytest.raises(UserError, match="not a checkpoint path"):
            service.resolve(path)
    with pytest.raises(UserError, match="no session"):
        service.create_model({"session_id": "../..", "model_seq_id": 0, "base_model": "tiny"})


def test_two_adam_steps_with_clipping_and_decay_equal_paddles_adamw(tiny_model_dir):
    from alignment.tinker_service.training import MLP, BaseModel, TrainingModel, lora_model

    base = BaseModel("tiny", tiny_model_dir, 512)
    ours = TrainingModel("m", base, lora_model(base, 2, 4.0, MLP, seed=1), 2)
    theirs = lora_model(base, 2, 4.0, MLP, seed=1)
    trained = [p for p in theirs.parameters() if not p.stop_gradient]
    assert [p.name for p in trained] and all(np.array_equal(a.numpy(), b.numpy())
                                             for a, b in zip(ours.params.values(), trained))
    adamw = paddle.optimizer.AdamW(learning_rate=0.05, beta1=0.7, beta2=0.9, epsilon=1e-3, weight_decay=0.2,
                                   parameters=trained, grad_clip=paddle.nn.ClipGradByGlobalNorm(0.5))
    rng = np.random.default_rng(0)
    for _ in range(2):  # grads = the constants (global norm about 30: clipped to 0.5)
        constants = [paddle.to_tensor(rng.normal(size=p.shape).astype("float32")) for p in trained]
        sum((p * c).sum() for p, c in zip(ours.params.values(), constants)).backward()
        sum((p * c).sum() for p, c in zip(trained, constants)).backward()
        metrics = ours.optim_step({"learning_rate": 0.05, "beta1": 0.7, "beta2": 0.9, "eps": 1e-3,
                                   "weight_decay": 0.2, "grad_clip_norm": 0.5})
        adamw.step()
        adamw.clear_grad()
        assert metrics["grad_norm:mean"] > 10
    for mine, want in zip(ours.params.values(), trained):
        np.testing.assert_allclose(mine.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert ours.step == 2 and all(p.grad is None or not p.grad.numpy().any() for p in ours.params.values())
