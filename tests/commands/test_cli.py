"""Command-line surface: how a program names itself, the end-of-stage summary, console commands, and the package
metadata that makes them (pyproject.toml against the checkout and requirements.txt)."""
import os
import re
import subprocess
import sys
import tomllib
import types

import pytest

from alignment import cli
from alignment.training.setup import program_name, wall_time, where_to_look
from tests.helpers import REPO


def test_the_usage_line_names_how_the_program_was_started():
    assert program_name("alignment/ppo/run_ppo.py") == "python alignment/ppo/run_ppo.py"
    assert program_name("/x/site-packages/alignment/ppo/__main__.py") == "python -m alignment.ppo"
    assert program_name("/venv/bin/alignment-ppo") == "alignment-ppo"


def test_wall_time_reads_as_hours_minutes_seconds():
    assert wall_time(4.24) == "4.2s"
    assert wall_time(65) == "1m 05s"
    assert wall_time(3725.4) == "1h 02m 05s"


def test_a_stage_ends_with_its_wall_time_and_where_to_look():
    args = types.SimpleNamespace(output_dir="outputs/x", report_to=["visualdl", "tensorboard"], logging_dir=None)
    text = where_to_look(args)
    assert re.match(r"wall time: ([0-9.]+s|\d+m \d\ds|\d+h \d\dm \d\ds)\n", text)  # since the import: any length
    assert "python tools/plot_run.py outputs/x" in text and "visualdl --logdir outputs/x/visualdl" in text
    assert "dashboard: tensorboard --logdir outputs/x/tensorboard" in text
    assert "visualdl" not in where_to_look(types.SimpleNamespace(output_dir="o", report_to=[], logging_dir=None))


def test_a_console_command_exits_0_although_main_returns_its_results(monkeypatch):
    calls = []
    module = types.SimpleNamespace(main=lambda: calls.append(1) or {"eval/loss": 1.0})
    monkeypatch.setitem(sys.modules, "alignment.commands.plot_run", module)
    assert cli.plot_run() == 0 and calls == [1]


def test_every_console_command_names_a_function_of_the_cli_module_and_an_existing_program():
    project = tomllib.load(open(os.path.join(REPO, "pyproject.toml"), "rb"))
    for command, target in project["project"]["scripts"].items():
        module, _, function = target.partition(":")
        assert module == "alignment.cli" and callable(getattr(cli, function)), command
    for name in cli.TOOLS:  # the package's program, and the checkout's script running it
        assert os.path.exists(os.path.join(REPO, "alignment", "commands", name + ".py")), name
        assert os.path.exists(os.path.join(REPO, "tools", name + ".py")), name


def test_the_package_list_covers_every_folder_of_alignment():
    project = tomllib.load(open(os.path.join(REPO, "pyproject.toml"), "rb"))
    listed = set(project["tool"]["setuptools"]["packages"])
    folders = {os.path.relpath(root, REPO).replace(os.sep, ".") for root, _, names in
               os.walk(os.path.join(REPO, "alignment")) if "__init__.py" in names}
    assert "alignment.models.convert" in folders and listed == folders
    assert "package-dir" not in project["tool"]["setuptools"]  # nothing from outside alignment/ is installed


PROJECT_LINES = ("-e .", ".")  # a requirements line that installs the checkout itself


def _names(requirements):
    """The distribution names a requirements list installs, not counting the line installing the project."""
    return {re.split(r"[<>=!~\[ ]", line.strip())[0].lower().replace("_", "-") for line in requirements
            if line.strip() and not line.strip().startswith("#") and line.strip() not in PROJECT_LINES}


def test_requirements_txt_installs_the_core_and_every_extra_but_the_trackers():
    """The trackers' extras (report_to: wandb, mlflow, ...) are each installed when wanted: in neither."""
    from alignment.config.registry import TRACKERS
    from alignment.training import trackers  # noqa: F401 (the built-in trackers register)

    project = tomllib.load(open(os.path.join(REPO, "pyproject.toml"), "rb"))["project"]
    optional = {cls.EXTRA for cls in TRACKERS.classes.values() if cls.EXTRA}
    assert optional and optional <= set(project["optional-dependencies"])
    extras = [req for name, reqs in project["optional-dependencies"].items() if name not in {"all"} | optional
              for req in reqs]
    declared = _names(project["dependencies"] + extras)
    assert _names(open(os.path.join(REPO, "requirements.txt"))) == declared
    assert "paddle-alignment" not in declared  # the `all` extra names the project; the project line installs it
    everything = project["optional-dependencies"]["all"][0]
    assert set(everything.split("[")[1].rstrip("]").split(",")) == \
        set(project["optional-dependencies"]) - {"all"} - optional


def test_requirements_txt_installs_the_project_so_every_documented_command_exists():
    """The README's install (`pip install -r requirements.txt` in the checkout) must give the console commands of
    [project.scripts]: only installing the project does (tests/repo/test_packaging.py installs it into a venv)."""
    lines = [line.strip() for line in open(os.path.join(REPO, "requirements.txt"))]
    assert [line for line in lines if line in PROJECT_LINES] == ["-e ."]
    assert all(not line.startswith("-") for line in lines if line != "-e .")  # no option that would change it


@pytest.mark.parametrize("stage", ["sft", "ppo"])
def test_python_dash_m_runs_a_stage(stage):
    shown = subprocess.run([sys.executable, "-m", f"alignment.{stage}", "--help"], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-500:]
    assert shown.stdout.startswith(f"usage: python -m alignment.{stage} ARGS.{{json,yaml}} [--key value ...]")


def test_relative_paths_are_found_beside_the_argument_file(tmp_path, monkeypatch):
    from alignment.training.setup import paths_beside_the_file

    folder = tmp_path / "experiment"
    (folder / "model").mkdir(parents=True)
    (folder / "prompts.jsonl").write_text("{}\n")
    (tmp_path / "work" / "here.jsonl").parent.mkdir()
    (tmp_path / "work" / "here.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path / "work")
    args = types.SimpleNamespace(model_name_or_path="model", tokenizer_name_or_path=None, lora_path="nowhere",
                                 train_datasets="prompt-only:1.0:prompts.jsonl", eval_datasets="alpaca:0.5:here.jsonl",
                                 output_dir="out")
    paths_beside_the_file(args, str(folder))
    assert args.model_name_or_path == str(folder / "model")
    assert args.train_datasets == [f"prompt-only:1.0:{folder / 'prompts.jsonl'}"]
    assert args.eval_datasets == "alpaca:0.5:here.jsonl"  # found from the working directory: as written
    assert args.lora_path == "nowhere" and args.output_dir == "out"  # missing everywhere / not an input: as written


def test_tool_flags_take_either_spelling():
    from alignment.commands.tool_parser import ToolParser, dashed

    assert dashed(["--max_new_tokens", "8", "--out_dir=a_b", "a_b", "-x"]) == \
        ["--max-new-tokens", "8", "--out-dir=a_b", "a_b", "-x"]
    parser = ToolParser("demo")
    parser.add_argument("--is_rm", action="store_true")
    parser.add_argument("--max-new-tokens", type=int, default=1)
    for argv in (["--is_rm", "--max_new_tokens", "3"], ["--is-rm", "--max-new-tokens=3"]):
        args = parser.parse_args(argv)
        assert args.is_rm and args.max_new_tokens == 3


@pytest.mark.parametrize("name", [*cli.TOOLS, "make_preference_data"])
def test_every_tool_help_has_a_usage_line_and_fits_100_columns(name, capsys):
    import importlib

    module = importlib.import_module(f"alignment.commands.{name}")
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    text = capsys.readouterr().out
    assert done.value.code == 0 and text.startswith("usage: ")
    assert max(len(line) for line in text.splitlines()) <= 100, name


@pytest.mark.parametrize("name", ["make_demo_data", "make_reasoning_data", "predict"])
def test_a_tools_script_shows_its_help_from_the_checkout(name):
    shown = subprocess.run([sys.executable, os.path.join(REPO, "tools", name + ".py"), "--help"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and shown.stdout.startswith(f"usage: {name}.py"), shown.stderr[-500:]
    assert max(len(line) for line in shown.stdout.splitlines()) <= 100, name


def test_tool_help_refills_prose_and_list_items_but_keeps_commands_on_their_lines():
    from alignment.commands.tool_parser import ToolParser, paragraphs

    doc = ("Prose that a writer wrapped\nat 120 columns goes on.\n\n    python tools/x.py --a 1 \\\n"
           "        --b 2\n\n- an item\n  continued\n- next item\n1. numbered\n   more\n")
    assert paragraphs(doc) == [
        ("", "Prose that a writer wrapped at 120 columns goes on."), ("", ""),
        ("    ", "python tools/x.py --a 1 \\"), ("        ", "--b 2"), ("", ""),
        ("", "- an item continued"), ("", "- next item"), ("", "1. numbered more")]
    text = ToolParser("PKU-SafeRLHF " + "word " * 30).format_help()
    assert "PKU-\n" not in text and max(len(line) for line in text.splitlines()) <= 100
