"""Make the HF-transformers reference fixtures of the model families and RoPE scalings
(tests/models/test_model_families.py).

What it makes
    tests/fixtures/models/<name>/ for each name in FIXTURES:
      config.json, model.safetensors   a tiny random float32 checkpoint written by transformers' save_pretrained;
      reference.safetensors            what transformers computes from it (safetensors, no pickle):
          input_ids      int64   [2, S]       random ids in [1, 128), seeded;
          logits         float32 [2, S, 128]  the logits for input_ids (attention mask all ones);
          greedy_tokens  int64   [1, P + 8]   generate(input_ids[0:1, :P], 8 new tokens, greedy, KV cache), P = 10
                                              (12 for `dynamic`);
          greedy_margin  float32 [8]          the gap between the best and second-best logit at each greedy step;
          MoE only: aux_loss, aux_loss_right_padded (transformers' load-balancing loss) and the logits with the
          family's routing detail off (logits_without_norm_topk_prob / logits_without_score_correction).
    The four RoPE-scaling fixtures share their weights (the same seed and shapes, so model.safetensors is the same
    bytes in each, one git object); `dynamic` runs S = 24 tokens past its max_position_embeddings of 16, and its
    greedy tokens cross 16 while decoding. For each scaled RoPE the same weights with plain RoPE must give other
    greedy tokens (checked here), so the greedy check tells the scaling apart. See tests/fixtures/models/README.md.

Regenerate (needs torch, transformers, safetensors and numpy; CPU is enough), from the repository root:
    /path/to/venv-with-torch-transformers/bin/python tools/make_model_fixtures.py
The outputs depend on the torch version (random init) and a little on the transformers version.
"""
import hashlib
import importlib.util
import os
import shutil
import sys

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    sys.exit("error: torch and transformers are needed: this script runs in their environment (see its docstring)")

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import (AutoModelForCausalLM, Ernie4_5Config, Ernie4_5ForCausalLM, Ernie4_5_MoeConfig,
                          Ernie4_5_MoeForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

# tools/make_hf_reference.py: N(0, 0.2) weights (logits far from uniform), file modes, --help and versions
from make_hf_reference import begin, readable, reinit_

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_ROOT = os.path.join(REPO_ROOT, "tests", "fixtures", "models")
SEED, NEW_TOKENS = 1234, 8

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, hidden_act="silu", tie_word_embeddings=True,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)  # no eos: always 8 new tokens
LLAMA = dict(COMMON, rms_norm_eps=1e-5, max_position_embeddings=256)


def rope(rope_type, **params):
    return {"rope_type": rope_type, "rope_theta": 10000.0, **params}


# name -> (config class, model class, config kwargs, logits length S, greedy prompt length P)
FIXTURES = {
    "llama3": (LlamaConfig, LlamaForCausalLM, dict(LLAMA, rope_parameters=rope(
        "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)), 12, 10),
    "linear": (LlamaConfig, LlamaForCausalLM, dict(LLAMA, rope_parameters=rope("linear", factor=2.0)), 12, 10),
    "dynamic": (LlamaConfig, LlamaForCausalLM, dict(LLAMA, max_position_embeddings=16,
                                                    rope_parameters=rope("dynamic", factor=2.0)), 24, 12),
    "yarn": (LlamaConfig, LlamaForCausalLM, dict(LLAMA, rope_parameters=rope(
        "yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0)), 12, 10),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(COMMON, head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=256,
                                                  attention_bias=False, use_sliding_window=False,
                                                  rope_parameters={"rope_type": "default", "rope_theta": 1e6}), 12, 10),
    # ERNIE-4.5-0.3B's layout: head_dim 2 x hidden / heads, no biases, eps 1e-5, theta 500000, interleaved RoPE
    "ernie4_5": (Ernie4_5Config, Ernie4_5ForCausalLM, dict(COMMON, head_dim=32, rms_norm_eps=1e-5, use_bias=False,
                                                           max_position_embeddings=256, rope_parameters={
                                                               "rope_type": "default", "rope_theta": 500000.0}), 12, 10),
    # MoE: 3 layers, 8 experts of intermediate 16, top-2. Qwen3-MoE: top-k weights renormalised (norm_topk_prob, as
    # Qwen3-30B-A3B), layer 1 dense (mlp_only_layers). ERNIE 4.5 MoE: layer 0 dense (moe_layer_start_index 1), one
    # shared expert, the selection biased by e_score_correction_bias (drawn here, zero at init)
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(
        COMMON, num_hidden_layers=3, head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=256, attention_bias=False,
        use_sliding_window=False, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[1], router_aux_loss_coef=0.001,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}), 12, 10),
    "ernie4_5_moe": (Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM, dict(
        COMMON, num_hidden_layers=3, head_dim=32, rms_norm_eps=1e-5, use_bias=False, max_position_embeddings=256,
        moe_num_experts=8, moe_k=2, moe_intermediate_size=16, moe_num_shared_experts=1, moe_layer_start_index=1,
        moe_layer_end_index=-1, moe_layer_interval=1, router_aux_loss_coef=0.001,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}), 12, 10),
}
RIGHT_PAD = 4  # MoE: the auxiliary loss also with the last RIGHT_PAD positions of row 1 masked out


def reinit_moe_(model) -> None:
    """reinit_ for what it leaves at the init std: expert tensors and router weights ~ N(0, 0.2) (decisive routing),
    ERNIE's e_score_correction_bias ~ N(0, 0.05) (it moves some top-k choices)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".experts." in name or name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 0.2)
            elif name.endswith("e_score_correction_bias"):
                param.normal_(0.0, 0.05)


def moe_arrays(name, out_dir, input_ids) -> dict:
    """The auxiliary load-balancing loss (output_router_logits) with the mask all ones and right-padded, and the
    logits with the family's routing detail switched off (so the fixture tells it apart)."""
    model = fresh(out_dir)
    mask = torch.ones_like(input_ids)
    mask[1, -RIGHT_PAD:] = 0
    out = {"aux_loss": model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             output_router_logits=True).aux_loss,
           "aux_loss_right_padded": model(input_ids=input_ids, attention_mask=mask, output_router_logits=True).aux_loss}
    if name == "qwen3_moe":
        model.config.norm_topk_prob = False
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.norm_topk_prob = False
        out["logits_without_norm_topk_prob"] = model(input_ids=input_ids).logits
    else:
        for name_, param in model.named_parameters():
            if name_.endswith("e_score_correction_bias"):
                param.data.zero_()
        out["logits_without_score_correction"] = model(input_ids=input_ids).logits
    return {key: value.detach().numpy().astype(np.float32).reshape(np.shape(value)) for key, value in out.items()}


def fresh(out_dir):
    """The saved checkpoint loaded anew: dynamic RoPE keeps state between calls, so each measurement starts clean."""
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def greedy(model, prompt):
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                          min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, output_logits=True,
                          return_dict_in_generate=True)


def make_one(name: str) -> dict:
    config_cls, model_cls, kwargs, length, prompt_len = FIXTURES[name]
    out_dir = os.path.join(OUT_ROOT, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    torch.manual_seed(SEED)
    model = model_cls(config_cls(**kwargs)).to(torch.float32)
    reinit_(model)
    reinit_moe_(model)
    model.save_pretrained(out_dir, safe_serialization=True)
    os.remove(os.path.join(out_dir, "generation_config.json"))  # defaults only

    gen = torch.Generator().manual_seed(SEED + 1)
    input_ids = torch.randint(1, COMMON["vocab_size"], (2, length), generator=gen, dtype=torch.int64)
    with torch.no_grad():
        logits = fresh(out_dir)(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits
        prompt = input_ids[0:1, :prompt_len]
        out = greedy(fresh(out_dir), prompt)
        if kwargs["rope_parameters"]["rope_type"] != "default":  # plain RoPE must give other greedy tokens
            plain = model_cls(config_cls(**dict(kwargs, rope_parameters=rope("default"))))
            plain.eval()
            plain.load_state_dict(model.state_dict())
            assert not torch.equal(greedy(plain, prompt).sequences, out.sequences), f"{name}: greedy tells nothing"
        if name.endswith("_moe"):
            arrays_moe = moe_arrays(name, out_dir, input_ids)
    top2 = torch.stack([step[0].topk(2).values for step in out.logits])  # [8, 2]
    arrays = {"input_ids": input_ids.numpy(), "logits": logits.numpy().astype(np.float32),
              "greedy_tokens": out.sequences.numpy(), "greedy_margin": (top2[:, 0] - top2[:, 1]).numpy()}
    if name.endswith("_moe"):
        arrays.update(arrays_moe)
        for key in ("logits_without_norm_topk_prob", "logits_without_score_correction"):
            if key in arrays:  # the routing detail moves the logits
                assert np.abs(arrays[key] - arrays["logits"]).max() > 1e-2, f"{name}: {key} tells nothing"
    assert arrays["greedy_tokens"].shape == (1, prompt_len + NEW_TOKENS)
    save_file(arrays, os.path.join(out_dir, "reference.safetensors"))
    readable(out_dir)
    return arrays


def main() -> int:
    if not begin(__doc__):  # any argument (--help) prints what it does
        return 0
    for name in FIXTURES:
        arrays = make_one(name)
        digest = hashlib.sha256(open(os.path.join(OUT_ROOT, name, "model.safetensors"), "rb").read()).hexdigest()
        print(f"{name}: weights {digest[:12]} max|logits| {np.abs(arrays['logits']).max():.3f} "
              f"std {arrays['logits'].std():.3f} min greedy margin {arrays['greedy_margin'].min():.4f} "
              f"greedy {arrays['greedy_tokens'][0, FIXTURES[name][4]:].tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
