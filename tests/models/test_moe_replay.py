"""MoE routing record and replay (alignment/models/moe.py, engine.py, generation.py) on the tiny Qwen3-MoE and
ERNIE 4.5 MoE fixtures: generate records the experts each fed token was routed to, laid out as its sequences; a
forward over those sequences with the record replayed routes every recorded token as the sampler did; SFT adds the
load-balancing loss when the config asks for it and logs it with the expert load."""
import os

import numpy as np
import paddle
import pytest

from alignment.models import GenerationConfig, LlamaForCausalLM, generate
from alignment.models.logprobs import answer_token_loss
from alignment.models.moe import moe_blocks, moe_training_terms, replayed_routing, router_aux_loss, routing_of
from alignment.models.static_decode import StaticDecoder
from alignment.ppo.rollout.rollout import response_log_probs
from alignment.sft.sft_trainer import SupervisedTrainer

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "models")
MOE = ["qwen3_moe", "ernie4_5_moe"]


def sampled(name):
    """Two left-padded prompts (10 and 6 tokens), 8 sampled tokens each, with the routing record."""
    model = LlamaForCausalLM.from_pretrained(os.path.join(FIXTURES, name))
    ids = np.array([[5, 17, 33, 2, 90, 14, 71, 8, 61, 3], [0, 0, 0, 0, 44, 12, 101, 9, 27, 6]], dtype="int64")
    mask = (np.arange(10)[None, :] >= np.array([[0], [4]])).astype("int64")
    paddle.seed(3)
    out = generate(model, paddle.to_tensor(ids), paddle.to_tensor(mask),
                   GenerationConfig(max_new_tokens=8, do_sample=True, temperature=1.0), log_prob_temperature=1.0)
    attention = paddle.concat([paddle.to_tensor(mask), out.response_mask], axis=1)
    return model, out, attention


@pytest.mark.parametrize("name", MOE)
def test_the_record_covers_every_fed_token_and_nothing_else(name):
    model, out, attention = sampled(name)
    experts = out.experts.numpy()  # [2, 10 + R, 2 sparse layers, top-2]
    assert experts.shape == (2, out.sequences.shape[1], 2, 2)
    recorded = (experts >= 0).all(axis=(2, 3))
    fed = attention.numpy().astype(bool)
    last = fed.shape[1] - 1 - np.argmax(fed[:, ::-1], axis=1)  # each row's last token: sampled, never fed
    fed[np.arange(2), last] = False
    np.testing.assert_array_equal(recorded, fed)
    assert ((experts < 0).all(axis=(2, 3)) | (experts >= 0).all(axis=(2, 3))).all()


@pytest.mark.parametrize("name", MOE)
def test_the_compiled_decode_step_records_the_experts_the_layers_do(name):
    """rollout_decode static: the compiled step (dense experts inside the program) returns the same record."""
    model = LlamaForCausalLM.from_pretrained(os.path.join(FIXTURES, name))
    ids = paddle.to_tensor(np.random.RandomState(5).randint(1, 100, size=(2, 10)).astype("int64"))
    config = GenerationConfig(max_new_tokens=8, do_sample=False)
    eager = generate(model, ids, paddle.ones_like(ids), config)
    static = generate(model, ids, paddle.ones_like(ids), config, static=StaticDecoder(model))
    np.testing.assert_array_equal(static.sequences.numpy(), eager.sequences.numpy())
    assert (eager.experts.numpy()[:, :-1] >= 0).all()
    np.testing.assert_array_equal(static.experts.numpy(), eager.experts.numpy())


@pytest.mark.parametrize("name", MOE)
def test_replay_routes_the_training_forward_as_the_sampler_did(name):
    model, out, attention = sampled(name)
    experts = out.experts.numpy()
    recorded = (experts >= 0).all(axis=(2, 3)).reshape(-1)
    with replayed_routing(model, out.experts):
        replayed, _ = response_log_probs(model, out.sequences, attention, 10)
        routing = routing_of(model)  # [2 * W, layers, k]
    np.testing.assert_array_equal(routing[recorded], experts.reshape(routing.shape)[recorded])
    response = out.response_mask.numpy().astype(bool)
    # the sampling pass (KV cache) and the full forward round differently: the ratio is 1 within that
    np.testing.assert_allclose(replayed.numpy()[response], out.log_probs.numpy()[response], atol=1e-5)
    assert moe_blocks(model)[0].replay is None  # the context restores the model's own routing


def other_experts(routing, experts, recorded) -> int:
    """How many (token, layer) pairs of the recorded tokens are routed to another set of experts."""
    return int((np.sort(routing[recorded], -1) != np.sort(experts.reshape(routing.shape)[recorded], -1)).any(-1).sum())


@pytest.mark.parametrize("name", MOE)
def test_after_the_router_moved_only_replay_keeps_the_samplers_experts(name):
    """A router that moved since sampling (an update, a stale sampler) routes some tokens elsewhere; replayed, the
    forward uses the sampler's experts for every one of them."""
    model, out, attention = sampled(name)
    experts = out.experts.numpy()
    recorded = (experts >= 0).all(axis=(2, 3)).reshape(-1)
    paddle.seed(5)
    for block in moe_blocks(model):
        block.gate.weight.set_value(block.gate.weight + 0.3 * paddle.randn(block.gate.weight.shape))
    model(out.sequences, attention_mask=attention)
    assert other_experts(routing_of(model), experts, recorded) > 5
    with replayed_routing(model, out.experts):
        model(out.sequences, attention_mask=attention)
        assert other_experts(routing_of(model), experts, recorded) == 0


def test_replay_runs_only_the_rows_and_columns_recorded():
    model, out, attention = sampled("qwen3_moe")
    with pytest.raises(ValueError, match="routing replay: choices for 36 tokens, the forward has 18"):
        with replayed_routing(model, out.experts):
            model(out.sequences[:1], attention_mask=attention[:1])


@pytest.mark.parametrize("output_router_logits", [False, True])
def test_sft_adds_the_load_balancing_loss_when_the_config_asks(output_router_logits, tmp_path):
    model = LlamaForCausalLM.from_pretrained(os.path.join(FIXTURES, "qwen3_moe"))
    model.config.extra["output_router_logits"] = output_router_logits
    for block in moe_blocks(model):
        block.settings = model.config.moe
    ids = paddle.to_tensor([[5, 17, 33, 2, 90, 14, 71, 8]], dtype="int64")
    labels = paddle.to_tensor([[-100, -100, -100, 2, 90, 14, 71, 8]], dtype="int64")
    batch = {"input_ids": ids, "attention_mask": paddle.ones_like(ids), "labels": labels}
    trainer = SupervisedTrainer.__new__(SupervisedTrainer)  # compute_loss needs only the model
    trainer.model = model
    loss, metrics, tokens = trainer.compute_loss(batch)
    aux = float(router_aux_loss(model, batch["attention_mask"]))
    plain = float(answer_token_loss(model, ids, batch["attention_mask"], labels)[0])
    assert tokens == 5 and metrics["moe/aux_loss"] == pytest.approx(aux)
    assert float(loss) == pytest.approx(plain + (0.001 * aux if output_router_logits else 0.0), rel=1e-6)
    assert set(metrics) == {"moe/aux_loss", "moe/max_expert_load/0", "moe/max_expert_load/1"}
    assert all(0.125 <= metrics[f"moe/max_expert_load/{j}"] <= 1 for j in (0, 1))
    assert moe_training_terms(LlamaForCausalLM.from_pretrained(os.path.join(FIXTURES, "qwen3")), None) == (None, {})
