"""Paddle `.pdparams` state dicts read without running code: a restricted unpickler.

A pickle names callables that the reader calls, so `paddle.load` (plain `pickle.load`) of a crafted file runs
whatever the file asks for. `paddle.save` of a state dict writes only {name: numpy array} (Paddle tensors are
turned into arrays first; paddle 2.1's `(name, array)` tuples and a `StructuredToParameterName@@` name table may
appear, and with pickle protocol 2/3 an array over 1 GiB is split into `name@@.i` slices listed under
`UnpackBigParamInfor@@`). So this reader admits exactly the callables such a file needs - numpy's array
reconstruction (always an empty plain ndarray, whatever shape or subclass the file asks for) and dtype (never an
object dtype; every array must hold numbers), OrderedDict, tuple and protocol 2's latin1 bytes - and refuses any other with the file and the
name it asked for. Memory is bounded by the file: array contents come from the file's own bytes.
"""
from __future__ import annotations

import collections
import pickle
from typing import Dict

import numpy as np

try:  # numpy >= 2
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct

BIG_PARAM_INFO = "UnpackBigParamInfor@@"  # Paddle's spelling
NUMBER_KINDS = "biufc"  # numpy dtype kinds of bool, int, uint, float, complex


class RefusedPickle(pickle.UnpicklingError):
    pass


def _empty_array(subtype, shape, typecode):
    """numpy's `_reconstruct`, always an empty plain ndarray: its dtype, shape and contents come from the file's
    bytes in the next step (ndarray.__setstate__), whatever subclass or shape the file asks for here."""
    return _reconstruct(np.ndarray, (0,), b"b")


def _dtype(spec, align=False, copy=False):
    dtype = np.dtype(spec, bool(align), bool(copy))
    if dtype.hasobject:
        raise RefusedPickle(f"it asks for an array of Python objects ({dtype}), not numbers")
    return dtype


def _ndarray_name(*args, **kwargs):
    """Stands for numpy.ndarray as `_reconstruct`'s first argument; never builds an array itself (np.ndarray(shape)
    would allocate whatever the file asks for)."""
    raise RefusedPickle("it calls numpy.ndarray directly, which paddle.save never does")


def _latin1_bytes(text, encoding):
    """How pickle protocol 2 writes bytes: _codecs.encode(str, 'latin1'). No other codec."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise RefusedPickle(f"it asks for the {str(encoding)[:40]!r} codec; pickles of arrays use only latin1")
    return text.encode("latin1")


_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _empty_array,
    ("numpy._core.multiarray", "_reconstruct"): _empty_array,
    ("numpy", "ndarray"): _ndarray_name,
    ("numpy", "dtype"): _dtype,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("_codecs", "encode"): _latin1_bytes,
    ("builtins", "tuple"): tuple,
    ("__builtin__", "tuple"): tuple,  # pickles written by Python 2
}


class _StateDictUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise RefusedPickle(f"it asks to call {module}.{name}, which a state dict of arrays never needs "
                                "(a crafted file?)") from None

    def persistent_load(self, pid):
        raise RefusedPickle("it holds persistent references, which a state dict of arrays never needs")


def read_state_dict(file: str) -> Dict[str, np.ndarray]:
    """{tensor name: numpy array} of one `.pdparams` file; anything else is a ValueError naming the file. Paddle's
    name table and other `...@@` entries are dropped, big-parameter slices joined."""
    try:
        with open(file, "rb") as f:
            state = _StateDictUnpickler(f, encoding="latin1").load()
    except RefusedPickle as err:
        raise ValueError(f"{file}: refused: {err}") from None
    except Exception as err:  # a damaged pickle raises almost anything (EOFError, KeyError, struct.error, ...)
        raise ValueError(f"{file}: cannot read PaddleNLP weights, truncated or corrupt? "
                         f"({type(err).__name__}: {err})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{file}: not a Paddle state dict (a {type(state).__name__})")
    state = _join_big_params(state, file)
    arrays = {}
    for name, value in state.items():
        if isinstance(name, str) and name.endswith("@@"):
            continue  # Paddle's name table
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
            value = value[1]  # paddle 2.1's (tensor name, array)
        if not isinstance(name, str) or not isinstance(value, np.ndarray) or value.dtype.kind not in NUMBER_KINDS:
            kind = f"an array of {value.dtype}" if isinstance(value, np.ndarray) else f"a {type(value).__name__}"
            raise ValueError(f"{file}: not a Paddle state dict of number arrays (entry {str(name)[:80]!r} is "
                             f"{kind})")
        arrays[name] = value
    return arrays


def _join_big_params(state: dict, file: str) -> dict:
    info = state.pop(BIG_PARAM_INFO, None)
    if info is None:
        return state
    try:
        for name, entry in info.items():
            parts = [state.pop(part) for part in entry["slices"]]
            state[name] = np.concatenate(parts).reshape(entry["OriginShape"])
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{file}: a damaged {BIG_PARAM_INFO} table ({type(err).__name__}: {err})") from None
    return state
