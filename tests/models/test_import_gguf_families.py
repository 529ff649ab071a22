"""GGUF import of the Qwen and ERNIE architectures (alignment/models/convert/gguf_families.py): the tiny fixtures of
tests/fixtures/models written as llama.cpp's convert_hf_to_gguf.py writes them (its metadata keys and tensor names,
experts stacked [experts, ...], q/k rows left as they are: only LLaMA's are permuted), imported, loaded by our model:
the logits are transformers' (reference.safetensors) and the tensor names and MoE keys transformers'. Qwen2 has no
transformers fixture: the qwen3 weights with q/k/v biases instead of q/k norms, against our model of that checkpoint."""
import json
import os

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer, pre_tokenizers

from alignment.commands import import_gguf
from alignment.config.model_families import FAMILIES
from alignment.config.moe_keys import moe_settings
from alignment.models import LlamaForCausalLM
from alignment.models.convert import gguf_families
from tests.bad_input_harness import case, run_case
from tests.models.test_import_gguf import CHAT_TEMPLATE, MERGES, SPECIALS, gguf_name
from tests.models.test_model_families import FIXTURES, assert_close_to_transformers, logits_of

# the fixtures' 128-token vocabulary: the specials, Ġ and 118 more byte-level characters, the merged tokens
MERGED = ["he", "ll", "hell", "Ġw", "or", "Ġwor"]
BYTES = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: (c != "Ġ", c))[:128 - len(SPECIALS) - len(MERGED)]
TOKENS = SPECIALS + BYTES + MERGED
EXPERT_STACKS = {"gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight",
                 "down_proj": "ffn_down_exps.weight"}
# what convert_hf_to_gguf.py's Qwen2MoeModel / Ernie4_5MoeModel write beyond the dense keys, from config.json
MOE_METADATA = {
    "qwen3moe": lambda c: {"expert_count": c["num_local_experts"], "expert_used_count": c["num_experts_per_tok"],
                           "expert_feed_forward_length": c["moe_intermediate_size"]},
    "ernie4_5-moe": lambda c: {
        "expert_count": c["moe_num_experts"], "expert_used_count": c["moe_k"],
        "interleave_moe_layer_step": c["moe_layer_interval"], "leading_dense_block_count": c["moe_layer_start_index"],
        "expert_feed_forward_length": c["moe_intermediate_size"], "expert_shared_count": c["moe_num_shared_experts"],
        "expert_shared_feed_forward_length": c["intermediate_size"] // c["num_key_value_heads"]},
}
# GGUF architecture -> the fixture written in it (qwen2: made by qwen2_checkpoint)
ARCHITECTURES = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe", "ernie4_5": "ernie4_5",
                 "ernie4_5-moe": "ernie4_5_moe"}


def stacked_experts(weights):
    """{(layer, projection): [experts, out, in]} from transformers' per-expert tensors, as the converter stacks them."""
    experts = {}
    for name in sorted(weights, key=lambda n: int(n.split(".")[5]) if ".mlp.experts." in n else 0):
        if ".mlp.experts." in name:
            layer, projection = int(name.split(".")[2]), name.split(".")[6]
            experts.setdefault((layer, projection), []).append(weights[name])
    return {key: np.stack(parts) for key, parts in experts.items()}


def byte_level_vocabulary(pre):
    def write(writer):
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(TOKENS)
        writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS)
                               + [gguf.TokenType.NORMAL] * (len(TOKENS) - 3))
        writer.add_token_merges(MERGES)
        writer.add_eos_token_id(2)
    return write


def write_gguf(path, hf_dir, arch, metadata=None, drop=(), pre="qwen2", tensor_type=None, vocabulary=None):
    """hf_dir as convert_hf_to_gguf.py writes it: `metadata` overrides keys after "<arch>." (None drops one), `drop`
    leaves tensors out, `tensor_type(gguf name, array)` -> (array, raw_dtype) quantizes, `vocabulary(writer)`
    writes the tokenizer's keys (default: the fixtures' byte-level BPE with `pre`)."""
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    weights = load_file(os.path.join(hf_dir, "model.safetensors"))
    rope = config.get("rope_parameters") or {"rope_theta": config["rope_theta"]}
    values = {"block_count": config["num_hidden_layers"], "context_length": config["max_position_embeddings"],
              "embedding_length": config["hidden_size"], "feed_forward_length": config["intermediate_size"],
              "attention.head_count": config["num_attention_heads"],
              "attention.head_count_kv": config["num_key_value_heads"], "rope.freq_base": rope["rope_theta"],
              "attention.layer_norm_rms_epsilon": config["rms_norm_eps"],
              "attention.key_length": config["head_dim"], "attention.value_length": config["head_dim"],
              **MOE_METADATA.get(arch, lambda c: {})(config), **(metadata or {})}
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in values.items():
        if value is not None:
            (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(f"{arch}.{key}", value)
    (vocabulary or byte_level_vocabulary(pre))(writer)
    writer.add_chat_template(CHAT_TEMPLATE)
    tensors = {gguf_name(name): weight for name, weight in weights.items() if ".mlp.experts." not in name}
    tensors.update({f"blk.{layer}.{EXPERT_STACKS[projection]}": stack
                    for (layer, projection), stack in stacked_experts(weights).items()})
    for name, weight in tensors.items():
        if name not in drop:
            data, raw_dtype = tensor_type(name, weight) if tensor_type else (weight, None)
            writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def qwen2_checkpoint(path):
    """The qwen3 fixture's weights as a Qwen2 checkpoint: q/k/v biases (~ N(0, 0.2)) in place of the q/k norms."""
    config = json.load(open(os.path.join(FIXTURES, "qwen3", "config.json")))
    config.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    weights = {k: v for k, v in load_file(os.path.join(FIXTURES, "qwen3", "model.safetensors")).items()
               if not k.endswith(("q_norm.weight", "k_norm.weight"))}
    rng = np.random.default_rng(63)
    for name in [n for n in weights if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))]:
        weights[name[: -len("weight")] + "bias"] = rng.normal(0, 0.2, weights[name].shape[0]).astype(np.float32)
    os.makedirs(path)
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    save_file(weights, os.path.join(path, "model.safetensors"))
    return str(path)


def source_of(arch, tmp_path):
    fixture = ARCHITECTURES[arch]
    return qwen2_checkpoint(tmp_path / "qwen2-hf") if arch == "qwen2" else os.path.join(FIXTURES, fixture)


def import_file(gguf_path, output):
    import_gguf.main(["--gguf", str(gguf_path), "--output", str(output)])
    return LlamaForCausalLM.from_pretrained(str(output))


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_imported_logits_are_the_checkpoints(arch, tmp_path):
    source = source_of(arch, tmp_path)
    model = import_file(write_gguf(tmp_path / f"{arch}.gguf", source, arch), tmp_path / "imported")
    ids = load_file(os.path.join(FIXTURES, "qwen3", "reference.safetensors"))["input_ids"]
    if arch != "qwen2":
        reference = load_file(os.path.join(source, "reference.safetensors"))
        ids = reference["input_ids"]
        assert_close_to_transformers(logits_of(model, ids), reference["logits"])
    np.testing.assert_array_equal(logits_of(model, ids), logits_of(LlamaForCausalLM.from_pretrained(source), ids))


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_imported_checkpoint_has_transformers_names_and_keys(arch, tmp_path):
    source = source_of(arch, tmp_path)
    output = tmp_path / "imported"
    import_gguf.main(["--gguf", write_gguf(tmp_path / f"{arch}.gguf", source, arch), "--output", str(output)])
    shapes = lambda d: {k: v.shape for k, v in load_file(os.path.join(d, "model.safetensors")).items()}  # noqa
    assert shapes(output) == shapes(source)
    ours, theirs = (json.load(open(os.path.join(d, "config.json"))) for d in (output, source))
    assert (ours["model_type"], ours["architectures"]) == (theirs["model_type"], theirs["architectures"])
    assert ours["head_dim"] == theirs["head_dim"] and ours["tie_word_embeddings"] is True
    kind, layers = FAMILIES[ours["model_type"]].moe, ours["num_hidden_layers"]
    assert moe_settings(kind, ours, layers) == moe_settings(kind, theirs, layers)
    assert Tokenizer.from_file(str(output / "tokenizer.json")).encode("hello world 123").tokens == [
        "hell", "o", "Ġwor", "l", "d", "Ġ", "1", "2", "3"]


def test_permuting_qwen_q_k_as_llama_s_would_give_other_logits(tmp_path, monkeypatch):
    """Why Qwen's q/k rows stay as they are: undoing a permutation the converter never made spoils them."""
    monkeypatch.setitem(gguf_families.GGUF_FAMILIES, "qwen3",
                        gguf_families.GGUF_FAMILIES["qwen3"]._replace(permuted_qk=True))
    model = import_file(write_gguf(tmp_path / "qwen3.gguf", source_of("qwen3", tmp_path), "qwen3"), tmp_path / "out")
    reference = load_file(os.path.join(FIXTURES, "qwen3", "reference.safetensors"))
    assert np.abs(logits_of(model, reference["input_ids"]) - reference["logits"]).max() > 0.1


def test_quantized_expert_stacks_dequantize_per_expert(tmp_path):
    def quantize(name, weight):  # Q8_0 where rows hold whole 32-value blocks, F16 elsewhere
        if name.endswith(("gate_exps.weight", "up_exps.weight")):
            return gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
        return (weight.astype(np.float16), None) if name.endswith("down_exps.weight") else (weight, None)
    source = source_of("qwen3moe", tmp_path)
    path = write_gguf(tmp_path / "q.gguf", source, "qwen3moe", tensor_type=quantize)
    import_gguf.main(["--gguf", path, "--output", str(tmp_path / "out")])
    ours, theirs = (load_file(os.path.join(d, "model.safetensors")) for d in (tmp_path / "out", source))
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name in [n for n in theirs if ".mlp.experts." in n]:
        expected = theirs[name].astype(np.float16).astype(np.float32) if "down_proj" in name else (
            gguf.quants.dequantize(gguf.quants.quantize(theirs[name], q8), q8))
        np.testing.assert_array_equal(ours[name], expected, err_msg=name)


def from_gguf_of(arch, **kwargs):
    def build(t, m):
        path = write_gguf(t / "model.gguf", source_of(arch, t), arch, **kwargs)
        return lambda: import_gguf.main(["--gguf", path, "--output", str(t / "out")])
    return build


def written_as(fixture, arch):
    """A fixture's tensors under another general.architecture."""
    def build(t, m):
        path = write_gguf(t / "model.gguf", os.path.join(FIXTURES, fixture), arch)
        return lambda: import_gguf.main(["--gguf", path, "--output", str(t / "out")])
    return build


BAD_FILES = [
    case("unsupported architecture", written_as("qwen3", "qwen2moe"), "model.gguf",
         "architecture 'qwen2moe' is not supported", "supported: llama, qwen2, qwen3, qwen3moe, ernie4_5, ernie4_5-moe"),
    case("a missing expert stack", from_gguf_of("qwen3moe", drop=("blk.2.ffn_up_exps.weight",)), "model.gguf",
         "tensor blk.2.ffn_up_exps.weight is missing (layer 2 is a mixture-of-experts layer)"),
    case("a missing router", from_gguf_of("ernie4_5-moe", drop=("blk.1.ffn_gate_inp.weight",)), "model.gguf",
         "tensor blk.1.ffn_gate_inp.weight is missing (layer 1 is a mixture-of-experts layer)"),
    case("metadata making a dense layer sparse", from_gguf_of("ernie4_5-moe", metadata={
        "leading_dense_block_count": 0}), "model.gguf", "tensor blk.0.ffn_gate_inp.weight is missing"),
    case("no expert_used_count", from_gguf_of("qwen3moe", metadata={"expert_used_count": None}), "model.gguf",
         "required metadata key qwen3moe.expert_used_count is missing"),
    case("shared experts the metadata does not count", from_gguf_of("ernie4_5-moe", metadata={
        "expert_shared_count": 0}), "model.gguf",
         "tensor blk.1.ffn_down_shexp.weight has no place in a Hugging Face ernie4_5_moe model of this config"),
    case("a missing q norm", from_gguf_of("qwen3", drop=("blk.1.attn_q_norm.weight",)), "model.gguf",
         "tensor blk.1.attn_q_norm.weight is missing"),
    case("a Qwen3 file called Qwen2", written_as("qwen3", "qwen2"), "model.gguf",
         "tensor blk.0.attn_q.bias is missing"),
]


@pytest.mark.parametrize("bad", BAD_FILES, ids=[c.id for c in BAD_FILES])
def test_bad_file_is_one_line_naming_the_file_and_the_key(bad, tmp_path, capsys):
    run_case(bad, tmp_path, None, capsys)
