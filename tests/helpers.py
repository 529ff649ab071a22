"""Shared test set-up: the tiny model built once per session by tools/make_tiny.py."""
import contextlib
import json
import os
import socket
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_metrics(output_dir):
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


GUESS = os.path.join(REPO, "examples", "guess_number_env.py")
GRPO_TOOLS = os.path.join(REPO, "config", "tiny", "grpo_tools_argument.json")


def run_args(out, model, estimator, *extra):
    args = [GRPO_TOOLS, "--actor_model_name_or_path", model, "--output_dir", str(out), "--disable_tqdm",
            "--environment", "guess-number", "--environment_args", "{}", "--user_env_modules", GUESS,
            "--reward_funcs", "", "--gold_judge", "", "--max_turns", "3", "--max_new_tokens", "6",
            "--max_length", "128", "--max_trajectory_tokens", "48", "--advantage_estimator", estimator,
            "--num_return_sequences", "2", "--per_device_prompt_batch_size", "2", "--max_steps", "4",
            "--per_device_train_batch_size", "2", "--eval_datasets", "", "--logging_steps", "1",
            "--train_datasets", f"prompt-only:1.0:{REPO}/data/reasoning/basic_arithmetic_train.jsonl"]
    return args + (["--critic_learning_rate", "1e-3"] if estimator == "gae" else []) + list(extra)


def environment_run_args(out, model, environment, environment_args, rows_file, max_turns=3, max_steps=1):
    """run_ppo's arguments for tiny GRPO steps (2 rows x 2 answers, 6 tokens a turn) on an environment's episodes, the
    environment's reward the only one."""
    return [GRPO_TOOLS, "--actor_model_name_or_path", model, "--output_dir", str(out), "--disable_tqdm",
            "--environment", environment, "--environment_args", json.dumps(environment_args),
            "--reward_funcs", "", "--gold_judge", "", "--max_turns", str(max_turns), "--max_new_tokens", "6",
            "--max_length", "512", "--max_trajectory_tokens", "48", "--num_return_sequences", "2",
            "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size", "4", "--max_steps", str(max_steps),
            "--eval_datasets", "", "--logging_steps", "1", "--save_steps", "0",
            "--train_datasets", f"prompt-only:1.0:{rows_file}"]


def episodes_cancelled(episodes, seconds=20.0):
    """Whether each episode task (a library's rollout its adapter left waiting) was cancelled within `seconds` and is
    no longer held by the environments' event loop."""
    from alignment.envs import event_loop

    deadline = time.time() + seconds
    while not all(episode.done() for episode in episodes) and time.time() < deadline:
        time.sleep(0.02)
    return all(episode.cancelled() for episode in episodes) and not set(episodes) & event_loop._tasks


@contextlib.contextmanager
def served_in_thread(app):
    """An ASGI app served by uvicorn on 127.0.0.1 in a daemon thread for the block: yields its base URL."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 30
        while not server.started and time.time() < deadline:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def benchmark_result(script: str, args, results_dir, timeout=600) -> dict:
    """Run benchmarks/`script` with `args`, writing into `results_dir`; -> its one result file, read."""
    import glob
    import subprocess
    import sys

    out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", script), *args, "--results-dir",
                          str(results_dir)], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    path, = glob.glob(os.path.join(str(results_dir), f"{script[len('bench_'):-len('.py')]}_*.json"))
    with open(path, encoding="utf-8") as f:
        return json.load(f)
