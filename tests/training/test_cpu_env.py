"""CPU settings chosen from the machine (alignment/cpu_env.py) and what benchmarks record about where they ran."""
import json
import os
import subprocess
import sys

import pytest

from alignment import cpu_env, mkl_path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fresh_process(code, **env_overrides):
    """Run code in a new interpreter without any CPU setting (or GLIBC_TUNABLES) inherited from this one."""
    env = {k: v for k, v in os.environ.items()
           if k not in cpu_env.SETTINGS and k not in ("GLIBC_TUNABLES", cpu_env.INHERITED, "PADDLE_LOCAL_SIZE")}
    env.update(PYTHONPATH=REPO, **env_overrides)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)


ZEN4 = {"vendor_id": "AuthenticAMD", "cpu family": "25", "flags": "fpu avx avx2 fma avx512f avx512cd avx512bw "
        "avx512dq avx512vl avx512_bf16"}
ZEN5 = {**ZEN4, "cpu family": "26"}
XEON = {"vendor_id": "GenuineIntel", "cpu family": "6", "flags": ZEN4["flags"]}


def test_mkl_debug_cpu_type_is_set_on_amd_only_and_threads_follow_the_cores():
    amd, intel = cpu_env.cpu_defaults(ZEN4, 4, lambda cpu, paths: "5"), cpu_env.cpu_defaults(XEON, 4)
    assert amd["MKL_DEBUG_CPU_TYPE"] == "5" and "MKL_DEBUG_CPU_TYPE" not in intel  # it halves GEMM on Intel
    for settings in (amd, intel):
        assert settings["OMP_NUM_THREADS"] == "1" and settings["MKL_NUM_THREADS"] == "4"
        assert settings["FLAGS_use_stride_kernel"] == "0"
        assert settings["KMP_BLOCKTIME"] == "10"  # the team stays awake between a step's regions, not 200 ms
    assert cpu_env.cpu_defaults({}, 0)["MKL_NUM_THREADS"] == "1"


def test_a_fresh_process_gets_the_defaults_and_keeps_what_the_user_set():
    code = ("import json, os; from alignment.cpu_env import apply_cpu_defaults, machine_facts; "
            "set_now = apply_cpu_defaults(); print(json.dumps([set_now, machine_facts()]))")
    done = _fresh_process(code, MKL_NUM_THREADS="7")
    done.check_returncode()
    set_now, facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert "MKL_NUM_THREADS" not in set_now and set_now["OMP_NUM_THREADS"] == "1"
    assert facts["settings"]["MKL_NUM_THREADS"] == "7"  # the user's value is what is in force and recorded
    assert facts["settings"]["OMP_NUM_THREADS"] == "1"
    vendor, model = cpu_env.cpu_model()
    assert (facts["vendor"], facts["model"]) == (vendor, model)
    assert facts["family"] == cpu_env.cpuinfo_fields().get("cpu family", "")
    assert facts["usable_cores"] == cpu_env.usable_cores() >= 1
    assert set(facts["isa"]) <= set(cpu_env.ISA_FLAGS)


APPLY = ("import json, os; from alignment.cpu_env import apply_cpu_defaults; apply_cpu_defaults(); "
         "print(json.dumps({k: os.environ.get(k) for k in ('MKL_NUM_THREADS', 'ALIGNMENT_OPTIMIZER_THREADS', "
         "'ALIGNMENT_CPU_DEFAULTS')}))")


def _applied_in_child(**env):
    done = _fresh_process(APPLY, **env)
    done.check_returncode()
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_processes_launched_on_one_host_share_its_cores():
    cores = cpu_env.usable_cores()
    alone = _applied_in_child()
    assert alone["MKL_NUM_THREADS"] == alone["ALIGNMENT_OPTIMIZER_THREADS"] == str(cores)
    crowded = _applied_in_child(PADDLE_LOCAL_SIZE=str(cores * 4))  # more processes than cores: 1 thread each
    assert crowded["MKL_NUM_THREADS"] == crowded["ALIGNMENT_OPTIMIZER_THREADS"] == "1"
    assert f"MKL_NUM_THREADS={cores}" in alone["ALIGNMENT_CPU_DEFAULTS"].split(";")
    if cores >= 2:
        assert _applied_in_child(PADDLE_LOCAL_SIZE="2")["MKL_NUM_THREADS"] == str(cores // 2)


def test_a_parents_defaults_are_chosen_again_by_a_launched_child_and_the_users_values_are_kept():
    parent = _applied_in_child()  # what pytest or a driver script leaves in the environment it passes on
    child = _applied_in_child(PADDLE_LOCAL_SIZE=str(cpu_env.usable_cores() * 4), MKL_NUM_THREADS=parent[
        "MKL_NUM_THREADS"], ALIGNMENT_CPU_DEFAULTS=parent["ALIGNMENT_CPU_DEFAULTS"])
    assert child["MKL_NUM_THREADS"] == "1"
    users = _applied_in_child(PADDLE_LOCAL_SIZE="8", MKL_NUM_THREADS="3")  # set by the user, no parent's mark
    assert users["MKL_NUM_THREADS"] == "3" and "MKL_NUM_THREADS" not in users["ALIGNMENT_CPU_DEFAULTS"]
    overridden = _applied_in_child(PADDLE_LOCAL_SIZE="8", MKL_NUM_THREADS="3",
                                   ALIGNMENT_CPU_DEFAULTS="MKL_NUM_THREADS=2")  # the user changed the parent's
    assert overridden["MKL_NUM_THREADS"] == "3"


SHARE_CORES = """
import json, os
from alignment.cpu_env import apply_cpu_defaults, share_cores, _paddle_library
apply_cpu_defaults()
import paddle
paddle.matmul(paddle.ones([64, 64]), paddle.ones([64, 64]))  # MKL initialised with the start-up count
mkl = _paddle_library("libmklml_intel.so")
before = mkl.MKL_Get_Max_Threads() if mkl else None
share_cores(1)
after = mkl.MKL_Get_Max_Threads() if mkl else None
print(json.dumps([before, after, os.environ["MKL_NUM_THREADS"], os.environ["ALIGNMENT_OPTIMIZER_THREADS"]]))
"""


def test_a_rank_given_the_hosts_cores_after_start_up_runs_mkl_on_them_unless_the_user_set_its_threads():
    cores = cpu_env.usable_cores()
    crowded = str(cores * 4)  # 1 thread at start-up
    done = _fresh_process(SHARE_CORES, PADDLE_LOCAL_SIZE=crowded)
    done.check_returncode()
    before, after, mkl_variable, optimizer_variable = json.loads(done.stdout.strip().splitlines()[-1])
    assert mkl_variable == optimizer_variable == str(cores)
    if before is not None:  # paddle's CPU wheel with its MKL
        assert (before, after) == (1, cores)
    users = _fresh_process(SHARE_CORES, PADDLE_LOCAL_SIZE=crowded, MKL_NUM_THREADS="1")
    users.check_returncode()
    before, after, mkl_variable, _ = json.loads(users.stdout.strip().splitlines()[-1])
    assert mkl_variable == "1" and (before is None or (before, after) == (1, 1))


def test_describe_machine_names_the_cpu_isa_cores_and_settings():
    facts = {"vendor": "GenuineIntel", "model": "Intel Xeon", "isa": ["avx2", "avx512f"], "usable_cores": 2,
             "settings": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2"}}
    assert cpu_env.describe_machine(facts) == ("Intel Xeon (GenuineIntel), ISA avx2 avx512f, 2 usable cores; "
                                               "OMP_NUM_THREADS=1 MKL_NUM_THREADS=2")
    assert "no CPU settings" in cpu_env.describe_machine({**facts, "settings": {}})
    zen5 = cpu_env.describe_machine({**facts, "vendor": "AuthenticAMD", "model": "AMD EPYC", "family": "26",
                                     "model_number": "2"})
    assert zen5.startswith("AMD EPYC (AuthenticAMD family 26 model 2), ISA avx2 avx512f")


def test_the_settings_benchmark_measures_each_distinct_candidate_once(monkeypatch):
    monkeypatch.syspath_prepend(REPO)
    from benchmarks import bench_cpu_settings as bench

    monkeypatch.setattr(bench, "usable_cores", lambda: 2)
    monkeypatch.setattr(bench, "cpuinfo_fields", lambda: ZEN4)
    monkeypatch.setattr(mkl_path, "measured_choice", lambda cpu, paths: {"25": "5", "26": "7"}[cpu["cpu family"]])
    amd = bench.candidates()
    assert list(amd)[0] == "chosen for this CPU" and "with MKL_DEBUG_CPU_TYPE=5" not in amd  # same as chosen
    assert amd["with MKL_DEBUG_CPU_TYPE=7 (AVX-512)"]["MKL_DEBUG_CPU_TYPE"] == "7"  # measured against the chosen 5
    monkeypatch.setattr(bench, "cpuinfo_fields", lambda: ZEN5)
    zen5 = bench.candidates()
    assert zen5["chosen for this CPU"]["MKL_DEBUG_CPU_TYPE"] == "7"
    assert "with MKL_DEBUG_CPU_TYPE=7 (AVX-512)" not in zen5  # the same as the chosen setting
    assert zen5["with MKL_DEBUG_CPU_TYPE=5"]["MKL_DEBUG_CPU_TYPE"] == "5"
    monkeypatch.setattr(bench, "cpuinfo_fields", lambda: XEON)
    intel = bench.candidates()
    assert "without MKL_DEBUG_CPU_TYPE" not in intel and intel["with MKL_DEBUG_CPU_TYPE=5"]["MKL_DEBUG_CPU_TYPE"] == "5"
    assert not any("=7" in name for name in intel)  # Intel: MKL dispatches to AVX-512 itself
    for found in (amd, zen5, intel):
        values = [json.dumps(s, sort_keys=True) for s in found.values()]
        assert len(values) == len(set(values))
        assert found["strided views on (Paddle's default)"]["FLAGS_use_stride_kernel"] == "1"
        assert found["glibc's default allocator"]["ALIGNMENT_MALLOC"] == "system"
        assert found["optimizer step on one thread"]["ALIGNMENT_OPTIMIZER_THREADS"] == "1"
    figures = {"chosen for this CPU": {"train_tokens_per_s": 100.0, "spread": 0.03},
               "one MKL thread": {"train_tokens_per_s": 102.0, "spread": 0.01}}
    assert "a tie with the chosen setting" in bench.verdict(figures)  # 2% ahead, rounds 3% apart
    figures["one MKL thread"]["train_tokens_per_s"] = 110.0
    assert "should change" in bench.verdict(figures)
    figures["chosen for this CPU"]["train_tokens_per_s"] = 120.0
    assert bench.verdict(figures) == "fastest training step: chosen for this CPU"


ALLOCATION_FAULTS = """
import ctypes, json, resource
from alignment.cpu_env import apply_cpu_defaults
set_now = apply_cpu_defaults()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for _ in range(6):  # 64 MB buffers: above glibc's largest mmap threshold, so by default each one is a new mapping
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = libc.malloc(64 << 20); ctypes.memset(buffer, 1, 64 << 20); libc.free(buffer)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps([set_now, faults]))
"""


def test_the_heap_allocator_setting_reuses_freed_buffers_instead_of_faulting_them_in_again():
    if not cpu_env._is_glibc():
        pytest.skip("mallopt settings are glibc's")
    heap = _fresh_process(ALLOCATION_FAULTS)
    system = _fresh_process(ALLOCATION_FAULTS, ALIGNMENT_MALLOC="system")
    (set_heap, heap_faults), (set_system, system_faults) = (json.loads(p.stdout.strip().splitlines()[-1])
                                                            for p in (heap, system))
    assert set_heap["ALIGNMENT_MALLOC"] == "heap" and "ALIGNMENT_MALLOC" not in set_system
    assert min(system_faults[1:]) >= 32  # every 64 MB buffer faulted in again (a fresh mapping; >= 2 MB a fault)
    assert max(heap_faults[1:]) <= 2  # the freed heap memory was reused


def test_a_bad_allocator_setting_is_refused_with_the_variable_named_and_tuned_glibc_is_left_alone():
    bad = _fresh_process("from alignment.cpu_env import apply_cpu_defaults; apply_cpu_defaults()",
                         ALIGNMENT_MALLOC="fast")
    assert bad.returncode != 0 and "ALIGNMENT_MALLOC must be 'heap' or 'system', got 'fast'" in bad.stderr
    tuned = _fresh_process("import json; from alignment.cpu_env import apply_cpu_defaults; "
                           "print(json.dumps(apply_cpu_defaults()))", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1")
    assert "ALIGNMENT_MALLOC" not in json.loads(tuned.stdout.strip().splitlines()[-1])
    assert cpu_env.configure_malloc("system") is False


OPTIMIZER_THREADS = """
import json, os
from alignment.cpu_env import apply_cpu_defaults, optimizer_threads, _paddle_library
set_now = apply_cpu_defaults()
import numpy as np, paddle
omp = _paddle_library("libiomp5.so")
def one_step(threaded):
    paddle.seed(0)
    layer = paddle.nn.Linear(300, 700)  # 210,700 weights: over 400 of AdamW's 512-element OpenMP chunks
    optimizer = paddle.optimizer.AdamW(learning_rate=0.1, parameters=layer.parameters(), weight_decay=0.01)
    for _ in range(3):
        layer(paddle.ones([4, 300])).square().sum().backward()
        if threaded:
            with optimizer_threads():
                inside = omp.omp_get_max_threads() if omp else None
                optimizer.step()
        else:
            inside = omp.omp_get_max_threads() if omp else None
            optimizer.step()
        optimizer.clear_grad()
    return layer.weight.numpy(), inside
(plain, outside), (threaded, inside) = one_step(False), one_step(True)
after = omp.omp_get_max_threads() if omp else None
print(json.dumps([set_now, bool((plain == threaded).all()), outside, inside, after]))
"""


def test_the_optimizer_step_runs_on_the_optimizer_threads_with_the_same_bits():
    done = _fresh_process(OPTIMIZER_THREADS, ALIGNMENT_OPTIMIZER_THREADS="2")
    done.check_returncode()
    set_now, same, outside, inside, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert set_now["OMP_NUM_THREADS"] == "1" and "ALIGNMENT_OPTIMIZER_THREADS" not in set_now  # the user's 2
    assert same  # AdamW's element-wise loop gives the same weights on 1 and 2 threads
    if outside is not None:  # paddle's CPU wheel with its libiomp5
        assert (outside, inside, after) == (1, 2, 1)
    assert cpu_env.cpu_defaults(XEON, 4)["ALIGNMENT_OPTIMIZER_THREADS"] == "4"


def test_a_bad_optimizer_threads_setting_fails_at_start_up_with_the_variable_named():
    bad = _fresh_process("from alignment.cpu_env import apply_cpu_defaults; apply_cpu_defaults()",
                         ALIGNMENT_OPTIMIZER_THREADS="all")
    assert bad.returncode != 0 and "ALIGNMENT_OPTIMIZER_THREADS must be a positive number of threads, got 'all'" \
        in bad.stderr
