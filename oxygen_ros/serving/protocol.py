"""openpi's wire format: msgpack, with numpy arrays and scalars as small maps.

`openpi-client` packs an array as ``{b"__ndarray__": True, b"data": <bytes>, b"dtype": <dtype.str>, b"shape":
<shape>}`` and a numpy scalar as ``{b"__npgeneric__": True, b"data": <item>, b"dtype": <dtype.str>}``, refusing
object, void and complex dtypes (its `msgpack_numpy.py`). This module speaks the same format both ways. Unpacking
is where untrusted bytes enter the server, so it never builds an object array, checks that an array's bytes
match its dtype and shape before viewing them, and turns every failure into one `ProtocolError` saying what was
wrong, in a bounded number of characters (`preview`).

Bytes alone do not bound what a message costs once decoded: a one-byte empty map becomes a Python dict of 64
bytes, so a 31 MB array of empty maps is gigabytes. Unpacking therefore counts what it builds: every array and map,
and every item and key in them, against `MAX_OBJECTS`; msgpack's own limits refuse a longer array or map, or a
longer string, from its header before anything is allocated, and the hooks refuse the message as soon as the
containers built so far pass the budget. An openpi-client request is a few dozen objects (its arrays travel as
one map of four entries around their raw bytes), so only a hostile or broken client comes near the limit. Nesting
is bounded by msgpack's own stack (a deeper message is refused as malformed).
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

ARRAY, SCALAR = b"__ndarray__", b"__npgeneric__"
REFUSED_DTYPE_KINDS = "VOc"  # void (structured), object, complex: openpi's packer refuses them too
MAX_OBJECTS = 2**18  # arrays, maps and their items in one message: ~36 MB of Python objects at most per message
MAX_STR_BYTES = 2**18  # one string's UTF-8 bytes: a 65536-character prompt of 4-byte characters, no more
MAX_DIMS = 64  # numpy's most
PREVIEW_CHARS = 80  # of a refused value, in an error message
TOO_LARGE = "the message is too large once decoded"


class ProtocolError(ValueError):
    """Bytes that are not an openpi message; the text says why."""


def pack(obj: Any) -> bytes:
    """A message (dicts, lists, str, numbers, numpy arrays and scalars) as openpi-client unpacks it."""
    return msgpack.packb(obj, default=_encode)


def unpack(data: bytes, max_objects: int = MAX_OBJECTS) -> Any:
    """A message from its bytes; ProtocolError for anything that is not well-formed msgpack-numpy, or that decodes
    into more than `max_objects` arrays, maps and items."""
    budget = _Budget(max_objects)
    try:
        return msgpack.unpackb(data, object_hook=lambda obj: _decode(budget.take(obj, 1 + 2 * len(obj))),
                               list_hook=lambda items: budget.take(items, 1 + len(items)),
                               max_array_len=max_objects, max_map_len=max_objects, max_str_len=MAX_STR_BYTES,
                               ext_hook=_no_extension)
    except ProtocolError:
        raise
    except Exception as err:  # msgpack raises many kinds (ExtraData, FormatError, StackError, ValueError, ...)
        if isinstance(err, ValueError) and "exceeds max_" in str(err):  # a length refused from its header
            raise ProtocolError(f"{TOO_LARGE}: {err}") from None
        raise ProtocolError(f"not a msgpack message: {type(err).__name__}: {err}") from None


def _no_extension(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack extension type {code} is not accepted (openpi's messages use none)")


class _Budget:
    """The objects one message may still decode into."""

    def __init__(self, limit: int):
        self.limit = self.left = limit

    def take(self, container: Any, count: int) -> Any:
        self.left -= count
        if self.left < 0:
            raise ProtocolError(f"{TOO_LARGE}: more than {self.limit} arrays, maps and items")
        return container


def preview(value: Any) -> str:
    """A short description of a decoded value, built without its whole repr (which can be gigabytes)."""
    if isinstance(value, str | bytes):
        more = f"... ({len(value)} {'characters' if isinstance(value, str) else 'bytes'})" \
            if len(value) > PREVIEW_CHARS else ""
        return repr(value[:PREVIEW_CHARS]) + more
    if isinstance(value, list | tuple | dict):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, np.ndarray):
        return f"an array of shape {list(value.shape)[:8]} and dtype {value.dtype}"
    return repr(value)[:PREVIEW_CHARS]  # a number, None, a numpy scalar: short


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
        raise ProtocolError(f"unknown dtype {preview(value)}") from None
    if dtype.kind in REFUSED_DTYPE_KINDS:
        raise ProtocolError(f"dtype {dtype} is not accepted (object, structured and complex arrays are refused)")
    return dtype


def _decode(obj: dict) -> Any:
    if ARRAY in obj:
        dtype = _dtype(obj.get(b"dtype"))
        shape, data = obj.get(b"shape"), obj.get(b"data")
        if not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS or \
                not all(isinstance(n, int) and n >= 0 for n in shape):  # the product of more sizes can take minutes
            raise ProtocolError(f"an array's shape must be a list of at most {MAX_DIMS} sizes, got {preview(shape)}")
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
            raise ProtocolError(f"a numpy scalar of dtype {dtype} cannot hold {preview(obj.get(b'data'))}: "
                                f"{str(err)[:PREVIEW_CHARS]}") from None
    return obj
