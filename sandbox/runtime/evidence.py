"""Evidence bytes of instruction turns, content-addressed under the session's directory.

An executor may send the evidence itself with a SUCCESS (``docs/protocol.md`` 3.5); once the
daemon has checked that its sha256 is the response's ``evidence_hash``, the bytes are kept at
``<session dir>/evidence/<sha256>`` (the session dir is ``<root>/planes/<tier>/sessions/<sid>``,
beside the ledgers; no turn can read it). Writing is idempotent: the same bytes are stored once.
The file is durable (file and directory fsynced) before the turn's ledger entries that name it
are committed. The entry records an `EvidenceRef`: the hash, the size, and the path relative to
the session directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["EVIDENCE_DIR", "EvidenceRef", "read_evidence", "store_evidence"]

#: The subdirectory of a session directory that holds evidence files.
EVIDENCE_DIR: Final = "evidence"
_SHA256: Final = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class EvidenceRef:
    """Stored evidence: its sha256, size, and path relative to the session directory."""

    sha256: str
    size: int
    path: str

    def to_dict(self) -> dict[str, object]:
        """As recorded in the turn's result and evidence ledger entry."""
        return {"sha256": self.sha256, "size": self.size, "path": self.path}


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def store_evidence(session_dir: Path, data: bytes) -> EvidenceRef:
    """Write *data* to ``<session_dir>/evidence/<sha256>`` durably (blocking; once per content)."""
    digest = hashlib.sha256(data).hexdigest()
    directory = session_dir / EVIDENCE_DIR
    ref = EvidenceRef(digest, len(data), f"{EVIDENCE_DIR}/{digest}")
    target = directory / digest
    if target.is_file() and target.stat().st_size == len(data):
        return ref  # content-addressed: already there
    created = not directory.is_dir()
    directory.mkdir(mode=0o700, exist_ok=True)
    if created:
        _fsync_dir(session_dir)
    temporary = directory / f".{digest}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    _fsync_dir(directory)
    return ref


def read_evidence(session_dir: Path, sha256: str) -> bytes:
    """The stored evidence with this hash (``FileNotFoundError`` if absent; ``ValueError`` for
    a malformed hash or bytes that no longer hash to it)."""
    if not _SHA256.fullmatch(sha256):
        msg = f"not a sha256: {sha256[:80]!r}"
        raise ValueError(msg)
    data = (session_dir / EVIDENCE_DIR / sha256).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        msg = f"stored evidence {sha256} is corrupt"
        raise ValueError(msg)
    return data
