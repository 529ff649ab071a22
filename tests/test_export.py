"""Export for inference: merged HF checkpoint + static graph, whose greedy output equals the dynamic model's."""
import json
import os
import shutil

import numpy as np
import paddle
import pytest

from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer, generate
from tools import export_model, predict


def dynamic_greedy(model_dir, prompt_ids, max_new_tokens):
    model = LlamaForCausalLM.from_pretrained(model_dir)
    ids = paddle.to_tensor([prompt_ids])
    out = generate(model, ids, paddle.ones_like(ids),
                   GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False,
                                    eos_token_id=model.config.eos_token_ids))
    n = int(out.response_mask.sum())
    return out.sequences[0, len(prompt_ids): len(prompt_ids) + n].numpy().tolist()


@pytest.fixture(scope="module")
def exported(tiny_model_dir, tmp_path_factory):
    return export_model.main(["--model", tiny_model_dir, "--output", str(tmp_path_factory.mktemp("exp") / "out"),
                              "--max-length", "48"])


def test_static_greedy_output_equals_the_dynamic_model(exported, tiny_model_dir):
    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    predictor, info = predict.load_predictor(exported)
    for prompt in ("Say hi.", "What is 7 + 5?"):
        ids = tokenizer.encode(tokenizer.apply_chat_template(tokenizer.chat_messages(prompt)), add_special_tokens=True)
        assert predict.greedy_tokens(predictor, info, ids, 12) == dynamic_greedy(tiny_model_dir, ids, 12)
    assert json.load(open(os.path.join(exported, "inference", "export.json")))["max_length"] == 48


def test_exported_checkpoint_has_the_same_weights(exported, tiny_model_dir):
    a, b = LlamaForCausalLM.from_pretrained(tiny_model_dir), LlamaForCausalLM.from_pretrained(
        os.path.join(exported, "hf"))
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=name)
    assert os.path.exists(os.path.join(exported, "hf", "tokenizer.json"))


def test_a_lora_adapter_exports_merged(tmp_path, tiny_model_dir):
    from alignment.models.lora import apply_lora, save_adapter

    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    apply_lora(model, 4, 8.0, 0.0, ["q_proj"])
    for layer in (model.model.layers[0].self_attn.q_proj,):
        layer.lora_B.set_value(paddle.full(layer.lora_B.shape, 0.05))
    save_adapter(model, str(tmp_path / "adapter"), tiny_model_dir, "CAUSAL_LM", tokenizer_dir=tiny_model_dir)
    out = export_model.main(["--model", str(tmp_path / "adapter"), "--output", str(tmp_path / "exp"),
                             "--max-length", "32"])
    ids = paddle.to_tensor([[3, 17, 45, 9]])
    model.eval()
    merged = LlamaForCausalLM.from_pretrained(os.path.join(out, "hf"))
    np.testing.assert_allclose(merged(ids).logits.numpy(), model(ids).logits.numpy(), atol=1e-5)


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


def test_predict_rejects_a_prompt_wider_than_the_graph(exported):
    predictor, info = predict.load_predictor(exported)
    with pytest.raises(ValueError, match="the exported graph holds 48"):
        predict.greedy_tokens(predictor, info, list(range(3, 60)), 4)
