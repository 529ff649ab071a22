"""How every program ends: scripts, `python -m`, console commands and the reward server share `run_program`.

    exit 0    done
    exit 2    bad input: a missing or malformed file, a bad flag or key (ValueError, FileNotFoundError, ...), or
              too little memory for what was asked (MemoryError, or a thread that cannot start: an address-space
              limit, `ulimit -v`, or a full RAM)
    exit 1    a failure: a full disk, a run that stopped itself, a bug (any other exception)
    exit 130  SIGINT (Ctrl-C);  exit 143  SIGTERM

Whatever ends the program prints one line on stderr, `error: ...` or `stopped by SIGTERM ...`, never a traceback
unless `--debug` is on the command line or ALIGNMENT_DEBUG=1 is set. The stages add where a run stopped and which
checkpoint is intact (training/setup.py's `training_stops`).

Paddle's import installs a C++ handler for SIGTERM that prints a stack dump; `run_program` imports paddle first
(unless the program never uses it) and only then installs its own handlers, which raise `Interrupted` in the main
thread so that `finally` blocks and atomic writes run as for any exception.

A program that ends with a non-zero code, however it failed, runs the cleanups registered with `on_failure` (the
output directory's lock file and the folders the run made and left empty go: training/output_dir.py).
"""
from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Callable, Optional

BAD_INPUT, FAILURE = 2, 1
# DataFormatError, ArgumentError and every "key 'x': ..." refusal are ValueErrors; a MemoryError is too little memory
# for what the arguments ask, the user's to change
BAD_INPUT_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, MemoryError)
NO_THREAD = "can't start new thread"  # threading's RuntimeError when the stack of a new thread cannot be mapped
_failure_cleanups: list = []


def on_failure(cleanup: Callable[[], None]) -> None:
    """Run `cleanup()` if the program ends with a non-zero exit code (once, however often it is registered)."""
    if cleanup not in _failure_cleanups:
        _failure_cleanups.append(cleanup)


def _run_failure_cleanups() -> None:
    while _failure_cleanups:
        try:
            _failure_cleanups.pop(0)()
        except Exception:  # noqa: BLE001 - a cleanup that fails must not hide the error being reported
            pass


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived. A BaseException, like KeyboardInterrupt: `except Exception` lets it through."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_of(stop: BaseException) -> int:
    """The signal that ended the program: an Interrupted's, or SIGINT for a KeyboardInterrupt."""
    return stop.signum if isinstance(stop, Interrupted) else signal.SIGINT


def debug_requested(argv: Optional[list] = None) -> bool:
    """--debug on the command line (removed from it, and kept as ALIGNMENT_DEBUG=1 for the rest of the program)
    or ALIGNMENT_DEBUG=1 in the environment."""
    argv = sys.argv if argv is None else argv
    if "--debug" in argv[1:]:
        argv.remove("--debug")
        os.environ["ALIGNMENT_DEBUG"] = "1"
    return debug_on()


def debug_on() -> bool:
    return os.environ.get("ALIGNMENT_DEBUG", "") not in ("", "0")


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def install_signal_handlers(uses_paddle: bool = True) -> dict:
    """SIGTERM and SIGINT raise Interrupted in the main thread (after paddle's import, which would replace them);
    returns the handlers they replace."""
    if uses_paddle and not _help_requested():
        import paddle  # noqa: F401  (its import installs the C++ handler ours must come after)
    return {signum: signal.signal(signum, _raise_interrupted) for signum in (signal.SIGTERM, signal.SIGINT)}


def _help_requested() -> bool:
    return any(arg in ("-h", "--help") for arg in sys.argv[1:])


def out_of_threads(error: BaseException) -> bool:
    """A thread that could not start: its stack is address space the limit (or the RAM) has no room for."""
    return isinstance(error, RuntimeError) and str(error).strip() == NO_THREAD


def bad_input(error: BaseException) -> bool:
    return isinstance(error, BAD_INPUT_ERRORS) or out_of_threads(error)


def one_line(error: BaseException) -> str:
    if isinstance(error, MemoryError):
        return out_of_memory(error)
    if out_of_threads(error):
        return out_of_memory(MemoryError(NO_THREAD))
    text = " ".join(str(error).split())
    return text if text else type(error).__name__


def out_of_memory(error: MemoryError) -> str:
    """A MemoryError says nothing by itself (its text is usually empty): name the limit that was hit."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    limit = ("no address-space limit is set: the machine's memory ran out" if soft == resource.RLIM_INFINITY
             else f"the address-space limit is {soft >> 20} MiB (ulimit -v {soft >> 10})")
    detail = " ".join(str(error).split())
    return (f"out of memory{f' ({detail})' if detail else ''}: {limit}; raise the limit or lower the batch sizes, "
            "max_length or the number of rollout samples")


def run_program(main: Callable[[], object], uses_paddle: bool = True) -> int:
    """Run `main()` as a program and return its exit code (for `sys.exit`). `main` may return anything (results
    for callers); an int it returns is taken as the exit code."""
    debug, replaced = debug_requested(), {}
    try:
        replaced = install_signal_handlers(uses_paddle)
        result = main()
        code = result if isinstance(result, int) and not isinstance(result, bool) else 0
    except SystemExit as stop:
        code = _code(stop.code)
    except (Interrupted, KeyboardInterrupt) as stop:
        signum = signal_of(stop)
        print(f"stopped by {signal.Signals(signum).name}", file=sys.stderr)
        code = 128 + signum
    except BaseException as err:  # noqa: BLE001 - the one place every program's errors end
        if debug:
            traceback.print_exc()
        code = BAD_INPUT if bad_input(err) else FAILURE
        hint = "" if debug or code == BAD_INPUT else " (rerun with --debug for the traceback)"
        print(f"error: {one_line(err)}{hint}", file=sys.stderr)
    finally:
        for signum, handler in replaced.items():  # a caller in the same process (a test) gets its own back
            signal.signal(signum, handler)
    if code != 0:
        _run_failure_cleanups()
    _failure_cleanups.clear()  # a later program in this process (a test) registers its own
    return code


def _code(code) -> int:
    """SystemExit's code as an exit status: None is 0, a message is printed as one line and is 2 (argparse-style)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    message = " ".join(str(code).split())
    print(message if message.startswith("error: ") else f"error: {message}", file=sys.stderr)
    return BAD_INPUT
