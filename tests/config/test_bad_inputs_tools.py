"""The bad-input catalogue of the command-line tools (alignment/commands/): every number a flag takes (NaN, inf,
beyond int64, out of range), the files each tool reads (prompts files, export.json, a model config for planning,
ledgers, metrics and generations of a run), and where it writes (the reward server's port file). Each case runs
the tool as its console command does and must exit 2 with one line naming the flag, file, line or key, and write
nothing (tests/bad_input_harness.py)."""
import gzip
import json
import os

import pytest

from alignment.commands import (export_model, generate, judge_policy, make_preference_data, make_tiny, plan_layout,
                                plot_overoptimization, plot_run, predict, replay_ledger, reward_server,
                                show_generations)
from tests.bad_input_harness import case, lines, run_case, write
from tests.helpers import REPO

DEEP = 100_000
TINY_CONFIG = {"vocab_size": 1024, "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
EXPORT = {"format": "kv-cache-v1", "program": "model", "num_hidden_layers": 4, "num_key_value_heads": 2,
          "head_dim": 32, "dtype": "float32", "vocab_size": 1024, "max_position_embeddings": 512,
          "eos_token_ids": [2], "pad_token_id": 3}


def tool(main, *argv):
    """A tool's main() with argv ({t}: the case's directory, {m}: the tiny model)."""
    return lambda t, m: lambda: main([a.format(t=t, m=m) for a in argv])


def plan(config=None, config_text=None, *flags):
    def build(t, m):
        text = config_text if config_text is not None else json.dumps({**TINY_CONFIG, **(config or {})})
        path = write(t / "config.json", text)
        return lambda: plan_layout.main(["--model", path, "--gpus", "8", "--gpu-memory-gib", "80", *flags])
    return build


def predict_prompts(content, *flags):
    """predict on the tiny checkpoint (--mode dynamic) with a prompts file holding `content` (bytes or rows)."""
    def build(t, m):
        path = write(t / "prompts.jsonl", content) if isinstance(content, bytes) else lines(t / "prompts.jsonl",
                                                                                              content)
        return lambda: predict.main(["--model", m, "--mode", "dynamic", "--prompts", path, "--max-new-tokens", "2",
                                     "--no-progress", *flags])
    return build


def predict_export(info=None, text=None):
    """predict on an export whose export.json holds `info` (or `text`); its program files are empty."""
    def build(t, m):
        folder = t / "exported" / "inference"
        write(folder / "export.json", text if text is not None else json.dumps(
            {k: v for k, v in {**EXPORT, **(info or {})}.items() if v is not None}))
        for ext in (".json", ".pdiparams"):
            write(folder / f"model{ext}", b"")
        return lambda: predict.main(["--model", str(t / "exported"), "--prompt", "hi"])
    return build


def reward_server_child(*flags):
    """The reward server in a child process (a server that does not refuse would serve, not return)."""
    return lambda t, m: ["tools/reward_server.py", "--judge", "arithmetic", "--port", "0",
                         *[f.format(t=t) for f in flags]]


def reward_server_flags(*flags):
    """The reward server's command line, parsed in this process as its main() does first (the one case that
    would serve when not refused runs the whole program in a child, above)."""
    return lambda t, m: lambda: reward_server.parse_args(["--judge", "arithmetic", "--port", "0",
                                                         *[f.format(t=t) for f in flags]])


def ledger(rows):
    def build(t, m):
        lines(t / "run" / "ledger" / "steps-000000.jsonl", rows)
        return lambda: replay_ledger.main([str(t / "run")])
    return build


def run_file(name, content, main, *flags):
    def build(t, m):
        path = t / "run" / name
        write(path, content) if isinstance(content, bytes) else lines(path, content)
        return lambda: main([str(t / "run"), *flags])
    return build


GOOD_LEDGER = {"step": 1, "version": 0, "reward": 0.5, "sample": "0:0:0"}
GOOD_GENERATION = {"step": 0, "prompt": "p", "completion": "c", "reward": 0.1}

CASES = [
    # --- the reward server
    case("reward server: --port-file in a missing directory", reward_server_child(
        "--port-file", "{t}/no-such-dir/port"), "--port-file", "no-such-dir"),
    case("reward server: --port-file is a directory", lambda t, m: (os.makedirs(t / "d"), reward_server_flags(
        "--port-file", "{t}/d")(t, m))[1], "--port-file"),
    case("reward server: --max-body-mb inf", reward_server_flags("--max-body-mb", "inf"), "--max-body-mb"),
    case("reward server: --judge-weight nan", reward_server_flags("--judge-weight", "nan"), "--judge-weight"),
    case("reward server: --max-batch beyond int64", reward_server_flags("--max-batch", str(2 ** 64)),
         "--max-batch"),
    case("reward server: --max-wait-ms nan", reward_server_flags("--max-wait-ms", "nan"), "--max-wait-ms"),
    # --- plan_layout: the model config and the flags
    case("plan_layout: hidden_size 0", plan({"hidden_size": 0}), "config.json",
         "'hidden_size' must be a positive integer"),
    case("plan_layout: num_hidden_layers -4", plan({"num_hidden_layers": -4}), "config.json", "'num_hidden_layers'"),
    case("plan_layout: vocab_size \"1024\"", plan({"vocab_size": "1024"}), "config.json", "'vocab_size'"),
    case("plan_layout: num_attention_heads 2.5", plan({"num_attention_heads": 2.5}), "config.json",
         "'num_attention_heads'"),
    case("plan_layout: intermediate_size true", plan({"intermediate_size": True}), "config.json",
         "'intermediate_size'"),
    case("plan_layout: hidden_size beyond int64", plan({"hidden_size": 2 ** 70}), "config.json", "'hidden_size'"),
    case("plan_layout: tie_word_embeddings \"false\"", plan({"tie_word_embeddings": "false"}), "config.json",
         "'tie_word_embeddings'"),
    case("plan_layout: missing num_hidden_layers", plan({"num_hidden_layers": None}), "config.json",
         "'num_hidden_layers'"),
    case("plan_layout: heads that do not divide hidden_size", plan({"num_attention_heads": 3,
                                                                    "num_key_value_heads": 3}),
         "config.json", "num_attention_heads 3"),
    case("plan_layout: config non-UTF-8", plan(config_text=b'{"hidden_size": 128,\n "x": "\xe9"}'),
         "config.json line 2", "UTF-8"),
    case("plan_layout: config nested 100,000 deep", plan(config_text='{"x": ' + "[" * DEEP + "]" * DEEP + "}"),
         "config.json line 1", "nested too deeply"),
    case("plan_layout: --gpus beyond int64", lambda t, m: plan()(t, m) and (lambda: plan_layout.main([
        "--model", str(t / "config.json"), "--gpus", str(2 ** 64), "--gpu-memory-gib", "80"])), "--gpus"),
    case("plan_layout: --gpu-memory-gib nan", lambda t, m: plan()(t, m) and (lambda: plan_layout.main([
        "--model", str(t / "config.json"), "--gpus", "8", "--gpu-memory-gib", "nan"])), "--gpu-memory-gib"),
    case("plan_layout: --lora-rank -1", plan(None, None, "--lora-rank", "-1"), "--lora-rank"),
    # --- predict: the prompts file
    case("predict: a non-UTF-8 prompts file", predict_prompts(b'{"prompt": "hi"}\n{"prompt": "caf\xe9"}\n'),
         "prompts.jsonl line 2", "UTF-8"),
    case("predict: a gzip-compressed prompts file", predict_prompts(gzip.compress(b'{"prompt": "hi"}\n')),
         "prompts.jsonl", "gzip-compressed"),
    case("predict: a UTF-16 prompts file", predict_prompts("hi\n".encode("utf-16")), "prompts.jsonl", "UTF-16"),
    case("predict: a lone surrogate in a prompt", predict_prompts(['{"prompt": "hi \\udc00"}']),
         "prompts.jsonl line 1", "surrogate"),
    case("predict: a prompt line nested 100,000 deep", predict_prompts(['{"prompt": ' + "[" * DEEP + "]" * DEEP
                                                                        + "}"]),
         "prompts.jsonl line 1", "nested too deeply"),
    case("predict: a prompt that is a number", predict_prompts([{"prompt": "hi"}, {"prompt": 5}]),
         "prompts.jsonl line 2", "\"prompt\""),
    case("predict: a broken JSON prompt line", predict_prompts([{"prompt": "hi"}, '{"prompt": "x",']),
         "prompts.jsonl line 2", "JSON"),
    case("predict: the prompts file is a directory", lambda t, m: (os.makedirs(t / "p"), lambda: predict.main([
        "--model", m, "--mode", "dynamic", "--prompts", str(t / "p")]))[1], "p", "directory"),
    # --- predict: export.json
    case("predict: a corrupt export.json", predict_export(text='{"format": "kv-cache-v1",\n "vocab_size": '),
         "export.json line 2", "JSON"),
    case("predict: export.json without vocab_size", predict_export({"vocab_size": None}), "export.json",
         "missing key 'vocab_size'"),
    case("predict: export.json non-UTF-8", predict_export(text=b'{"format": "kv-cache-v1\xff"}'),
         "export.json line 1", "UTF-8"),
    case("predict: export.json num_hidden_layers \"4\"", predict_export({"num_hidden_layers": "4"}), "export.json",
         "'num_hidden_layers'"),
    case("predict: export.json program outside its folder", predict_export({"program": "../../model"}),
         "export.json", "'program'"),
    case("predict: export.json eos_token_ids [-1]", predict_export({"eos_token_ids": [-1]}), "export.json",
         "'eos_token_ids'"),
    case("predict: export.json a JSON array", predict_export(text="[]"), "export.json", "JSON object"),
    # --- predict / generate / make_preference_data: the numbers of the flags
    case("predict: --temperature nan", tool(predict.main, "--model", "{m}", "--prompt", "hi", "--do-sample",
                                            "--temperature", "nan"), "--temperature"),
    case("predict: --top-p 2", tool(predict.main, "--model", "{m}", "--prompt", "hi", "--do-sample", "--top-p", "2"),
         "--top-p"),
    case("predict: --top-k -1", tool(predict.main, "--model", "{m}", "--prompt", "hi", "--do-sample", "--top-k",
                                     "-1"), "--top-k"),
    case("predict: --seed beyond int64", tool(predict.main, "--model", "{m}", "--prompt", "hi", "--seed",
                                              str(2 ** 64)), "--seed"),
    case("predict: --min-new-tokens -1", tool(predict.main, "--model", "{m}", "--prompt", "hi", "--min-new-tokens",
                                              "-1"), "--min-new-tokens"),
    case("predict: --repetition-penalty 0", tool(predict.main, "--model", "{m}", "--prompt", "hi",
                                                 "--repetition-penalty", "0"), "--repetition-penalty"),
    case("generate: --temperature nan", tool(generate.main, "--model", "{m}", "--prompt", "hi", "--temperature",
                                             "nan"), "--temperature"),
    case("generate: --top-k -5", tool(generate.main, "--model", "{m}", "--prompt", "hi", "--top-k", "-5"),
         "--top-k"),
    case("generate: --seed beyond int64", tool(generate.main, "--model", "{m}", "--prompt", "hi", "--seed",
                                               str(2 ** 64)), "--seed"),
    case("make_preference_data: --temperature inf", tool(
        make_preference_data.main, "--model", "{m}", "--prompts", f"{REPO}/data/prompts/eval.jsonl", "--output",
        "{t}/out.jsonl", "--temperature", "inf"), "--temperature"),
    case("make_preference_data: --top-p 0", tool(
        make_preference_data.main, "--model", "{m}", "--prompts", f"{REPO}/data/prompts/eval.jsonl", "--output",
        "{t}/out.jsonl", "--top-p", "0"), "--top-p"),
    case("judge_policy: --show -1", tool(judge_policy.main, "--model", "{m}", "--show", "-1"), "--show"),
    case("judge_policy: --environment-args a list", tool(judge_policy.main, "--model", "{m}", "--environment-args",
                                                         "[1]"), "--environment-args"),
    # --- export_model and make_tiny
    case("export_model: a LoRA adapter trained for another base model", lambda t, m: (
        __import__("tests.config.test_bad_inputs_models", fromlist=["x"]).other_base_adapter(t),
        lambda: export_model.main(["--model", str(t / "adapter"), "--base", m, "--output", str(t / "out"),
                                   "--no-progress"]))[1],
         "adapter", "another base model"),
    case("make_tiny: a non-UTF-8 corpus file", lambda t, m: (
        write(t / "d" / "sft" / "a.jsonl", b'{"text": "ok"}\n{"text": "\xff"}\n'),
        lambda: make_tiny.main(["--data-dir", str(t / "d"), "--output", str(t / "out")]))[1],
         "a.jsonl line 2", "UTF-8"),
    # --- a run's files, read back by the tools
    case("replay_ledger: a non-UTF-8 line", ledger([GOOD_LEDGER, b'{"step": 1, "x": "\xe9"}']),
         "steps-000000.jsonl line 2", "UTF-8"),
    case("replay_ledger: a reward given as a string", ledger([GOOD_LEDGER, {**GOOD_LEDGER, "reward": "high"}]),
         "steps-000000.jsonl line 2", "'reward'"),
    case("replay_ledger: a version given as a string", ledger([GOOD_LEDGER, {**GOOD_LEDGER, "version": "0"}]),
         "steps-000000.jsonl line 2", "'version'"),
    case("show_generations: a broken line", run_file("eval_generations.jsonl", [GOOD_GENERATION, '{"step": '],
                                                     show_generations.main),
         "eval_generations.jsonl line 2"),
    case("show_generations: a row without step", run_file("eval_generations.jsonl", [
        GOOD_GENERATION, {"prompt": "p", "completion": "c", "reward": 0.1}], show_generations.main),
         "eval_generations.jsonl line 2", "'step'"),
    case("show_generations: --samples -1", lambda t, m: run_file("eval_generations.jsonl", [GOOD_GENERATION],
                                                                 show_generations.main, "--samples", "-1")(t, m),
         "--samples"),
    case("plot_run: a non-UTF-8 metrics.jsonl", run_file("metrics.jsonl", b'{"step": 1, "loss": 1.0}\n\xff\n',
                                                         plot_run.main), "metrics.jsonl line 2", "UTF-8"),
    case("plot_run: a metrics row without step", run_file("metrics.jsonl", [{"step": 1, "loss": 1.0}, {"loss": 2.0}],
                                                          plot_run.main), "metrics.jsonl line 2", "'step'"),
    case("plot_overoptimization: a broken args.json", lambda t, m: (
        lines(t / "run" / "metrics.jsonl", [{"step": 1, "gold_reward/mean": 0.1, "reward/mean": 0.2, "kl": 0.0}]),
        write(t / "run" / "args.json", '{"kl_coeff": '),
        lambda: plot_overoptimization.main([str(t / "run"), "--output", str(t / "o.png")]))[2],
         "args.json line 1"),
    case("plot_overoptimization: --smooth 0", lambda t, m: (
        lines(t / "run" / "metrics.jsonl", [{"step": 1, "gold_reward/mean": 0.1, "reward/mean": 0.2, "kl": 0.0}]),
        lambda: plot_overoptimization.main([str(t / "run"), "--smooth", "0", "--output", str(t / "o.png")]))[1],
         "--smooth"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_tool_inputs(tmp_path, tiny_model_dir, capsys, case):
    run_case(case, tmp_path, tiny_model_dir, capsys)


def test_the_catalogue_names_each_case_once():
    assert len({c.id for c in CASES}) == len(CASES)
