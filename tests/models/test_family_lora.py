"""LoRA on every family's projection names (tests/training/test_family_stages.py's tiny Llama 3, Qwen3, ERNIE 4.5,
Qwen3-MoE and ERNIE 4.5 MoE checkpoints): two SFT steps with adapters move only the adapters, the saved adapter loads back
to the same logits, and merging it gives those logits in a model without adapters. The MoE families' experts are
wrapped (gate/up/down of every expert), their router is not."""
import os

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file

from alignment.commands import merge_lora
from alignment.models import LlamaForCausalLM
from alignment.models.lora import apply_lora, has_lora, load_adapter
from alignment.sft import run_sft
from tests.helpers import REPO
from tests.training.test_family_stages import FAMILIES, family_checkpoint

IDS = np.array([[3, 17, 45, 9, 200, 31], [5, 6, 7, 8, 9, 10]])
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def logits(model):
    model.eval()
    return model(paddle.to_tensor(IDS)).logits.numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_trains_saves_and_merges_on_every_family(family, tiny_model_dir, tmp_path):
    base_dir = family_checkpoint(family, tiny_model_dir, str(tmp_path / "base"))
    run_sft.main([os.path.join(REPO, "config", "tiny", "sft_argument.json"), "--model_name_or_path", base_dir,
                  "--output_dir", str(tmp_path / "out"), "--disable_tqdm", "--train_datasets",
                  f"alpaca:1.0:{REPO}/data/sft/train.jsonl", "--eval_datasets", "", "--max_steps", "2",
                  "--logging_steps", "1", "--per_device_train_batch_size", "4", "--learning_rate", "1e-2",
                  "--lora", "true", "--lora_rank", "4", "--lora_alpha", "8"])
    adapter = str(tmp_path / "out" / "model")
    names = list(load_file(os.path.join(adapter, "adapter_model.safetensors")))
    wrapped = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in names}
    assert wrapped == set(PROJECTIONS), wrapped  # the family's projections, under transformers' names
    experts = [name for name in names if ".mlp.experts." in name]
    assert bool(experts) == family.endswith("_moe")
    assert not any(".mlp.gate." in name for name in names)  # an MoE router is not adapted

    base = LlamaForCausalLM.from_pretrained(base_dir)
    model = LlamaForCausalLM.from_pretrained(base_dir)
    apply_lora(model, 4, 8.0, 0.0)
    load_adapter(model, adapter)
    with_adapter = logits(model)
    assert np.abs(with_adapter - logits(base)).max() > 1e-4  # the adapters learned something
    merged = LlamaForCausalLM.from_pretrained(merge_lora.main(["--adapter", adapter, "--output",
                                                                str(tmp_path / "merged")]))
    assert not has_lora(merged) and merged.config.model_type == base.config.model_type
    np.testing.assert_allclose(logits(merged), with_adapter, rtol=1e-5, atol=1e-5 * np.abs(with_adapter).max())
