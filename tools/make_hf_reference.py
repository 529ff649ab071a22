"""Make the HF-transformers reference fixtures used to test our Paddle LLaMA/Qwen2 causal LM.

What it makes
    tests/fixtures/hf_reference/<name>/ for name in ``llama``, ``llama_tied`` and ``qwen2``:
      config.json, model.safetensors (and generation_config.json if transformers writes one)
          a tiny random float32 checkpoint in the Hugging Face layout, written by ``save_pretrained``;
      input_ids.npy            int64   [2, 12]   random ids in [1, vocab), seeded;
      logits.npy               float32 [2, 12, V] HF logits for input_ids, full attention mask;
      input_ids_left.npy       int64   [2, 12]   input_ids with row 1's first 4 ids replaced by pad id 0;
      attention_mask_left.npy  int64   [2, 12]   row 0 all ones, row 1 zeros on its first 4 positions;
      position_ids_left.npy    int64   [2, 12]   mask.cumsum(-1) - 1, filled with 1 where mask == 0
                                                 (what HF generate() uses for left padding), passed explicitly;
      logits_left.npy          float32 [2, 12, V] HF logits for the left-padded batch; only the positions
                                                 where attention_mask_left == 1 are meaningful;
      greedy_tokens.npy        int64   [1, 16]   model.generate(input_ids[0:1, :6], max_new_tokens=10,
                                                 do_sample=False): the prompt followed by 10 greedy tokens.
    See tests/fixtures/hf_reference/README.md for details and the versions used.

Why
    The acceptance check for our Paddle model is "logits equal those of the same weights loaded in HF
    transformers within 1e-4 max abs", for LLaMA- and Qwen2-style configs. Producing the reference once
    and committing it lets CI run that check without torch or transformers installed.
    Weights are re-initialised with a larger std than HF's default (0.02) so the logits are far from
    uniform (std around 1-2), which makes the comparison meaningful.

Regenerate (needs torch, transformers, safetensors and numpy; CPU is enough), from the repository root:
    /path/to/venv-with-torch-transformers/bin/python tools/make_hf_reference.py
The outputs depend on the torch version (random init) and to a small degree on the transformers version.
"""
import importlib.util
import json
import os
import shutil
import sys

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    sys.exit("error: torch and transformers are needed: this script runs in their environment (see its docstring)")

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_ROOT = os.path.join(REPO_ROOT, "tests", "fixtures", "hf_reference")

BATCH, SEQ_LEN, N_LEFT_PAD, PAD_ID = 2, 12, 4, 0
PROMPT_LEN, MAX_NEW_TOKENS = 6, 10
SEED = 1234

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    hidden_act="silu",
    # No special tokens: generation must never stop early on a random eos, and no embedding row is special.
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

CONFIGS = {
    "llama": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(COMMON, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False),
    ),
    "llama_tied": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(COMMON, num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True),
    ),
    "qwen2": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(
            COMMON,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            use_sliding_window=False,
        ),
    ),
}


def reinit_(model: torch.nn.Module) -> None:
    """Larger-than-default random weights, so logits are not near-uniform. Tied weights stay tied."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                module.weight.normal_(0.0, 0.2)
                if getattr(module, "bias", None) is not None:
                    module.bias.normal_(0.0, 0.1)
            elif type(module).__name__.endswith("RMSNorm"):
                module.weight.copy_(1.0 + 0.1 * torch.randn_like(module.weight))


def left_pad_inputs(input_ids: torch.Tensor):
    ids = input_ids.clone()
    mask = torch.ones_like(ids)
    mask[1, :N_LEFT_PAD] = 0
    ids[1, :N_LEFT_PAD] = PAD_ID
    # As in transformers' generate() for left padding.
    position_ids = mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(mask == 0, 1)
    return ids, mask, position_ids


def make_one(name: str) -> dict:
    config_cls, model_cls, kwargs = CONFIGS[name]
    out_dir = os.path.join(OUT_ROOT, name)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)

    torch.manual_seed(SEED)
    config = config_cls(**kwargs)
    config._attn_implementation = "eager"
    model = model_cls(config).to(torch.float32)
    reinit_(model)
    model.eval()
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(out_dir, safe_serialization=True)

    gen = torch.Generator().manual_seed(SEED + 1)
    input_ids = torch.randint(1, config.vocab_size, (BATCH, SEQ_LEN), generator=gen, dtype=torch.int64)
    ids_left, mask_left, pos_left = left_pad_inputs(input_ids)

    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits
        logits_left = model(input_ids=ids_left, attention_mask=mask_left, position_ids=pos_left).logits
        prompt = input_ids[0:1, :PROMPT_LEN]
        greedy = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=MAX_NEW_TOKENS,
            min_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
            pad_token_id=PAD_ID,
        )
    assert greedy.shape == (1, PROMPT_LEN + MAX_NEW_TOKENS), greedy.shape

    arrays = {
        "input_ids": input_ids.numpy().astype(np.int64),
        "logits": logits.float().numpy(),
        "input_ids_left": ids_left.numpy().astype(np.int64),
        "attention_mask_left": mask_left.numpy().astype(np.int64),
        "position_ids_left": pos_left.numpy().astype(np.int64),
        "logits_left": logits_left.float().numpy(),
        "greedy_tokens": greedy.numpy().astype(np.int64),
    }
    for key, value in arrays.items():
        np.save(os.path.join(out_dir, key + ".npy"), value)
    readable(out_dir)
    return arrays


def readable(out_dir: str) -> None:
    for fname in os.listdir(out_dir):  # save_pretrained writes model.safetensors as 0600
        os.chmod(os.path.join(out_dir, fname), 0o644)


def begin(doc: str) -> bool:
    """False after printing `doc` when the script was given any argument (--help); else print the versions and
    compute on one thread (determinism of float reductions across machines is not guaranteed, but it helps)."""
    if len(sys.argv) > 1:
        print(doc)
        return False
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")
    torch.set_num_threads(1)
    return True


def main() -> int:
    if not begin(__doc__):
        return 0
    for name in CONFIGS:
        arrays = make_one(name)
        with open(os.path.join(OUT_ROOT, name, "config.json")) as f:
            saved = json.load(f)
        print(
            f"{name}: max|logits|={np.abs(arrays['logits']).max():.4f} std={arrays['logits'].std():.4f} "
            f"greedy={arrays['greedy_tokens'].tolist()} config.json keys={sorted(saved)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
