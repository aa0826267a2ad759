"""openpi's wire format: msgpack, with numpy arrays and scalars as small maps.

`openpi-client` packs an array as ``{b"__ndarray__": True, b"data": <bytes>, b"dtype": <dtype.str>, b"shape":
<shape>}`` and a numpy scalar as ``{b"__npgeneric__": True, b"data": <item>, b"dtype": <dtype.str>}``, refusing
object, void and complex dtypes (its `msgpack_numpy.py`). This module speaks the same format both ways. Unpacking
is where untrusted bytes enter the server, so it never builds an object array, checks that an array's bytes
match its dtype and shape before viewing them, and turns every failure into one `ProtocolError` saying what was
wrong.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

ARRAY, SCALAR = b"__ndarray__", b"__npgeneric__"
REFUSED_DTYPE_KINDS = "VOc"  # void (structured), object, complex: openpi's packer refuses them too


class ProtocolError(ValueError):
    """Bytes that are not an openpi message; the text says why."""


def pack(obj: Any) -> bytes:
    """A message (dicts, lists, str, numbers, numpy arrays and scalars) as openpi-client unpacks it."""
    return msgpack.packb(obj, default=_encode)


def unpack(data: bytes) -> Any:
    """A message from its bytes; ProtocolError for anything that is not well-formed msgpack-numpy."""
    try:
        return msgpack.unpackb(data, object_hook=_decode)
    except ProtocolError:
        raise
    except Exception as err:  # msgpack raises many kinds (ExtraData, FormatError, StackError, ValueError, ...)
        raise ProtocolError(f"not a msgpack message: {type(err).__name__}: {err}") from None


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind in REFUSED_DTYPE_KINDS:
        raise TypeError(f"cannot send dtype {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {ARRAY: True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return {SCALAR: True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send a {type(obj).__name__}")


def _dtype(value: Any) -> np.dtype:
    if not isinstance(value, str | bytes):
        raise ProtocolError(f"an array's dtype must be a string, got {type(value).__name__}")
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        raise ProtocolError(f"unknown dtype {value!r}") from None
    if dtype.kind in REFUSED_DTYPE_KINDS:
        raise ProtocolError(f"dtype {dtype} is not accepted (object, structured and complex arrays are refused)")
    return dtype


def _decode(obj: dict) -> Any:
    if ARRAY in obj:
        dtype = _dtype(obj.get(b"dtype"))
        shape, data = obj.get(b"shape"), obj.get(b"data")
        if not isinstance(shape, list | tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ProtocolError(f"an array's shape must be a list of sizes, got {shape!r}")
        if not isinstance(data, bytes):
            raise ProtocolError("an array's data must be bytes")
        if math.prod(shape) * dtype.itemsize != len(data):
            raise ProtocolError(f"an array of shape {list(shape)} and dtype {dtype} needs "
                                f"{math.prod(shape) * dtype.itemsize} bytes, the message carries {len(data)}")
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if SCALAR in obj:
        dtype = _dtype(obj.get(b"dtype"))
        try:
            return dtype.type(obj.get(b"data"))
        except (TypeError, ValueError, OverflowError) as err:
            raise ProtocolError(f"a numpy scalar of dtype {dtype} cannot hold {obj.get(b'data')!r}: {err}") from None
    return obj
