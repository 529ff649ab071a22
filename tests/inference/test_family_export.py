"""Every model family exports for inference (alignment/commands/export_model.py: a merged HF checkpoint and one
static KV-cache program) and the exported program gives the dynamic model's logits over a left-padded prefill and
decode steps, on the tiny checkpoints of tests/training/test_family_stages.py."""
import numpy as np
import paddle
import pytest

from alignment.commands import export_model
from alignment.inference import batch_generation, exported_model
from alignment.models import LlamaForCausalLM
from tests.training.test_family_stages import FAMILIES, family_checkpoint


@pytest.mark.parametrize("family", FAMILIES)
def test_the_exported_program_gives_the_dynamic_models_logits(family, tiny_model_dir, tmp_path):
    path = family_checkpoint(family, tiny_model_dir, str(tmp_path / family))
    exported = export_model.main(["--model", path, "--output", str(tmp_path / "out"), "--no-progress"])
    model = LlamaForCausalLM.from_pretrained(path)
    model.eval()
    lm = exported_model.load(exported, "cpu")
    ids, mask = batch_generation.left_pad([[5, 6, 7, 8, 9], [10, 11]], 3)
    ours, ref = lm(ids, attention_mask=mask), model(ids, attention_mask=mask, use_cache=True, last_only=True)
    position = mask.sum(axis=1, keepdim=True)
    for token in (17, 42, 99):
        np.testing.assert_allclose(ours.logits.numpy(), ref.logits.numpy(), atol=1e-5)
        step = paddle.full([2, 1], token, "int64")
        mask = paddle.concat([mask, paddle.ones_like(step)], axis=1)
        ours = lm(step, attention_mask=mask, position_ids=position, past_key_values=ours.past_key_values)
        ref = model(step, attention_mask=mask, position_ids=position, past_key_values=ref.past_key_values,
                    use_cache=True, last_only=True)
        position = position + 1
    np.testing.assert_allclose(ours.logits.numpy(), ref.logits.numpy(), atol=1e-5)
