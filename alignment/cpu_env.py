"""CPU settings for Paddle, chosen from the machine; they only take effect before paddle is imported.

Entry points call `apply_cpu_defaults()` first thing (the stages' run_*.py through alignment/entry.py; importing
`alignment` changes nothing). Measured on 2-core AMD EPYC and Intel Xeon machines (docs/performance.md, "CPU
settings"; `python benchmarks/bench_cpu_settings.py` re-measures any machine):
- OMP_NUM_THREADS=1 with MKL_NUM_THREADS = the usable cores: eager training ran 3-4x faster than with OpenMP
  threads competing with MKL's. Under `paddle.distributed.launch` the processes on one host share its cores, so
  each gets the usable cores over their number (at least 1): 8 processes on 2 cores, each on 2 MKL threads, ran
  a tiny 3-step PPO 1.7x slower than on 1 thread each (tests/parallel/test_layouts.py, tp2xpp2xdp2).
- MKL_DEBUG_CPU_TYPE (AMD only, `mkl_code_path`): the MKL bundled with paddle runs its generic code on AMD CPUs
  unless told which of its paths to take. 5, the AVX2 path: SmolLM2 training 73 -> 137 tokens/s. 7, the AVX-512
  (Skylake-SP) path: on Zen 5 fp32 GEMM 237 -> 434 GFLOP/s, a SmolLM2 GRPO step 18.8 -> 13.1 s. Where a CPU has
  both paths' instructions the faster is measured once per CPU model and kept (alignment/mkl_path.py): the CPU
  family does not tell, since Zen 4 splits 512-bit FMAs in two and 7 still ran its decode GEMMs 1.7-1.9x faster.
  A path whose instructions the CPU lacks dies of SIGILL (8 does on Zen 5), so each is only a candidate with its
  ISA flags present. On an Intel Xeon MKL dispatches itself, and 5 halves fp32 GEMM there (156 vs 287-301
  GFLOP/s): nothing is set.
- FLAGS_use_stride_kernel=0: transpose and slicing copy with dense kernels instead of returning strided views,
  whose backward took most of the gap to torch on CPU (one PPO step 2.857 s -> 2.021 s).
- FLAGS_new_executor_serial_run=1: a static program's ops run on the calling thread instead of executor threads
  competing with MKL's (a static decode step 9.1 ms -> 4.6 ms).
- ALIGNMENT_MALLOC=heap: glibc's malloc serves every size from its heap and never hands freed memory back
  (mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=max; Paddle's CPU tensors come straight from malloc). By default every
  buffer above 32 MB (logits, the LM head's gradient) and, after a trim, every activation is a fresh mapping whose
  pages fault in on first write: 300-390k page faults per SmolLM2 training step, 35k with the heap kept, and the
  step about 5% faster. The process keeps its peak memory instead of returning it between steps.
  ALIGNMENT_MALLOC=system leaves glibc's defaults; a malloc setting in GLIBC_TUNABLES is also left alone.
- ALIGNMENT_OPTIMIZER_THREADS = the usable cores: the optimizer step runs Paddle's OpenMP loops (its CPU AdamW
  kernel is an `omp parallel for` over 512-element chunks, memory-bound) on that many threads, and everything
  else keeps OMP_NUM_THREADS (`optimizer_threads()`). AdamW of the 8.3M-parameter peer policy 15.6 -> 9.1 ms,
  of SmolLM2-135M 227 -> 123 ms; element-wise loops give the same bits on any thread count. 1 turns it off.
- ALIGNMENT_CPU_KERNELS=auto: our C++ kernels for token log-probs, RMSNorm, SwiGLU, attention's softmax and a
  decode step's weight GEMMs and attention (alignment/cpu_kernels: built once per CPU, threaded over the usable
  cores) run where they measured faster than Paddle's operations on this CPU (docs/performance.md, "Where the time
  goes"); the ranks of a job agree on one choice. `on` takes all of them, `off` none (as for a library user who
  never calls this).
- KMP_BLOCKTIME=10: the OpenMP threads (MKL's, and our kernels', which run on the same team) spin 10 ms after a
  parallel region ends before they sleep, where the runtime's default is 200 ms. On a 2-core AMD EPYC Zen 3 KVM
  guest waking a sleeping thread cost about as much as a small GEMM or a kernel call, so 0 cost rollouts about 40%
  of their speed; 10 ms covers the Python between a step's regions and bounds what a spinning thread takes from other
  processes on the cores (environments, a reward server). bench_cpu_settings.py times 0 and 200 beside it.
Nothing is set on a machine with a CUDA build of Paddle installed, and values the user set are left alone. A
value this module set in a parent process (pytest, a driver script) is not the user's: the parent names what it
set in ALIGNMENT_CPU_DEFAULTS, and a child chooses those again for itself.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.metadata
import os
import sys
import warnings
from typing import Callable, Dict, List, Optional, Tuple

from alignment import mkl_path
from alignment.launcher import local_processes

_applied: Dict[str, str] = {}
INHERITED = "ALIGNMENT_CPU_DEFAULTS"  # "KEY=VALUE;..." this module set in a parent process (not the user's)


def cpuinfo_fields() -> Dict[str, str]:
    """The first CPU's fields of /proc/cpuinfo ({} where there is none)."""
    fields: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not key.strip():  # the blank line after the first processor
                    break
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> Tuple[str, str]:
    """(vendor id, model name) from /proc/cpuinfo ('', '' where there is none)."""
    fields = cpuinfo_fields()
    return fields.get("vendor_id", ""), fields.get("model name", "")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def last_level_cache_bytes() -> int:
    """The largest CPU cache's size from sysfs (0 where it does not say)."""
    sizes = [0]
    base = "/sys/devices/system/cpu/cpu0/cache"
    for index in os.listdir(base) if os.path.isdir(base) else []:
        try:
            with open(os.path.join(base, index, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG") or 0) * scale)
    return max(sizes)


def cores_per_process(processes: int = 0) -> int:
    """The usable cores over `processes` (default: the processes `paddle.distributed.launch` started on this
    host), at least 1."""
    return max(1, usable_cores() // max(1, processes or local_processes()))


def has_cuda_paddle() -> bool:
    for name in ("paddlepaddle-gpu", "paddlepaddle_gpu"):
        try:
            importlib.metadata.distribution(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def mkl_code_path(cpu: Dict[str, str], choose: Optional[Callable[[Dict[str, str], List[str]], str]] = None
                  ) -> Optional[str]:
    """MKL_DEBUG_CPU_TYPE for the CPU described by these /proc/cpuinfo fields, or None (MKL's own choice): the one
    path it can take, or of two the faster as `choose` finds it (default: measured once per CPU and kept,
    alignment/mkl_path.py)."""
    paths = mkl_path.possible_paths(cpu)
    if len(paths) < 2:
        return paths[0] if paths else None
    return (choose or mkl_path.measured_choice)(cpu, paths)


def cpu_defaults(cpu: Dict[str, str], cores: int, choose=None) -> Dict[str, str]:
    """The settings for the CPU described by these /proc/cpuinfo fields, with this many usable cores (`choose`:
    as for mkl_code_path)."""
    settings = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": str(max(1, cores)),
                "FLAGS_use_stride_kernel": "0", "FLAGS_new_executor_serial_run": "1", "ALIGNMENT_MALLOC": "heap",
                "ALIGNMENT_OPTIMIZER_THREADS": str(max(1, cores)), "ALIGNMENT_CPU_KERNELS": "auto",
                "KMP_BLOCKTIME": "10"}
    path = mkl_code_path(cpu, choose)
    if path is not None:
        settings["MKL_DEBUG_CPU_TYPE"] = path
    return settings


def apply_cpu_defaults() -> Dict[str, str]:
    """Set this machine's defaults for the variables the user left unset; returns what was set ({} on a CUDA
    install, or when paddle was already imported and it would be too late)."""
    if _applied or "paddle" in sys.modules or has_cuda_paddle():
        return dict(_applied)
    # paddle's import warns that no ccache is installed (for compiling custom operators, which we never do): two
    # lines of noise before every command's output, and before its one-line error
    warnings.filterwarnings("ignore", message="No ccache found", module="paddle.utils.cpp_extension")
    inherited = dict(item.split("=", 1) for item in os.environ.get(INHERITED, "").split(";") if "=" in item)
    defaults = cpu_defaults(cpuinfo_fields(), cores_per_process(), choose=_mkl_choice(inherited))
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        defaults.pop("ALIGNMENT_MALLOC")  # the user tuned malloc already
    for key, value in defaults.items():
        if key not in os.environ or inherited.get(key) == os.environ[key]:
            os.environ[key] = value
            _applied[key] = value
    os.environ[INHERITED] = ";".join(f"{key}={value}" for key, value in _applied.items())
    configure_malloc(os.environ.get("ALIGNMENT_MALLOC", "system"))
    optimizer_thread_count()  # a bad value fails at start-up, not at the first optimizer step
    return dict(_applied)


def _mkl_choice(inherited: Dict[str, str]):
    """How to choose between MKL paths in apply_cpu_defaults: not at all when the user set MKL_DEBUG_CPU_TYPE (it
    stays, so nothing is measured); a parent's measured choice on this host is kept; otherwise measured."""
    value = os.environ.get("MKL_DEBUG_CPU_TYPE")
    if value is not None and inherited.get("MKL_DEBUG_CPU_TYPE") != value:
        return lambda cpu, paths: paths[-1]  # not applied: the user's value is kept
    if value is not None:
        return lambda cpu, paths: value if value in paths else mkl_path.measured_choice(cpu, paths)
    return None


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt(3) parameter numbers from glibc's malloc.h


def configure_malloc(mode: str) -> bool:
    """'heap': glibc serves every allocation from its heap (no per-buffer mmap) and never trims it, so freed
    tensors' pages are reused instead of faulting in again; 'system': glibc's defaults. Returns whether the
    setting was applied (False on a C library other than glibc, or for 'system')."""
    if mode not in ("heap", "system"):
        raise ValueError(f"ALIGNMENT_MALLOC must be 'heap' or 'system', got {mode!r}")
    if mode == "system" or not _is_glibc():
        return False
    libc = ctypes.CDLL(None)
    # -1 as an int is SIZE_MAX inside glibc: never trim
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, -1))


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (ValueError, OSError, AttributeError):
        return False


_libraries: Dict[str, object] = {}  # name -> handle or None, found once paddle is imported


def _paddle_library(name: str):
    """A library Paddle's CPU wheel ships and loads (libiomp5.so: the OpenMP runtime its kernels and MKL share;
    libmklml_intel.so: MKL), or None (paddle not imported, a CUDA build). dlopen of the same path gives the handle
    paddle already has."""
    paddle = sys.modules.get("paddle")
    if paddle is None:
        return None
    if name not in _libraries:
        path = os.path.join(os.path.dirname(paddle.__file__), "libs", name)
        _libraries[name] = ctypes.CDLL(path) if not has_cuda_paddle() and os.path.exists(path) else None
    return _libraries[name]


def share_cores(processes: int) -> None:
    """From now on this process runs MKL, our CPU kernels and the optimizer step on the usable cores over
    `processes`, where the start-up default divided them among every process on the host. For ranks whose
    neighbours on the host mostly wait: an asynchronous run's training ranks beside its rollout ranks (on 2 cores,
    1 rollout + 1 training rank took 2.1-2.6 s a step with 2 MKL threads on the training rank, 3.4 s with 1;
    benchmarks/bench_async.py). Only counts this module chose change; the user's stay."""
    threads = str(cores_per_process(processes))
    mkl = _paddle_library("libmklml_intel.so") if "MKL_NUM_THREADS" in _applied else None
    if mkl is not None:
        mkl.MKL_Set_Num_Threads(int(threads))
        os.environ["MKL_NUM_THREADS"] = _applied["MKL_NUM_THREADS"] = threads
    if "ALIGNMENT_OPTIMIZER_THREADS" in _applied:
        os.environ["ALIGNMENT_OPTIMIZER_THREADS"] = _applied["ALIGNMENT_OPTIMIZER_THREADS"] = threads


def optimizer_thread_count():
    """ALIGNMENT_OPTIMIZER_THREADS as a number (None when unset); anything but a positive integer is refused."""
    value = os.environ.get("ALIGNMENT_OPTIMIZER_THREADS", "")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"ALIGNMENT_OPTIMIZER_THREADS must be a positive number of threads, got {value!r}")
    return int(value)


@contextlib.contextmanager
def optimizer_threads():
    """Inside the block Paddle's OpenMP loops run on ALIGNMENT_OPTIMIZER_THREADS threads, after it on
    OMP_NUM_THREADS again (MKL's own count is untouched). Nothing changes when the variable is unset or not above
    OMP_NUM_THREADS, or when paddle's OpenMP runtime is not there (a CUDA build: the optimizer runs on the GPU)."""
    wanted = optimizer_thread_count()
    usual = int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS", "").isdigit() else 1
    runtime = _paddle_library("libiomp5.so") if wanted is not None and wanted > usual else None
    if runtime is None:
        yield
        return
    runtime.omp_set_num_threads(wanted)
    try:
        yield
    finally:
        runtime.omp_set_num_threads(usual)


ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DEBUG_CPU_TYPE", "FLAGS_use_stride_kernel",
            "FLAGS_new_executor_serial_run", "ALIGNMENT_MALLOC", "ALIGNMENT_OPTIMIZER_THREADS",
            "ALIGNMENT_CPU_KERNELS")


def machine_facts() -> Dict[str, object]:
    """What a benchmark result must record about where it ran: CPU vendor, model name and family/model numbers (a
    VM names Zen 4 and Zen 5 both "AMD EPYC"), the ISA flags that decide GEMM and elementwise kernels, usable
    cores, and the settings in force (unset ones left out)."""
    fields = cpuinfo_fields()
    flags = set(fields.get("flags", "").split())
    return {"vendor": fields.get("vendor_id", ""), "model": fields.get("model name", ""),
            "family": fields.get("cpu family", ""), "model_number": fields.get("model", ""),
            "isa": [f for f in ISA_FLAGS if f in flags],
            "usable_cores": usable_cores(), "settings": {k: os.environ[k] for k in SETTINGS if k in os.environ}}


def describe_machine(facts: Dict[str, object]) -> str:
    """machine_facts() in one line, for the head of a benchmark's printout and its markdown."""
    settings = " ".join(f"{k}={v}" for k, v in facts["settings"].items()) or "no CPU settings"
    family = f" family {facts['family']} model {facts.get('model_number', '')}" if facts.get("family") else ""
    return (f"{facts['model'] or facts['vendor'] or 'unknown CPU'} ({facts['vendor']}{family}), ISA "
            f"{' '.join(facts['isa']) or '-'}, {facts['usable_cores']} usable cores; {settings}")


def describe() -> str:
    """One line for the log: the CPU and the settings in effect (ours or the user's)."""
    vendor, model = cpu_model()
    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DEBUG_CPU_TYPE", "ALIGNMENT_MALLOC",
            "ALIGNMENT_OPTIMIZER_THREADS")
    values = ", ".join(f"{k}={os.environ[k]}" + ("" if k in _applied else " (yours)")
                       for k in keys if k in os.environ)
    shared = f" shared by {local_processes()} processes" if local_processes() > 1 else ""
    return (f"cpu: {model or vendor or 'unknown'}, {usable_cores()} usable cores{shared}; "
            f"{values or 'no thread settings'}")


def main() -> int:
    """`python -m alignment.cpu_env`: measure MKL's paths again where this CPU has a choice (replacing the kept
    figures), then print the settings an entry point here would choose."""
    cpu = cpuinfo_fields()
    paths = mkl_path.possible_paths(cpu)
    chosen = paths[0] if paths else None
    if len(paths) > 1:
        chosen = mkl_path.measured_choice(cpu, paths, remeasure=True)
        entry = mkl_path.read_cache(mkl_path.cache_file()).get(mkl_path.cpu_key(cpu))
        if entry is None:
            print(f"no MKL probe ran (Paddle's libmklml_intel.so not found, or every path's probe failed): "
                  f"MKL_DEBUG_CPU_TYPE={chosen}, not kept")
        for path, figures in (entry or {}).get("gflops", {}).items():
            print(f"MKL_DEBUG_CPU_TYPE={path}: " + ", ".join(f"{shape} {g:.0f}" for shape, g in figures.items()) +
                  " GFLOP/s")
        print(f"kept in {mkl_path.cache_file()} for {mkl_path.cpu_key(cpu)}")
    settings = cpu_defaults(cpu, cores_per_process(), choose=lambda _, choices: chosen)
    print(describe_machine({**machine_facts(), "settings": settings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
