"""Weights that provably moved (models/weights_digest.py, ppo/asynchronous/weight_check.py): every sampled row
carries the digest of the weights that sampled it, and each way a sampler can hold other weights than it claims is
caught: a rollout rank that skips a sync, a LoRA adapter never applied at sampling, a decode engine kept across a
sync. A normal run records each version's digest in the ledger."""
import hashlib

import numpy as np
import paddle
import pytest

from alignment.models import LlamaForCausalLM
from alignment.models.engine import DecodeEngine, DecodeSequence
from alignment.models.generation import generate
from alignment.models.lora import adapters_disabled, apply_lora
from alignment.models.sampling import GenerationConfig
from alignment.models.weights_digest import (StaleWeights, base_digest, policy_version, set_policy_version,
                                             weights_digest)
from alignment.ppo.asynchronous import wire
from alignment.ppo.rollout.rollout import Rollout
from alignment.ppo.asynchronous.weight_check import WeightsCheck, stamp


def moved(model, amount=0.01):
    """An optimizer step's worth of change to every trainable parameter."""
    with paddle.no_grad():
        for _, p in wire.trainable(model):
            p.set_value(p + amount)
    return model


def rollout_of(rows, version, digest, who, batch=1):
    """A `rows`-row rollout as a rollout rank posts it, through the wire's JSON (as the mailbox carries it)."""
    ids = paddle.to_tensor(np.arange(rows * 4, dtype="int64").reshape([rows, 4]))
    rollout = Rollout(ids, paddle.ones([rows, 4], "int64"), paddle.ones([rows, 2]), 2, ["p"] * rows, ["c"] * rows,
                      {}, versions=[version] * rows, sample_ids=[f"{batch}:{i}:{i}" for i in range(rows)])
    stamp(rollout, digest, who)
    return wire.rollout_from_json(wire.rollout_to_json(rollout))


def test_the_digest_is_sha256_of_the_weights_the_model_samples_with(tiny_model_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    expected = hashlib.sha256()  # by hand, over copies of the values (the digest reads them in place)
    for name, p in model.named_parameters():
        expected.update(f"{name}:{p.dtype}:{list(p.shape)};".encode() + p.numpy().tobytes())
    assert weights_digest(model) == expected.hexdigest()
    assert weights_digest(LlamaForCausalLM.from_pretrained(tiny_model_dir)) == expected.hexdigest()
    with paddle.no_grad():
        model.lm_head.weight[0, 0] = model.lm_head.weight[0, 0] + 1e-6  # one value, barely moved
    assert weights_digest(model) != expected.hexdigest()


def test_a_rollout_rank_that_skips_a_sync_is_caught(tiny_model_dir):
    trainer, sampler = LlamaForCausalLM.from_pretrained(tiny_model_dir), LlamaForCausalLM.from_pretrained(
        tiny_model_dir)
    check = WeightsCheck(staleness=1)
    wire.unpack_weights(sampler, *wire.pack_weights(trainer, 0))
    check.record(0, trainer)
    check.check(rollout_of(2, 0, weights_digest(sampler), "rollout rank 1", batch=0), 0)  # synced: passes
    check.record(1, moved(trainer))  # the step's update, then version 1 goes out ...
    skipped = rollout_of(2, 1, weights_digest(sampler), "rollout rank 1")  # ... and the rank never loads it
    with pytest.raises(StaleWeights, match=r"^rollout rank 1: sample 1:0:0 \(policy version 1, trained at step 1\) "
                                           r"was sampled with policy version 0's weights .* skipped a weight sync$"):
        check.check(skipped, 1)
    other = rollout_of(2, 1, weights_digest(moved(LlamaForCausalLM.from_pretrained(tiny_model_dir), 0.5)),
                       "rollout rank 2")
    with pytest.raises(StaleWeights, match="rollout rank 2: .* no policy version in 0..1"):
        check.check(other, 1)
    wire.unpack_weights(sampler, *wire.pack_weights(trainer, 1))
    check.check(rollout_of(2, 1, weights_digest(sampler), "rollout rank 1"), 1)
    check.record(2, moved(trainer))
    check.record(3, moved(trainer))  # max_staleness 1: a version-1 row is too old at step 3
    with pytest.raises(StaleWeights, match=r"\(policy version 1, trained at step 3\) is older than the versions "
                                           r"2..3 key 'max_staleness' 1 allows"):
        check.check(rollout_of(1, 1, weights_digest(sampler), "rollout rank 1"), 3)
    assert sorted(check.known) == [2, 3]  # the window only
    resumed = WeightsCheck(staleness=1)  # a resumed run checks the batches sampled ahead with the saved digests
    resumed.load_state_dict(check.state_dict())
    with pytest.raises(StaleWeights, match="sampled with policy version 2's weights"):
        resumed.check(rollout_of(1, 3, check.known[2], "rollout rank 1"), 3)
    with pytest.raises(StaleWeights, match="carries no weights digest"):
        resumed.check(rollout_of(1, 3, None, "rollout rank 1"), 3)


def test_a_lora_adapter_not_applied_at_sampling_is_caught_at_the_first_step(tiny_model_dir):
    paddle.seed(3)
    actor = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    apply_lora(actor, rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))
    plain = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    assert base_digest(actor) == weights_digest(plain) != weights_digest(actor)  # B starts at zero: still differs
    assert base_digest(plain) is None
    check = WeightsCheck()
    check.record(0, actor)
    with adapters_disabled(actor):  # a sampler that runs the model with its adapters off
        off = weights_digest(actor)
    for digest, who in [(off, "local engine of rank 0"), (weights_digest(plain), "rollout rank 1")]:
        with pytest.raises(StaleWeights, match=rf"^{who}: sample 0:0:0 \(policy version 0, trained at step 0\) was "
                                               r"sampled without the LoRA adapter: .* is the base model's"):
            check.check(rollout_of(1, 0, digest, who, batch=0), 0)
    check.check(rollout_of(1, 0, weights_digest(actor), "rollout rank 1", batch=0), 0)


def greedy(model, prompt, tokens=5):
    config = GenerationConfig(max_new_tokens=tokens, do_sample=False, eos_token_id=[], pad_token_id=0)
    ids = paddle.to_tensor([prompt], dtype="int64")
    return generate(model, ids, paddle.ones_like(ids), config).sequences.numpy()[0, len(prompt):].tolist()


def test_a_decode_engine_kept_across_a_sync_is_caught_and_a_new_one_sees_the_new_weights(tiny_model_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    newer = moved(LlamaForCausalLM.from_pretrained(tiny_model_dir), 0.05)
    prompt = [5, 17, 42, 9]
    expected = greedy(newer, prompt)
    assert greedy(model, prompt) != expected  # the two versions sample differently
    set_policy_version(model, 0)
    config = GenerationConfig(max_new_tokens=5, do_sample=False, eos_token_id=[], pad_token_id=0)
    engine = DecodeEngine(model, 1, 16)
    engine.add(DecodeSequence(prompt, config, 16))
    engine.step()
    wire.unpack_weights(model, *wire.pack_weights(newer, 1))  # the sync
    assert policy_version(model) == 1
    with pytest.raises(StaleWeights, match="policy version 0's, the model is version 1 now"):
        engine.step()
    assert greedy(model, prompt) == expected  # every call builds its engine: nothing of version 0 is reused

    loads = []

    def partial(rounds):  # partial rollouts move the weights between two decode steps on purpose
        if rounds == 2 and not loads:
            loads.append(wire.unpack_weights(model, *wire.pack_weights(moved(newer), 2)))
            return True
        return False
    moving = DecodeEngine(model, 1, 16, before_decode=partial)
    seq = DecodeSequence(prompt, config, 16)
    moving.add(seq)
    while moving.busy():
        moving.step()
    assert loads == [2] and len(seq.turn) == 5


def test_a_normal_run_records_each_versions_digest_in_the_ledger(tmp_path, tiny_model_dir, tiny_reward_dir):
    from alignment.ppo import run_ppo
    from alignment.ppo.rollout.ledger import read_ledger
    from tests.helpers import REPO

    out = tmp_path / "run"
    run_ppo.main([f"{REPO}/config/tiny/grpo_argument.json", "--actor_model_name_or_path", tiny_model_dir,
                  "--output_dir", str(out), "--disable_tqdm", "--eval_datasets", "", "--max_steps", "2",
                  "--max_new_tokens", "4", "--per_device_prompt_batch_size", "2", "--num_return_sequences", "2",
                  "--per_device_train_batch_size", "4", "--rollout_ledger", "true", "--learning_rate", "1e-2",
                  "--gold_judge", ""])
    rows = read_ledger(str(out))
    assert [r["step"] for r in rows] == [1] * 4 + [2] * 4
    assert {r["sampled_by"] for r in rows} == {"local engine of rank 0"}
    first, second = {r["weights_digest"] for r in rows[:4]}, {r["weights_digest"] for r in rows[4:]}
    assert first == {weights_digest(LlamaForCausalLM.from_pretrained(tiny_model_dir))}  # version 0: the start
    assert len(second) == 1 and second != first  # version 1: the weights moved


@pytest.mark.parallel
def test_a_launch_whose_rollout_rank_skips_a_sync_stops_in_one_line_naming_it(tmp_path, tiny_model_dir,
                                                                              tiny_reward_dir, monkeypatch):
    from alignment.ppo.asynchronous.asynchronous import SKIP_VARIABLE
    from alignment.ppo.rollout.ledger import read_ledger
    from tests.ppo.test_async_runs import launch, ppo_args

    monkeypatch.setenv("MKL_NUM_THREADS", "1")
    flags = ("--rollout_ranks", "1", "--max_staleness", "1", "--max_steps", "4")
    good = tmp_path / "good"
    launch(tmp_path / "logs-good", ppo_args(good, tiny_model_dir, tiny_reward_dir, "grpo", *flags))
    rows = read_ledger(str(good))
    assert {r["sampled_by"] for r in rows} == {"rollout rank 1"}
    by_version = {}
    for r in rows:
        by_version.setdefault(r["version"], set()).add(r["weights_digest"])
    assert sorted(by_version) == [0, 1, 2] and all(len(d) == 1 for d in by_version.values())
    assert len(set.union(*by_version.values())) == 3  # each version its own weights
    assert by_version[0] == {weights_digest(LlamaForCausalLM.from_pretrained(tiny_model_dir))}

    monkeypatch.setenv(SKIP_VARIABLE, "2")  # the rollout rank receives version 2 and keeps version 1's weights
    bad = tmp_path / "bad"
    done = launch(tmp_path / "logs-bad", ppo_args(bad, tiny_model_dir, tiny_reward_dir, "grpo", *flags), check=False)
    assert done.returncode != 0
    log = (tmp_path / "logs-bad" / "workerlog.0").read_text()
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: rollout rank 1: sample 3:0:") and \
        "(policy version 2, trained at step 3)" in errors[0] and "skipped a weight sync" in errors[0], log[-3000:]
    assert "Traceback" not in log
    assert [r["step"] for r in read_metrics_or_empty(bad)] == [1, 2, 3]  # steps 1-3 trained, the 4th refused


def read_metrics_or_empty(out):
    from tests.helpers import read_metrics

    return read_metrics(out) if (out / "metrics.jsonl").exists() else []
