"""Experiment trackers (report_to; docs/trackers.md): a tiny SFT run reports to every tracker whose package is
installed, in its offline / local mode; what each wrote is read back with the tracker's own reader and compared with
metrics.jsonl (values and steps), before and after an exact resume from a checkpoint, which continues the same
tracker run. A tracker whose package is missing is a one-line exit 2 before any work."""
import glob
import importlib.util
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import pytest

from alignment.config.data import DataArguments, ModelArguments
from alignment.config.parser import ArgumentError, ArgumentParser
from alignment.config.training import TrainingArguments
from alignment.training.logger import read_series
from alignment.training.trackers.files import visualdl_tag
from tests.helpers import REPO

SFT = os.path.join(REPO, "alignment", "sft", "run_sft.py")
PACKAGES = {"visualdl": ("visualdl",), "tensorboard": ("tensorboardX",), "mlflow": ("mlflow", "sqlalchemy"),
            "wandb": ("wandb",), "trackio": ("trackio",), "swanlab": ("swanlab", "swanboard")}
INSTALLED = [name for name, modules in PACKAGES.items()
             if all(importlib.util.find_spec(module) is not None for module in modules)]
TIMED = ("time/", "memory/", "tokens_per_sec")  # measured, not computed: a resumed run's differ from the first's


def parse(values):
    return ArgumentParser(ModelArguments, DataArguments, TrainingArguments).parse_dict(
        {"model_name_or_path": "m", "train_datasets": "x", **values})[2]


def test_report_to_reads_lists_strings_and_paddlenlp_and_hf_spellings():
    assert parse({}).report_to == ["visualdl"]
    assert parse({"report_to": None}).report_to == ["visualdl"]  # PaddleNLP's null default
    assert parse({"report_to": "wandb, TensorBoard"}).report_to == ["wandb", "tensorboard"]
    assert parse({"report_to": "wandb tensorboard"}).report_to == ["wandb", "tensorboard"]
    assert parse({"report_to": ["mlflow", "trackio"]}).report_to == ["mlflow", "trackio"]
    assert parse({"report_to": '["swanlab"]'}).report_to == ["swanlab"]  # JSON on the command line
    assert parse({"report_to": "none"}).report_to == [] and parse({"report_to": ["none"]}).report_to == []
    assert parse({"report_to": "all"}).report_to == ["all"]
    with pytest.raises(ArgumentError, match="'none' and 'all' stand alone"):
        parse({"report_to": ["all", "wandb"]})
    with pytest.raises(ArgumentError, match="wandb_mode"):
        parse({"wandb_mode": "sometimes"})
    train = parse({"wandb_project": "rlhf", "run_name": "first", "logging_dir": "logs"})  # PaddleNLP / HF keys
    assert (train.project, train.run_name, train.logging_dir) == ("rlhf", "first", "logs")


def sft(out, *extra, env=None):
    return subprocess.run([sys.executable, SFT, os.path.join(REPO, "config", "tiny", "sft_argument.json"),
                           "--output_dir", str(out), "--disable_tqdm", "--train_datasets",
                           f"alpaca:1.0:{REPO}/data/sft/train.jsonl", "--eval_datasets", "", "--max_steps", "6",
                           "--logging_steps", "1", "--save_steps", "3", "--per_device_train_batch_size", "4",
                           *extra], env=env, capture_output=True, text=True, cwd=REPO, timeout=600)


def test_a_tracker_whose_package_is_missing_is_one_line_and_exit_2_before_any_work(tmp_path, tiny_model_dir):
    blocked = tmp_path / "blocked"  # a module of that name that fails to import, ahead of site-packages
    blocked.mkdir()
    (blocked / "wandb.py").write_text("raise ImportError('blocked by the test')\n")
    env = {**os.environ, "PYTHONPATH": str(blocked)}
    run = sft(tmp_path / "out", "--model_name_or_path", tiny_model_dir, "--report_to", "visualdl,wandb", env=env)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "tracker 'wandb' needs the 'wandb' module" in lines[0], lines
    assert "blocked by the test" in lines[0] and "pip install 'paddle-alignment[wandb]'" in lines[0]
    assert not (tmp_path / "out").exists()  # before any work: not even the output directory
    unknown = sft(tmp_path / "out", "--model_name_or_path", tiny_model_dir, "--report_to", "wandb,nosuch")
    assert unknown.returncode == 2 and "key 'report_to' must be one of" in unknown.stderr
    assert "got 'nosuch'" in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1


# --- reading back what each tracker wrote ---------------------------------------------------------------------------

def wandb_records(path):
    """The records of a .wandb file (wandb's LevelDB-style log: a 7-byte header, then 32 KiB blocks of records, each
    with a 7-byte header: CRC, length, type FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, chunk = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768  # a block's tail too short for a header is padding
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        chunk, pos = chunk + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def read_wandb(out, env):
    """[(run id, config keys, {metric: [(step, value)]}) for each offline-run directory, oldest first]."""
    runs = []
    for path in sorted(glob.glob(os.path.join(out, "wandb", "offline-run-*", "run-*.wandb"))):
        run_id, config, series = None, set(), {}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
            elif kind == "config":
                config |= {item.key for item in record.config.update}
            elif kind == "history":
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)
                    if not key.startswith("_"):
                        series.setdefault(key, []).append((record.history.step.num, float(json.loads(item.value_json))))
        runs.append((run_id, config, series))
    return runs


def read_tensorboard(out, env):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(out, "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()  # purges what a SessionLog START (purge_step) says a resumed run replaces
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def read_mlflow(out, env):
    """[(run id, parameters, {metric: [(step, value)]}) for each run of the local store]."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{os.path.join(out, 'mlflow.db')}")
    experiment = client.get_experiment_by_name("alignment")
    return [(run.info.run_id, run.data.params,
             {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
              for key in run.data.metrics}) for run in client.search_runs([experiment.experiment_id])]


def read_trackio(out, env):
    """{run name: {metric: [(step, value)]}} of the project (read in a process that sees the test's TRACKIO_DIR)."""
    code = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; print(json.dumps({r: "
            "[S.get_logs('alignment', r), S.get_run_config('alignment', r)] for r in S.get_runs('alignment')}))")
    logs = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True).stdout.strip().splitlines()[-1])
    return {run: ({key: [(row["step"], row[key]) for row in rows if key in row]
                   for key in {k for row in rows for k in row} - {"step", "timestamp"}}, config)
            for run, (rows, config) in logs.items()}


def read_visualdl(out, env):
    from visualdl import LogReader

    series = {}
    for path in sorted(glob.glob(os.path.join(out, "visualdl", "vdlrecords.*"))):
        reader = LogReader(file_path=path)
        for tag in reader.get_tags().get("scalar", []):
            series.setdefault(tag, []).extend((r.id, r.value) for r in reader.get_data("scalar", tag))
    return series


def read_swanlab(out, env):
    """[(experiment name, {metric: [(step, value)]})] from SwanLab's local dashboard store (swanlog/runs.swanlab:
    which metric is in which folder of an experiment's run directory) and the metric files there."""
    import sqlite3

    store = sqlite3.connect(os.path.join(out, "swanlog", "runs.swanlab"))
    runs = []
    for experiment, run_dir, name in store.execute("select id, run_id, name from experiment order by id").fetchall():
        series = {}
        for tag, folder in store.execute("select name, folder from tag where experiment_id = ? and system = 0",
                                         (experiment,)).fetchall():
            for path in sorted(glob.glob(os.path.join(out, "swanlog", run_dir, "logs", folder, "*.log"))):
                series.setdefault(tag, []).extend((row["index"], row["data"]) for row in map(json.loads, open(path)))
        runs.append((name, series))
    store.close()
    return runs


READERS = {"swanlab": read_swanlab, "visualdl": read_visualdl, "tensorboard": read_tensorboard, "mlflow": read_mlflow,
           "wandb": read_wandb,
           "trackio": read_trackio}


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, tiny_model_dir):
    """A 6-step SFT run reporting to every installed tracker, read back; then resumed from its checkpoint-3 (as
    after a kill past step 6 before the end) and read back again. {'fresh' / 'resumed': {tracker: reading}}."""
    names = [name for name in INSTALLED if name in READERS]
    root = tmp_path_factory.mktemp("trackers")
    out = root / "run"
    chosen_modes = ("WANDB_MODE", "MLFLOW_TRACKING_URI", "SWANLAB_MODE")  # the defaults are what is tested
    env = {key: value for key, value in os.environ.items() if key not in chosen_modes}
    env.update(TRACKIO_DIR=str(root / "trackio"), WANDB_CONFIG_DIR=str(root / "wandb-config"),
               WANDB_CACHE_DIR=str(root / "wandb-cache"), WANDB_DATA_DIR=str(root / "wandb-data"))
    readings = {}
    for phase, extra in (("fresh", ()), ("resumed", ("--resume_from_checkpoint", str(out / "checkpoint-3")))):
        run = sft(out, "--model_name_or_path", tiny_model_dir, "--report_to", ",".join(names), *extra, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        readings[phase] = {name: READERS[name](str(out), env) for name in names}
        readings[phase]["metrics"] = {key: [(s, v) for s, v in values if math.isfinite(v)]
                                      for key, values in read_series(str(out / "metrics.jsonl")).items()}
        readings[phase]["stdout"] = run.stdout
        shutil.copy(out / "metrics.jsonl", root / f"{phase}.jsonl")
    state = out / "trackers.json"  # only trackers with run ids of their own keep one (VisualDL, TensorBoard: none)
    assert state.exists() == bool(set(names) - {"visualdl", "tensorboard"}), names
    readings["state"] = json.load(open(state)) if state.exists() else {}
    return readings


def same_series(written, expected, keys=None):
    keys = keys if keys is not None else expected
    for key in keys:
        assert [s for s, _ in written[key]] == [s for s, _ in expected[key]], key
        assert [v for _, v in written[key]] == pytest.approx([v for _, v in expected[key]], rel=1e-6), key


def untimed(series):
    return [key for key in series if not key.startswith(TIMED)]


def need(name):
    if name not in INSTALLED:
        pytest.skip(f"{' / '.join(PACKAGES[name])} not installed (pip install 'paddle-alignment[{name}]')")


def test_tensorboard_holds_every_row_once_with_the_resumed_values(tracked):
    need("tensorboard")
    pytest.importorskip("tensorboard", reason="the tensorboard package reads the event files")
    for phase in ("fresh", "resumed"):
        metrics = tracked[phase]["metrics"]
        board = tracked[phase]["tensorboard"]
        assert set(board) == {visualdl_tag(key) for key in metrics}
        same_series({key: board[visualdl_tag(key)] for key in metrics}, metrics)  # purge_step: steps 4-6 once


def test_mlflow_continues_the_same_run_and_holds_each_step_once(tracked):
    need("mlflow")
    fresh, resumed = tracked["fresh"]["mlflow"], tracked["resumed"]["mlflow"]
    assert len(fresh) == 1 and [run[0] for run in resumed] == [fresh[0][0]] == [tracked["state"]["mlflow"]["run_id"]]
    same_series(fresh[0][2], tracked["fresh"]["metrics"])
    metrics = tracked["resumed"]["metrics"]
    same_series(resumed[0][2], metrics, untimed(metrics))  # steps 4-6 the stopped run logged are not sent twice
    assert [s for s, _ in resumed[0][2]["tokens_per_sec"]] == [1, 2, 3, 4, 5, 6]
    assert resumed[0][1]["learning_rate"] == "0.003" and resumed[0][1]["report_to"].startswith("['")


def test_wandb_offline_resumes_the_same_run_id(tracked):
    need("wandb")
    fresh, resumed = tracked["fresh"]["wandb"], tracked["resumed"]["wandb"]
    run_id = tracked["state"]["wandb"]["id"]
    assert [run[0] for run in fresh] == [run_id] and [run[0] for run in resumed] == [run_id, run_id]
    same_series(fresh[0][2], tracked["fresh"]["metrics"])
    assert {"learning_rate", "report_to"} <= fresh[0][1] and "learning_rate" in resumed[1][1]
    metrics = tracked["resumed"]["metrics"]
    after = {key: [(s, v) for s, v in values if s > 3] for key, values in metrics.items()}
    same_series(resumed[1][2], after)  # the resumed part: steps 4-6 as metrics.jsonl now holds them
    same_series(resumed[0][2], metrics, untimed(metrics))


def test_trackio_continues_the_run_of_the_same_name(tracked):
    need("trackio")
    fresh, resumed = tracked["fresh"]["trackio"], tracked["resumed"]["trackio"]
    assert list(fresh) == list(resumed) == ["run"]
    same_series(fresh["run"][0], tracked["fresh"]["metrics"])
    metrics = tracked["resumed"]["metrics"]
    same_series(resumed["run"][0], metrics, untimed(metrics))
    assert [s for s, _ in resumed["run"][0]["loss"]] == [1, 2, 3, 4, 5, 6]
    assert fresh["run"][1]["learning_rate"] == 0.003 and fresh["run"][1]["report_to"][0] == "visualdl"


def test_swanlab_local_mode_gets_the_rows_and_a_resume_is_a_second_experiment(tracked):
    need("swanlab")
    fresh, resumed = tracked["fresh"]["swanlab"], tracked["resumed"]["swanlab"]
    assert [name for name, _ in fresh] == ["run"] and len(resumed) == 2
    same_series(fresh[0][1], tracked["fresh"]["metrics"])
    metrics = tracked["resumed"]["metrics"]
    same_series(resumed[1][1], {key: [(s, v) for s, v in values if s > 3] for key, values in metrics.items()})


def test_visualdl_gets_the_same_rows_and_each_dashboard_is_named(tracked):
    need("visualdl")
    metrics = tracked["fresh"]["metrics"]
    same_series({key: tracked["fresh"]["visualdl"][visualdl_tag(key)] for key in metrics}, metrics)
    assert tracked["resumed"]["metrics"]["loss"] == tracked["fresh"]["metrics"]["loss"]  # an exact resume
    assert "dashboard: visualdl --logdir" in tracked["fresh"]["stdout"]
    if "tensorboard" in INSTALLED:
        assert "dashboard: tensorboard --logdir" in tracked["fresh"]["stdout"]


def test_the_fan_out_sends_finite_numbers_and_histograms(tmp_path):
    pytest.importorskip("tensorboardX")
    pytest.importorskip("tensorboard", reason="the tensorboard package reads the event files")
    from alignment.training.trackers import TrackerFanOut

    trackers = TrackerFanOut(parse({"report_to": "tensorboard", "output_dir": str(tmp_path)}), {"seed": 1})
    trackers.open(None)
    trackers.log(2, {"step": 2, "loss": 0.5, "note": "text", "bad": float("nan"), "flag": True, "lengths": [1, 2]})
    trackers.log_histogram("eval/chosen_scores", [0.25, 0.5, 2.0], 2)
    trackers.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    assert events.Tags()["scalars"] == ["train/loss"] and [(e.step, e.value) for e in events.Scalars("train/loss")] \
        == [(2, 0.5)]
    histogram = events.Histograms("eval/chosen_scores")
    assert [h.step for h in histogram] == [2] and histogram[0].histogram_value.num == 3
    assert histogram[0].histogram_value.sum == pytest.approx(2.75)
    assert "arguments/text_summary" in events.Tags()["tensors"]  # the run's arguments, as a text entry


def test_the_docs_example_continues_the_same_tensorboard_and_mlflow_runs(tmp_path, tiny_model_dir):
    """docs/trackers.md's example: 4 tiny SFT steps, then the same run continued from checkpoint-2."""
    from docsgen.runnable import block_on

    for module in ("tensorboardX", "tensorboard", "mlflow", "sqlalchemy", "alembic"):
        pytest.importorskip(module)
    block = block_on('trackers.md', "tests/training/test_trackers.py")
    work = tmp_path / "work"
    shutil.copytree(tiny_model_dir, work / "checkpoints" / "tiny")
    for name in ("alignment", "config", "data", "tools"):
        os.symlink(os.path.join(REPO, name), work / name)
    env = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.script], cwd=work, capture_output=True, text=True,
                          timeout=900, env={**env, "PYTHONPATH": str(work)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = str(work / "outputs" / "sft-tracked")
    metrics = {key: [(s, v) for s, v in values if math.isfinite(v)]
               for key, values in read_series(os.path.join(out, "metrics.jsonl")).items()}
    assert [s for s, _ in metrics["loss"]] == [1, 2, 3, 4] and [s for s, _ in metrics["eval/loss"]] == [4]
    board = read_tensorboard(out, env)
    same_series({key: board[visualdl_tag(key)] for key in metrics}, metrics)
    runs = read_mlflow(out, env)
    assert [run[0] for run in runs] == [json.load(open(os.path.join(out, "trackers.json")))["mlflow"]["run_id"]]
    same_series(runs[0][2], metrics, untimed(metrics))
    assert "dashboard: mlflow ui --backend-store-uri sqlite:///" in done.stdout


def test_a_damaged_trackers_json_starts_new_tracker_runs_with_a_line_saying_so(tmp_path, capsys):
    pytest.importorskip("tensorboardX")
    from alignment.training.trackers import TrackerFanOut

    (tmp_path / "trackers.json").write_text('{"mlflow": {"run_id": "abc"')  # cut short by a full disk
    trackers = TrackerFanOut(parse({"report_to": "tensorboard", "output_dir": str(tmp_path)}))
    trackers.open(resume_step=3)
    trackers.close()
    assert "trackers.json is not the trackers' JSON object of run ids: the trackers start new runs" in \
        capsys.readouterr().out
    assert os.listdir(tmp_path / "tensorboard")
