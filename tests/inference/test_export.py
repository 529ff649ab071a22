"""Export for inference: merged HF checkpoint + one static KV-cache program whose logits equal the dynamic model's.
(tests/inference/test_predict.py decodes through it: greedy tokens equal the dynamic model's generate.)"""
import json
import os
import shutil

import numpy as np
import paddle
import pytest

from alignment.models import LlamaForCausalLM
from alignment.models.static_decode import EXPORT_FORMAT
from alignment.commands import export_model
from alignment.inference import batch_generation, export, exported_model


@pytest.fixture(scope="module")
def exported(tiny_model_dir, tmp_path_factory):
    return export_model.main(["--model", tiny_model_dir, "--output", str(tmp_path_factory.mktemp("exp") / "out"),
                              "--no-progress"])


def test_prefill_and_decode_steps_equal_the_dynamic_model_with_left_padding(exported, tiny_model_dir):
    """One program, dynamic shapes: a prefill (empty caches) and steps (one token) at two batch sizes."""
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    lm = exported_model.load(exported, "cpu")
    for rows in ([[5, 6, 7, 8, 9], [10, 11]], [[12, 13, 14]]):
        ids, mask = batch_generation.left_pad(rows, 3)
        ours, ref = lm(ids, attention_mask=mask), model(ids, attention_mask=mask, use_cache=True, last_only=True)
        position = mask.sum(axis=1, keepdim=True)
        for token in (17, 42, 99):
            np.testing.assert_allclose(ours.logits.numpy(), ref.logits.numpy(), atol=1e-5)
            for (k, v), (k_ref, v_ref) in zip(ours.past_key_values, ref.past_key_values):
                np.testing.assert_allclose(k.numpy(), k_ref.numpy(), atol=1e-5)
                np.testing.assert_allclose(v.numpy(), v_ref.numpy(), atol=1e-5)
            step = paddle.full([len(rows), 1], token, "int64")
            mask = paddle.concat([mask, paddle.ones_like(step)], axis=1)
            ours = lm(step, attention_mask=mask, position_ids=position, past_key_values=ours.past_key_values)
            ref = model(step, attention_mask=mask, position_ids=position, past_key_values=ref.past_key_values,
                        use_cache=True, last_only=True)
            position = position + 1


def test_export_json_records_the_program_and_cache_layout(exported, tiny_model_dir):
    info = json.load(open(os.path.join(exported, "inference", "export.json")))
    config = json.load(open(os.path.join(tiny_model_dir, "config.json")))
    assert info["format"] == EXPORT_FORMAT and info["dtype"] == "float32"
    assert info["inputs"][:3] == ["input_ids", "attention_mask", "position_ids"]
    assert len(info["inputs"]) == 3 + 2 * config["num_hidden_layers"]
    assert (info["num_key_value_heads"], info["head_dim"]) == (config["num_key_value_heads"], config["head_dim"])
    assert info["eos_token_ids"] == [config["eos_token_id"]] and info["pad_token_id"] == config["pad_token_id"]
    for name in ("model.json", "model.pdiparams", "tokenizer.json", "tokenizer_config.json"):
        assert os.path.exists(os.path.join(exported, "inference", name)), name


def test_exported_checkpoint_has_the_same_weights(exported, tiny_model_dir):
    a, b = LlamaForCausalLM.from_pretrained(tiny_model_dir), LlamaForCausalLM.from_pretrained(
        os.path.join(exported, "hf"))
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=name)
    assert os.path.exists(os.path.join(exported, "hf", "tokenizer.json"))


def test_a_lora_adapter_exports_merged_with_a_line_per_stage(tmp_path, tiny_model_dir, capsys):
    from alignment.models.lora import apply_lora, save_adapter

    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    apply_lora(model, 4, 8.0, 0.0, ["q_proj"])
    for layer in (model.model.layers[0].self_attn.q_proj,):
        layer.lora_B.set_value(paddle.full(layer.lora_B.shape, 0.05))
    save_adapter(model, str(tmp_path / "adapter"), tiny_model_dir, "CAUSAL_LM", tokenizer_dir=tiny_model_dir)
    out = export_model.main(["--model", str(tmp_path / "adapter"), "--output", str(tmp_path / "exp")])
    ids = paddle.to_tensor([[3, 17, 45, 9]])
    model.eval()
    merged = LlamaForCausalLM.from_pretrained(os.path.join(out, "hf"))
    np.testing.assert_allclose(merged(ids).logits.numpy(), model(ids).logits.numpy(), atol=1e-5)
    err = capsys.readouterr().err  # stderr is no terminal here: stage lines instead of a bar
    assert all(f"export: {stage}" in err for stage in export.STAGES), err


@pytest.mark.parametrize("damage, fragment", [
    ("no directory", "model directory not found"),
    ("no weights", "model.safetensors"),
    ("config mismatch", "shape"),
])
def test_broken_checkpoints_fail_clearly_and_write_nothing(tmp_path, tiny_model_dir, capsys, damage, fragment):
    source = tmp_path / "ckpt"
    if damage != "no directory":
        shutil.copytree(tiny_model_dir, source)
    if damage == "no weights":
        (source / "model.safetensors").unlink()
    if damage == "config mismatch":
        config = json.load(open(source / "config.json"))
        config["hidden_size"] *= 2
        (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as info:
        export_model.main(["--model", str(source), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and fragment in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
