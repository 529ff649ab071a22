"""No command writes over what is already at its output path - a file, a link, a directory that is not empty -
unless told to (`--overwrite`; make_tiny `--force`); what it replaced is what it wrote before (a port file, a tiny
model of its own recipe). The refusal is one line, exit 2, and the existing file is unchanged."""
import os
import subprocess
import sys

import pytest

from alignment.fileio import OutputExists, refuse_to_replace
from tests.helpers import REPO


def test_refuse_to_replace_says_what_is_there(tmp_path):
    (tmp_path / "file").write_text("mine")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "empty").mkdir()
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    for name, kind in (("file", "file"), ("full", "directory"), ("dangling", "file")):
        with pytest.raises(OutputExists, match=rf"{name}: an existing {kind}; give a new path, or --overwrite"):
            refuse_to_replace(str(tmp_path / name), overwrite=False)
        refuse_to_replace(str(tmp_path / name), overwrite=True)
    for free in ("empty", "new"):
        refuse_to_replace(str(tmp_path / free), overwrite=False)
    refuse_to_replace(str(tmp_path / "file"), False, ours=lambda path: open(path).read() == "mine")


def run(*argv):
    return subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("argv", [
    ["tools/export_model.py", "--model", "{model}", "--output", "{target}"],
    ["tools/convert_checkpoint.py", "--input", "{model}", "--output", "{target}"],
    ["tools/merge_lora.py", "--adapter", "{model}", "--output", "{target}"],
    ["tools/predict.py", "--model", "{model}", "--prompt", "hi", "--output", "{target}"],
    ["tools/judge_policy.py", "--model", "{model}", "--output", "{target}"],
    ["tools/plot_run.py", "{model}", "--output", "{target}"],
    ["tools/plot_overoptimization.py", "{model}", "--output", "{target}"],
    ["tools/make_tiny.py", "--output", "{target}"],
    ["tools/reward_server.py", "--judge", "arithmetic", "--port", "0", "--port-file", "{target}"],
], ids=lambda argv: argv[0].split("/")[-1])
def test_an_existing_file_at_the_output_is_refused_and_left_as_it_was(tmp_path, tiny_model_dir, argv):
    target = tmp_path / "precious.txt"
    target.write_text("not yours\n")
    result = run(*[a.format(model=tiny_model_dir, target=target) for a in argv])
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-1500:]
    assert lines[0].startswith(f"error: {target}: an existing file; give a new path"), lines
    assert target.read_text() == "not yours\n"


def test_a_directory_someone_else_filled_is_refused_and_an_overwrite_replaces_it(tmp_path, tiny_model_dir):
    target = tmp_path / "converted"
    target.mkdir()
    (target / "notes.md").write_text("keep me")
    refused = run("tools/convert_checkpoint.py", "--input", tiny_model_dir, "--output", str(target))
    assert refused.returncode == 2 and "an existing directory" in refused.stderr
    assert (target / "notes.md").read_text() == "keep me"
    done = run("tools/convert_checkpoint.py", "--input", tiny_model_dir, "--output", str(target), "--overwrite")
    assert done.returncode == 0, done.stderr[-1500:]
    assert (target / "config.json").exists() and not (target / "notes.md").exists()
