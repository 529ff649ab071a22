"""The shared reader's typed keys (alignment/inputs/keys.py) at their edges: nothing is coerced."""
from alignment.inputs import (FINITE, FLAG, INT64_MAX, INT64_MIN, POSITIVE_INT, TEXT, either, integer, key_problems,
                              list_of, number)


def test_integers_are_ints_within_int64_and_never_bools_or_floats():
    assert integer().accepts(INT64_MAX) and integer().accepts(INT64_MIN)
    assert not integer().accepts(INT64_MAX + 1) and not integer().accepts(INT64_MIN - 1)
    assert [POSITIVE_INT.accepts(v) for v in (1, 0, -1, True, 1.0, "1", None)] == [True] + [False] * 6


def test_numbers_are_finite_and_never_bools_or_strings():
    assert [FINITE.accepts(v) for v in (0, -2.5, 10 ** 30, float("nan"), float("inf"), False, "1")] == [
        True, True, True, False, False, False, False]
    assert number(above=0).accepts(1e-30) and not number(above=0).accepts(0.0)
    assert number(at_least=0, at_most=1).accepts(1) and not number(at_least=0, at_most=1).accepts(1.5)


def test_flags_text_and_lists_are_what_they_say():
    assert [FLAG.accepts(v) for v in (True, False, 1, "true", None)] == [True, True, False, False, False]
    assert list_of(TEXT, non_empty=True).accepts(["a"]) and not list_of(TEXT, non_empty=True).accepts([])
    assert not list_of(TEXT).accepts(["a", 1]) and either(TEXT, list_of(TEXT)).accepts("a")


def test_key_problems_name_every_key_once_in_order():
    kinds = {"r": POSITIVE_INT, "alpha": FINITE, "rslora": FLAG}
    assert key_problems({"r": "4", "alpha": float("nan"), "rslora": None, "other": object()}, kinds, ("r", "x")) == [
        "missing key 'x'", "key 'r' must be a positive integer, got '4'",
        "key 'alpha' must be a finite number, got NaN"]
    assert key_problems({"r": None}, kinds, ("r",)) == ["key 'r' is null"]


def test_a_small_file_reads_under_an_address_space_limit(tmp_path):
    """`ulimit -v` (containers, batch schedulers): the reader reads in chunks instead of asking for the whole size
    limit up front, which was a MemoryError before a byte was read (issue 65)."""
    import subprocess
    import sys
    import textwrap

    from tests.helpers import REPO

    (tmp_path / "args.json").write_text('{"learning_rate": 1e-5}' + " " * 1000)
    child = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {REPO!r})
        from alignment.inputs.files import read_bytes
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), vm + (256 << 20)))
        data = read_bytes({str(tmp_path / "args.json")!r}, "argument file", limit=8 << 30)
        print(len(data))
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "1023", done.stderr[-500:]
