"""Builds csrc/*.cc just in time with `paddle.utils.cpp_extension.load`, once per machine, and loads it.

The library is built with -O3 -march=native, so it is kept per CPU: in <cache>/kernels/<hash>, the hash over the
source, Paddle's version, the CPU's model and flags, the compiler and its flags (<cache> as for alignment/mkl_path.py:
$ALIGNMENT_CACHE_DIR, else $XDG_CACHE_HOME/alignment, else ~/.cache/alignment). Processes starting together build
once (a file lock); the others load what it built. Without a C++ compiler ($CXX, else c++), on a build that fails,
or on a CUDA build of Paddle nothing is built: `load_kernels` returns None, and the first time says so in one line on
stdout (stderr is kept for a program's one error line); the model code then runs Paddle's own operations. Nothing
is downloaded.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import types
from typing import List, Optional

from alignment import cpu_env, mkl_path

NAME = "alignment_cpu_kernels"
BUILT = "built"  # written once a build finished: later processes register the library without Paddle's `load`
CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
SOURCES = [os.path.join(CSRC, name)
           for name in ("cpu_kernels.cc", "attention_softmax.cc", "decode_matmul.cc", "decode_attention.cc",
                        "decode_layer.cc", "rope.cc")]
HEADERS = [os.path.join(CSRC, name) for name in ("common.h", "panels.h", "attention_row.h")]
# -fopenmp: the kernels' threads are an OpenMP team (common.h parallel_for); no trapping math lets the selects vectorise
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-trapping-math", "-fno-math-errno"]
_state = {"tried": False, "module": None, "why": ""}


def compiler() -> Optional[str]:
    """The C++ compiler's path ($CXX, else c++), or None when there is none."""
    return shutil.which(os.environ.get("CXX") or "c++")


def openmp_link_flags() -> List[str]:
    """The OpenMP runtime the kernels link: Paddle's libiomp5 where Paddle ships it, the one MKL's GEMMs run on, so
    that a kernel's team is the GEMM's threads, still awake (KMP_BLOCKTIME), rather than a second pool contending
    for the cores; else the compiler's own."""
    import paddle

    libs = os.path.join(os.path.dirname(paddle.__file__), "libs")
    if os.path.exists(os.path.join(libs, "libiomp5.so")):
        return [f"-L{libs}", "-liomp5", f"-Wl,-rpath,{libs}"]
    return ["-fopenmp"]


def build_dir(cxx: str) -> str:
    """<cache>/kernels/<hash of what the library depends on>."""
    cpu = cpu_env.cpuinfo_fields()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    digest = hashlib.sha256()
    for path in SOURCES + HEADERS:
        with open(path, "rb") as f:
            digest.update(f.read())
    for part in (importlib.metadata.version("paddlepaddle"), cpu.get("model name", ""), cpu.get("flags", ""),
                 cxx, version, " ".join(CFLAGS + openmp_link_flags())):
        digest.update(part.encode() + b"\0")
    return os.path.join(os.path.dirname(mkl_path.cache_file()), "kernels", digest.hexdigest()[:16])


@contextlib.contextmanager
def _quiet(log_path: str):
    """File descriptors 1 and 2 go to log_path inside the block (the compiler's and setuptools' output)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def _last_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or [""])[-1][:200]


def _build_and_load(cxx: str):
    """The compiled operators (built now unless the cache has them); raises on failure. Paddle's `load` runs a
    setup.py in a child process on every call, built or not (0.7 s a process); once a build of this directory
    finished (its BUILT marker), the library is registered directly instead."""
    from paddle.utils.cpp_extension import load

    where = build_dir(cxx)
    library = os.path.join(where, NAME, f"{NAME}.so")
    finished = lambda: os.path.exists(os.path.join(where, BUILT)) and os.path.exists(library)  # noqa: E731
    if finished():
        return _operators(library)
    os.makedirs(where, exist_ok=True)
    env = {"CC": os.environ.get("CC"), "CXX": os.environ.get("CXX")}
    os.environ["CXX"] = os.environ["CC"] = cxx  # setuptools compiles .cc files with CC
    log = os.path.join(where, "build.log")
    try:
        with mkl_path._locked(os.path.join(where, "build")):
            if finished():  # another process built it while we waited
                return _operators(library)
            with _quiet(log):
                module = load(name=NAME, sources=list(SOURCES), extra_cxx_cflags=list(CFLAGS),
                              extra_ldflags=openmp_link_flags(), build_directory=where)
            open(os.path.join(where, BUILT), "w").close()
            return module
    except Exception as error:  # noqa: BLE001 - any failure of the build means: Paddle's operations instead
        raise RuntimeError(_last_line(log) or str(error).splitlines()[0]) from error
    finally:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _operators(library: str) -> types.SimpleNamespace:
    """The built library's operators, registered with Paddle, each called in eager mode as the module `load`
    generates calls it (the only mode the kernels run in: cpu_kernels' functions are not converted to static)."""
    from paddle import _C_ops
    from paddle.utils.cpp_extension import load_op_meta_info_and_register_op

    def operator(name):
        def call(*args):
            outputs = _C_ops._run_custom_op(name, *args)
            return outputs[0] if len(outputs) == 1 else outputs
        return call

    return types.SimpleNamespace(**{name: operator(name) for name in load_op_meta_info_and_register_op(library)})


def load_kernels():
    """The module of compiled operators, or None (no compiler, a CUDA build, the build failed): tried once per
    process, and a None says why once on stdout."""
    if _state["tried"]:
        return _state["module"]
    _state["tried"] = True
    cxx = compiler()
    if cpu_env.has_cuda_paddle():
        _state["why"] = "a CUDA build of Paddle"
    elif cxx is None:
        _state["why"] = f"no C++ compiler ({os.environ.get('CXX') or 'c++'} not found)"
    else:
        try:
            _state["module"] = _build_and_load(cxx)
        except RuntimeError as error:
            _state["why"] = f"the build failed: {error}"
    if _state["module"] is None:
        # on stdout, as the entry points' other `cpu:` lines: stderr is kept for a program's one error line
        print(f"cpu kernels: not built ({_state['why']}); Paddle's operations instead", flush=True)
    return _state["module"]
