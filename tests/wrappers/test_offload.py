"""offload_level: tensors leave for host memory and come back with identical values; a PPO run with every level
on equals the run without, bit for bit."""
import os
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


def test_ppo_with_every_offload_level_equals_the_run_without(tiny_model_dir, tiny_reward_dir, tmp_path, monkeypatch):
    """Both runs in this process (the same thread settings); in the offloaded one every model and optimizer state
    really moves (new storage each time, counted per move), phase by phase, and nothing moves without the levels."""
    from alignment.ppo import run_ppo
    from alignment.wrappers import offload

    common = [os.path.join(REPO, "config", "tiny", "ppo_argument.json"), "--actor_model_name_or_path", tiny_model_dir,
              "--reward_model_name_or_path", tiny_reward_dir, "--eval_datasets", "", "--max_steps", "2",
              "--max_new_tokens", "8", "--disable_tqdm"]
    move, moves = offload._move, {}

    def counting(tensors, place):
        tensors = [t for t in tensors if t is not None and t._is_initialized()]
        before = [t.data_ptr() for t in tensors]
        move(tensors, place)
        assert all(t.data_ptr() != p for t, p in zip(tensors, before))  # new storage: the data really moved
        moves.setdefault(run, []).append(len(tensors))

    monkeypatch.setattr(offload, "_move", counting)
    for run, extra in (("plain", []), ("offload", ["--offload_level", "freeze_model optimizer train_model"])):
        run_ppo.main([*common, "--output_dir", str(tmp_path / run), *extra])
    assert sum(moves["plain"]) == 0
    from alignment.models.score_model import ScoreModel

    actor, reward = LlamaForCausalLM.from_pretrained(tiny_model_dir), ScoreModel.from_pretrained(tiny_reward_dir)
    a, r = len(offload.model_tensors(actor)), len(offload.model_tensors(reward))
    states = 4 * (len(actor.parameters()) + len(reward.parameters()))  # AdamW: two moments, two beta powers each

    def step(optimizer_states):  # in and out: generate (actor), score (all four models), train (actor, critic)
        return [a, a, 2 * a + 2 * r, 2 * a + 2 * r, a + r + optimizer_states, a + r + optimizer_states]
    # at the start the four models go to host; step 1's update creates the optimizer states, which leave with the
    # models at its end; step 2 brings them in and out; the final save brings actor and critic
    first = step(0)[:-1] + [a + r + states]
    assert moves["offload"] == [2 * a + 2 * r] + first + step(states) + [a + r, a + r]
    plain, offloaded = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "offload")
    for a, b in zip(plain, offloaded):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == \
            {k: v for k, v in b.items() if not k.startswith("time/")}
    a = LlamaForCausalLM.from_pretrained(str(tmp_path / "plain" / "policy"))
    b = LlamaForCausalLM.from_pretrained(str(tmp_path / "offload" / "policy"))
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=name)
