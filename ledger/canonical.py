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


class _Unusual(Exception):
    """Raised by `_plain` for anything but the exact built-in JSON types (or a rule broken)."""


def _plain(value: object) -> object:
    """`normalize` for values made only of exact ``dict``/``list``/``tuple``/``str``/``int``/
    ``bool``/``None`` (what the daemon writes): no key paths are built, nothing else is looked
    at; raises `_Unusual` otherwise, and the caller runs the full, path-naming check."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return value
    if kind is int:
        if -MAX_SAFE_INT <= value <= MAX_SAFE_INT:  # type: ignore[operator]
            return value
        raise _Unusual
    if kind is dict:
        for key in value:  # type: ignore[attr-defined]
            if type(key) is not str or not key.isascii():
                raise _Unusual
        return {key: _plain(item) for key, item in value.items()}  # type: ignore[attr-defined]
    if kind is list or kind is tuple:
        return [_plain(item) for item in value]  # type: ignore[attr-defined]
    raise _Unusual


def normalize(value: object, where: str = "record") -> object:
    """Return a JSON-native copy of ``value`` or raise `LedgerRecordError` naming the key path.

    Allowed: ``None``, ``bool``, ``int`` within +-(2**53 - 1), ``str``, mappings with ASCII
    ``str`` keys, lists and tuples. Everything else (floats, NaN, bytes, sets, datetimes, ...) is
    rejected so that the hashed bytes never depend on an encoder's choices.

    Plain built-in values take a fast path (same result, no key paths built); anything else,
    or a broken rule, goes through the full check, which names the offending key path.
    """
    try:
        return _plain(value)
    except _Unusual:
        return _normalize(value, where)


def _normalize(value: object, where: str) -> object:
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
        return {key: _normalize(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_normalize(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, float):
        raise LedgerRecordError(
            where, f"float {value!r} is not allowed (use integers, e.g. microseconds)"
        )
    if isinstance(value, int):  # an int subclass (IntEnum...): store the plain integer
        return _normalize(int(value), where)
    if isinstance(value, str):  # a str subclass (StrEnum...): store the plain string
        return str(value)
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return [_normalize(item, f"{where}[{index}]") for index, item in enumerate(value)]
    raise LedgerRecordError(where, f"type {type(value).__name__} is not allowed in a ledger entry")
