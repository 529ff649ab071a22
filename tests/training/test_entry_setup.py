"""The entry-point skeleton (alignment/training/setup.py), the launcher's environment (alignment/launcher.py) and
arguments parsed once: the layout planned at parse time, ranges stated by their field, reward-server URLs kept."""
import pytest

from alignment import launcher
from alignment.config.data import DataArguments, LoRAArguments, ModelArguments
from alignment.config.dpo import DPOArguments
from alignment.config.parser import ArgumentError, ArgumentParser
from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
from alignment.config.training import TrainingArguments
from alignment.parallel.layout import Layout
from alignment.training import setup

SFT = (ModelArguments, DataArguments, LoRAArguments, TrainingArguments)
PPO = (PPOModelArguments, PPODataArguments, PPOArguments, LoRAArguments, TrainingArguments)
SFT_FLAGS = ["--model_name_or_path", "m", "--train_datasets", "alpaca"]
PPO_FLAGS = ["--actor_model_name_or_path", "m", "--train_datasets", "x", "--reward_funcs", "sentiment"]


def test_the_launcher_environment_is_read_in_one_place(monkeypatch):
    for key in ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "PADDLE_TRAINER_ENDPOINTS"):
        monkeypatch.delenv(key, raising=False)
    assert (launcher.world_size(), launcher.rank(), launcher.endpoints(), launcher.speaks_for_all()) == (1, 0, [], True)
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "3")
    monkeypatch.setenv("PADDLE_TRAINER_ENDPOINTS", "h1:6170,h2:6171")
    assert (launcher.world_size(), launcher.rank(), launcher.endpoints(), launcher.speaks_for_all()) == \
        (4, 3, ["h1:6170", "h2:6171"], False)


def test_the_watchdog_names_a_lost_rank_by_its_host_from_the_launch(monkeypatch):
    from alignment.parallel.watchdog import _host_of

    monkeypatch.setenv("PADDLE_TRAINER_ENDPOINTS", "10.0.0.1:6170,10.0.0.2:6171")
    assert (_host_of(0), _host_of(1), _host_of(2)) == ("10.0.0.1", "10.0.0.2", "?")


def test_parse_arguments_plans_the_layout_once_and_keeps_the_argument_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")  # not rank 0: prints nothing
    path = tmp_path / "args.json"
    path.write_text('{"model_name_or_path": "m", "train_datasets": "alpaca", "tensor_parallel_degree": 2}')
    *_, train, run = setup.parse_arguments([str(path)], *SFT)
    assert run.layout == Layout(world=4, tensor=2, micro_batch_size=8)
    assert (run.layout.data, run.argument_dir, run.effective["tensor_parallel_degree"]) == (2, str(tmp_path), 2)
    assert capsys.readouterr().out == ""


def test_a_layout_that_does_not_fit_the_launch_names_the_source_and_exits_2(tmp_path, capsys):
    path = tmp_path / "args.json"
    path.write_text('{"model_name_or_path": "m", "train_datasets": "alpaca", "tensor_parallel_degree": 2}')
    with pytest.raises(SystemExit) as stop:
        setup.parse_arguments([str(path)], *SFT)
    assert stop.value.code == 2
    message = capsys.readouterr().err
    assert message.startswith(f"error: {path}: tensor_parallel_degree 2 x pipeline_parallel_degree 1 does not divide "
                              "the world size 1") and message.count("\n") == 1


@pytest.mark.parametrize("classes, flags, fragment", [
    (SFT, SFT_FLAGS + ["--lora", "true"], "key 'lora': LoRA with pipeline_parallel_degree > 1 is not supported"),
    (PPO, PPO_FLAGS + ["--critic_lora", "true"],
     "key 'critic_lora': LoRA with pipeline_parallel_degree > 1 is not supported"),
    ((ModelArguments, DataArguments, DPOArguments, LoRAArguments, TrainingArguments),
     SFT_FLAGS + ["--loss_type", "kto"], "key 'loss_type': 'kto' with pipeline_parallel_degree > 1 is not supported"),
])
def test_what_pipelines_cannot_run_is_refused_when_parsing(classes, flags, fragment):
    with pytest.raises(ArgumentError, match=f"command line: {fragment}"):
        ArgumentParser(*classes).parse_args(flags + ["--pipeline_parallel_degree", "2"])
    ArgumentParser(*classes).parse_args(flags)  # the same without pipeline stages is fine


@pytest.mark.parametrize("classes, flags, message", [
    (SFT, SFT_FLAGS + ["--per_device_train_batch_size", "0"], "key 'per_device_train_batch_size' must be >= 1, got 0"),
    (SFT, SFT_FLAGS + ["--max_length", "4"], "key 'max_length' must be >= 8, got 4"),
    (SFT, SFT_FLAGS + ["--lora_rank", "0"], "key 'lora_rank' must be >= 1, got 0"),
    (SFT, SFT_FLAGS + ["--tensor_parallel_degree", "0"], "key 'tensor_parallel_degree' must be >= 1, got 0"),
    (PPO, PPO_FLAGS + ["--top_p", "1.5"], "key 'top_p' must be <= 1, got 1.5"),
    (PPO, PPO_FLAGS + ["--gae_lambda", "-0.1"], "key 'gae_lambda' must be >= 0, got -0.1"),
    (PPO, PPO_FLAGS + ["--reward_server_retries", "-1"], "key 'reward_server_retries' must be >= 0, got -1"),
])
def test_a_range_is_checked_by_its_field_naming_the_key(classes, flags, message):
    with pytest.raises(ArgumentError) as error:
        ArgumentParser(*classes).parse_args(flags)
    assert str(error.value) == f"command line: {message}"


def test_reward_server_urls_are_parsed_once_and_the_client_keeps_them():
    from alignment.rewards.remote import RewardServerClient

    ppo = ArgumentParser(*PPO).parse_args(PPO_FLAGS + ["--use_rm_server", "true", "--reward_server",
                                                       " http://a:1/, https://b/ "])[2]
    assert ppo.reward_server_urls == ["http://a:1", "https://b"]
    assert RewardServerClient(ppo.reward_server_urls).urls == ["http://a:1", "https://b"]


def test_models_for_a_stage_trained_frozen_and_the_reference(tiny_model_dir):
    from alignment.models.lora import has_lora

    lora = LoRAArguments(lora=True)
    policy = setup.load_trained_model("causal", tiny_model_dir, Layout(), lora)
    trainable = {name for name, p in policy.named_parameters() if not p.stop_gradient}
    assert has_lora(policy) and trainable and all("lora" in name for name in trainable)
    assert setup.reference_model(policy, lora, tiny_model_dir) is policy  # the base weights, adapters off

    reference = setup.reference_model(policy, LoRAArguments(), tiny_model_dir)
    assert reference is not policy and not reference.training and not has_lora(reference)
    assert all(p.stop_gradient for p in reference.parameters())
    own = setup.reference_model(policy, lora, tiny_model_dir, own_path=tiny_model_dir)
    assert own is not policy and all(p.stop_gradient for p in own.parameters())

    critic = setup.load_trained_model("score", tiny_model_dir, Layout(), LoRAArguments(), score_type="critic",
                                      do_normalize=False)
    assert critic.config.score_type == "critic" and all(not p.stop_gradient for p in critic.parameters())


@pytest.mark.parametrize("classes, flags, fragment", [
    (SFT, SFT_FLAGS + ["--sharding", "stage2", "--pipeline_parallel_degree", "2"],
     "key 'sharding' 'stage2' with pipeline_parallel_degree 2: pipeline parallelism is not compatible"),
    (SFT, SFT_FLAGS + ["--sharding", "stage3", "--fp16", "true"], "key 'sharding' 'stage3' with fp16"),
    (SFT, SFT_FLAGS + ["--sharding", "stage3 offload"], "Paddle's sharding offload is not used here"),
    (PPO, PPO_FLAGS + ["--sharding", "stage2", "--offload_level", "train_model"],
     "key 'offload_level' 'train_model' with sharding stage2"),
], ids=["stage2-pipeline", "stage3-fp16", "offload", "stage2-train_model-offload"])
def test_sharding_stages_2_and_3_refuse_what_they_cannot_run_before_anything_loads(monkeypatch, capsys, classes,
                                                                                  flags, fragment):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    with pytest.raises(SystemExit) as stop:
        setup.parse_arguments(flags, *classes)
    assert stop.value.code == 2 and fragment in capsys.readouterr().err


def test_sharding_stages_plan_their_groups(monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "8")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    *_, run = setup.parse_arguments(SFT_FLAGS + ["--sharding", "stage3", "--tensor_parallel_degree", "2",
                                                 "--sharding_parallel_degree", "2"], *SFT)
    assert (run.layout.tensor, run.layout.sharding, run.layout.stage, run.layout.data) == (2, 2, "stage3", 2)
    *_, run = setup.parse_arguments(SFT_FLAGS + ["--sharding", "stage2"], *SFT)  # -1: every rank left over
    assert (run.layout.sharding, run.layout.stage, run.layout.data) == (8, "stage2", 1)
