"""The head store: the anchored (seq, entry_hash) of every synced ledger.

A plain hash chain does not reveal truncation (a valid prefix is a valid chain), so after every
sync batch the writer records the ledger's head somewhere else. Location rule, used by both the
writer and `verify` when nobody says otherwise:

* a ledger under ``<root>/planes/...`` -> ``<root>/state/ledger-heads/<path below root>.head``
  (the supervisor's state directory, which an agent's sandbox cannot write);
* any other ledger file -> a sidecar ``<file>.head``.

A head file holds two fixed-size 128-byte slots written alternately in place with ``pwrite`` (no
rename, no new inode, so anchoring costs one small write per sync batch). Each slot is
``<seq:020d> <entry_hash> <check>`` padded with spaces and ending in a newline, where ``check``
is the first 16 hex digits of ``sha256(DOMAIN_HEAD || "<seq:020d> <entry_hash>")``; a torn slot
fails its check and the other slot (the previous head) is used.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from ledger.chain import DOMAIN_HEAD, is_hex_hash
from ledger.errors import IntegrityError
from ledger.files import fsync_dir, make_dirs

__all__ = [
    "Head",
    "HeadAnchor",
    "HeadStore",
    "SidecarHeadStore",
    "StateDirHeadStore",
    "default_head_store",
    "read_head",
    "resolve_head_path",
]

SLOT_SIZE: Final = 128
HEADS_DIR: Final = ("state", "ledger-heads")


@dataclass(frozen=True, slots=True)
class Head:
    """An anchored head: the last synced entry's ``seq`` and ``entry_hash``."""

    seq: int
    entry_hash: str


class HeadStore(Protocol):
    """Maps a ledger file to the file that anchors its head."""

    def head_path(self, ledger_path: Path) -> Path:
        """The head file for ``ledger_path``."""
        ...


@dataclass(frozen=True, slots=True)
class SidecarHeadStore:
    """Head next to the ledger: ``<file>.head``."""

    def head_path(self, ledger_path: Path) -> Path:
        """``<file>.head``."""
        return ledger_path.with_name(ledger_path.name + ".head")


@dataclass(frozen=True, slots=True)
class StateDirHeadStore:
    """Heads of ledgers below ``root`` mirrored under ``<root>/state/ledger-heads/``."""

    root: Path

    def head_path(self, ledger_path: Path) -> Path:
        """``<root>/state/ledger-heads/<ledger path relative to root>.head``."""
        relative = ledger_path.resolve().relative_to(self.root.resolve())
        return self.root.joinpath(*HEADS_DIR, *relative.parts[:-1], relative.name + ".head")


@dataclass(frozen=True, slots=True)
class _FixedHeadPath:
    path: Path

    def head_path(self, ledger_path: Path) -> Path:
        return self.path


def default_head_store(ledger_path: Path) -> HeadStore:
    """Apply the location rule: the nearest ancestor named ``planes`` marks ``<root>``."""
    resolved = ledger_path.resolve()
    for ancestor in resolved.parents:
        if ancestor.name == "planes":
            return StateDirHeadStore(ancestor.parent)
    return SidecarHeadStore()


def resolve_head_path(ledger_path: Path, head_store: HeadStore | Path | None) -> Path:
    """The head file for ``ledger_path``: an explicit path, a store's choice, or the rule."""
    if isinstance(head_store, Path):
        return head_store
    store = default_head_store(ledger_path) if head_store is None else head_store
    return store.head_path(ledger_path)


def _slot(head: Head) -> bytes:
    text = f"{head.seq:020d} {head.entry_hash}"
    check = hashlib.sha256(DOMAIN_HEAD + text.encode("ascii")).hexdigest()[:16]
    return f"{text} {check}".ljust(SLOT_SIZE - 1).encode("ascii") + b"\n"


def _parse_slot(raw: bytes) -> Head | None:
    try:
        seq_text, digest, _check = raw.decode("ascii").split()
    except (UnicodeDecodeError, ValueError):
        return None
    if len(seq_text) != 20 or not seq_text.isdigit() or not is_hex_hash(digest):
        return None
    head = Head(int(seq_text), digest)
    return head if _slot(head) == raw else None


def _read_slots(head_path: Path) -> list[Head | None]:
    data = head_path.read_bytes()
    return [_parse_slot(data[i : i + SLOT_SIZE]) for i in range(0, 2 * SLOT_SIZE, SLOT_SIZE)]


def read_head(head_path: Path) -> Head | None:
    """The anchored head, ``None`` when no head file exists.

    Raises `IntegrityError` when the file exists but neither slot is valid.
    """
    try:
        data = head_path.read_bytes()
    except FileNotFoundError:
        return None
    if not data.strip(b"\x00"):
        return None  # created, nothing anchored yet (crash right after creation)
    slots = [_parse_slot(data[i : i + SLOT_SIZE]) for i in range(0, 2 * SLOT_SIZE, SLOT_SIZE)]
    valid = [slot for slot in slots if slot is not None]
    if not valid:
        raise IntegrityError(head_path, 0, None, "head anchor file has no valid slot")
    return max(valid, key=lambda head: head.seq)


class HeadAnchor:
    """The writer's open head file: `write` in place after each sync batch, `sync` on close."""

    def __init__(self, head_path: Path) -> None:
        self.path = head_path
        make_dirs(head_path.parent)
        created = not head_path.exists()
        self._fd = os.open(head_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if created:
            fsync_dir(head_path.parent)
        self._next_slot = 0
        self._dirty = False
        try:
            slots = _read_slots(head_path)
        except OSError:
            slots = [None, None]
        current = [(slot.seq, index) for index, slot in enumerate(slots) if slot is not None]
        if current:
            self._next_slot = 1 - max(current)[1]

    def write(self, head: Head) -> None:
        """Overwrite the older slot with ``head`` (page cache only; see `sync`)."""
        os.pwrite(self._fd, _slot(head), self._next_slot * SLOT_SIZE)
        self._next_slot = 1 - self._next_slot
        self._dirty = True

    def sync(self) -> None:
        """Make the last written head durable."""
        if self._dirty:
            os.fdatasync(self._fd)
            self._dirty = False

    def close(self) -> None:
        """Sync and close."""
        if self._fd >= 0:
            try:
                self.sync()
            finally:
                os.close(self._fd)
                self._fd = -1
