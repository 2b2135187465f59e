"""Tests of ledger.chain: hashes and sealing."""

from __future__ import annotations

import hashlib

import orjson

from ledger.chain import DOMAIN_ENTRY, entry_hash, genesis_hash, is_hex_hash, seal


def test_genesis_depends_on_ledger_id_and_legacy_prefix() -> None:
    """Different ledger ids or legacy prefixes give different genesis hashes."""
    assert genesis_hash("a/exec") != genesis_hash("b/exec")
    assert genesis_hash("a/exec") != genesis_hash("a/exec", b'{"old":1}\n')
    assert is_hex_hash(genesis_hash("a/exec"))


def test_seal_hashes_canonical_body_with_domain_prefix() -> None:
    """entry_hash = sha256(domain || canonical(entry without entry_hash))."""
    entry: dict[str, object] = {"seq": 1, "kind": "x", "v": 1}
    line, digest = seal(entry)
    body = orjson.dumps({"kind": "x", "seq": 1, "v": 1})
    assert digest == hashlib.sha256(DOMAIN_ENTRY + body).hexdigest() == entry_hash(body)
    assert line == orjson.dumps(entry, option=orjson.OPT_SORT_KEYS) + b"\n"
    assert entry["entry_hash"] == digest


def test_is_hex_hash() -> None:
    """Only 64 lowercase hex digits pass."""
    assert is_hex_hash("a" * 64)
    assert not is_hex_hash("A" * 64)
    assert not is_hex_hash("a" * 63)
    assert not is_hex_hash(None)
