"""Canonical JSON for hashed ledger entries.

A subset of RFC 8785 that orjson produces exactly and fast: keys sorted (``OPT_SORT_KEYS``), keys
ASCII only (so code-point order equals RFC 8785's UTF-16 order), compact separators, no floats
(encoders disagree on their text, and NaN silently becomes ``null``), integers within
+-(2**53 - 1) (exact in every JSON implementation), timestamps as integer microseconds.

`normalize` checks a value against these rules and returns a JSON-native copy (tuples become
lists); `encode` produces the canonical bytes of an already-normalized value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import orjson

from ledger.errors import LedgerRecordError

__all__ = ["MAX_SAFE_INT", "decode", "encode", "normalize"]

MAX_SAFE_INT: Final = 2**53 - 1
_OPTIONS: Final = orjson.OPT_SORT_KEYS


def encode(value: object) -> bytes:
    """Canonical bytes of a normalized JSON value (no trailing newline)."""
    return orjson.dumps(value, option=_OPTIONS)


def decode(data: bytes) -> object:
    """Parse JSON bytes (raises ``orjson.JSONDecodeError``, a ``ValueError``)."""
    return orjson.loads(data)


def normalize(value: object, where: str = "record") -> object:
    """Return a JSON-native copy of ``value`` or raise `LedgerRecordError` naming the key path.

    Allowed: ``None``, ``bool``, ``int`` within +-(2**53 - 1), ``str``, mappings with ASCII
    ``str`` keys, lists and tuples. Everything else (floats, NaN, bytes, sets, datetimes, ...) is
    rejected so that the hashed bytes never depend on an encoder's choices.
    """
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return value
    if kind is int:
        if -MAX_SAFE_INT <= value <= MAX_SAFE_INT:  # type: ignore[operator]
            return value
        raise LedgerRecordError(where, f"integer {value} is outside +-(2**53 - 1)")
    if isinstance(value, Mapping):
        for key in value:
            if type(key) is not str:
                raise LedgerRecordError(
                    where, f"key {key!r} is a {type(key).__name__}, keys must be str"
                )
            if not key.isascii():
                raise LedgerRecordError(f"{where}.{key}", "keys must be ASCII")
        return {key: normalize(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [normalize(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, float):
        raise LedgerRecordError(
            where, f"float {value!r} is not allowed (use integers, e.g. microseconds)"
        )
    if isinstance(value, int):  # an int subclass (IntEnum...): store the plain integer
        return normalize(int(value), where)
    if isinstance(value, str):  # a str subclass (StrEnum...): store the plain string
        return str(value)
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return [normalize(item, f"{where}[{index}]") for index, item in enumerate(value)]
    raise LedgerRecordError(where, f"type {type(value).__name__} is not allowed in a ledger entry")
