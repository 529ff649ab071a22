"""benchmarks/bench_machine_limits.py's arithmetic: the one-pass STREAM triad computes b + 3c over every element
whatever the split, the prompt pass's FLOPs count the LM head once per row (tied or not), a generate call's
decode steps are its time after the prompt pass, and the ceilings' GEMMs are a training step's products and the
decoder's streamed weights."""
import importlib.util
import os

import numpy as np
import pytest

from alignment.models import LlamaConfig, LlamaForCausalLM
from tests.helpers import REPO


def limits_module():
    spec = importlib.util.spec_from_file_location("bench_machine_limits",
                                                  os.path.join(REPO, "benchmarks", "bench_machine_limits.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_stream_triad_writes_b_plus_3c_over_uneven_parts_and_chunks(threads):
    limits = limits_module()
    n = 2 * limits.TRIAD_CHUNK + 1001  # neither the threads' parts nor the chunks divide it
    rng = np.random.default_rng(0)
    b, c = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    a = np.full(n, np.nan, dtype=np.float32)
    limits.stream_triad(a, b, c, threads)
    np.testing.assert_array_equal(a, b + np.float32(3.0) * c)


@pytest.mark.parametrize("tied", [False, True])
def test_prompt_flops_count_the_head_at_the_last_position_only(tied):
    limits = limits_module()
    smol = limits.smol
    hidden, inter, layers, heads, kv_heads, vocab = 16, 40, 2, 4, 2, 96
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                         num_hidden_layers=layers, num_attention_heads=heads,
                                         num_key_value_heads=kv_heads, tie_word_embeddings=tied))
    d = hidden // heads
    per_layer = hidden * heads * d * 2 + 2 * hidden * kv_heads * d + 3 * hidden * inter + 2 * hidden
    decoder = layers * per_layer + hidden  # the final norm; the embedding lookup is no FLOPs
    tokens = smol.BATCH * smol.PROMPT
    expected = 2 * decoder * tokens + 4 * smol.PROMPT * hidden * layers * tokens + 2 * vocab * hidden * smol.BATCH
    assert limits.prompt_flops(model) == expected


def test_decode_steps_are_the_call_after_its_prompt_pass():
    limits = limits_module()
    smol = limits.smol
    figures = limits.generate_figures(generate_s=4.0, prompt_s=0.5, bound=400.0)
    steps = smol.BATCH * (smol.NEW_TOKENS - 1) / 3.5
    assert figures["decode_steps_tokens_s"] == pytest.approx(steps)
    assert figures["decode_steps_of_bound"] == pytest.approx(steps / 400.0)
    assert figures["generate_tokens_s"] == pytest.approx(smol.BATCH * smol.NEW_TOKENS / 4.0)


def test_the_bound_takes_the_largest_bandwidth_of_both_measurements():
    limits = limits_module()
    best, line = limits.best_bandwidth({"numpy_triad_gb_s": 20.0, "paddle_add_gb_s": 10.5},
                                       {"numpy_triad_gb_s": 23.1, "paddle_add_gb_s": 21.0})
    assert best == 23.1
    assert "before: numpy_triad_gb_s 20.0, paddle_add_gb_s 10.5" in line and "after: numpy_triad_gb_s 23.1" in line


def tiny_model(tied: bool):
    return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied))


@pytest.mark.parametrize("tied", [False, True])
def test_train_gemms_are_a_steps_forward_and_backward_products(tied):
    limits = limits_module()
    model = tiny_model(tied)
    batch, seq = 3, 5
    calls, flops = limits.train_gemms(model, batch, seq)
    cfg, tokens = model.config, batch * seq
    projections = sum(int(p.size) for name, p in model.named_parameters() if "proj" in name)
    attention = 3 * 2 * 2 * batch * seq * seq * cfg.hidden_size * cfg.num_hidden_layers  # q k^T and p v, x 3
    head = 6 * batch * (seq - 1) * cfg.vocab_size * cfg.hidden_size
    assert flops == 6 * projections * tokens + attention + head
    assert len(calls) == cfg.num_hidden_layers * (7 * 3 + 6) + 3
    limits.run_matmuls(calls)  # every product's shapes agree


@pytest.mark.parametrize("tied", [False, True])
def test_score_gemms_are_the_forward_products_only(tied):
    limits = limits_module()
    model = tiny_model(tied)
    batch, seq = 3, 5
    calls, flops = limits.train_gemms(model, batch, seq, backward=False)
    cfg, tokens = model.config, batch * seq
    projections = sum(int(p.size) for name, p in model.named_parameters() if "proj" in name)
    attention = 2 * 2 * batch * seq * seq * cfg.hidden_size * cfg.num_hidden_layers  # q k^T and p v
    head = 2 * batch * (seq - 1) * cfg.vocab_size * cfg.hidden_size
    assert flops == 2 * projections * tokens + attention + head
    assert len(calls) == cfg.num_hidden_layers * (7 + 2) + 1
    assert flops * 3 == limits.train_gemms(model, batch, seq)[1]  # a step's backward is twice its forward
    limits.run_matmuls(calls)


@pytest.mark.parametrize("tied", [False, True])
def test_decode_gemms_multiply_every_weight_the_decoder_streams(tied):
    limits = limits_module()
    model = tiny_model(tied)
    from alignment.models.fused_decode import Panels, matmul

    calls = limits.decode_gemms(model, 4)
    shapes = [(int(w.packed.shape[1]), w.n) if isinstance(w, Panels) else tuple(w.shape) for _, w in calls]  # K, N
    norms = sum(int(p.size) for name, p in model.named_parameters() if "norm" in name)
    lookup_only = 0 if tied else int(model.model.embed_tokens.weight.size)  # an untied embedding is only indexed
    assert sum(k * n for k, n in shapes) == sum(int(p.size) for p in model.parameters()) - norms - lookup_only
    assert all(list(a.shape) == [4, 1, k] and list(matmul(a, w).shape) == [4, 1, n]
               for (a, w), (k, n) in zip(calls, shapes))
    limits.run_decode_gemms(calls)


def test_decode_ceiling_is_a_batch_per_gemm_pass_against_the_bound():
    limits = limits_module()
    ceiling = limits.decode_ceiling(gemms_s=0.02, bound=800.0)
    assert ceiling["decode_gemms_tokens_s"] == pytest.approx(limits.smol.BATCH / 0.02)
    assert ceiling["decode_gemms_of_bound"] == pytest.approx(limits.smol.BATCH / 0.02 / 800.0)


def test_settle_calls_until_a_call_faults_in_no_page_and_stops_at_the_limit():
    limits = limits_module()
    counts = iter([0, 500, 500, 620, 620, 620, 620])  # page-fault counter read before and after each call
    calls = []
    assert limits.settle(lambda: calls.append(1), limit=10, faults=lambda: next(counts)) == 3
    assert len(calls) == 3
    always = iter(range(0, 1000, 7))
    assert limits.settle(lambda: None, limit=4, faults=lambda: next(always)) == 4
