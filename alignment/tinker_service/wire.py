"""The protocol-buffer messages of the Tinker API that are not JSON: the SDK sends `forward_backward` as a
`tinker_public.ForwardBackwardRequest` and asks (Accept: application/x-protobuf) for `ForwardBackwardOutput` and
`SampleResponse` in that form. A small codec of the wire format (varints, length-delimited fields, fixed 32/64-bit
numbers) with the field numbers of the SDK's schema (tinker 0.38, tinker/proto/tinker_public_pb2), so the server
needs neither protobuf nor the SDK.

    ForwardBackwardRequest  1 model_id, 2 seq_id, 3 data (Datum, repeated), 4 loss_fn,
                            5 loss_fn_config (map string -> double), 6 forward_only,
                            7 loss_fn_config_v2 (map string -> LossConfigValue {1 number, 2 text})
    Datum                   1 model_input (Chunk, repeated: 1 encoded_text {1 tokens: int32 bytes}),
                            2 loss_fn_inputs (map string -> Tensor)
    Tensor                  1 dense bytes, 2 sparse_csr, 3 dtype (1 float32, 2 int64, 3 int32), 4 shape (packed)
    ForwardBackwardOutput   1 loss_fn_output_type, 2 loss_fn_outputs (ArrayRecord), 3 metrics (map string -> double)
    ArrayRecord             1 type_tag, 2 fields (map string -> BatchedTensor), 3 num_datums
    BatchedTensor           1 data bytes, 2 offsets (int64 byte offsets, one per datum and one more), 3 dtype,
                            4 trailing_shape
    SampleResponse          1 sequences (SampledSequence: 1 stop_reason (0 stop, 1 length), 2 tokens int32 bytes,
                            3 logprobs float32 bytes)
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

import numpy as np

FLOAT32, INT64, INT32 = 1, 2, 3
NUMPY_DTYPES = {FLOAT32: np.float32, INT64: np.int64, INT32: np.int32}
STOP_REASONS = {"stop": 0, "length": 1}


class WireError(ValueError):
    """A message that does not decode (the request's fault: HTTP 400)."""


def _varint(buf: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 64 bits")


def fields(buf: bytes) -> Dict[int, list]:
    """field number -> its values in order: ints (varint), bytes (length-delimited), raw 8 / 4 bytes (fixed)."""
    out: Dict[int, list] = {}
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, pos = _varint(buf, pos)
        elif kind == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise WireError("truncated length-delimited field")
            value, pos = buf[pos:pos + size], pos + size
        elif kind in (1, 5):
            width = 8 if kind == 1 else 4
            if pos + width > len(buf):
                raise WireError("truncated fixed-width field")
            value, pos = buf[pos:pos + width], pos + width
        else:
            raise WireError(f"unsupported wire type {kind} (field {number})")
        out.setdefault(number, []).append(value)
    return out


def _one(f: Dict[int, list], number: int, default):
    return f[number][-1] if number in f else default


def _text(f: Dict[int, list], number: int) -> str:
    return bytes(_one(f, number, b"")).decode("utf-8")


def _double(raw: bytes) -> float:
    return struct.unpack("<d", raw)[0]


def _packed_ints(values: list) -> List[int]:
    out: List[int] = []
    for value in values:
        if isinstance(value, int):
            out.append(value)
            continue
        pos = 0
        while pos < len(value):
            item, pos = _varint(value, pos)
            out.append(item)
    return [v - (1 << 64) if v >= 1 << 63 else v for v in out]  # int64 two's complement


def _tensor(buf: bytes) -> np.ndarray:
    f = fields(buf)
    dtype = NUMPY_DTYPES.get(_one(f, 3, 0))
    if dtype is None:
        raise WireError(f"tensor dtype {_one(f, 3, 0)} is not float32, int64 or int32")
    if 2 in f:
        raise WireError("sparse CSR tensors are not supported; send dense 1-D loss inputs")
    data = np.frombuffer(bytes(_one(f, 1, b"")), dtype=dtype)
    shape = _packed_ints(f.get(4, []))
    return data.reshape(shape) if shape else data


@dataclass
class Datum:
    tokens: List[int]  # model_input, the encoded-text chunks joined
    inputs: Dict[str, np.ndarray] = field(default_factory=dict)  # loss_fn_inputs


@dataclass
class ForwardBackwardRequest:
    model_id: str
    seq_id: int
    data: List[Datum]
    loss_fn: str
    loss_fn_config: Dict[str, object]
    forward_only: bool


def _datum(buf: bytes) -> Datum:
    f = fields(buf)
    tokens: List[int] = []
    for chunk in f.get(1, []):
        parts = fields(chunk)
        if 1 not in parts:
            raise WireError("only encoded-text chunks are supported in model_input (no image or audio chunks)")
        tokens.extend(np.frombuffer(bytes(_one(fields(parts[1][-1]), 1, b"")), dtype=np.int32).tolist())
    inputs = {}
    for entry in f.get(2, []):
        e = fields(entry)
        inputs[_text(e, 1)] = _tensor(bytes(_one(e, 2, b"")))
    return Datum(tokens, inputs)


def decode_forward_backward(buf: bytes) -> ForwardBackwardRequest:
    f = fields(buf)
    config: Dict[str, object] = {}
    for entry in f.get(5, []):
        e = fields(entry)
        config[_text(e, 1)] = _double(_one(e, 2, b"\0" * 8))
    for entry in f.get(7, []):  # v2 wins where both are set, as the SDK's dual write intends
        e = fields(entry)
        value = fields(bytes(_one(e, 2, b"")))
        config[_text(e, 1)] = _double(value[1][-1]) if 1 in value else _text(value, 2)
    seq = _one(f, 2, 0)
    return ForwardBackwardRequest(_text(f, 1), seq - (1 << 64) if seq >= 1 << 63 else seq,
                                  [_datum(d) for d in f.get(3, [])], _text(f, 4), config, bool(_one(f, 6, 0)))


def _key(number: int, kind: int) -> bytes:
    return _encode_varint(number << 3 | kind)


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _encode_varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _key(number, 0) + _encode_varint(value) if value else b""


def _batched(arrays: Sequence[np.ndarray]) -> bytes:
    """Per-datum 1-D float32 arrays -> a BatchedTensor."""
    parts = [np.ascontiguousarray(a, dtype=np.float32).tobytes() for a in arrays]
    offsets = np.cumsum([0] + [len(p) for p in parts]).astype(np.int64)
    return _bytes_field(1, b"".join(parts)) + _bytes_field(2, offsets.tobytes()) + _int_field(3, FLOAT32)


def encode_forward_backward_output(outputs: Dict[str, Sequence[np.ndarray]], metrics: Dict[str, float]) -> bytes:
    """outputs: field name -> one 1-D float32 array per datum (e.g. "logprobs"); metrics: "name:reduction"."""
    count = len(next(iter(outputs.values()))) if outputs else 0
    record = _bytes_field(1, b"ArrayRecord")
    for name, arrays in outputs.items():
        record += _bytes_field(2, _bytes_field(1, name.encode()) + _bytes_field(2, _batched(arrays)))
    record += _int_field(3, count)
    out = _bytes_field(1, b"ArrayRecord") + _bytes_field(2, record)
    for name, value in metrics.items():
        out += _bytes_field(3, _bytes_field(1, name.encode()) + _key(2, 1) + struct.pack("<d", float(value)))
    return out


def encode_sample_response(sequences: Sequence[Tuple[str, Sequence[int], Sequence[float]]]) -> bytes:
    """sequences: (stop reason "stop" / "length", tokens, their log-probs)."""
    out = b""
    for reason, tokens, logprobs in sequences:
        seq = _int_field(1, STOP_REASONS[reason]) + _bytes_field(2, np.asarray(tokens, np.int32).tobytes())
        seq += _bytes_field(3, np.asarray(logprobs, np.float32).tobytes())
        out += _bytes_field(1, seq)
    return out
