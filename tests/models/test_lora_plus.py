"""rsLoRA and LoRA+ as PaddleNLP has them: the scaling, lora_alpha -1 and rslora_plus, B's learning rate, and the
adapter files recording use_rslora so loading and merging give the same model."""
import json
import math
import os

import numpy as np
import paddle
import pytest

from alignment.config.data import DataArguments, LoRAArguments, ModelArguments, lora_scaling
from alignment.config.parser import ArgumentError, ArgumentParser
from alignment.config.training import TrainingArguments
from alignment.models import LlamaForCausalLM
from alignment.models.convert.merge_adapter import merge
from alignment.models.lora import adapter_scaling, apply_lora, load_adapter, lora_layers, save_adapter
from alignment.models.logprobs import answer_token_loss
from alignment.training.optim import build_optimizer
from tests.models.test_lora import IDS, logits, sft


@pytest.mark.parametrize("rank, alpha, rslora, plus, rslora_plus, expected", [
    (8, 16.0, False, 1.0, False, (16.0, False, 1.0)),
    (8, -1, False, 1.0, False, (16.0, False, 1.0)),   # PaddleNLP: 2 x lora_rank
    (8, -1, True, 1.0, False, (4.0, True, 1.0)),      # ... 4 with rslora
    (8, 32.0, False, 2.0, True, (4.0, True, 4.0)),    # rslora_plus replaces all three
    (16, -1, False, 1.0, True, (4.0, True, 4.0)),
])
def test_effective_lora_settings_follow_paddlenlp(rank, alpha, rslora, plus, rslora_plus, expected):
    assert tuple(lora_scaling(rank, alpha, rslora, plus, rslora_plus)) == expected


def test_adapter_scaling_golden_values():
    assert adapter_scaling(16.0, 4) == 4.0
    assert adapter_scaling(16.0, 4, rslora=True) == 8.0          # 16 / sqrt(4)
    assert adapter_scaling(4.0, 8, rslora=True) == pytest.approx(4 / math.sqrt(8))


def parse(values):
    return ArgumentParser(ModelArguments, DataArguments, LoRAArguments, TrainingArguments).parse_dict(
        {"model_name_or_path": "m", "train_datasets": "x", **values})[2]


def test_paddlenlp_lora_keys_parse_and_bad_values_name_the_key():
    lora = parse({"lora": True, "lora_rank": 8, "lora_alpha": -1, "rslora_plus": True})
    assert tuple(lora.scaling()) == (4.0, True, 4.0)
    assert tuple(parse({"lora": True, "lora_alpha": -1}).scaling()) == (16.0, False, 1.0)
    for values, key in (({"lora_alpha": -2}, "lora_alpha"), ({"lora_alpha": 0}, "lora_alpha"),
                        ({"lora_plus_scale": 0}, "lora_plus_scale")):
        with pytest.raises(ArgumentError, match=f"key '{key}'"):
            parse(values)


def one_step(model_dir, plus_scale):
    """One AdamW step (constant lr 1e-3) of fresh adapters with the same seed; returns the model."""
    paddle.seed(5)
    model = LlamaForCausalLM.from_pretrained(model_dir)
    apply_lora(model, 4, 8.0, 0.0, ["q_proj", "down_proj"], plus_scale=plus_scale)
    optimizer, _ = build_optimizer(model, TrainingArguments(learning_rate=1e-3, weight_decay=0.1,
                                                            lr_scheduler_type="constant"), 10)
    model.train()
    ids = paddle.to_tensor(IDS)
    loss, _ = answer_token_loss(model, ids, paddle.ones_like(ids), ids)
    loss.backward()
    optimizer.step()
    return model


def test_lora_plus_gives_b_scale_times_the_learning_rate(tiny_model_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    apply_lora(model, 4, 8.0, 0.0, ["q_proj"], plus_scale=4.0)
    rates = {name: p.optimize_attr["learning_rate"] for name, p in model.named_parameters() if not p.stop_gradient}
    assert rates and all(rate == (4.0 if name.endswith("lora_B") else 1.0) for name, rate in rates.items())

    plain, plus = lora_layers(one_step(tiny_model_dir, 1.0)), lora_layers(one_step(tiny_model_dir, 4.0))
    for name in plain:
        b1, b4 = plain[name].lora_B.numpy(), plus[name].lora_B.numpy()
        assert np.abs(b1).max() > 0
        # B starts at 0 (no decay to apply): Adam's first step is lr x g / (|g| + eps), 4 x as far with LoRA+
        np.testing.assert_allclose(b4, 4.0 * b1, rtol=1e-5, atol=1e-12, err_msg=name)
        np.testing.assert_array_equal(plus[name].lora_A.numpy(), plain[name].lora_A.numpy())  # A: B was 0


def test_rslora_adapter_saves_loads_and_merges_to_the_same_logits(tmp_path, tiny_model_dir):
    paddle.seed(3)
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    apply_lora(model, 4, 8.0, 0.0, ["q_proj", "down_proj"], rslora=True)
    for layer in lora_layers(model).values():
        assert layer.scaling == 4.0  # 8 / sqrt(4)
        layer.lora_B.set_value(paddle.randn(layer.lora_B.shape) * 0.05)
    expected = logits(model, IDS)
    save_adapter(model, str(tmp_path / "a"), tiny_model_dir, "CAUSAL_LM")
    config = json.load(open(tmp_path / "a" / "adapter_config.json"))
    assert (config["use_rslora"], config["r"], config["lora_alpha"]) == (True, 4, 8.0)

    again = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    apply_lora(again, 4, 8.0, 0.0, ["q_proj", "down_proj"], rslora=True)
    load_adapter(again, str(tmp_path / "a"))
    np.testing.assert_array_equal(logits(again, IDS), expected)
    merged = LlamaForCausalLM.from_pretrained(merge(str(tmp_path / "a"), str(tmp_path / "merged")))
    np.testing.assert_allclose(logits(merged, IDS), expected, atol=1e-5)

    plain = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    apply_lora(plain, 4, 8.0, 0.0, ["q_proj", "down_proj"])  # scaling 2, not the adapter's 4
    with pytest.raises(ValueError, match="use_rslora True.*'rslora'"):
        load_adapter(plain, str(tmp_path / "a"))


def test_sft_with_rslora_plus_records_it_and_merges_to_the_same_logits(tmp_path, tiny_model_dir):
    sft(tmp_path, tiny_model_dir, "--max_steps", "2", "--rslora_plus", "true")
    adapter = str(tmp_path / "out" / "model")
    config = json.load(open(os.path.join(adapter, "adapter_config.json")))
    assert (config["use_rslora"], config["lora_alpha"], config["r"]) == (True, 4.0, 4)
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    apply_lora(model, 4, 4.0, 0.0, rslora=True)
    load_adapter(model, adapter)
    merged = LlamaForCausalLM.from_pretrained(merge(adapter, str(tmp_path / "merged")))
    np.testing.assert_allclose(logits(merged, IDS), logits(model, IDS), atol=1e-5)
