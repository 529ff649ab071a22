"""The real `tinker` SDK (0.38) against alignment-tinker-serve's service on the tiny LLaMA: a supervised step's
loss equals the SFT stage's loss on the same batch and its Adam step equals paddle's AdamW on the SFT gradients;
the RL losses equal a numpy computation; samples from saved weights equal the project's own decoding; checkpoints
round-trip. Skipped where the SDK is not installed (`pip install -e .[tinker]`)."""
import os
import time

import numpy as np
import paddle
import pytest

tinker = pytest.importorskip("tinker", reason="the tinker SDK is not installed (pip install -e .[tinker])")
from tinker import types  # noqa: E402

from alignment.models import LlamaForCausalLM  # noqa: E402
from alignment.models.engine import DecodeEngine, DecodeSequence  # noqa: E402
from alignment.models.generation import generate_without_cache  # noqa: E402
from alignment.models.logprobs import answer_token_loss, gather_log_probs  # noqa: E402
from alignment.models.lora import apply_lora, load_adapter, lora_layers, merge_lora  # noqa: E402
from alignment.models.sampling import GenerationConfig  # noqa: E402
from alignment.tinker_service.http import TinkerServer  # noqa: E402
from alignment.tinker_service.service import TinkerService  # noqa: E402
from alignment.tinker_service.training import ATTENTION, MLP, BaseModel  # noqa: E402

KEY, RANK, ALPHA = "tml-test-key", 4, 32.0
PROMPT, ANSWER = [5, 17, 42, 9, 33], [101, 7, 250, 64]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    os.environ["TINKER_TELEMETRY"] = "0"  # the SDK would post telemetry to the server (accepted and dropped)
    service = TinkerService({"tiny": BaseModel("tiny", tiny_model_dir, 512)},
                            str(tmp_path_factory.mktemp("tinker")), ALPHA, poll_seconds=0.02)  # the SDK meets try_again
    srv = TinkerServer(service, KEY)
    client = tinker.ServiceClient(base_url=srv.base_url, api_key=KEY)
    yield service, client
    client.close("success").result()
    srv.stop()


def checkpoint(service, path):
    """The directory behind a tinker:// checkpoint path."""
    return service.resolve(path)


def lora_model_from(base_dir, adapter_dir):
    model = LlamaForCausalLM.from_pretrained(base_dir)
    apply_lora(model, RANK, ALPHA, 0.0, list(ATTENTION + MLP))
    load_adapter(model, adapter_dir)
    return model


def sft_datum(prompt, answer):
    """Tinker's SFT datum: inputs = sequence[:-1], targets = sequence[1:], weight 1 on the answer's tokens."""
    full = prompt + answer
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                       loss_fn_inputs={"target_tokens": full[1:], "weights": weights})


def sft_loss_sum(model, prompt, answer):
    """The SFT stage's loss (answer_token_loss: mean over answer tokens) times the answer's tokens."""
    full = paddle.to_tensor([prompt + answer])
    labels = paddle.to_tensor([[-100] * len(prompt) + answer])
    loss, count = answer_token_loss(model, full, paddle.ones_like(full), labels)
    return loss * count


def test_a_supervised_step_equals_the_sft_loss_and_one_adamw_step(server, tiny_model_dir):
    service, client = server
    polls = service.try_agains
    trainer = client.create_lora_training_client(base_model="tiny", rank=RANK, seed=3).result()
    init = trainer.save_state("init").result().path
    batch = [(PROMPT, ANSWER), ([3, 8], [77, 12, 5])]
    adam = types.AdamParams(learning_rate=1e-2, beta1=0.8, beta2=0.99, eps=1e-4, weight_decay=0.1)
    with service.lock:  # the worker's jobs wait for it: the SDK's polls meet "try_again" until it is released
        backward = trainer.forward_backward([sft_datum(p, a) for p, a in batch], "cross_entropy")
        step = trainer.optim_step(adam)
        deadline = time.monotonic() + 60
        while service.try_agains == polls and time.monotonic() < deadline:
            time.sleep(0.01)
    result = backward.result()
    step.result()
    after = trainer.save_state("after").result().path
    assert service.try_agains > polls  # the SDK polled again after "try_again" answers, and got its results

    ours = lora_model_from(tiny_model_dir, checkpoint(service, init))
    loss = sum(sft_loss_sum(ours, p, a) for p, a in batch)
    assert result.metrics["loss:sum"] == pytest.approx(float(loss), rel=1e-5)
    full = paddle.to_tensor([PROMPT + ANSWER])
    expected = gather_log_probs(ours(full[:, :-1]).logits, full[:, 1:])[0].numpy()
    np.testing.assert_allclose(result.loss_fn_outputs[0]["logprobs"].to_numpy(), expected, rtol=1e-5, atol=1e-6)

    trained = [p for p in ours.parameters() if not p.stop_gradient]
    optimizer = paddle.optimizer.AdamW(learning_rate=1e-2, beta1=0.8, beta2=0.99, epsilon=1e-4, weight_decay=0.1,
                                       parameters=trained)
    # the gradients of the same loss computed per datum as the server does (the SFT loss above equals it up to
    # rounding, which Adam's g / (|g| + eps) would magnify on the tiniest gradients)
    datum_loss = 0.0
    for p, a in batch:
        ids = paddle.to_tensor([p + a])
        lp = gather_log_probs(ours(ids[:, :-1]).logits, ids[:, 1:])[0]  # [N]
        datum_loss = datum_loss - lp[len(p) - 1:].sum()
    assert float(datum_loss) == pytest.approx(float(loss), rel=1e-5)
    datum_loss.backward()
    optimizer.step()
    stepped = lora_model_from(tiny_model_dir, checkpoint(service, after))
    for name, layer in lora_layers(ours).items():
        for part in ("lora_A", "lora_B"):
            want, got = getattr(layer, part).numpy(), getattr(lora_layers(stepped)[name], part).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"{name}.{part}")
        assert np.abs(layer.lora_B.numpy()).max() > 5e-3  # B left zero: the step moved it by about the rate

    # save_state / load_state: back to the initial weights, the loss is the first one again
    trainer.load_state(init).result()
    again = trainer.forward([sft_datum(p, a) for p, a in batch], "cross_entropy").result()
    assert again.metrics["loss:sum"] == pytest.approx(result.metrics["loss:sum"], rel=1e-6)
    # a new training client from the stepped checkpoint with its optimizer state
    resumed = client.create_training_client_from_state_with_optimizer(after).result()
    out = resumed.forward([sft_datum(p, a) for p, a in batch], "cross_entropy").result()
    assert out.metrics["loss:sum"] == pytest.approx(float(sum(sft_loss_sum(stepped, p, a) for p, a in batch)),
                                                    rel=1e-5)
    assert out.metrics["loss:sum"] < result.metrics["loss:sum"]
    first, second = service.models[trainer.model_id], service.models[resumed.model_id]
    assert second.step == 1 and set(second.exp_avg) == set(first.params)
    # the first trainer was reloaded without optimizer state; compare against the saved moments directly
    from safetensors.numpy import load_file
    moments = load_file(os.path.join(checkpoint(service, after), "optimizer.safetensors"))
    for name, value in second.exp_avg_sq.items():
        np.testing.assert_array_equal(value.numpy(), moments[f"exp_avg_sq.{name}"])


def test_rl_losses_equal_a_numpy_computation_and_samples_carry_the_models_logprobs(server, tiny_model_dir):
    service, client = server
    trainer = client.create_lora_training_client(base_model="tiny", rank=RANK, seed=4).result()
    trainer.forward_backward([sft_datum(PROMPT, ANSWER)], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    drawn = sampler.sample(types.ModelInput.from_ints(PROMPT), 1,
                           types.SamplingParams(max_tokens=6, temperature=1.0, seed=11, stop=[])).result()
    tokens, sampled_lp = list(drawn.sequences[0].tokens), np.asarray(drawn.sequences[0].logprobs, np.float32)
    assert len(tokens) == 6 and drawn.sequences[0].stop_reason == "length"
    full = PROMPT + tokens
    n = len(full) - 1
    targets = np.asarray(full[1:])
    current = trainer.forward([types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                           loss_fn_inputs={"target_tokens": targets})], "cross_entropy").result()
    logp = current.loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(logp[-6:], sampled_lp, atol=2e-4)  # the sampler's log-probs are the model's

    rng = np.random.default_rng(0)
    q = (logp + rng.uniform(-0.5, 0.5, n)).astype(np.float32)  # an older sampler: ratios well outside [0.8, 1.2]
    adv = np.where(np.arange(n) < len(PROMPT) - 1, 0.0, rng.normal(size=n)).astype(np.float32)
    datum = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                        loss_fn_inputs={"target_tokens": targets, "logprobs": q, "advantages": adv})
    ratio = np.exp(logp.astype(np.float64) - q)
    is_loss = trainer.forward([datum], "importance_sampling").result().metrics["loss:sum"]
    assert is_loss == pytest.approx(-(ratio * adv).sum(), rel=1e-4, abs=1e-5)
    for low, high in ((0.8, 1.2), (0.9, 1.05)):
        config = None if (low, high) == (0.8, 1.2) else {"clip_low_threshold": low, "clip_high_threshold": high}
        ppo = trainer.forward([datum], "ppo", config).result().metrics["loss:sum"]
        want = -np.minimum(ratio * adv, np.clip(ratio, low, high) * adv).sum()
        assert ppo == pytest.approx(want, rel=1e-4, abs=1e-5)
        assert abs(want - is_loss) > 1e-3  # the clip bites
    with pytest.raises(tinker.RequestFailedError, match="not supported"):
        trainer.forward([datum], "cispo").result()


def test_samples_from_saved_weights_equal_the_projects_decoding(server, tiny_model_dir):
    service, client = server
    trainer = client.create_lora_training_client(base_model="tiny", rank=RANK, seed=5).result()
    trainer.forward_backward([sft_datum(PROMPT, ANSWER)], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    saved = trainer.save_weights_for_sampler("snap").result().path
    sampler = client.create_sampling_client(model_path=saved).result()
    prompt = types.ModelInput.from_ints(PROMPT)

    model = lora_model_from(tiny_model_dir, checkpoint(service, saved))
    merge_lora(model)
    model.eval()
    eos = model.config.eos_token_ids
    greedy = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8, temperature=0.0)).result().sequences[0]
    reference = generate_without_cache(model, paddle.to_tensor([PROMPT]), paddle.ones([1, len(PROMPT)], "int64"),
                                       GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=eos))
    want = reference.sequences[0, len(PROMPT):].numpy()[reference.response_mask[0].numpy() > 0].tolist()
    assert list(greedy.tokens) == want

    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=7)
    seeded = sampler.sample(prompt, 2, params).result().sequences
    assert [list(s.tokens) for s in seeded] == [list(s.tokens) for s in sampler.sample(prompt, 2, params).result()
                                               .sequences]
    config = GenerationConfig(max_new_tokens=8, do_sample=True, temperature=1.0, eos_token_id=eos)
    engine = DecodeEngine(model, 1, len(PROMPT) + 8)
    for i, got in enumerate(seeded):
        seq = DecodeSequence(PROMPT, config, len(PROMPT) + 8, rng=np.random.default_rng(7 + i))
        engine.add(seq)
        while engine.busy():
            engine.step()
        engine.release(seq)
        assert list(got.tokens) == seq.turn and got.stop_reason == ("stop" if seq.ending == "eos" else "length")
    assert seeded[0].tokens != seeded[1].tokens  # two draws, not one repeated


def test_closing_a_session_frees_its_models_but_keeps_its_checkpoints(server):
    service, client = server
    own = tinker.ServiceClient(base_url=client.holder._base_url, api_key=KEY)
    trainer = own.create_lora_training_client(base_model="tiny", rank=RANK).result()
    saved = trainer.save_state("kept").result().path
    sampler = trainer.save_weights_and_get_sampling_client().result()
    assert trainer.model_id in service.models and sampler._sampling_session_id in service.samplers
    own.close("success").result()
    assert trainer.model_id not in service.models and sampler._sampling_session_id not in service.samplers
    assert os.path.isdir(service.resolve(saved))


def test_info_tokenizer_and_capabilities_name_the_served_base(server, tiny_model_dir):
    service, client = server
    trainer = client.create_lora_training_client(base_model="tiny", rank=RANK).result()
    info = trainer.get_info()
    assert (info.model_name, info.lora_rank, info.model_data.tokenizer_id) == ("tiny", RANK, tiny_model_dir)
    capabilities = tinker.RestClient(base_url=client.holder._base_url, api_key=KEY).get_server_capabilities()
    assert [(m.model_name, m.max_context_length) for m in capabilities.result().supported_models] == [("tiny", 512)]
    try:
        import transformers  # noqa: F401  get_tokenizer loads the tokenizer_id directory with AutoTokenizer
    except ImportError:
        return
    from alignment.models import Tokenizer
    assert trainer.get_tokenizer().encode("hello world") == Tokenizer.from_pretrained(tiny_model_dir).encode(
        "hello world")


def test_a_wrong_key_is_refused(server):
    service, client = server
    with pytest.raises(tinker.AuthenticationError):  # the server's 401, not a connection failure
        tinker.ServiceClient(base_url=client.holder._base_url, api_key="tml-wrong").create_lora_training_client(
            base_model="tiny", rank=RANK)


def test_the_docs_example_runs_against_the_command(tiny_model_dir, tmp_path):
    """docs/tinker.md's block: tools/tinker_serve.py serving, the SDK training three steps and sampling; its
    checkpoint merges with tools/merge_lora.py as the page says."""
    import glob
    import shutil
    import subprocess
    import sys

    from docsgen import runnable
    from tests.helpers import REPO

    block = runnable.block_on('tinker.md', "tests/tinker_service/test_tinker_service.py")
    shutil.copytree(tiny_model_dir, tmp_path / "checkpoints" / "tiny")
    for name in ("alignment", "tools"):
        os.symlink(os.path.join(REPO, name), tmp_path / name)
    env = {**os.environ, "PYTHONPATH": str(tmp_path),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}  # this python, with the SDK
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    losses = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 3 and losses[2] < losses[0], done.stdout
    assert "greedy tokens [" in done.stdout and "/weights/step-3" in done.stdout
    saved = glob.glob(str(tmp_path / "tinker-checkpoints" / "*" / "weights" / "step-3"))
    assert len(saved) == 1 and os.path.exists(os.path.join(saved[0], "optimizer.safetensors"))
    merged = subprocess.run([sys.executable, "tools/merge_lora.py", "--adapter", saved[0], "--base",
                             "checkpoints/tiny", "--output", "merged"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env=env)
    assert merged.returncode == 0 and (tmp_path / "merged" / "config.json").exists(), merged.stderr[-2000:]
