"""The faster norm and clip (one squared_l2_norm per gradient, no scaling within bounds) against the per-parameter
reference they replaced: bitwise the same losses, norms and weights over 10 steps; state names; resumable."""
import math

import numpy as np
import paddle
import pytest

from alignment.config.training import TrainingArguments
from alignment.models import LlamaConfig, LlamaForCausalLM
from alignment.training.optim import build_optimizer, clip_gradients, global_grad_norm
from alignment.training.optimizer_state import load_whole_optimizer_state, whole_optimizer_state

CONFIG = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)
ARGS = TrainingArguments(learning_rate=3e-3, weight_decay=0.1, warmup_steps=2, max_grad_norm=0.5)


def tiny_model(seed: int = 3) -> LlamaForCausalLM:
    paddle.seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    model.train()
    return model


def batches(steps: int):
    rng = np.random.default_rng(0)
    return [paddle.to_tensor(rng.integers(0, CONFIG["vocab_size"], [2, 12]), dtype="int64") for _ in range(steps)]


def lm_loss(model, ids):
    """Mean next-token negative log-likelihood of ids [b, s]."""
    hidden, _ = model.model(ids)
    log_probs, _ = model.token_log_probs(hidden[:, :-1], ids[:, 1:])
    return -log_probs.mean()


def reference_norm(parameters) -> float:
    """The formula the trainers used before: one square and one sum per gradient, added up."""
    squares = [paddle.sum(paddle.square(p.grad.astype("float32"))) for p in parameters if p.grad is not None]
    return math.sqrt(float(paddle.add_n(squares)))


def reference_clip(parameters, max_norm: float, norm: float) -> None:
    scale = max_norm / max(norm, max_norm)
    with paddle.no_grad():
        for param in parameters:
            if param.grad is not None:
                param.grad.scale_(scale)


def reference_optimizer(model, scheduler):
    """Paddle's own per-parameter AdamW, configured as build_optimizer configures ours."""
    no_decay = {p.name for n, p in model.named_parameters() if p.ndim == 1 or n.endswith("norm.weight")}
    return paddle.optimizer.AdamW(learning_rate=scheduler, parameters=model.parameters(), beta1=ARGS.adam_beta1,
                                  beta2=ARGS.adam_beta2, epsilon=ARGS.adam_epsilon, weight_decay=ARGS.weight_decay,
                                  apply_decay_param_fun=lambda name: name not in no_decay)


def train(model, optimizer, scheduler, ids_list, norm_fn, clip_fn):
    losses, norms = [], []
    params = list(model.parameters())
    for ids in ids_list:
        loss = lm_loss(model, ids)
        loss.backward()
        norm = norm_fn(params)
        clip_fn(params, ARGS.max_grad_norm, norm)
        optimizer.step()
        scheduler.step()
        optimizer.clear_grad()
        losses.append(float(loss))
        norms.append(norm)
    return losses, norms


def test_fast_path_equals_the_per_parameter_reference_over_ten_steps():
    ids_list = batches(10)
    fast = tiny_model()
    optimizer, scheduler = build_optimizer(fast, ARGS, 10)
    fast_losses, fast_norms = train(fast, optimizer, scheduler, ids_list, global_grad_norm, clip_gradients)

    ref = tiny_model()
    _, ref_scheduler = build_optimizer(ref, ARGS, 10)  # the same schedule
    ref_losses, ref_norms = train(ref, reference_optimizer(ref, ref_scheduler), ref_scheduler, ids_list,
                                  reference_norm, reference_clip)
    assert max(fast_norms) > ARGS.max_grad_norm  # clipping took part
    assert fast_losses == ref_losses and fast_norms == ref_norms  # bitwise: numerics unchanged
    for (name, a), b in zip(fast.named_parameters(), ref.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)


def test_grad_norm_is_bitwise_the_square_and_sum_formula():
    model = tiny_model()
    lm_loss(model, batches(1)[0]).backward()
    params = list(model.parameters())
    assert global_grad_norm(params) == reference_norm(params)


def test_clip_scales_only_above_the_bound():
    model = tiny_model()
    lm_loss(model, batches(1)[0]).backward()
    params = list(model.parameters())
    norm = global_grad_norm(params)
    before = [p.grad.numpy().copy() for p in params]
    clip_gradients(params, norm * 2, norm)  # within bounds: untouched
    for p, g in zip(params, before):
        np.testing.assert_array_equal(p.grad.numpy(), g)
    clip_gradients(params, norm / 4, norm)
    assert global_grad_norm(params) == pytest.approx(norm / 4, rel=1e-5)


def keys_by_structure(model, state) -> set:
    """state_dict keys with each parameter's unique name ('linear_65.w_0') replaced by its place in the model."""
    names = {p.name: n for n, p in model.named_parameters()}
    out = set()
    for key in state:
        owner = max((name for name in names if key.startswith(name + "_")), key=len, default=None)
        out.add(key if owner is None else names[owner] + key[len(owner):])
    return out


def test_state_dict_names_equal_adamw_and_resume_continues_the_same_steps():
    ids_list = batches(6)
    fast = tiny_model()
    optimizer, scheduler = build_optimizer(fast, ARGS, 6)
    train(fast, optimizer, scheduler, ids_list[:3], global_grad_norm, clip_gradients)
    state = optimizer.state_dict()

    ref = tiny_model()
    ref_opt = reference_optimizer(ref, build_optimizer(ref, ARGS, 6)[1])
    train(ref, ref_opt, ref_opt._learning_rate, ids_list[:1], reference_norm, reference_clip)
    assert keys_by_structure(fast, state) == keys_by_structure(ref, ref_opt.state_dict())  # moment1_0, ...

    resumed = tiny_model()
    resumed.set_state_dict(fast.state_dict())
    resumed_opt, resumed_scheduler = build_optimizer(resumed, ARGS, 6)
    saved = whole_optimizer_state(fast, optimizer)  # what step checkpoints write
    assert "model.layers.0.mlp.up_proj.weight/moment1_0" in saved
    load_whole_optimizer_state(resumed, resumed_opt, saved, "test")
    resumed_scheduler.set_state_dict(scheduler.state_dict())
    tail = train(resumed, resumed_opt, resumed_scheduler, ids_list[3:], global_grad_norm, clip_gradients)
    straight = train(fast, optimizer, scheduler, ids_list[3:], global_grad_norm, clip_gradients)
    assert tail == straight


def test_frozen_and_gradient_less_parameters_are_left_alone():
    model = tiny_model()
    model.model.layers[0].mlp.up_proj.weight.stop_gradient = True
    optimizer, _ = build_optimizer(model, ARGS, 4)
    frozen = model.model.layers[0].mlp.up_proj.weight.numpy().copy()
    ids = batches(1)[0]
    hidden, _ = model.model(ids)  # the head's tied table gets a gradient only through the embedding here
    hidden.mean().backward()
    optimizer.step()
    np.testing.assert_array_equal(model.model.layers[0].mlp.up_proj.weight.numpy(), frozen)
