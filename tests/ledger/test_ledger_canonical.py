"""Tests of ledger.canonical: the canonical JSON rules."""

from __future__ import annotations

import enum
import math

import pytest

from ledger.canonical import MAX_SAFE_INT, decode, encode, normalize
from ledger.errors import LedgerRecordError


class Color(enum.IntEnum):
    RED = 1


def test_encode_sorts_keys_compactly() -> None:
    """Canonical bytes have sorted keys and no spaces."""
    assert encode({"b": 1, "a": [True, None, "x"]}) == b'{"a":[true,null,"x"],"b":1}'


def test_normalize_converts_tuples_and_int_subclasses() -> None:
    """Tuples become lists and IntEnum members plain ints."""
    assert normalize({"a": (1, 2), "c": Color.RED}) == {"a": [1, 2], "c": 1}


def test_float_rejected_with_key_path() -> None:
    """A float is refused, naming where it was."""
    with pytest.raises(LedgerRecordError, match=r"^record\.x\[1\]: float 1\.5 is not allowed"):
        normalize({"x": [1, 1.5]})


def test_nan_rejected() -> None:
    """NaN is a float too."""
    with pytest.raises(LedgerRecordError, match=r"^record\.y: float nan"):
        normalize({"y": math.nan})


def test_integer_range() -> None:
    """Integers beyond +-(2**53 - 1) are refused; the bounds are accepted."""
    assert normalize({"a": MAX_SAFE_INT, "b": -MAX_SAFE_INT}) == {
        "a": MAX_SAFE_INT,
        "b": -MAX_SAFE_INT,
    }
    with pytest.raises(LedgerRecordError, match=r"^record\.a: integer 9007199254740992 is outside"):
        normalize({"a": MAX_SAFE_INT + 1})


def test_non_string_key_rejected() -> None:
    """Keys must be strings."""
    with pytest.raises(LedgerRecordError, match=r"^record\.m: key 1 is a int, keys must be str"):
        normalize({"m": {1: "x"}})


def test_non_ascii_key_rejected() -> None:
    """Keys must be ASCII (code-point order equals RFC 8785 order only for ASCII)."""
    with pytest.raises(LedgerRecordError, match=r"^record\.clé: keys must be ASCII$"):
        normalize({"clé": 1})


def test_unsupported_type_rejected() -> None:
    """Bytes, sets and other objects are refused."""
    with pytest.raises(LedgerRecordError, match=r"^record\.b: type bytes is not allowed"):
        normalize({"b": b"raw"})
    with pytest.raises(LedgerRecordError, match=r"^record\.s: type set is not allowed"):
        normalize({"s": {1}})


def test_non_ascii_values_round_trip() -> None:
    """Non-ASCII string values are fine and survive encode/decode."""
    value = {"text": "grüße ✓"}
    assert decode(encode(normalize(value))) == value
