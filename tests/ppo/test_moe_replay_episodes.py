"""MoE routing replay on multi-turn episodes (key moe_routing_replay with an `environment` or an `agent`;
envs/multiturn.py keep_experts, ppo/rollout/episodes.py): the sampler's record of each fed token's experts (the
prompt, every turn, and the tool results and template text prefilled between turns, a turn's last token from the
next turn's prefill) lands in the columns of the rollout's input_ids and follows them through the update's
layouts; at the sampler's weights the trainer's replayed passes route every token as the sampler did (mismatch 0)
and the first update pass's ratio is exactly 1; an environment's episodes and the same episodes played by an agent
program through the gateway train to the same bits; what replay still refuses is one line, exit 2."""
import json
import os

import numpy as np
import paddle
import pytest

from alignment.config.environment import EnvironmentArguments
from alignment.envs import Environment, StepResult
from alignment.envs.multiturn import Trajectory
from alignment.exits import run_program
from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer
from alignment.models.config import LlamaConfig
from alignment.ppo import run_ppo
from alignment.ppo.learner.routing_replay import OwnRouting, RolloutRouting
from alignment.ppo.learner.update import log_probs_as_updated, pass_micro_batches
from alignment.ppo.rollout.episodes import episode_rollout, prompt_only
from alignment.ppo.rollout.rollout import response_log_probs
from alignment.ppo.rollout.samplers import Draw, Episodes
from tests.helpers import REPO, read_metrics, run_args

FIXTURE = os.path.join(REPO, "tests", "fixtures", "models", "qwen3_moe", "config.json")
AGENT = os.path.join(REPO, "examples", "openai_agent", "guess_number_agent.py")


class ToolResults(Environment):
    """Answers every turn with a tool message ("result k"); never ends by itself."""
    NAME = "test-moe-tool-results"

    def reset(self, row):
        self.k = 0
        return [{"role": "user", "content": row["input"]}]

    def step(self, assistant_message):
        self.k += 1
        return StepResult([{"role": "tool", "content": f"result {self.k}"}], float(self.k), False, {"tool_calls": 1})


@pytest.fixture(scope="module")
def moe_dir(tiny_model_dir, tmp_path_factory):
    """A random tiny Qwen3-MoE policy (8 experts, top-2, sparse layers 0 and 2) on the tiny model's tokenizer."""
    config = json.load(open(FIXTURE))
    tiny = json.load(open(os.path.join(tiny_model_dir, "config.json")))
    config.update({key: tiny[key] for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")})
    path = tmp_path_factory.mktemp("moe_episodes") / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    paddle.seed(21)
    LlamaForCausalLM(LlamaConfig.from_pretrained(str(path))).save_pretrained(str(path), tokenizer_dir=tiny_model_dir)
    return str(path)


def coded(ids, prompt_len, turns):
    """A trajectory of `ids` whose record codes each fed token (all but the last): 100 id + 10 layer + slot."""
    record = [100 * t + 10 * np.arange(2)[:, None] + np.arange(2)[None] for t in ids[:-1]]  # [2 layers, k = 2] each
    mask = [0] * prompt_len + turns
    return Trajectory(list(ids), mask, [0.0] * len(ids), prompt_len, [], [], [], {}, experts=record)


def test_each_episode_tokens_record_lands_in_its_column_and_follows_it_through_the_layouts():
    trajectories = [coded([1, 2, 3, 4, 5, 6, 7], 2, [1, 1, 0, 0, 1]),  # a turn, an observation, a turn
                    coded([11, 12, 13, 14, 15], 4, [1]),
                    prompt_only({"input_ids": [21, 22, 23]}, error="failed")]  # no record: its own routing
    items = [{"prompt": "", "answer": None}] * 3
    rollout = episode_rollout(trajectories, items, 0, False, experts_shape=(2, 2))
    assert rollout.experts.shape == [3, 4 + 5, 2, 2] and rollout.prompt_len == 4
    for view in (rollout, rollout.packed(), rollout.trimmed(), rollout.micro_batch(np.array([2, 0]), False)):
        ids, attention, experts = (x.numpy() for x in (view.input_ids, view.attention_mask, view.experts))
        code = 100 * ids[:, :, None, None] + 10 * np.arange(2)[None, None, :, None] + np.arange(2)
        recorded = (experts >= 0).all(axis=(2, 3))
        np.testing.assert_array_equal(experts[recorded], code[recorded])
        assert (experts[~recorded] == -1).all() and not (recorded & (attention == 0)).any()
        # every real token but each episode's last is recorded, the failed episode's none
        last = ids.shape[1] - 1 - np.argmax(attention[:, ::-1], axis=1)
        expected = attention > 0
        expected[np.arange(len(ids)), last] = False
        expected[(ids > 20).any(axis=1)] = False  # the failed episode (ids 21-23)
        np.testing.assert_array_equal(recorded, expected)
    assert episode_rollout(trajectories, items, 0, False).experts is None


def episodes(max_turns=3, keep_experts=True):
    env = EnvironmentArguments(environment=ToolResults.NAME, max_turns=max_turns, max_trajectory_tokens=64)

    class PPO:
        max_new_tokens, min_new_tokens, rollout_decode = 5, 0, "eager"
    return Episodes(PPO, 256, None, env, keep_experts)


@pytest.fixture(scope="module")
def sampled(moe_dir):
    """Two prompts x two episodes of three turns, each turn answered by a tool result, sampled with the record."""
    model, tokenizer = LlamaForCausalLM.from_pretrained(moe_dir), Tokenizer.from_pretrained(moe_dir)
    base = GenerationConfig(max_new_tokens=1, temperature=1.0, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
    items = [{"prompt": p, "answer": None, "input_ids": [1]} for p in ("add 2 and 3", "what is the weather?")]
    rollout = episodes()(model, tokenizer, base, Draw(items, 2, seed=7, log_prob_temperature=1.0))
    return model, tokenizer, base, items, rollout


def test_every_fed_token_of_an_episode_is_recorded_tool_results_included(sampled):
    model, tokenizer, base, items, rollout = sampled
    experts, ids = rollout.experts.numpy(), rollout.input_ids.numpy()
    attention = rollout.attention_mask.numpy() > 0
    assert experts.shape == (4, ids.shape[1], 2, 2)  # [N, P + R, sparse layers, top-2]
    assert all(e["turns"] == 3 for e in rollout.episodes)
    recorded = (experts >= 0).all(axis=(2, 3))
    assert ((experts < 0).all(axis=(2, 3)) | recorded).all() and (experts < 8).all()
    fed = attention.copy()
    last = ids.shape[1] - 1 - np.argmax(attention[:, ::-1], axis=1)  # each episode's last token: sampled, not fed
    fed[np.arange(4), last] = False
    np.testing.assert_array_equal(recorded, fed)  # the prompt, every turn and every observation token
    policy = np.zeros_like(attention)
    policy[:, rollout.prompt_len:] = rollout.response_mask.numpy() > 0
    observed = attention & ~policy
    observed[:, :rollout.prompt_len] = False
    for row in range(4):  # the tool results are there, and recorded
        text = tokenizer.decode(ids[row][observed[row]].tolist())
        assert "result 1" in text and "result 2" in text
        assert recorded[row][observed[row]].all()
    # a turn's last token is fed with the observation after it (the next turn's prefill): recorded from there
    ends = policy & ~np.concatenate([policy[:, 1:], np.zeros([4, 1], bool)], axis=1)
    assert recorded[ends & fed].sum() == 4 * 2  # turns 1 and 2 of every episode (turn 3's end is the last token)
    again = episodes(keep_experts=False)(model, tokenizer, base, Draw(items, 2, seed=7, log_prob_temperature=1.0))
    assert again.experts is None
    np.testing.assert_array_equal(again.input_ids.numpy(), ids)  # recording changes no token


def first_pass(model, rollout, routing, parts):
    """The update's first pass at the sampler's weights, micro-batch by micro-batch as actor_step runs it (train
    mode, gradients recorded): each one's response log-probs [n, keep] and its moe/* metrics."""
    model.train()
    out = []
    for rows in parts:
        batch = rollout.micro_batch(rows, False)
        with routing.around(model, batch):
            log_probs, _ = response_log_probs(model, batch.input_ids, batch.attention_mask, batch.prompt_len, 1.0,
                                              response_index=batch.response_index)
            out.append((log_probs.detach().numpy(), routing.step_terms(model, batch)[1]))
    model.eval()
    return out


def test_with_replay_the_first_ratio_is_exactly_one_and_no_routing_differs(sampled):
    """The trainer's old log-probs (score_log_probs: the first pass's micro-batches, replayed) and the first update
    pass, both routed to the sampler's record: every ratio on a policy token is exactly 1 and moe/routing_mismatch
    is 0 (the record sits on the tokens it was made for: a record shifted by one column would disagree on most).
    Without replay the sampler's log-probs and the trainer's are measured against each other."""
    model, _, _, _, rollout = sampled

    class PPO:
        num_return_sequences, shared_prompt_forward, group_by_length = 2, False, True
    parts = pass_micro_batches(rollout, np.random.default_rng(3), 2, PPO)
    mask = rollout.response_mask.numpy() > 0
    replay = RolloutRouting(model)
    old = log_probs_as_updated(model, rollout, parts, 1.0, False, replay.around).numpy()  # [N, R]
    for rows, (log_probs, metrics) in zip(parts, first_pass(model, rollout, replay, parts)):
        keep = log_probs.shape[1]
        ratio = np.exp(log_probs - old[rows, :keep])
        assert (ratio[mask[rows, :keep]] == 1.0).all()
        assert metrics["moe/routing_mismatch"] == 0.0 and 1.0 < metrics["moe/aux_loss"] < 8.0
    shifted = rollout.packed()
    shifted.experts = paddle.roll(shifted.experts, 1, axis=1)
    with paddle.no_grad(), replay.around(model, shifted):
        response_log_probs(model, shifted.input_ids, shifted.attention_mask, 0, response_index=shifted.response_index)
        assert replay.step_terms(model, shifted)[1]["moe/routing_mismatch"] > 0.5
    # the sampling pass's log-probs (KV cache, one token a step) against the trainer's full forward: the same
    # routing, so they differ by float rounding only, with replay or without (the router has not moved)
    sampler = rollout.old_log_probs.numpy()
    own = log_probs_as_updated(model, rollout, parts, 1.0, False, OwnRouting(model).around).numpy()
    for trainer in (old, own):
        assert np.abs(trainer[mask] - sampler[mask]).max() < 2e-5


@pytest.fixture(scope="module")
def environment_run(moe_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("moe_env") / "run"
    run_ppo.main(run_args(out, moe_dir, "grpo", "--save_steps", "0", "--max_steps", "2", "--max_trajectory_tokens",
                          "120", "--moe_routing_replay", "rollout", "--per_device_train_batch_size", "4",
                          "--update_iters", "1", "--rollout_ledger", "true"))
    return out


def test_a_replayed_environment_run_starts_each_update_exactly_on_policy(environment_run):
    """One optimizer step per training step over the whole rollout: the logged ratio is the first pass's."""
    rows = read_metrics(environment_run)
    assert len(rows) == 2 and all(r["env/turns"] > 1 for r in rows)
    for row in rows:
        assert row["ratio"] == 1.0 and row["clip_frac"] == 0.0 and row["moe/routing_mismatch"] == 0.0
    for row in (json.loads(line) for path in (environment_run / "ledger").glob("steps-*.jsonl") for line in open(path)):
        experts = np.asarray(row["experts"])  # the prompt, then every turn and observation
        assert experts.shape == (len(row["prompt_ids"]) + len(row["response_ids"]), 2, 2)
        assert (experts[:-1] >= 0).all() and (experts[-1] == -1).all()


@pytest.mark.parametrize("replay", ["rollout", "none"])
def test_the_samplers_log_probs_against_the_first_pass_are_measured_with_and_without_replay(moe_dir, tmp_path,
                                                                                           replay):
    """rollout_log_probs (two passes, so the old log-probs are the sampling pass's: KV cache, a token or a prefill
    at a time) against the first pass (the trainer's full forward), measured by rollout/log_prob_diff_max. At the
    sampler's weights both route alike, so with replay or without the gap is float rounding; replay takes out of
    the ratio the router moving between sampling and update (later passes, stale samplers)."""
    run_ppo.main(run_args(tmp_path / "run", moe_dir, "grpo", "--save_steps", "0", "--max_steps", "1",
                          "--moe_routing_replay", replay, "--per_device_train_batch_size", "4", "--update_iters",
                          "2", "--rollout_log_probs", "true"))
    row = read_metrics(tmp_path / "run")[0]
    assert 0.0 < row["rollout/log_prob_diff_max"] < 1e-4
    assert ("moe/routing_mismatch" in row) == (replay == "rollout")


def test_an_agent_program_records_and_replays_the_same_routing_as_the_environment(environment_run, moe_dir,
                                                                                  tmp_path):
    """The guess-number episodes played by an OpenAI-client program through the gateway: the same ledger experts,
    metrics and weights as the environment's run."""
    from safetensors.numpy import load_file

    args = run_args(tmp_path / "agent", moe_dir, "grpo", "--save_steps", "0", "--max_steps", "2",
                    "--max_trajectory_tokens", "120", "--moe_routing_replay", "rollout",
                    "--per_device_train_batch_size", "4", "--update_iters", "1", "--rollout_ledger", "true")
    i = args.index("--environment")
    run_ppo.main(args[:i] + ["--environment", ""] + args[i + 2:] + ["--agent", f"{AGENT}:play"])
    for env_row, agent_row in zip(read_metrics(environment_run), read_metrics(tmp_path / "agent")):
        for key in ("ratio", "moe/routing_mismatch", "moe/aux_loss", "actor_loss", "env/turns"):
            assert env_row[key] == agent_row[key], key

    def ledger(run):
        return [json.loads(line)["experts"] for path in sorted((run / "ledger").glob("steps-*.jsonl"))
                for line in open(path)]
    assert ledger(environment_run) == ledger(tmp_path / "agent")
    a, b = (load_file(os.path.join(run, "policy", "model.safetensors")) for run in (environment_run,
                                                                                    tmp_path / "agent"))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_replay_is_accepted_with_an_environment_and_under_pipeline_parallelism():
    from types import SimpleNamespace

    from alignment.config.ppo import PPOArguments

    model, data = SimpleNamespace(reward_model_name_or_path=None), SimpleNamespace(ptx_datasets=None)
    environment = SimpleNamespace(multi_turn=True)
    ppo = PPOArguments(moe_routing_replay="rollout")
    ppo.validate_with(model, data, environment)
    ppo.validate_with(model, data, environment, SimpleNamespace(pipeline_parallel_degree=2))
