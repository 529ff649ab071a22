"""Speculative decoding with a draft model inside RL (keys speculative_draft_model, speculative_draft_keep_every,
num_assistant_tokens; alignment/config/speculative.py, alignment/ppo/rollout/drafts.py): the keys' refusals; the
samplers give the engine the draft (single-turn rollouts, multi-turn episodes) and greedy draws keep plain
decoding's tokens, with log-probs the policy's verifying pass gave (a full forward's within 1e-5); the layer-dropped
draft follows the policy's versions and a checkpoint stays frozen; a GRPO run with a draft (top_k 1: every draw
the policy's argmax) gives the plain run's rollouts, losses and weights, the draft offloaded with freeze_model."""
import json
import os
import shutil

import numpy as np
import paddle
import pytest

from alignment.config.environment import EnvironmentArguments
from alignment.config.ppo import PPOArguments
from alignment.envs import Environment, StepResult
from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer
from alignment.models.draft_model import DraftModel, layer_dropped
from alignment.models.weights_digest import set_policy_version
from alignment.ppo import run_ppo
from alignment.ppo.rollout.agent_programs import make_sampler
from alignment.ppo.rollout.drafts import DroppedLayersDraft, FrozenDraft
from alignment.ppo.rollout.rollout import response_log_probs
from alignment.ppo.rollout.samplers import Draw, rollout_generation_config
from alignment.data.tokenized import collate_prompts
from tests.helpers import REPO, read_metrics

GRPO_CONFIG = os.path.join(REPO, "config", "tiny", "grpo_argument.json")
PROMPTS = f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl"


class Repeat(Environment):
    """Answers every turn with the question again; never ends by itself."""
    NAME = "test-repeat-speculative"

    def reset(self, row):
        self.question = row["input"]
        return [{"role": "user", "content": self.question}]

    def step(self, assistant_message):
        return StepResult([{"role": "user", "content": f"again: {self.question}"}], 1.0, False)


class Counting(DraftModel):
    """A draft model keeping the drafters it gave engines (their stats: draft steps run)."""

    def __init__(self, model):
        super().__init__(model)
        self.drafters = []

    def drafter(self, engine):
        self.drafters.append(super().drafter(engine))
        return self.drafters[-1]


class Given:
    """A draft source (drafts.py's interface) giving one draft model."""

    def __init__(self, draft):
        self.draft, self.models = draft, (draft.model,)

    def for_model(self, model):
        return self.draft


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    return model, Tokenizer.from_pretrained(tiny_model_dir)


def ppo(**keys):
    args = PPOArguments(max_new_tokens=12, **keys)
    args.validate()
    return args


def items(tokenizer, n):
    texts = [f"what is {i} plus {i}? say {i} plus {i} again" for i in range(n)]
    return [{"prompt": t, "answer": None, "input": t, "input_ids": tokenizer.encode(t)} for t in texts]


def test_the_keys_refuse_static_decoding_two_drafters_and_keeping_every_layer():
    assert ppo().draft_key == "" and ppo(speculative_draft_model="d").draft_key == "speculative_draft_model"
    cases = [({"speculative_draft_keep_every": 2, "rollout_decode": "static"}, "key 'speculative_draft_keep_every' "
              "needs 'rollout_decode': 'eager'"),
             ({"speculative_draft_model": "d", "rollout_decode": "static"}, "key 'speculative_draft_model' needs"),
             ({"prompt_lookup_num_tokens": 3, "rollout_decode": "static"}, "key 'prompt_lookup_num_tokens' needs"),
             ({"speculative_draft_model": "d", "speculative_draft_keep_every": 2}, "set one of them"),
             ({"speculative_draft_keep_every": 2, "prompt_lookup_num_tokens": 3}, "one drafter at a time"),
             ({"speculative_draft_keep_every": 1}, "keeps every layer")]
    for keys, message in cases:
        with pytest.raises(ValueError, match=message):
            ppo(**keys)


def test_greedy_single_turn_rollouts_with_a_draft_are_plain_decodings_with_the_policys_log_probs(tiny):
    model, tokenizer = tiny
    set_policy_version(model, 0)
    args = ppo(speculative_draft_keep_every=2, num_assistant_tokens=3)
    base = rollout_generation_config(args, model, tokenizer)
    assert base.num_assistant_tokens == 3 and rollout_generation_config(ppo(), model, tokenizer) \
        .num_assistant_tokens == 0
    collate = lambda rows: collate_prompts(rows, tokenizer.pad_token_id)  # noqa: E731
    draft, counting = DroppedLayersDraft(model, 2), Counting(layer_dropped(model, 2))
    rollouts = {}
    for name, with_draft in (("plain", None), ("draft", draft), ("frozen", FrozenDraft(model)),
                             ("counted", Given(counting))):
        sampler = make_sampler(args, 64, collate, draft=with_draft)
        rollouts[name] = sampler(model, tokenizer, base, Draw(items(tokenizer, 3), 1, greedy=True,
                                                                log_prob_temperature=1.0))
    plain = rollouts["plain"]
    for name in ("draft", "frozen", "counted"):
        np.testing.assert_array_equal(rollouts[name].input_ids.numpy(), plain.input_ids.numpy())
        np.testing.assert_array_equal(rollouts[name].response_mask.numpy(), plain.response_mask.numpy())
        full = response_log_probs(model, rollouts[name].input_ids, rollouts[name].attention_mask,
                                  rollouts[name].prompt_len)[0]
        mask = rollouts[name].response_mask.numpy() > 0
        # the log-probs the update reads as old ones are the verifying pass's: a full forward's
        np.testing.assert_allclose(rollouts[name].old_log_probs.numpy()[mask], full.numpy()[mask], atol=1e-5)
    assert draft.copied == (id(model), 0)  # copied from the policy at its version
    assert len(counting.drafters) == 1 and counting.drafters[0].stats["steps"] > 0  # the engine drafted with it


def test_episodes_speculate_with_the_draft_and_keep_plain_greedy_turns(tiny):
    model, tokenizer = tiny
    env = EnvironmentArguments(environment="test-repeat-speculative", max_turns=3)
    args = ppo(speculative_draft_model="the policy itself", num_assistant_tokens=4)
    base = rollout_generation_config(args, model, tokenizer)
    out = {}
    counting = Counting(model)
    for name, draft in (("plain", None), ("draft", Given(counting))):
        sampler = make_sampler(args, 160, None, env, draft=draft)
        out[name] = sampler(model, tokenizer, base, Draw(items(tokenizer, 2), 1, greedy=True,
                                                         log_prob_temperature=1.0))
    assert [e["messages"] for e in out["draft"].episodes] == [e["messages"] for e in out["plain"].episodes]
    assert counting.drafters and counting.drafters[0].stats["steps"] > 0  # the episodes' engine drafted
    np.testing.assert_array_equal(out["draft"].input_ids.numpy(), out["plain"].input_ids.numpy())
    mask = out["draft"].response_mask.numpy() > 0
    full = response_log_probs(model, out["draft"].input_ids, out["draft"].attention_mask, out["draft"].prompt_len)[0]
    np.testing.assert_allclose(out["draft"].old_log_probs.numpy()[mask], full.numpy()[mask], atol=1e-5)


def test_the_layer_dropped_draft_follows_the_policys_versions_and_a_checkpoint_stays_frozen(tiny_model_dir):
    policy = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    frozen_model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    dropped, frozen = DroppedLayersDraft(policy, 2), FrozenDraft(frozen_model)
    weight = lambda m: m.model.layers[1].mlp.down_proj.weight.numpy().copy()  # noqa: E731  policy layer 2's
    set_policy_version(policy, 0)
    assert dropped.for_model(policy).model is dropped.model and frozen.for_model(policy).model is frozen_model
    before, frozen_before = weight(dropped.model), weight(frozen_model)
    with paddle.no_grad():
        policy.model.layers[2].mlp.down_proj.weight.set_value(policy.model.layers[2].mlp.down_proj.weight + 1.0)
    dropped.for_model(policy)
    np.testing.assert_array_equal(weight(dropped.model), before)  # the same version: not copied again
    set_policy_version(policy, 1)  # the trainer marks every step's version
    dropped.for_model(policy)
    np.testing.assert_allclose(weight(dropped.model), before + 1.0, rtol=1e-6)
    np.testing.assert_array_equal(weight(frozen_model), frozen_before)  # the checkpoint draft never moves
    teacher = LlamaForCausalLM(frozen_model.config.__class__(**{**frozen_model.config.__dict__,
                                                                "num_hidden_layers": 2}))
    assert dropped.for_model(teacher) is None  # a model of another shape (a seq_kd teacher) samples without it


def common(tmp_path, actor, *extra):
    return [GRPO_CONFIG, "--actor_model_name_or_path", actor, "--output_dir", str(tmp_path / "out"),
            "--disable_tqdm", "--train_datasets", PROMPTS, "--eval_datasets", "", "--max_steps", "2",
            "--max_new_tokens", "10", "--per_device_prompt_batch_size", "2", "--num_return_sequences", "2",
            "--logging_steps", "1", "--reward_funcs", "sentiment", "--top_k", "1", "--rollout_log_probs", "true",
            "--update_iters", "2", *extra]  # two passes: the old log-probs are the sampler's


@pytest.mark.parametrize("estimator", ["grpo", "reinforce_plus_plus"])
def test_an_rl_run_with_a_draft_gives_the_plain_runs_rollouts_and_weights(tmp_path, tiny_model_dir, estimator):
    """top_k 1: every draw is the policy's argmax, with or without a draft (a draft token other than it has p = 0:
    rejected, the residual the argmax), so the runs agree; the log-probs the update reads are the sampler's, within
    1e-5 of the trainer's full forward (rollout/log_prob_diff_max). GRPO's groups are then alike (no advantage);
    REINFORCE++'s batch baseline moves the weights, so step 2 drafts with the updated policy's layers."""
    runs = {}
    for name, extra in (("plain", []), ("dropped", ["--speculative_draft_keep_every", "2"]),
                        ("checkpoint", ["--speculative_draft_model", tiny_model_dir, "--num_assistant_tokens", "3",
                                        "--offload_level", "freeze_model"])):
        run_ppo.main(common(tmp_path / name, tiny_model_dir, "--advantage_estimator", estimator, *extra))
        runs[name] = read_metrics(tmp_path / name / "out")
    for name in ("dropped", "checkpoint"):
        assert [r["response_length"] for r in runs[name]] == [r["response_length"] for r in runs["plain"]]
        for key in ("reward/mean", "kl", "actor_loss"):
            np.testing.assert_allclose([r[key] for r in runs[name]], [r[key] for r in runs["plain"]], rtol=1e-4,
                                       atol=1e-6, err_msg=f"{name} {key}")
        assert all(r["rollout/log_prob_diff_max"] < 1e-5 for r in runs[name])
        mine = LlamaForCausalLM.from_pretrained(str(tmp_path / name / "out" / "policy"))
        plain = LlamaForCausalLM.from_pretrained(str(tmp_path / "plain" / "out" / "policy"))
        np.testing.assert_allclose(mine.model.layers[0].self_attn.q_proj.weight.numpy(),
                                   plain.model.layers[0].self_attn.q_proj.weight.numpy(), atol=1e-6)
    if estimator == "reinforce_plus_plus":
        assert runs["plain"][1]["kl"] != 0.0  # step 2 sampled from an actor the first update changed


def test_a_draft_checkpoint_with_another_vocabulary_is_refused_naming_the_key(tmp_path, tiny_model_dir, capsys):
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    with open(other / "tokenizer.json", encoding="utf-8") as f:
        data = json.load(f)
    vocab = data["model"]["vocab"]
    first, second = [w for w in vocab if len(w) > 3 and w.isalpha()][:2]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # the same tokens and size, two ids swapped
    with open(other / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(data, f)
    for extra, fragment in ((["--speculative_draft_model", str(other)], "another vocabulary than the policy's"),
                            (["--speculative_draft_model", str(tmp_path / "none")], "is not a checkpoint")):
        with pytest.raises(SystemExit) as info:
            run_ppo.main(common(tmp_path / "run", tiny_model_dir, *extra))
        err = capsys.readouterr().err
        assert info.value.code == 2 and "key 'speculative_draft_model'" in err and fragment in err, err
        assert len(err.strip().splitlines()) == 1, err
