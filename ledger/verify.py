"""Verification on read: recompute every hash and link, check the anchored head.

The per-line work is kept minimal because verification runs over whole ledgers (and every
session of a root) routinely: one ``orjson.loads``, one ``orjson.dumps`` with sorted keys (the
canonical re-encoding, compared with the line's bytes), a byte splice that removes the
``"entry_hash":"<hex>"`` member (valid because the line *is* canonical and that member occurs
exactly once) and one sha256 over domain prefix and body. See docs/ledger.md.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Final

import orjson
import structlog

from ledger.chain import DOMAIN_ENTRY, FORMAT_VERSION, genesis_hash, is_hex_hash
from ledger.errors import IntegrityError
from ledger.heads import Head, HeadStore, read_head, resolve_head_path

__all__ = [
    "BatchReport",
    "Scan",
    "VerifyReport",
    "infer_ledger_id",
    "scan_bytes",
    "session_ledger_paths",
    "verify",
    "verify_many",
    "verify_root",
    "verify_scan",
    "verify_session_dir",
]

_log = structlog.get_logger("ledger")

LEDGER_FILES: Final = ("exec.jsonl", "evidence.jsonl")
_MEMBER: Final = b'"entry_hash":"'
_SORT: Final = orjson.OPT_SORT_KEYS
_CHUNK: Final = 32  # small chunks keep few parsed dicts alive (cheaper GC)

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The result of verifying one ledger file that passed."""

    path: Path
    ledger_id: str | None
    entries: int
    legacy_entries: int
    head_seq: int
    head_hash: str
    warnings: tuple[str, ...] = ()
    anchored_seq: int | None = None
    head_path: Path | None = None


@dataclass(slots=True)
class Scan:
    """What `scan_bytes` learned about a ledger's bytes (all checks passed)."""

    ledger_id: str | None
    entries: int
    legacy_entries: int
    legacy_prefix: bytes
    head_seq: int
    head_hash: str
    last_ts_us: int
    lines: int
    parsed: list[dict[str, object]] = field(default_factory=list)


def infer_ledger_id(path: Path) -> str | None:
    """``<sid>/exec`` for ``.../sessions/<sid>/ledger/exec.jsonl`` (same for evidence)."""
    if path.name in LEDGER_FILES and path.parent.name == "ledger":
        session = path.parent.parent.name
        if session:
            return f"{session}/{path.name.removesuffix('.jsonl')}"
    return None


def _fail(path: Path, line: int, seq: int | None, reason: str) -> IntegrityError:
    return IntegrityError(path, line, seq, reason)


def scan_bytes(
    data: bytes,
    path: Path,
    *,
    ledger_id: str | None,
    anchor: Head | None = None,
    collect: bool = False,
) -> Scan:
    """Check a whole ledger's bytes; raise `IntegrityError` at the first problem.

    ``collect`` keeps the parsed hashed entries (for replay and display).
    """
    lines = data.split(b"\n")
    if lines[-1]:
        raise _fail(
            path,
            len(lines),
            None,
            f"torn last line ({len(lines[-1])} bytes without a trailing newline; "
            "opening the ledger for writing moves it aside)",
        )
    lines.pop()
    loads = orjson.loads
    count = len(lines)
    # Legacy (hash-less) leading prefix.
    legacy = 0
    first: dict[str, object] | None = None
    while legacy < count:
        try:
            obj = loads(lines[legacy])
        except orjson.JSONDecodeError as exc:
            raise _fail(path, legacy + 1, None, f"undecodable line: {exc}") from None
        if type(obj) is not dict:
            raise _fail(path, legacy + 1, None, "line is not a JSON object")
        if "entry_hash" in obj:
            first = obj
            break
        legacy += 1
    legacy_prefix = b"".join(line + b"\n" for line in lines[:legacy]) if legacy else b""
    if first is not None and ledger_id is None:
        found = first.get("ledger_id")
        if type(found) is not str:
            raise _fail(path, legacy + 1, None, "ledger_id missing or not a string")
        ledger_id = found
    previous = genesis_hash(ledger_id, legacy_prefix) if ledger_id is not None else ""
    if (
        anchor is not None
        and anchor.seq == 0
        and ledger_id is not None
        and anchor.entry_hash != previous
    ):
        raise _fail(path, 0, 0, "anchored head mismatch at seq 0 (rollback or rewrite)")
    dumps = orjson.dumps
    sha256 = hashlib.sha256
    domain = DOMAIN_ENTRY
    anchor_seq = -1 if anchor is None else anchor.seq
    anchor_hash = "" if anchor is None else anchor.entry_hash
    parsed: list[dict[str, object]] = []
    seq = 0
    last_ts = 0
    for chunk_start in range(legacy, count, _CHUNK):
        chunk = lines[chunk_start : chunk_start + _CHUNK]
        # One parse and one canonical re-encoding per chunk: the chunk's lines joined as a JSON
        # array re-encode to exactly the same bytes iff every line is canonical.
        joined = b"[" + b",".join(chunk) + b"]"
        try:
            entries = loads(joined)
            fast = len(entries) == len(chunk) and dumps(entries, option=_SORT) == joined
        except orjson.JSONDecodeError:
            fast = False
        if not fast:  # some line is bad: find it, checking line by line
            entries = []
            link = previous
            for offset, line in enumerate(chunk, start=1):
                entry = _check_line(
                    path,
                    legacy + seq + offset,
                    line,
                    expected_seq=seq + offset,
                    ledger_id=ledger_id,
                    previous=link,
                    anchor=anchor,
                )
                link = str(entry["entry_hash"])
                entries.append(entry)
        for line, entry in zip(chunk, entries, strict=True):
            seq += 1
            # Every check in one expression; any surprise goes to _check_line, which repeats
            # the checks one at a time and raises the precise IntegrityError.
            try:
                digest = entry["entry_hash"]
                body = line.replace(_MEMBER + digest.encode() + b'",', b"")
                ok = (
                    len(body) == len(line) - 80
                    and sha256(domain + body).hexdigest() == digest
                    and entry["seq"] == seq
                    and entry["previous_hash"] == previous
                    and entry["ledger_id"] == ledger_id
                    and entry["v"] == FORMAT_VERSION
                    and type(entry["seq"]) is int is type(entry["ts_us"]) is type(entry["v"])
                    and (seq != anchor_seq or digest == anchor_hash)
                )
            except (KeyError, TypeError, AttributeError, ValueError):
                ok = False
            if not ok:
                _check_line(
                    path,
                    legacy + seq,
                    line,
                    expected_seq=seq,
                    ledger_id=ledger_id,
                    previous=previous,
                    anchor=anchor,
                )
                raise _fail(path, legacy + seq, seq, "entry failed verification")
            previous = digest
        if entries:
            last_ts = entries[-1]["ts_us"]
        if collect:
            parsed.extend(entries)
    if anchor is not None and anchor.seq > seq:
        raise _fail(
            path,
            count,
            seq,
            f"truncated below anchored head (anchored seq {anchor.seq}, file ends at seq {seq})",
        )
    return Scan(
        ledger_id=ledger_id,
        entries=seq,
        legacy_entries=legacy,
        legacy_prefix=legacy_prefix,
        head_seq=seq,
        head_hash=previous,
        last_ts_us=last_ts,
        lines=count,
        parsed=parsed,
    )


def _check_line(
    path: Path,
    line_number: int,
    line: bytes,
    *,
    expected_seq: int,
    ledger_id: str | None,
    previous: str,
    anchor: Head | None,
) -> dict[str, object]:
    """Check one hashed line step by step; raise the precise `IntegrityError` or return the
    parsed entry."""
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise _fail(path, line_number, None, f"undecodable line: {exc}") from None
    if type(entry) is not dict:
        raise _fail(path, line_number, None, "line is not a JSON object")
    seq = _seq_of(entry)
    digest = entry.get("entry_hash")
    if digest is None:
        raise _fail(path, line_number, seq, "hash-less entry after a hashed one")
    if not is_hex_hash(digest):
        raise _fail(path, line_number, seq, "entry_hash is not 64 lowercase hex digits")
    if orjson.dumps(entry, option=_SORT) != line:
        raise _fail(path, line_number, seq, "non-canonical bytes")
    member = _MEMBER + digest.encode() + b'"'
    start = line.find(member)
    if line.find(member, start + 1) != -1:
        raise _fail(path, line_number, seq, "entry_hash member occurs more than once")
    end = start + len(member)
    if line[end : end + 1] == b",":
        body = line[:start] + line[end + 1 :]
    else:
        body = line[: start - 1] + line[end:]
    if hashlib.sha256(DOMAIN_ENTRY + body).hexdigest() != digest:
        raise _fail(path, line_number, seq, "bad hash: entry_hash does not match the entry")
    found_seq = entry.get("seq")
    if type(found_seq) is not int or found_seq != expected_seq:
        raise _fail(
            path, line_number, seq, f"seq gap: expected seq {expected_seq}, found {found_seq}"
        )
    if entry.get("ledger_id") != ledger_id:
        raise _fail(
            path,
            line_number,
            seq,
            f"wrong ledger id: expected {ledger_id!r}, found {entry.get('ledger_id')!r}",
        )
    if entry.get("previous_hash") != previous:
        raise _fail(path, line_number, seq, "broken link: previous_hash does not match")
    version = entry.get("v")
    if type(version) is not int or version != FORMAT_VERSION:
        raise _fail(path, line_number, seq, f"unsupported format version {version!r}")
    if type(entry.get("ts_us")) is not int:
        raise _fail(path, line_number, seq, "ts_us missing or not an integer")
    if anchor is not None and seq == anchor.seq and digest != anchor.entry_hash:
        raise _fail(path, line_number, seq, "anchored head mismatch (rollback or rewrite)")
    return entry


def _seq_of(entry: dict[str, object]) -> int | None:
    seq = entry.get("seq")
    return seq if type(seq) is int else None


def verify(
    path: Path | str,
    *,
    ledger_id: str | None = None,
    head_store: HeadStore | Path | None = None,
) -> VerifyReport:
    """Verify one ledger file; raise `IntegrityError` naming file, line, seq and reason.

    ``ledger_id`` defaults to the one implied by the session layout (``<sid>/exec``) or, for
    other files, the first hashed entry's. The anchored head is found by the location rule of
    `ledger.heads` unless ``head_store`` says otherwise. Never modifies anything.
    """
    report, _scan = verify_scan(
        Path(path), ledger_id=ledger_id, head_store=head_store, collect=False
    )
    return report


def verify_scan(
    path: Path,
    *,
    ledger_id: str | None,
    head_store: HeadStore | Path | None,
    collect: bool,
) -> tuple[VerifyReport, Scan]:
    """`verify`, also returning the `Scan` (with parsed entries when ``collect``)."""
    if ledger_id is None:
        ledger_id = infer_ledger_id(path)
    head_path = resolve_head_path(path, head_store)
    anchor = read_head(head_path)
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        # A live ledger: a sync round's write may have been half-copied when we read. Read once
        # more; a tail that is still incomplete is reported as torn.
        data = path.read_bytes()
    scan = scan_bytes(data, path, ledger_id=ledger_id, anchor=anchor, collect=collect)
    warnings: list[str] = []
    if scan.legacy_entries:
        warnings.append(f"legacy prefix: {scan.legacy_entries} entries without hashes")
        _log.warning("ledger_legacy_prefix", path=str(path), legacy_entries=scan.legacy_entries)
    if anchor is None and scan.entries:
        warnings.append(f"no head anchor at {head_path}: truncation cannot be detected")
    elif anchor is not None and scan.head_seq > anchor.seq:
        warnings.append(
            f"{scan.head_seq - anchor.seq} entries after the anchored head (seq {anchor.seq})"
        )
    report = VerifyReport(
        path=path,
        ledger_id=scan.ledger_id,
        entries=scan.entries,
        legacy_entries=scan.legacy_entries,
        head_seq=scan.head_seq,
        head_hash=scan.head_hash,
        warnings=tuple(warnings),
        anchored_seq=None if anchor is None else anchor.seq,
        head_path=head_path,
    )
    return report, scan


def session_ledger_paths(directory: Path) -> tuple[Path, Path]:
    """``(exec, evidence)`` paths of a session directory (or of its ``ledger/`` directory)."""
    ledger_dir = directory if directory.name == "ledger" else directory / "ledger"
    return ledger_dir / LEDGER_FILES[0], ledger_dir / LEDGER_FILES[1]


def verify_session_dir(directory: Path | str) -> list[VerifyReport]:
    """Verify both ledgers of a session; both must exist (FR-RT-018 gate)."""
    paths = session_ledger_paths(Path(directory))
    for ledger_path in paths:
        if not ledger_path.is_file():
            raise IntegrityError(
                ledger_path,
                0,
                None,
                "ledger missing: a session needs both exec.jsonl and evidence.jsonl",
            )
    return [verify(ledger_path) for ledger_path in paths]


@dataclass(frozen=True, slots=True)
class BatchReport:
    """Results of verifying many targets: the passing reports and the integrity errors."""

    reports: tuple[VerifyReport, ...]
    errors: tuple[IntegrityError, ...]

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return not self.errors


def _verify_target(target: Path) -> list[VerifyReport] | IntegrityError:
    try:
        if target.is_dir():
            return verify_session_dir(target)
        return [verify(target)]
    except IntegrityError as exc:
        return exc


def verify_many(
    targets: Sequence[Path],
    *,
    workers: int | None = None,
    progress: Progress | None = None,
) -> BatchReport:
    """Verify ledger files and session directories, in parallel processes when ``workers`` is
    more than one (default: the number of usable CPUs)."""
    total = len(targets)
    if workers is None:
        workers = len(os.sched_getaffinity(0))
    workers = max(1, min(workers, total))
    results: list[list[VerifyReport] | IntegrityError] = []
    if workers == 1:
        for done, target in enumerate(targets, start=1):
            results.append(_verify_target(target))
            if progress is not None:
                progress(done, total)
    else:
        # fork is cheapest (no re-import) and safe while this process has a single thread;
        # with other threads running (a daemon's syncer) a forked child could inherit a held
        # lock, so then spawn.
        method = "fork" if threading.active_count() == 1 else "spawn"
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context(method)) as pool:
            futures = [pool.submit(_verify_target, target) for target in targets]
            for done, _future in enumerate(as_completed(futures), start=1):
                if progress is not None:
                    progress(done, total)
            results = [future.result() for future in futures]
    reports: list[VerifyReport] = []
    errors: list[IntegrityError] = []
    for result in results:
        if isinstance(result, IntegrityError):
            errors.append(result)
        else:
            reports.extend(result)
    return BatchReport(reports=tuple(reports), errors=tuple(errors))


def session_dirs(root: Path) -> list[Path]:
    """Every session directory under ``<root>/planes/<tier>/sessions/``."""
    return sorted(path for path in root.glob("planes/*/sessions/*") if path.is_dir())


def verify_root(
    root: Path | str,
    *,
    workers: int | None = None,
    progress: Progress | None = None,
) -> BatchReport:
    """Verify every session under ``root`` in parallel across cores."""
    return verify_many(session_dirs(Path(root)), workers=workers, progress=progress)
