"""MoE routing replay in the RL recipes (key moe_routing_replay, alignment/ppo/learner/routing_replay.py): the sampler's
expert choices travel with the rollout through every layout the update uses (trimmed, packed, joined), the
trainer's passes route each token as the sampler did even after the router moved, the ledger keeps the choices and
a step replayed from it equals the run bit for bit (and changes when the ledger's choices change); an MoE step logs
the load-balancing loss and the expert load; bad settings are one line, exit 2."""
import json
import os
import shutil

import numpy as np
import paddle
import pytest

from alignment.exits import run_program
from alignment.models import LlamaForCausalLM
from alignment.data.tokenized import collate_prompts
from alignment.models.config import LlamaConfig
from alignment.models.generation import GenerationConfig
from alignment.models.moe import moe_blocks, replayed_routing
from alignment.models.tokenizer import Tokenizer
from alignment.ppo import run_ppo
from alignment.ppo.rollout.rollout import Rollout, concat_rollouts, response_log_probs, sample_rollout
from alignment.ppo.learner.routing_replay import RolloutRouting
from alignment.ppo.learner.update import log_probs_as_updated
from tests.helpers import read_metrics
from tests.ppo.test_replay_train import assert_bitwise_equal, replay, tiny_run, weights

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "models", "qwen3_moe", "config.json")


@pytest.fixture(scope="module")
def moe_dir(tiny_model_dir, tmp_path_factory):
    """A random tiny Qwen3-MoE policy (8 experts, top-2, a dense layer between two sparse ones) on the tiny
    model's tokenizer, its load-balancing loss in the training loss (output_router_logits)."""
    config = json.load(open(FIXTURE))
    tiny = json.load(open(os.path.join(tiny_model_dir, "config.json")))
    config.update({key: tiny[key] for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")},
                  output_router_logits=True, router_aux_loss_coef=0.01)
    path = tmp_path_factory.mktemp("moe") / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    paddle.seed(21)
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(str(path)))
    model.save_pretrained(str(path), tokenizer_dir=tiny_model_dir)
    return str(path)


def coded_rollout(prompt_lens, response_lens, p=5, r=4, layers=2, k=2) -> Rollout:
    """Left-padded rows whose experts encode their token: token t at (layer l, slot j) -> 100 t + 10 l + j; -1 on
    padding."""
    n = len(prompt_lens)
    ids = np.zeros([n, p + r], "int64")
    attention = np.zeros([n, p + r], "int64")
    for i, (a, b) in enumerate(zip(prompt_lens, response_lens)):
        attention[i, p - a: p + b] = 1
    ids[attention > 0] = np.arange(1, int(attention.sum()) + 1)
    experts = np.where(attention[:, :, None, None] > 0,
                       100 * ids[:, :, None, None] + 10 * np.arange(layers)[None, None, :, None]
                       + np.arange(k)[None, None, None, :], -1)
    return Rollout(input_ids=paddle.to_tensor(ids), attention_mask=paddle.to_tensor(attention),
                   response_mask=paddle.to_tensor(attention[:, p:].astype("float32")), prompt_len=p,
                   prompts=[""] * n, completions=[""] * n, labels={}, experts=paddle.to_tensor(experts))


def assert_experts_follow_tokens(rollout: Rollout):
    ids, attention, experts = (x.numpy() for x in (rollout.input_ids, rollout.attention_mask, rollout.experts))
    assert experts.shape[:2] == ids.shape
    layers, k = experts.shape[2:]
    code = 100 * ids[:, :, None, None] + 10 * np.arange(layers)[None, None, :, None] + np.arange(k)
    real = attention > 0
    np.testing.assert_array_equal(experts[real], code[real])
    assert (experts[~real] == -1).all()


def test_each_tokens_experts_stay_with_it_through_trimmed_packed_and_joined_rollouts():
    rollout = coded_rollout([3, 5, 2], [4, 1, 2])
    assert_experts_follow_tokens(rollout)
    assert_experts_follow_tokens(rollout.trimmed())
    assert_experts_follow_tokens(rollout.packed())
    assert_experts_follow_tokens(rollout.micro_batch(np.array([2, 0]), share_prompts=False))
    assert_experts_follow_tokens(rollout.take([1]))
    joined = concat_rollouts([coded_rollout([2], [1], p=2, r=1), coded_rollout([3, 5, 2], [4, 1, 2])], pad_id=0)
    assert joined.experts.shape == [4, 9, 2, 2]
    assert_experts_follow_tokens(joined)


def sampled(moe_dir, keep_experts=True):
    model = LlamaForCausalLM.from_pretrained(moe_dir)
    tokenizer = Tokenizer.from_pretrained(moe_dir)
    items = [{"prompt": p, "input_ids": tokenizer.encode(p)} for p in ("1 + 2 =", "what is seven times six?", "hi")]
    paddle.seed(4)
    config = GenerationConfig(max_new_tokens=6, do_sample=True, temperature=1.0,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    collate = lambda rows: collate_prompts(rows, tokenizer.pad_token_id)  # noqa: E731
    rollout = sample_rollout(model, tokenizer, items, config, 2, collate, keep_experts=keep_experts)
    return model, rollout


def test_the_sampler_keeps_the_experts_only_when_they_are_replayed(moe_dir):
    _, rollout = sampled(moe_dir)
    assert rollout.experts.shape == [6, rollout.input_ids.shape[1], 2, 2]
    fed = rollout.attention_mask.numpy() > 0
    assert ((rollout.experts.numpy() >= 0).all(axis=(2, 3)) <= fed).all()  # padding is never recorded
    assert sampled(moe_dir, keep_experts=False)[1].experts is None


def test_after_the_router_moved_the_trainers_passes_route_as_the_sampler_did(moe_dir):
    """Packed micro-batches in a shuffled order, replayed, give the log-probs of one whole-rollout forward with
    the sampler's record replayed; without replay the moved router gives other log-probs."""
    model, rollout = sampled(moe_dir)
    routing, batch = RolloutRouting(model), rollout.micro_batch(np.arange(6), share_prompts=False)
    assert mismatch(model, routing, batch) == 0.0  # the same weights: the trainer would route as the sampler did
    paddle.seed(5)
    for block in moe_blocks(model):
        block.gate.weight.set_value(block.gate.weight + 0.5 * paddle.randn(block.gate.weight.shape))
    mask = rollout.response_mask.numpy() > 0
    with paddle.no_grad(), replayed_routing(model, rollout.experts):
        whole, _ = response_log_probs(model, rollout.input_ids, rollout.attention_mask, rollout.prompt_len)
    parts = [np.array([4, 1, 3]), np.array([0, 5, 2])]
    replayed = log_probs_as_updated(model, rollout, parts, 1.0, False, RolloutRouting(model).around)
    own = log_probs_as_updated(model, rollout, parts, 1.0, False)
    np.testing.assert_allclose(replayed.numpy()[mask], whole.numpy()[mask], atol=2e-5)
    assert np.abs(own.numpy()[mask] - whole.numpy()[mask]).max() > 1e-3
    assert mismatch(model, routing, batch) > 0.05  # the moved router would choose otherwise on some tokens


def mismatch(model, routing, batch) -> float:
    with paddle.no_grad(), routing.around(model, batch):
        response_log_probs(model, batch.input_ids, batch.attention_mask, batch.prompt_len,
                           response_index=batch.response_index)
        return routing.step_terms(model, batch)[1]["moe/routing_mismatch"]


@pytest.fixture(scope="module")
def replayed_run(moe_dir, tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("moe_grpo") / "run", "grpo_argument.json", moe_dir,
                    "--per_device_prompt_batch_size", "2", "--num_return_sequences", "2",
                    "--per_device_train_batch_size", "2", "--update_iters", "2", "--moe_routing_replay", "rollout")


def test_an_moe_step_logs_the_load_balancing_loss_and_the_expert_load(replayed_run):
    rows = read_metrics(replayed_run)
    assert len(rows) == 2
    for row in rows:
        assert 1.0 < row["moe/aux_loss"] < 8.0  # experts x sum of load x mean probability: k = 2 when uniform
        assert 0.0 < row["moe/routing_mismatch"] < 1.0  # the optimizer steps inside a step move the router
        for layer in (0, 1):  # top-2 of 8 experts: one expert holds between 1/8 and 1/2 of the choices
            assert 0.125 <= row[f"moe/max_expert_load/{layer}"] <= 0.5


def test_the_ledger_keeps_each_tokens_experts_and_a_replayed_step_equals_the_run(replayed_run, tmp_path, capsys):
    rows = [json.loads(line) for line in (replayed_run / "ledger" / "steps-000001.jsonl").read_text().splitlines()]
    for row in rows:
        experts = np.asarray(row["experts"])
        assert experts.shape == (len(row["prompt_ids"]) + len(row["response_ids"]), 2, 2)
        assert (experts[:-1] >= 0).all() and (experts[-1] == -1).all()  # the last token was sampled, never fed
    assert replay(replayed_run, 2, tmp_path / "two") == 0
    assert_bitwise_equal(weights(tmp_path / "two"), weights(replayed_run))
    # the replayed update reads the ledger's experts: other choices, other weights
    run = tmp_path / "run"
    shutil.copytree(replayed_run, run)
    path = run / "ledger" / "steps-000001.jsonl"
    for row in rows:
        if row["step"] == 2:
            row["experts"] = [[[(e + 1) % 8 if e >= 0 else e for e in layer] for layer in token]
                              for token in row["experts"]]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    capsys.readouterr()
    assert replay(run, 2, tmp_path / "moved") == 1
    assert "tensors differ from the run's" in capsys.readouterr().out


def test_with_the_compiled_decode_step_the_ledger_holds_every_fed_tokens_experts(moe_dir, tmp_path):
    """rollout_decode static: the compiled step returns each row's experts, so replay needs no eager decoding; one
    optimizer step over the rollout starts exactly on policy."""
    out = tiny_run(tmp_path / "run", "grpo_argument.json", moe_dir, "--per_device_prompt_batch_size", "2",
                   "--num_return_sequences", "2", "--per_device_train_batch_size", "4", "--update_iters", "1",
                   "--moe_routing_replay", "rollout", "--rollout_decode", "static")
    row = read_metrics(out)[0]
    assert row["moe/routing_mismatch"] == 0.0 and row["clip_frac"] == 0.0
    for line in (out / "ledger" / "steps-000001.jsonl").read_text().splitlines():
        experts = np.asarray(json.loads(line)["experts"])
        assert (experts[:-1] >= 0).all() and (experts[-1] == -1).all()


@pytest.mark.parametrize("extra, message", [
    (["--moe_routing_replay", "always"], "key 'moe_routing_replay' must be one of ('none', 'rollout'), got 'always'"),
])
def test_bad_replay_settings_are_one_line_and_exit_2(moe_dir, tmp_path, capsys, extra, message):
    assert run_program(lambda: tiny_run(tmp_path / "out", "grpo_argument.json", moe_dir, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_replay_for_a_dense_actor_is_one_line_and_exit_2(tiny_model_dir, tmp_path, capsys):
    code = run_program(lambda: tiny_run(tmp_path / "out", "grpo_argument.json", tiny_model_dir,
                                        "--moe_routing_replay", "rollout"))
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "key 'moe_routing_replay' 'rollout' replays expert choices, but the actor has no expert layers" in err


@pytest.mark.parallel
def test_a_rollout_rank_sends_the_experts_and_stale_samples_are_replayed(moe_dir, tiny_reward_dir, tmp_path):
    """Asynchronous GRPO (a rollout rank one version behind): the experts cross the wire into the trainer and the
    ledger, and the trainer's router, one update ahead of the sampler's, would have routed some tokens elsewhere."""
    from alignment.ppo.rollout.ledger import read_ledger
    from tests.ppo.test_async_runs import launch, ppo_args

    out = tmp_path / "run"
    launch(tmp_path / "logs", ppo_args(out, moe_dir, tiny_reward_dir, "grpo", "--rollout_ranks", "1",
                                       "--max_staleness", "1", "--max_steps", "3", "--rollout_ledger", "true",
                                       "--moe_routing_replay", "rollout", "--learning_rate", "1e-3"))
    rows = read_metrics(out)
    assert [r["async/staleness"] for r in rows] == [0, 1, 1]
    assert all(r["moe/routing_mismatch"] > 0 for r in rows[1:])
    for row in read_ledger(str(out)):
        assert np.asarray(row["experts"]).shape == (len(row["prompt_ids"]) + len(row["response_ids"]), 2, 2)
