"""Asynchronous RL's parts in one process: the schedule, the off-policy weights against hand-computed values, the
wire format (rollouts bit-exact through JSON, weights checked by their checksum), the ledger's resume and report,
and the arguments an asynchronous run refuses. The launches themselves: tests/ppo/test_async_runs.py (parallel)."""
import json
import math

import numpy as np
import paddle
import pytest

from alignment.commands import replay_ledger
from alignment.config.parser import ArgumentError, ArgumentParser
from alignment.models import LlamaForCausalLM
from alignment.ppo.rl_math import off_policy
from alignment.ppo.asynchronous import wire
from alignment.ppo.asynchronous.asynchronous import token_version, version_for, versions_needed
from alignment.ppo.rollout.ledger import Ledger, read_ledger
from alignment.ppo.rollout.rollout import Rollout
from alignment.ppo.run_ppo import AsyncArguments, EnvironmentArguments, LoRAArguments
from tests.parallel.test_stores import Rendezvous
from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
from alignment.config.training import TrainingArguments


def test_the_schedule_names_each_batchs_version_and_the_versions_to_send():
    assert [version_for(b, 0) for b in range(4)] == [0, 1, 2, 3]
    assert [version_for(b, 2) for b in range(5)] == [0, 0, 0, 1, 2]
    assert versions_needed(0, 6, 2) == [0, 1, 2, 3]  # batches 0-2 share version 0
    assert versions_needed(4, 6, 2) == [2, 3]  # resumed at step 2 with batches 2, 3 sampled ahead
    assert versions_needed(0, 3, 0) == [0, 1, 2]


def test_partial_rollouts_move_each_generation_one_version_on_every_segment_up_to_the_step_before():
    # k = 2, a segment of 4 tokens: batch 5 starts at version 3, moves to 4 at token 4 and stays (4 = 5 - 1)
    assert [token_version(5, t, 2, 4) for t in (0, 3, 4, 7, 8, 20)] == [3, 3, 4, 4, 4, 4]
    assert [token_version(2, t, 2, 4) for t in (0, 3, 4, 9)] == [0, 0, 1, 1]
    assert [token_version(1, t, 2, 4) for t in (0, 9)] == [0, 0]  # version 0 is the newest batch 1 may use
    assert [token_version(6, t, 3, 2) for t in (0, 2, 4, 6)] == [3, 4, 5, 5]
    assert token_version(5, 9, 2, 0) == 3  # off: the batch's one version
    assert versions_needed(0, 6, 2, 4, 8) == [0, 1, 2, 3, 4]  # one more than without: batch 5's tail by 4
    assert versions_needed(0, 6, 2) == [0, 1, 2, 3]
    assert versions_needed(4, 6, 2, 4, 8) == [2, 3, 4]
    assert versions_needed(0, 6, 2, 4, 4) == [0, 1, 2, 3]  # 4 tokens never reach the second segment


def test_behaviour_weights_are_truncated_ratios_on_stale_rows_only():
    prox = paddle.to_tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    behaviour = paddle.to_tensor([[-1.5, -1.0, -3.0], [-2.0, -9.0, -1.0]])
    mask = paddle.to_tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    stale = paddle.to_tensor([True, False])
    weights = off_policy.behaviour_weights(prox, behaviour, mask, stale, 2.0).numpy()
    np.testing.assert_allclose(weights, [[math.exp(0.5), math.exp(-1.0), 1.0], [1.0, 1.0, 1.0]], rtol=1e-6)
    capped = off_policy.behaviour_weights(prox, behaviour, mask, paddle.to_tensor([True, True]), 2.0).numpy()
    np.testing.assert_allclose(capped[1], [2.0, 2.0, 1.0], rtol=1e-6)  # exp(1), exp(8) truncated at C = 2
    advantages = paddle.to_tensor([[1.0, -2.0, 0.0], [3.0, 3.0, 3.0]])
    corrected = off_policy.corrected_advantages(advantages, prox, behaviour, mask, stale, 2.0).numpy()
    np.testing.assert_allclose(corrected, [[math.exp(0.5), -2.0 * math.exp(-1.0), 0.0], [3.0, 3.0, 3.0]], rtol=1e-6)
    fresh = paddle.to_tensor([False, False])
    assert off_policy.corrected_advantages(advantages, prox, behaviour, mask, fresh, 2.0) is advantages
    assert off_policy.log_prob_gap(prox, behaviour, mask)[0] == pytest.approx(8.0)
    assert off_policy.log_prob_gap(prox, behaviour, paddle.zeros([2, 3])) == (0.0, 0.0)


def test_partial_rollouts_weigh_each_token_by_its_own_version():
    prox = paddle.to_tensor([[-1.0, -2.0, -3.0]])
    behaviour = paddle.to_tensor([[-1.5, -1.0, -2.0]])
    mask = paddle.to_tensor([[1.0, 1.0, 1.0]])
    stale = paddle.to_tensor([[True, True, False]])  # the last token drawn by the current version
    weights = off_policy.behaviour_weights(prox, behaviour, mask, stale, 2.0).numpy()
    np.testing.assert_allclose(weights, [[math.exp(0.5), math.exp(-1.0), 1.0]], rtol=1e-6)


def test_a_rollout_survives_the_wire_bit_for_bit():
    rng = np.random.default_rng(0)
    rollout = Rollout(
        input_ids=paddle.to_tensor(rng.integers(0, 1000, [2, 7])), attention_mask=paddle.ones([2, 7], "int64"),
        response_mask=paddle.to_tensor([[1.0, 1, 1, 0], [1, 0, 1, 1]]), prompt_len=3, prompts=["a", ["b", "c"]],
        completions=["x", "y\u00e9"], labels={"answer": ["1", None]},
        old_log_probs=paddle.to_tensor(rng.normal(-3, 1, [2, 4]).astype("float32")),
        episodes=[{"turns": 2, "messages": [{"role": "user", "content": "hi"}]}, {"turns": 1, "messages": []}],
        sample_ids=["0:0:5", "0:1:5"], versions=[3, 3])
    back = wire.rollout_from_json(wire.rollout_to_json(rollout))
    for name in ("input_ids", "attention_mask", "response_mask", "old_log_probs"):
        a, b = getattr(rollout, name).numpy(), getattr(back, name).numpy()
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert (back.prompts, back.completions, back.labels, back.episodes, back.versions) == (
        rollout.prompts, rollout.completions, rollout.labels, rollout.episodes, rollout.versions)
    with pytest.raises(ValueError, match="not a rollout"):
        wire.rollout_from_json(json.dumps({"input_ids": 1}))
    bad = json.loads(wire.rollout_to_json(rollout))
    bad["input_ids"]["dtype"] = "object"
    with pytest.raises(ValueError, match="dtype"):
        wire.rollout_from_json(json.dumps(bad))


def test_weights_travel_with_a_checksum_the_receiver_checks(tiny_model_dir):
    source, target = LlamaForCausalLM.from_pretrained(tiny_model_dir), LlamaForCausalLM.from_pretrained(tiny_model_dir)
    with paddle.no_grad():
        for p in source.parameters():
            p.set_value(p + 0.01)
    header, flat = wire.pack_weights(source, 7)
    assert wire.unpack_weights(target, header, flat) == 7
    assert wire.flat_digest(source) == wire.flat_digest(target)
    flat[5] = flat[5] + 1.0  # one value changed in transit
    with pytest.raises(ValueError, match="version 7: checksum or size mismatch"):
        wire.unpack_weights(target, header, flat)


def ledger_row(step, sample, version=0):
    return {"step": step, "sample": sample, "version": version, "reward": 1.0, "prompt": "p"}


def test_a_resumed_ledger_keeps_each_step_once_and_the_report_finds_duplicates_and_gaps(tmp_path, capsys):
    ledger = Ledger(str(tmp_path), True, {"reward_funcs": []})
    for step in (1, 2, 3):
        ledger.write([ledger_row(step, f"{step - 1}:{r}:9") for r in range(2)])
    with open(tmp_path / "ledger" / "steps-000001.jsonl", "a") as f:
        f.write('{"step": 4, "sam')  # a line cut by a kill
    ledger.resume_at(2)  # the checkpoint was at step 2: steps 3 and the cut line go
    assert [r["step"] for r in read_ledger(str(tmp_path))] == [1, 1, 2, 2]
    ledger.write([ledger_row(3, f"2:{r}:9") for r in range(2)])
    assert replay_ledger.main([str(tmp_path)]) == 0
    assert "twice: none" in capsys.readouterr().out
    ledger.write([ledger_row(4, "2:1:9"), ledger_row(4, "4:0:9"), ledger_row(4, "4:1:9")])
    assert replay_ledger.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "twice: 2:1:9" in out and "lost_batches: 3" in out


def test_a_fresh_run_in_a_used_output_dir_starts_a_new_ledger(tmp_path):
    first = Ledger(str(tmp_path), True)
    first.write([ledger_row(step, f"{step - 1}:0:9") for step in (1, 2)])
    again = Ledger(str(tmp_path), True)  # overwrite_output_dir: a new run, not a resume
    again.write([ledger_row(1, "0:0:9")])
    assert [(r["step"], r["sample"]) for r in read_ledger(str(tmp_path))] == [(1, "0:0:9")]
    resumed = Ledger(str(tmp_path), True)
    resumed.resume_at(1)
    resumed.write([ledger_row(2, "1:0:9")])
    assert [r["step"] for r in read_ledger(str(tmp_path))] == [1, 2]


PARSER = ArgumentParser(PPOModelArguments, PPODataArguments, PPOArguments, EnvironmentArguments, AsyncArguments,
                        LoRAArguments, TrainingArguments)
BASE = ["--actor_model_name_or_path", "m", "--train_datasets", "prompt-only", "--reward_funcs", "arithmetic",
        "--advantage_estimator", "grpo", "--num_return_sequences", "2"]


@pytest.mark.parametrize("flags, message", [
    (["--max_staleness", "1"], "key 'max_staleness' > 0 needs rollout_ranks > 0"),
    (["--rollout_ranks", "1", "--dynamic_sampling", "true"], "key 'max_gen_batches' must be >= 1 with"),
    (["--rollout_ranks", "1", "--behaviour_weight_cap", "0"], "key 'behaviour_weight_cap' must be > 0"),
    (["--rollout_ranks", "1", "--max_staleness", "1", "--partial_rollout_tokens", "4"],
     "key 'partial_rollout_tokens' needs max_staleness >= 2"),
    (["--rollout_ranks", "1", "--max_staleness", "2", "--partial_rollout_tokens", "4", "--environment",
      "calculator"], "key 'partial_rollout_tokens' with an 'environment'"),
])
def test_what_an_asynchronous_run_refuses_is_named(flags, message):
    with pytest.raises(ArgumentError, match=message):
        PARSER.parse_args(BASE + flags)


def test_a_synchronous_run_writes_the_ledger_when_asked(tmp_path, tiny_model_dir, tiny_reward_dir):
    from alignment.ppo import run_ppo
    from tests.helpers import REPO

    out = tmp_path / "run"
    run_ppo.main([f"{REPO}/config/tiny/ppo_argument.json", "--actor_model_name_or_path", tiny_model_dir,
                  "--reward_model_name_or_path", tiny_reward_dir, "--output_dir", str(out), "--disable_tqdm",
                  "--eval_datasets", "", "--max_steps", "3", "--max_new_tokens", "6", "--per_device_prompt_batch_size",
                  "4", "--per_device_train_batch_size", "4", "--rollout_ledger", "true", "--reward_funcs", "combined"])
    rows = read_ledger(str(out))
    assert [r["step"] for r in rows] == [1] * 4 + [2] * 4 + [3] * 4
    assert [r["sample"].split(":")[:2] for r in rows[:4]] == [["0", str(i)] for i in range(4)]
    assert all(set(r["reward_parts"]) == {"model", "combined"} and r["version"] == r["step"] - 1 for r in rows)
    assert all(len(r["response_ids"]) == len(r["policy_token"]) <= 6 for r in rows)
    sources = json.load(open(out / "ledger" / "sources.json"))
    assert sources["reward_model"] == tiny_reward_dir and len(sources["reward_model_sha256"]) == 64


def test_the_mailbox_answers_two_threads_each_their_own_question():
    """A rollout rank reads the weights counter in its receiver thread while sampling posts batches: over one
    TCPStore client without the mailbox's lock the answers cross (or the socket breaks) and the receiver waits on a
    transfer never sent."""
    import threading

    from alignment.parallel.stores import rank_zero_store
    from alignment.ppo.asynchronous.asynchronous import Mailbox, weights_key

    rendezvous = Rendezvous()
    server = rank_zero_store(0, "/test/mailbox", "127.0.0.1", rendezvous, 30)
    mailbox = Mailbox(rank_zero_store(1, "/test/mailbox", "127.0.0.1", rendezvous, 30), slots=3)
    mailbox.publish_start(0)
    seen, errors = set(), []

    def receiver():
        try:
            for _ in range(300):
                seen.add(mailbox.count(weights_key(1)))
        except Exception as err:  # noqa: BLE001 - the test reports it
            errors.append(err)

    thread = threading.Thread(target=receiver)
    thread.start()
    for batch in range(300):
        mailbox.add("async/taken", 1)
        mailbox.put(0, batch, f"batch {batch}")
    thread.join()
    assert errors == [] and seen == {0}
    assert mailbox.take(0, 299) == "batch 299" and mailbox.first_batch(0) == 0
    del server
