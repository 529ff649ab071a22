"""offload_level: tensors leave for host memory and come back with identical values; a PPO run with every level
on equals the run without, bit for bit."""
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from alignment.models import LlamaForCausalLM
from alignment.config.choices import parse_offload_levels as parse_levels
from alignment.wrappers.offload import Offloader, host_place, optimizer_tensors
from tests.helpers import REPO, read_metrics


def test_parameters_and_optimizer_states_leave_and_return_unchanged(tiny_model_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model.train()
    optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    model(paddle.to_tensor([[5, 6, 7, 8]])).logits.mean().backward()
    optimizer.step()
    states = optimizer_tensors(optimizer)
    assert len(states) == 4 * len(model.parameters())  # two moments and two beta powers per parameter
    tensors = list(model.parameters()) + states
    values = [t.numpy().copy() for t in tensors]
    pointers = [t.data_ptr() for t in tensors]
    offloader = Offloader(parse_levels("train_model optimizer"), trained_models=[model], optimizers=[optimizer])
    offloader.offload_all()
    assert all(t.place._equals(host_place()) for t in tensors)
    moved = [t.data_ptr() for t in tensors]
    assert all(a != b for a, b in zip(pointers, moved))  # new storage: the data really moved
    for tensor, value in zip(tensors, values):
        np.testing.assert_array_equal(tensor.numpy(), value)
    with offloader.phase("train", [model], [optimizer]):
        assert all(a != b for a, b in zip(moved, (t.data_ptr() for t in tensors)))  # back on the device
        for tensor, value in zip(tensors, values):
            np.testing.assert_array_equal(tensor.numpy(), value)


def test_frozen_levels_skip_trained_models_and_unknown_levels_fail(tiny_model_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    offloader = Offloader(parse_levels("freeze_model"), frozen_models=[model], trained_models=[model])
    assert offloader.frozen == []  # LoRA: the reference is the actor; it is trained, so not a frozen model
    with pytest.raises(ValueError, match="offload_level"):
        parse_levels("freeze_model everything")


def test_ppo_with_every_offload_level_equals_the_run_without(tiny_model_dir, tiny_reward_dir, tmp_path):
    common = [os.path.join(REPO, "alignment", "ppo", "run_ppo.py"),
              os.path.join(REPO, "config", "tiny", "ppo_argument.json"), "--actor_model_name_or_path", tiny_model_dir,
              "--reward_model_name_or_path", tiny_reward_dir, "--eval_datasets", "", "--max_steps", "2",
              "--max_new_tokens", "8", "--disable_tqdm"]
    for name, extra in (("plain", []), ("offload", ["--offload_level", "freeze_model optimizer train_model"])):
        subprocess.run([sys.executable, *common, "--output_dir", str(tmp_path / name), *extra], cwd=REPO, check=True,
                       capture_output=True)
    plain, offload = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "offload")
    for a, b in zip(plain, offload):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == \
            {k: v for k, v in b.items() if not k.startswith("time/")}
    a = LlamaForCausalLM.from_pretrained(str(tmp_path / "plain" / "policy"))
    b = LlamaForCausalLM.from_pretrained(str(tmp_path / "offload" / "policy"))
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=name)
