"""Which of MKL's code paths an AMD CPU runs fastest: measured once per CPU, kept in a small cache file.

Paddle's CPU wheel bundles MKL, which runs generic code on AMD CPUs unless MKL_DEBUG_CPU_TYPE names one of its
paths: 5 (AVX2) or 7 (AVX-512, Skylake-SP). A CPU family does not decide which is faster. Zen 5 runs 512-bit FMAs at
full width, and 7 doubled fp32 GEMM there. Zen 4 splits them in two, yet 7 still made its decode GEMM (8 x 576 x
1536) 1.7-1.9x faster and its training GEMMs 3-10% faster. So where an AMD CPU has the instructions of both paths,
both are timed on GEMMs of the shapes that matter: decode at batch 8, and a training step's forward, input-gradient
and weight-gradient products. MKL reads the variable once, when it loads, so each path runs in its own child
process. The child loads Paddle's bundled libmklml_intel.so through ctypes, without importing paddle, and takes
about a second. The path with the higher geometric mean of GFLOP/s over the shapes is kept, keyed by vendor,
family, model, the CPU's flags and Paddle's version (a new wheel may bundle another MKL). A path whose probe dies
(SIGILL: its instructions are missing) is not chosen.

The cache is `mkl_paths.json` in $ALIGNMENT_CACHE_DIR, else $XDG_CACHE_HOME/alignment, else ~/.cache/alignment.
`python -m alignment.cpu_env` measures again, prints the figures and replaces this CPU's entry.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
from typing import Callable, Dict, List, Optional

AVX2_PATH = ("avx2", "fma")
AVX512_PATH = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")  # what MKL's Skylake-SP path executes
PATH_ISA = {"7": AVX512_PATH, "5": AVX2_PATH}  # MKL_DEBUG_CPU_TYPE -> the flags its code needs
# name -> (m, k, n, A transposed, B transposed): a Linear's forward x @ W, its input gradient dy @ W^T and its
# weight gradient x^T @ dy, at SmolLM2-135M's sizes (hidden 576, intermediate 1536)
SHAPES = {"decode 8x576x1536": (8, 576, 1536, False, False), "decode 8x1536x576": (8, 1536, 576, False, False),
          "train 1024x576x1536": (1024, 576, 1536, False, False),
          "train grad-input 1024x1536x576": (1024, 1536, 576, False, True),
          "train grad-weight 576x1024x1536": (576, 1024, 1536, True, False)}
CACHE_FILE = "mkl_paths.json"
PROBE_TIMEOUT = 120.0  # seconds a probe may take (it takes about one)
Figures = Dict[str, Dict[str, float]]  # path -> shape name -> GFLOP/s

PROBE = r"""
import ctypes, json, os, sys, time
libs, shapes, seconds = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
ctypes.CDLL(os.path.join(libs, "libiomp5.so"), mode=ctypes.RTLD_GLOBAL)  # MKL's OpenMP runtime; no rpath finds it
sgemm = ctypes.CDLL(os.path.join(libs, "libmklml_intel.so")).cblas_sgemm
sgemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
out = {}
for name, (m, k, n, ta, tb) in shapes.items():
    a, b, c = (ctypes.c_float * (m * k))(), (ctypes.c_float * (k * n))(), (ctypes.c_float * (m * n))()
    ctypes.memset(a, 0x3F, ctypes.sizeof(a)); ctypes.memset(b, 0x3F, ctypes.sizeof(b))  # every float 0.747
    args = (ROW_MAJOR, TRANS if ta else NO_TRANS, TRANS if tb else NO_TRANS, m, n, k, 1.0,
            a, m if ta else k, b, k if tb else n, 0.0, c, n)
    sgemm(*args)
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter(); sgemm(*args); best = min(best, time.perf_counter() - t)
    out[name] = 2 * m * n * k / best / 1e9
print(json.dumps(out))
"""


def possible_paths(cpu: Dict[str, str]) -> List[str]:
    """The MKL paths an AMD CPU described by these /proc/cpuinfo fields can take, widest first ([] elsewhere: on
    Intel MKL dispatches itself, and 5 there halves fp32 GEMM)."""
    if cpu.get("vendor_id") != "AuthenticAMD":
        return []
    flags = set(cpu.get("flags", "").split())
    return [path for path, isa in PATH_ISA.items() if flags.issuperset(isa)]


def faster(figures: Figures) -> str:
    """The path with the highest geometric mean of GFLOP/s over the shapes every path was measured on."""
    shapes = sorted(set.intersection(*(set(shape_figures) for shape_figures in figures.values())))
    return max(figures, key=lambda path: sum(math.log(figures[path][s]) for s in shapes))


def mkl_library_dir() -> Optional[str]:
    """Paddle's `libs` directory holding libmklml_intel.so, found without importing paddle (None if absent)."""
    spec = importlib.util.find_spec("paddle")
    if spec is None or not spec.submodule_search_locations:
        return None
    libs = os.path.join(list(spec.submodule_search_locations)[0], "libs")
    return libs if os.path.exists(os.path.join(libs, "libmklml_intel.so")) else None


def measure(paths: List[str], rounds: int = 2, seconds: float = 0.1) -> Figures:
    """GFLOP/s of each path at SHAPES on one MKL thread, the best of `rounds` interleaved child processes; a path
    whose probe fails is left out."""
    libs = mkl_library_dir()
    figures: Figures = {}
    if libs is None:
        return figures
    failed = set()
    for _ in range(rounds):
        for path in paths:
            if path in failed:
                continue
            measured = _probe(path, libs, seconds)
            if measured is None:
                failed.add(path)
                figures.pop(path, None)
                continue
            for shape, gflops in measured.items():
                kept = figures.setdefault(path, {})
                kept[shape] = round(max(kept.get(shape, 0.0), gflops), 1)
    return figures


def _probe(path: str, libs: str, seconds: float) -> Optional[Dict[str, float]]:
    """One child's GFLOP/s per shape under MKL_DEBUG_CPU_TYPE=path; None when it dies, hangs or prints no figures."""
    env = {**os.environ, "MKL_DEBUG_CPU_TYPE": path, "MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-I", "-c", PROBE, libs, json.dumps(SHAPES), str(seconds)],
                              env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT)
        measured = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    if not isinstance(measured, dict) or set(measured) != set(SHAPES) or not all(
            isinstance(v, (int, float)) and v > 0 for v in measured.values()):
        return None
    return {shape: float(gflops) for shape, gflops in measured.items()}


def cpu_key(cpu: Dict[str, str]) -> str:
    """What the choice depends on: vendor, family, model, the flags (a VM may hide some) and Paddle's version."""
    try:
        paddle_version = importlib.metadata.version("paddlepaddle")
    except importlib.metadata.PackageNotFoundError:
        paddle_version = "none"
    flags = hashlib.sha256(" ".join(sorted(cpu.get("flags", "").split())).encode()).hexdigest()[:12]
    return (f"{cpu.get('vendor_id', '')} family {cpu.get('cpu family', '')} model {cpu.get('model', '')} "
            f"flags {flags} paddle {paddle_version}")


def cache_file() -> str:
    root = os.environ.get("ALIGNMENT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "alignment")
    return os.path.join(root, CACHE_FILE)


def read_cache(path: str) -> Dict[str, dict]:
    """The cache's entries; {} for a missing, unreadable or malformed file (it is measured again and rewritten)."""
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


@contextlib.contextmanager
def _locked(path: str):
    """Holds an exclusive lock beside the cache, so processes starting together (the ranks of one host) measure
    once and the others read the result; without a writable directory nothing is locked."""
    try:
        import fcntl

        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path + ".lock", "a")
    except (ImportError, OSError):
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _write_cache(path: str, entries: Dict[str, dict]) -> None:
    """Replace the file whole (a temp file renamed over it), or leave it as it was when that fails."""
    try:
        handle, temp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def measured_choice(cpu: Dict[str, str], paths: List[str], remeasure: bool = False,
                    measure_paths: Callable[[List[str]], Figures] = measure) -> str:
    """The faster of `paths` on this CPU: from the cache, or measured now and kept. When no probe runs (no MKL
    library found) the narrowest path is returned and nothing is kept, so the next start tries again."""
    path, key = cache_file(), cpu_key(cpu)
    entry = read_cache(path).get(key)
    if not remeasure and isinstance(entry, dict) and entry.get("path") in paths:
        return entry["path"]
    with _locked(path):
        entries = read_cache(path)
        entry = entries.get(key)
        if not remeasure and isinstance(entry, dict) and entry.get("path") in paths:
            return entry["path"]  # another process measured while this one waited for the lock
        figures = measure_paths(paths)
        if not figures:
            return paths[-1]
        chosen = faster(figures)
        entries[key] = {"path": chosen, "gflops": figures, "cpu": cpu.get("model name", ""),
                        "measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
        _write_cache(path, entries)
        return chosen
