"""LoRA adapters: frozen base, PEFT file layout, merge, the PPO reference without a second model, resume."""
import json
import os
import shutil

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file

from alignment.dpo import run_dpo
from alignment.models import LlamaForCausalLM
from alignment.models.lora import adapters_disabled, apply_lora, has_lora, load_adapter, save_adapter
from alignment.models.score_model import ScoreModel
from alignment.ppo import run_ppo
from alignment.ppo.rollout.rollout import response_log_probs
from alignment.rm import run_reward
from alignment.sft import run_sft
from tests.helpers import REPO, read_metrics
from alignment.commands import merge_lora

SFT_CONFIG = os.path.join(REPO, "config", "tiny", "sft_argument.json")
LORA = ["--lora", "true", "--lora_rank", "4", "--lora_alpha", "8"]


def sft(tmp_path, model, *extra):
    return run_sft.main([SFT_CONFIG, "--model_name_or_path", model, "--output_dir", str(tmp_path / "out"),
                         "--disable_tqdm", "--train_datasets", f"alpaca:1.0:{REPO}/data/sft/train.jsonl",
                         "--eval_datasets", "", "--max_steps", "4", "--logging_steps", "1",
                         "--per_device_train_batch_size", "4", *LORA, *extra])


def logits(model, ids):
    model.eval()
    return model(paddle.to_tensor(ids)).logits.numpy()


IDS = np.array([[3, 17, 45, 9, 200, 31], [5, 6, 7, 8, 9, 10]])


def test_lora_sft_trains_adapters_and_merges_to_the_same_logits(tmp_path, tiny_model_dir):
    sft(tmp_path, tiny_model_dir)
    adapter = str(tmp_path / "out" / "model")
    assert sorted(f for f in os.listdir(adapter) if f.startswith("adapter")) == ["adapter_config.json",
                                                                                 "adapter_model.safetensors"]
    base = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    wrapped = apply_lora(model, 4, 8.0, 0.0)
    load_adapter(model, adapter)
    # loading the adapter leaves the checkpoint's base weights as they were
    base_params = dict(base.named_parameters())
    for name, param in model.named_parameters():
        if ".lora_" not in name:
            np.testing.assert_array_equal(param.numpy(), base_params[name].numpy(), err_msg=name)
    assert len(wrapped) == 7 * base.config.num_hidden_layers
    trained_b = [float(np.abs(layer.lora_B.numpy()).max()) for layer in
                 (model.model.layers[0].self_attn.q_proj, model.model.layers[1].mlp.down_proj)]
    assert min(trained_b) > 0  # training moved the adapters (B starts at 0)
    with_adapter = logits(model, IDS)
    with adapters_disabled(model):
        np.testing.assert_array_equal(logits(model, IDS), logits(base, IDS))
    merged = merge_lora.main(["--adapter", adapter, "--output", str(tmp_path / "merged")])
    merged_model = LlamaForCausalLM.from_pretrained(merged)
    assert not has_lora(merged_model)
    np.testing.assert_allclose(logits(merged_model, IDS), with_adapter, atol=1e-5)


def test_training_steps_leave_the_base_weights_bitwise_unchanged(tiny_model_dir):
    from alignment.models.logprobs import answer_token_loss
    from alignment.config.training import TrainingArguments
    from alignment.training.optim import build_optimizer

    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    apply_lora(model, 4, 8.0, 0.1)
    before = {n: p.numpy().copy() for n, p in model.named_parameters()}
    optimizer, _ = build_optimizer(model, TrainingArguments(learning_rate=1e-2, weight_decay=0.1), 10)
    model.train()
    ids = paddle.to_tensor(IDS)
    for _ in range(3):
        loss, _ = answer_token_loss(model, ids, paddle.ones_like(ids), ids)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
    for name, param in model.named_parameters():
        if ".lora_" in name:
            if name.endswith("lora_B"):
                assert np.abs(param.numpy()).max() > 0, name  # the adapters trained
        else:
            np.testing.assert_array_equal(param.numpy(), before[name], err_msg=name)  # bitwise


def test_only_adapters_are_trainable_and_in_the_optimizer(tmp_path, tiny_model_dir):
    from alignment.config.training import TrainingArguments
    from alignment.training.optim import build_optimizer

    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    apply_lora(model, 4, 8.0, 0.0, ["q_proj", "v_proj"])
    trainable = [n for n, p in model.named_parameters() if not p.stop_gradient]
    assert trainable and all(n.endswith((".lora_A", ".lora_B")) for n in trainable)
    assert len(trainable) == 2 * 2 * model.config.num_hidden_layers
    optimizer, _ = build_optimizer(model, TrainingArguments(), 10)
    assert {p.name for p in optimizer._parameter_list} == {p.name for p in model.parameters() if not p.stop_gradient}


def test_peft_layout_names_and_config_keys(tmp_path, tiny_model_dir):
    """The names peft writes for LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]) on
    LlamaForCausalLM (get_peft_model_state_dict, adapter "default" stripped):
        base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight  [r, in]
        base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight  [out, r]
        base_model.model.model.layers.{i}.mlp.down_proj.lora_A.weight / lora_B.weight
    and for a sequence-classification model with modules_to_save=["score"]: base_model.model.score.weight [1, h].
    adapter_config.json carries peft's LoraConfig keys (peft_type, task_type, r, lora_alpha, lora_dropout,
    target_modules, modules_to_save, base_model_name_or_path, bias, fan_in_fan_out, ...)."""
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    apply_lora(model, 4, 8.0, 0.0, ["q_proj", "down_proj"])
    save_adapter(model, str(tmp_path / "a"), tiny_model_dir, "CAUSAL_LM")
    tensors = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    cfg = model.config
    expected = {}
    for i in range(cfg.num_hidden_layers):
        expected[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight"] = (4, cfg.hidden_size)
        expected[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight"] = (
            cfg.num_attention_heads * cfg.head_dim, 4)
        expected[f"base_model.model.model.layers.{i}.mlp.down_proj.lora_A.weight"] = (4, cfg.intermediate_size)
        expected[f"base_model.model.model.layers.{i}.mlp.down_proj.lora_B.weight"] = (cfg.hidden_size, 4)
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected
    config = json.load(open(tmp_path / "a" / "adapter_config.json"))
    assert {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8.0, "lora_dropout": 0.0,
            "target_modules": ["down_proj", "q_proj"], "modules_to_save": None, "bias": "none",
            "fan_in_fan_out": False, "base_model_name_or_path": tiny_model_dir}.items() <= config.items()

    score = ScoreModel.from_pretrained(tiny_model_dir)
    apply_lora(score, 4, 8.0, 0.0, ["q_proj"], trainable=("score.",))
    save_adapter(score, str(tmp_path / "s"), tiny_model_dir, "SEQ_CLS")
    tensors = load_file(str(tmp_path / "s" / "adapter_model.safetensors"))
    assert tensors["base_model.model.score.weight"].shape == (1, cfg.hidden_size)
    assert json.load(open(tmp_path / "s" / "adapter_config.json"))["modules_to_save"] == ["score"]


def test_ppo_reference_with_adapters_off_equals_a_separate_base_model(tmp_path, tiny_model_dir, tiny_reward_dir):
    from alignment.config.data import LoRAArguments
    from alignment.config.ppo import PPOArguments, PPOModelArguments
    from alignment.config.training import TrainingArguments

    model_args = PPOModelArguments(actor_model_name_or_path=tiny_model_dir, reward_model_name_or_path=tiny_reward_dir)
    lora = LoRAArguments(lora=True, lora_rank=4)
    actor, reference, critic, _, _ = run_ppo.build_models(model_args, PPOArguments(critic_lora=True), lora,
                                                          TrainingArguments())
    assert reference is actor and has_lora(actor) and has_lora(critic)
    for layer in (actor.model.layers[0].self_attn.q_proj, actor.model.layers[1].mlp.up_proj):
        layer.lora_B.set_value(paddle.full(layer.lora_B.shape, 0.05))  # adapters that change the outputs
    ids = paddle.to_tensor(IDS)
    mask = paddle.ones_like(ids)
    with adapters_disabled(reference):
        ref, _ = response_log_probs(reference, ids, mask, 3)
    base = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    expected, _ = response_log_probs(base, ids, mask, 3)
    np.testing.assert_allclose(ref.numpy(), expected.numpy(), atol=1e-6)
    adapted, _ = response_log_probs(actor, ids, mask, 3)
    assert np.abs(adapted.numpy() - expected.numpy()).max() > 1e-4


def test_ppo_and_reward_model_train_with_lora_and_merge(tmp_path, tiny_model_dir, tiny_reward_dir):
    run_reward.main([os.path.join(REPO, "config", "tiny", "rm_argument.json"), "--model_name_or_path",
                     tiny_model_dir, "--output_dir", str(tmp_path / "rm"), "--disable_tqdm", "--eval_datasets", "",
                     "--max_steps", "2", "--train_datasets", f"PKU-SafeRLHF/train:1.0:{REPO}/data/preference",
                     *LORA])
    rm_adapter = str(tmp_path / "rm" / "model")
    assert "base_model.model.score.weight" in load_file(os.path.join(rm_adapter, "adapter_model.safetensors"))
    merged = merge_lora.main(["--adapter", rm_adapter, "--output", str(tmp_path / "rm-merged"), "--is_rm"])
    ScoreModel.from_pretrained(merged)
    run_ppo.main([os.path.join(REPO, "config", "tiny", "ppo_argument.json"), "--actor_model_name_or_path",
                  tiny_model_dir, "--reward_model_name_or_path", merged, "--output_dir", str(tmp_path / "ppo"),
                  "--disable_tqdm", "--train_datasets", f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl",
                  "--eval_datasets", "", "--max_steps", "2", "--max_new_tokens", "8",
                  "--per_device_prompt_batch_size", "4", *LORA, "--critic_lora", "true"])
    rows = read_metrics(tmp_path / "ppo")
    assert rows[0]["kl"] == 0.0 and rows[1]["kl"] != 0.0  # the reference (adapters off) stays the start policy
    for part in ("policy", "value"):
        assert os.path.exists(tmp_path / "ppo" / part / "adapter_model.safetensors")


def test_lora_resume_and_dpo_reference_from_the_base(tmp_path, tiny_model_dir):
    sft(tmp_path / "a", tiny_model_dir, "--save_steps", "2")
    resumed_dir = tmp_path / "b"
    shutil.copytree(tmp_path / "a" / "out" / "checkpoint-2", resumed_dir / "out" / "checkpoint-2")
    assert os.path.exists(resumed_dir / "out" / "checkpoint-2" / "model" / "adapter_config.json")
    sft(resumed_dir, tiny_model_dir, "--save_steps", "2", "--resume_from_checkpoint", "auto")
    a = load_file(str(tmp_path / "a" / "out" / "model" / "adapter_model.safetensors"))
    b = load_file(str(resumed_dir / "out" / "model" / "adapter_model.safetensors"))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    results = run_dpo.main([os.path.join(REPO, "config", "tiny", "dpo_argument.json"), "--model_name_or_path",
                            tiny_model_dir, "--output_dir", str(tmp_path / "dpo"), "--disable_tqdm",
                            "--train_datasets", f"PKU-SafeRLHF/train:1.0:{REPO}/data/preference",
                            "--eval_datasets", f"PKU-SafeRLHF/test:1.0:{REPO}/data/preference", "--max_steps", "3",
                            "--per_device_train_batch_size", "8", "--learning_rate", "3e-3", *LORA])
    assert results["start_eval/loss"] == pytest.approx(np.log(2), abs=1e-5)  # policy == base reference at start
    assert results["eval/loss"] < results["start_eval/loss"]


@pytest.mark.parametrize("extra, fragment", [
    (["--lora", "false", "--lora_path", "x"], "key 'lora_path' needs 'lora': true"),
    (["--lora_target_modules", '["nothing_here"]'], "key 'lora_target_modules'"),
    (["--lora_rank", "0"], "key 'lora_rank' must be >= 1"),
])
def test_bad_lora_arguments(tmp_path, tiny_model_dir, capsys, extra, fragment):
    with pytest.raises(SystemExit) as info:
        sft(tmp_path, tiny_model_dir, *extra)
    assert info.value.code == 2 and fragment in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
