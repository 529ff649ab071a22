"""Nothing we load runs code: `.pdparams` files go through a restricted unpickler (alignment/models/pdparams.py),
weight indexes name only files beside them, and no module of the package, its tools or benchmarks calls a loader
that can run what it reads. A crafted PaddleNLP checkpoint is refused, with the file named, through every entry
point that takes a model directory."""
import ast
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest

from alignment.models import LlamaForCausalLM
from alignment.models.pdparams import read_state_dict
from alignment.models.score_model import ScoreModel
from alignment.ppo import run_ppo
from tests.helpers import REPO

SCANNED = ("alignment", "tools", "benchmarks")
UNPICKLER = os.path.join("alignment", "models", "pdparams.py")  # the one module allowed to import pickle
CODE_RUNNING_MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "UniqueKeyLoader"}  # UniqueKeyLoader: config/parser.py's SafeLoader


class RunsCommand:
    """A pickle payload: unpickling it calls os.system, which would create the file it names."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def _python_files():
    for top in SCANNED:
        for root, _, names in os.walk(os.path.join(REPO, top)):
            for name in names:
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(root, name), REPO)


def _call_name(node: ast.Call) -> str:
    parts, func = [], node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def _unsafe_uses(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            yield from (f"import {n}" for n in names if n.split(".")[0] in CODE_RUNNING_MODULES)
        if not isinstance(node, ast.Call):
            continue
        name, keywords = _call_name(node), {k.arg: k.value for k in node.keywords}
        if name in ("eval", "exec", "compile", "__import__", "paddle.load", "torch.load", "yaml.unsafe_load",
                    "yaml.full_load", "yaml.unsafe_load_all", "jsonpickle.decode"):
            yield name
        if name.endswith("np.load") or name.endswith("numpy.load"):
            if isinstance(keywords.get("allow_pickle"), ast.Constant) and keywords["allow_pickle"].value:
                yield f"{name}(allow_pickle=True)"
        if name in ("yaml.load", "yaml.load_all"):
            loader = keywords.get("Loader") or (node.args[1] if len(node.args) > 1 else None)
            loader_name = loader.attr if isinstance(loader, ast.Attribute) else getattr(loader, "id", None)
            if loader_name not in SAFE_YAML_LOADERS:
                yield f"{name}(Loader={loader_name})"


def test_no_module_calls_a_loader_that_can_run_code():
    found = []
    for path in _python_files():
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        found += [f"{path}: {use}" for use in _unsafe_uses(tree) if not (path == UNPICKLER and use == "import pickle")]
    assert found == []


def test_the_scan_catches_each_kind_of_unsafe_call():
    source = ("import pickle\nimport yaml, numpy as np, paddle\npaddle.load('x')\nyaml.load(t, Loader=yaml.Loader)\n"
              "yaml.load(t, yaml.SafeLoader)\nnp.load('a', allow_pickle=True)\nnp.load('b')\neval(s)\nm.eval()\n")
    assert list(_unsafe_uses(ast.parse(source))) == [
        "import pickle", "paddle.load", "yaml.load(Loader=Loader)", "np.load(allow_pickle=True)", "eval"]


def crafted_checkpoint(model_dir, tmp_path, marker, name="crafted"):
    """The tiny model's directory with its weights replaced by a PaddleNLP-style pdparams whose unpickling would run
    `touch marker` (PaddleNLP checkpoints are detected by that file and preferred)."""
    path = tmp_path / name
    shutil.copytree(model_dir, path)
    os.remove(path / "model.safetensors")
    with open(path / "model_state.pdparams", "wb") as f:
        pickle.dump({"llama.norm.weight": RunsCommand(marker)}, f, protocol=4)
    return path


def test_paddle_saved_state_dicts_read_as_paddle_load_reads_them(tmp_path):
    state = {"w": paddle.randn([3, 4]), "b": paddle.to_tensor([1.5, -2.0]).astype("bfloat16"),
             "ids": paddle.arange(5, dtype="int64")}
    file = str(tmp_path / "model_state.pdparams")
    paddle.save(state, file)
    ours, reference = read_state_dict(file), paddle.load(file)  # paddle.load: on a file this test wrote
    assert sorted(ours) == sorted(state)
    for name, tensor in reference.items():
        assert paddle.to_tensor(ours[name]).dtype == tensor.dtype
        np.testing.assert_array_equal(ours[name], np.array(tensor))


def test_big_parameter_slices_are_joined_and_tuples_unwrapped(tmp_path):
    """Pickle protocol 2/3 saves split arrays over 1 GiB into slices; paddle 2.1 saved (name, array) tuples."""
    full = np.arange(12, dtype="float32").reshape(3, 4)
    state = {"w@@.0": full.ravel()[:7], "w@@.1": full.ravel()[7:], "v": ("linear_0.b_0", np.ones(2, "float32")),
             "UnpackBigParamInfor@@": {"w": {"OriginShape": (3, 4), "slices": ["w@@.0", "w@@.1"]}},
             "StructuredToParameterName@@": {"w": "linear_0.w_0"}}
    file = tmp_path / "old.pdparams"
    file.write_bytes(pickle.dumps(state, protocol=2))
    out = read_state_dict(str(file))
    assert sorted(out) == ["v", "w"]
    np.testing.assert_array_equal(out["w"], full)
    np.testing.assert_array_equal(out["v"], np.ones(2, "float32"))


class CallsNdarray:
    def __reduce__(self):
        return np.ndarray, ((1 << 40,), "float32")


@pytest.mark.parametrize("payload, message", [
    (lambda marker: RunsCommand(marker), "asks to call posix.system"),
    (lambda marker: {"w": RunsCommand(marker)}, "asks to call posix.system"),
    (lambda marker: {"w": np.array([RunsCommand(marker)], dtype=object)}, "array of Python objects"),
    (lambda marker: {"w": CallsNdarray()}, "calls numpy.ndarray directly"),
    (lambda marker: {"w": "text"}, "entry 'w' is a str"),
    (lambda marker: [np.ones(2)], r"not a Paddle state dict \(a list\)"),
])
def test_crafted_pickles_are_refused_without_running_anything(tmp_path, payload, message):
    marker = tmp_path / "pwned"
    file = tmp_path / "model_state.pdparams"
    file.write_bytes(pickle.dumps(payload(marker), protocol=4))
    with pytest.raises(ValueError, match=message) as err:
        read_state_dict(str(file))
    assert str(err.value).startswith(f"{file}: ") and not marker.exists()


@pytest.mark.parametrize("cls", [LlamaForCausalLM, ScoreModel])
def test_from_pretrained_refuses_a_crafted_paddlenlp_checkpoint(tmp_path, tiny_model_dir, cls):
    marker = tmp_path / "pwned"
    path = crafted_checkpoint(tiny_model_dir, tmp_path, marker)
    with pytest.raises(ValueError, match=r"model_state\.pdparams: refused: it asks to call posix\.system"):
        cls.from_pretrained(str(path))
    assert not marker.exists()


@pytest.mark.parametrize("index_name, target", [
    ("model.safetensors.index.json", "../outside.safetensors"),
    ("model.safetensors.index.json", "/etc/passwd"),
    ("model.safetensors.index.json", "model_state.pdparams"),  # another reader's kind of file
    ("model_state.pdparams.index.json", "sub/model_state.pdparams"),
])
def test_an_index_may_only_name_files_beside_it(tmp_path, tiny_model_dir, index_name, target):
    path = tmp_path / "model"
    shutil.copytree(tiny_model_dir, path)
    (tmp_path / "outside.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    os.remove(path / "model.safetensors")
    (path / index_name).write_text(json.dumps({"weight_map": {"model.norm.weight": target}}))
    with pytest.raises(ValueError, match=rf"{index_name}: tensor 'model.norm.weight' is mapped to"):
        LlamaForCausalLM.from_pretrained(str(path))


def run_tool(*argv, cwd=REPO):
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_convert_checkpoint_refuses_a_crafted_checkpoint(tmp_path, tiny_model_dir):
    marker = tmp_path / "pwned"
    path = crafted_checkpoint(tiny_model_dir, tmp_path, marker)
    out = tmp_path / "converted"
    result = run_tool("tools/convert_checkpoint.py", "--input", str(path), "--output", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "posix.system" in result.stderr
    assert not marker.exists() and not out.exists()


def test_merge_lora_and_the_reward_server_refuse_a_crafted_base(tmp_path, tiny_model_dir):
    marker = tmp_path / "pwned"
    path = crafted_checkpoint(tiny_model_dir, tmp_path, marker)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "base_model_name_or_path":
        str(path), "task_type": "CAUSAL_LM"}))
    out = tmp_path / "merged"
    merged = run_tool("tools/merge_lora.py", "--adapter", str(adapter), "--output", str(out))
    served = run_tool("tools/reward_server.py", "--model", str(path), "--port", "0")
    for result in (merged, served):
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert "model_state.pdparams" in result.stderr
    assert not marker.exists() and not out.exists()


@pytest.mark.parametrize("key", ["--actor_model_name_or_path", "--reward_model_name_or_path",
                                 "--reward_critic_model_name_or_path"])
def test_ppo_refuses_a_crafted_actor_reward_or_critic(tmp_path, tiny_model_dir, tiny_reward_dir, key, capsys):
    marker = tmp_path / "pwned"
    path = str(crafted_checkpoint(tiny_model_dir, tmp_path, marker))
    models = {"--actor_model_name_or_path": tiny_model_dir, "--reward_model_name_or_path": tiny_reward_dir,
              "--reward_critic_model_name_or_path": tiny_reward_dir, key: path}
    argv = [os.path.join(REPO, "config", "tiny", "ppo_argument.json"), "--output_dir", str(tmp_path / "out"),
            "--max_steps", "1", "--disable_tqdm",
            *[x for pair in models.items() for x in pair]]
    with pytest.raises(SystemExit) as stop:
        run_ppo.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "model_state.pdparams: refused" in err and err.strip().count("\n") == 0
    assert not marker.exists() and not (tmp_path / "out").exists()
