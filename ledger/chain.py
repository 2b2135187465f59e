"""The hash chain: domain prefixes, genesis hashes and sealing of entries.

``entry_hash = sha256(DOMAIN_ENTRY || canonical(entry without "entry_hash"))`` as 64 lowercase hex
digits. The hashed entry holds ``v``, ``ledger_id``, a contiguous ``seq`` (the first entry is 1)
and ``previous_hash``; the first entry's ``previous_hash`` is `genesis_hash` of the ledger id, so
an entry cannot be moved to another ledger or renumbered without breaking its hash. Each use of
sha256 in the package has its own domain prefix, so no hash of one kind can be passed off as
another.
"""

from __future__ import annotations

import hashlib
from typing import Final

import orjson

__all__ = [
    "DOMAIN_ENTRY",
    "DOMAIN_FOLD",
    "DOMAIN_GENESIS",
    "DOMAIN_HEAD",
    "DOMAIN_LEGACY",
    "FORMAT_VERSION",
    "content_hash",
    "entry_hash",
    "genesis_hash",
    "is_hex_hash",
    "seal",
]

FORMAT_VERSION: Final = 1
DOMAIN_ENTRY: Final = b"humanoid-hunter/ledger/v1/entry\x00"
DOMAIN_GENESIS: Final = b"humanoid-hunter/ledger/v1/genesis\x00"
DOMAIN_LEGACY: Final = b"humanoid-hunter/ledger/v1/legacy-prefix\x00"
DOMAIN_HEAD: Final = b"humanoid-hunter/ledger/v1/head\x00"
DOMAIN_FOLD: Final = b"humanoid-hunter/ledger/v1/fold\x00"

_SORT: Final = orjson.OPT_SORT_KEYS
_HEX: Final = frozenset("0123456789abcdef")


def genesis_hash(ledger_id: str, legacy_prefix: bytes = b"") -> str:
    """The ``previous_hash`` of a ledger's first hashed entry.

    Derived from the ledger id; when the file starts with legacy (hash-less) lines, their exact
    bytes are bound in too, so the legacy prefix cannot be edited once a hashed entry follows.
    """
    digest = hashlib.sha256(DOMAIN_GENESIS + ledger_id.encode("utf-8"))
    if legacy_prefix:
        digest.update(b"\x00" + hashlib.sha256(DOMAIN_LEGACY + legacy_prefix).digest())
    return digest.hexdigest()


def entry_hash(body: bytes) -> str:
    """Hash of the canonical bytes of an entry without its ``entry_hash`` key."""
    return hashlib.sha256(DOMAIN_ENTRY + body).hexdigest()


def is_hex_hash(value: object) -> bool:
    """True for a 64-character lowercase hex string."""
    return type(value) is str and len(value) == 64 and _HEX.issuperset(value)


def content_hash(data: object) -> str:
    """SHA-256 of *data*'s canonical JSON (sorted keys): the ``query_hash`` and ``result_hash``
    a turn entry carries for its request and its result."""
    return hashlib.sha256(orjson.dumps(data, option=_SORT)).hexdigest()


def seal(entry: dict[str, object]) -> tuple[bytes, str]:
    """Add ``entry_hash`` to a normalized entry (in place); return its line bytes and hash."""
    digest = entry_hash(orjson.dumps(entry, option=_SORT))
    entry["entry_hash"] = digest
    return orjson.dumps(entry, option=_SORT | orjson.OPT_APPEND_NEWLINE), digest
