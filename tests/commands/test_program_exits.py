"""Every program ends the same way (alignment/exits.py): a script under tools/ or alignment/<stage>/, `python -m
alignment.<stage>` and a console command (alignment.cli, what pyproject's [project.scripts] run) each exit 2 with
one `error:` line on stderr and no traceback for a bad flag and for a missing input file; SIGTERM and SIGINT end a
program with one line and 143 / 130."""
import os
import signal
import subprocess
import sys
import time

import pytest

from alignment import cli
from tests.helpers import REPO

MISSING = "/nonexistent/input"
# every command: (console function, script, argv naming a missing input)
PROGRAMS = [
    ("sft", "alignment/sft/run_sft.py", [MISSING + ".json"]),
    ("rm", "alignment/rm/run_reward.py", [MISSING + ".yaml"]),
    ("ppo", "alignment/ppo/run_ppo.py", [MISSING + ".json"]),
    ("dpo", "alignment/dpo/run_dpo.py", [MISSING + ".json"]),
    ("predict", "tools/predict.py", ["--model", MISSING, "--prompt", "hi"]),
    ("export_model", "tools/export_model.py", ["--model", MISSING, "--output", "{tmp}/out"]),
    ("import_gguf", "tools/import_gguf.py", ["--gguf", MISSING + ".gguf", "--output", "{tmp}/out"]),
    ("convert_checkpoint", "tools/convert_checkpoint.py", ["--input", MISSING, "--output", "{tmp}/out"]),
    ("merge_lora", "tools/merge_lora.py", ["--adapter", MISSING, "--output", "{tmp}/out"]),
    ("generate", "tools/generate.py", ["--model", MISSING, "--prompt", "hi"]),
    ("judge_policy", "tools/judge_policy.py", ["--model", MISSING]),
    ("show_generations", "tools/show_generations.py", [MISSING]),
    ("plot_run", "tools/plot_run.py", [MISSING]),
    ("plot_overoptimization", "tools/plot_overoptimization.py", [MISSING]),
    ("plan_layout", "tools/plan_layout.py", ["--model", MISSING + ".json", "--gpus", "8", "--gpu-memory-gib", "80"]),
    ("reward_server", "tools/reward_server.py", ["--model", MISSING, "--port", "0"]),
    ("make_tiny", "tools/make_tiny.py", ["--data-dir", MISSING, "--output", "{tmp}/out"]),
    ("replay_ledger", "tools/replay_ledger.py", [MISSING]),
    ("check_env", "tools/check_env.py", ["tools", "--rows", MISSING + ".jsonl"]),
    ("serve", "tools/serve.py", ["--model", MISSING, "--port", "0"]),
    ("evaluate", "tools/evaluate.py", ["--model", MISSING, "--task", "basic_arithmetic"]),
    ("tinker_serve", "tools/tinker_serve.py", ["--base-model", "tiny=" + MISSING, "--checkpoints", "{tmp}/ckpt",
                                               "--api-key", "tml-test", "--port", "0"]),
]
STAGE_CONFIGS = {"sft": "sft_argument.json", "rm": "rm_argument.json", "ppo": "ppo_argument.json",
                 "dpo": "dpo_argument.json"}
assert {p[0] for p in PROGRAMS} == {"sft", "rm", "ppo", "dpo", *cli.TOOLS}  # a new command joins this table


def run(argv, timeout=240):
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("ALIGNMENT_DEBUG", None)
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def console(function):
    """How the installed console command starts: `sys.exit(alignment.cli.<function>())`."""
    return ["-c", f"import sys; sys.argv[0] = 'alignment-{function}'; from alignment import cli; "
                  f"sys.exit(cli.{function}())"]


def assert_one_error_line(result, *fragments):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-1500:]
    assert "Traceback" not in result.stderr and all(f in lines[0] for f in fragments), lines


@pytest.mark.parametrize("function, script, argv", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_a_missing_input_is_one_line_and_exit_2_from_the_script_and_the_console_command(tmp_path, function, script,
                                                                                         argv):
    argv = [a.format(tmp=tmp_path) for a in argv]
    for start in ([script], console(function)):
        result = run(start + argv)
        assert_one_error_line(result, "/nonexistent/input")
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("function, script, argv", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_a_bad_flag_is_one_line_and_exit_2(tmp_path, function, script, argv):
    if function in STAGE_CONFIGS:  # a stage reads its argument file first: give it a real one
        argv = [os.path.join("config", "tiny", STAGE_CONFIGS[function])]
    result = run([script, *[a.format(tmp=tmp_path) for a in argv], "--no-such-flag", "1"])
    assert_one_error_line(result)
    assert "no-such-flag" in result.stderr or "no_such_flag" in result.stderr, result.stderr


def test_python_m_and_debug_show_the_same_error_and_debug_adds_the_traceback():
    plain = run(["-m", "alignment.dpo", MISSING + ".json"])
    assert_one_error_line(plain, "/nonexistent/input")
    debug = run(["tools/convert_checkpoint.py", "--input", MISSING, "--output", MISSING + "-out", "--debug"])
    assert debug.returncode == 2 and "Traceback" in debug.stderr and "error: " in debug.stderr


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_a_program_with_one_line(tmp_path, signum, code):
    """A program in its work (the reward server serving) stops with one line, not Paddle's C++ stack dump."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "tools/reward_server.py", "--judge", "arithmetic", "--port", "0",
                             "--port-file", str(port_file)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not port_file.exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-1500:]
        time.sleep(0.1)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err[-1500:]
    assert err.strip().splitlines() == [f"stopped by {signal.Signals(signum).name}"], err[-1500:]


def test_sigterm_mid_training_names_the_step_and_the_intact_checkpoint(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "alignment/sft/run_sft.py", "config/tiny/sft_argument.json",
                             "--model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--max_steps", "400",
                             "--save_steps", "2", "--eval_datasets", "", "--disable_tqdm"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not (out / "latest").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-1500:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert proc.returncode == 143 and len(lines) == 1 and "Traceback" not in err, err[-1500:]
    latest = (out / "latest").read_text().strip()
    assert lines[0].startswith("stopped by SIGTERM at step ")
    assert lines[0].endswith(f"the last complete checkpoint, {out / latest}, is intact (resume_from_checkpoint: auto "
                             "continues from it)"), lines


def test_no_progress_bar_when_the_output_is_not_a_terminal(tmp_path, tiny_model_dir):
    """A stage whose output goes to a file or pipe (CI, nohup) writes one line per logging step, no bar updates."""
    result = run(["alignment/sft/run_sft.py", "config/tiny/sft_argument.json", "--model_name_or_path", tiny_model_dir,
                  "--output_dir", str(tmp_path / "out"), "--max_steps", "3", "--logging_steps", "1",
                  "--eval_datasets", ""])
    assert result.returncode == 0, result.stderr[-1500:]
    assert "\r" not in result.stderr + result.stdout and "it/s" not in result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines() if line.startswith("step ")] == [
        "step 1", "step 2", "step 3"]
