"""`hunter ledger export` and `hunter ledger verify --store`: the ledgers a shared PostgreSQL
store anchors, as files, and files checked against it.

With several daemons on one PostgreSQL the store is the ledger of record: it keeps every line of
every session and each ledger's head. `export` writes seed 004's layout
(``<DIR>/planes/<tier>/sessions/<sid>/ledger/{exec,evidence}.jsonl``) from it, every line checked
to continue its chain as it is written. `verify --store` first checks the files as `verify`
always does (every hash and link), then compares them with the store line by line and with the
anchored heads: an entry dropped or altered in either place is reported. Only the sessions whose
files are under the root are compared; the others are listed with why (on a daemon's root, a
session another daemon homes is checked there). When the root holds none, the store's lines are
checked on their own (written out to a scratch directory as `export` writes them, then
compared), and the command says how to compare files.

The store is named by ``--dsn``, or by the ``[store]`` section of ``--config`` (as for `hunter
serve`; the password only from ``store.password_file`` or libpq's own mechanisms).
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from ledger import cli as ledger_cli
from ledger.entries import SealedLine
from supervisor.cli.exit_codes import EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from supervisor.store.fleet import DaemonRecord

__all__ = ["check_store", "export_ledgers", "register", "verify_against_store"]

EXIT_INTEGRITY = 1


@dataclass(slots=True)
class Report:
    sessions: int = 0
    lines: int = 0
    problems: list[str] = field(default_factory=list)
    #: sessions of the store not compared with files under the root, each with why
    skipped: list[str] = field(default_factory=list)


def register(actions: Any, verify: argparse.ArgumentParser) -> None:
    """Add ``ledger export`` and ``ledger verify --store``."""
    export = actions.add_parser(
        "export",
        help="write the session ledgers a PostgreSQL turn store anchors as files",
        description="Write exec.jsonl and evidence.jsonl of every session (or one) from the "
        "shared turn store, in seed 004's layout under DIR. Exit 0 when every chain is whole, "
        "1 when the store's lines do not form one, 2 on usage errors.",
    )
    export.add_argument("--root", type=Path, required=True, metavar="DIR", help="where to write")
    export.add_argument("--session", metavar="SID", help="only this session")
    _store_options(export)
    export.set_defaults(handler=_export_command)
    verify.add_argument(
        "--store",
        action="store_true",
        help="also compare the files with the PostgreSQL turn store's lines and anchored heads",
    )
    verify.add_argument("--session", metavar="SID", help="with --store: only this session")
    _store_options(verify)
    plain = verify.get_default("handler")
    verify.set_defaults(handler=lambda args: _verify_command(args, plain))


def _store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", help="the PostgreSQL connection string (no password)")
    parser.add_argument(
        "--config", metavar="FILE", help="TOML config whose [store] names the database"
    )


def _dsn(args: argparse.Namespace) -> str:
    if args.dsn:
        return str(args.dsn)
    from supervisor.config import load_config
    from supervisor.server import postgres_target

    config = load_config(Path(args.config) if args.config else None, env=os.environ)
    if config.store.engine != "postgres":
        msg = "the configured store is not PostgreSQL: give --dsn or a --config with [store]"
        raise ValueError(msg)
    return postgres_target(config)[0]


def _export_command(args: argparse.Namespace) -> int:
    try:
        dsn = _dsn(args)
    except Exception as exc:
        sys.stderr.write(f"hunter ledger export: {exc}\n")
        return EXIT_USAGE
    report = anyio.run(export_ledgers, dsn, args.root, args.session)
    for problem in report.problems:
        sys.stderr.write(f"hunter ledger export: {problem}\n")
    sys.stdout.write(
        f"exported {report.lines} lines of {report.sessions} sessions to {args.root}\n"
    )
    return EXIT_INTEGRITY if report.problems else EXIT_OK


def _verify_command(args: argparse.Namespace, plain: Any) -> int:
    from ledger.verify import session_dirs

    if not args.store:
        return int(plain(args))
    root: Path | None = args.root
    if root is None:
        sys.stderr.write("hunter ledger verify: --store needs --root DIR\n")
        return EXIT_USAGE
    if not args.paths and root.is_dir() and not session_dirs(root):
        # nothing for the file checks: say so (the store is checked below all the same)
        sys.stdout.write(f"{root} holds no session ledger files\n")
        code = EXIT_OK
    else:
        code = int(plain(args))
        if code == EXIT_USAGE:
            return code
    try:
        dsn = _dsn(args)
    except Exception as exc:
        sys.stderr.write(f"hunter ledger verify: {exc}\n")
        return EXIT_USAGE
    report = anyio.run(verify_against_store, dsn, root, args.session)
    for note in report.skipped:
        sys.stdout.write(f"--  {note}\n")
    for problem in report.problems:
        sys.stdout.write(f"MISMATCH {problem}\n")
    if report.problems:
        return EXIT_INTEGRITY
    if report.sessions:
        others = f"; {len(report.skipped)} not compared here (above)" if report.skipped else ""
        sessions = f"{report.sessions} session{'' if report.sessions == 1 else 's'}"
        sys.stdout.write(
            f"store: {report.lines} lines of {sessions} match the files and the anchored"
            f" heads{others}\n"
        )
        return code
    # No file here to compare with the store: check what the store holds on its own.
    own = anyio.run(check_store, dsn, args.session)
    for problem in own.problems:
        sys.stdout.write(f"MISMATCH {problem}\n")
    if own.problems:
        return EXIT_INTEGRITY
    sessions = f"{own.sessions} session{'' if own.sessions == 1 else 's'}"
    sys.stdout.write(
        f"store: {own.lines} lines of {sessions} form whole chains that end at their anchored"
        f" heads (checked on their own: no file under {root} was compared with them)\n"
        "to compare a session's files with the store, run this on the root of the daemon that"
        " homes it, or `hunter ledger export --root DIR`, then `hunter ledger verify --root DIR"
        " --store`\n"
    )
    return code


async def export_ledgers(dsn: str, out: Path, session_id: str | None) -> Report:
    """Write the store's lines as files under *out* (each checked to continue its chain)."""
    from ledger import IntegrityError
    from ledger.session import SessionLedgers
    from supervisor.store.postgres import open_postgres_store

    report = Report()
    async with open_postgres_store(dsn, migrate=False, read_connections=1) as store:
        if session_id is not None:
            records = [await store.get_session(session_id)]
        else:
            records = await store.list_sessions()
        for record in records:
            sid = record.session_id
            lines = await store.ledger_lines([f"{sid}/exec", f"{sid}/evidence"])
            try:
                await anyio.to_thread.run_sync(
                    functools.partial(
                        SessionLedgers.adopt,
                        root=out,
                        tier=record.tier,
                        session_id=sid,
                        lines=lines,
                    )
                )
            except IntegrityError as exc:
                report.problems.append(f"session {sid}: {exc}")
                continue
            report.sessions += 1
            report.lines += len(lines)
    return report


def _daemon_of(daemons: list[DaemonRecord], root: Path) -> str | None:
    """The daemon whose root *root* is (on this host, as its last heartbeat says), if any."""
    try:
        wanted = root.resolve()
    except OSError:
        return None
    host = socket.gethostname()
    for daemon in daemons:  # newest heartbeat first
        said = daemon.info.get("root")
        if daemon.host == host and isinstance(said, str) and Path(said) == wanted:
            return daemon.owner
    return None


async def verify_against_store(dsn: str, root: Path, session_id: str | None) -> Report:
    """Compare the files under *root* with the store's lines and heads, ledger by ledger.

    Only the sessions whose files are there: a session without files under *root* is noted
    in `Report.skipped`, not a mismatch (unless *root* is the root of the daemon homing it,
    which must have them). On the root of a daemon of the fleet, a session another daemon homes
    is noted as checked there: the files here hold what this daemon wrote while it homed it."""
    from ledger import session_dir_for
    from ledger.tail import read_sealed_lines
    from supervisor.store.postgres import open_postgres_store

    report = Report()
    async with open_postgres_store(dsn, migrate=False, read_connections=1) as store:
        if session_id is not None:
            records = [await store.get_session(session_id)]
        else:
            records = await store.list_sessions()
        heads = {h.ledger_id: h for h in await store.ledger_heads()}
        homes = await store.session_homes(None if session_id is None else [session_id])
        here = _daemon_of(await store.daemons(), root)
        for record in records:
            sid = record.session_id
            ledger_dir = session_dir_for(root, record.tier, sid) / "ledger"
            home = homes.get(sid)
            if here is not None and home is not None and home != here:
                report.skipped.append(
                    f"{sid}: homed by {home}, checked there ({root} is the root of {here})"
                )
                continue
            if not any((ledger_dir / f"{role}.jsonl").exists() for role in ("exec", "evidence")):
                if here is not None and home == here:
                    report.problems.append(
                        f"{sid}: homed by {here}, the daemon of this root, but {ledger_dir}"
                        " holds no ledger files"
                    )
                else:
                    where = (
                        f"homed by {home}: its files are on that daemon's root"
                        if home
                        else f"{record.state.value}, homed by no daemon now"
                    )
                    report.skipped.append(f"{sid}: no ledger files under {root} ({where})")
                continue
            report.sessions += 1
            for role in ("exec", "evidence"):
                ledger_id = f"{sid}/{role}"
                stored = await store.ledger_lines([ledger_id])
                path = ledger_dir / f"{role}.jsonl"
                try:
                    found, _ = read_sealed_lines(path, ledger_id)
                except (OSError, ValueError) as exc:
                    report.problems.append(f"{ledger_id}: cannot read {path}: {exc}")
                    continue
                report.lines += len(found)
                report.problems.extend(_compare(ledger_id, found, stored))
                head = heads.get(ledger_id)
                last = stored[-1] if stored else None
                if head is None and last is not None:
                    report.problems.append(f"{ledger_id}: the store has lines but no head")
                elif head is not None and (
                    last is None or (head.seq, head.entry_hash) != (last.seq, last.entry_hash)
                ):
                    report.problems.append(
                        f"{ledger_id}: anchored head seq {head.seq} {head.entry_hash[:12]} is not"
                        " the store's last line (lines were dropped or altered in the store)"
                    )
                if (
                    head is not None
                    and found
                    and (found[-1].seq, found[-1].entry_hash)
                    != (
                        head.seq,
                        head.entry_hash,
                    )
                ):
                    report.problems.append(
                        f"{ledger_id}: the file ends at seq {found[-1].seq}, the anchored head is"
                        f" seq {head.seq}"
                    )
    return report


async def check_store(dsn: str, session_id: str | None) -> Report:
    """What the store holds, on its own: every session's lines written out (each checked to
    continue its chain, as `export_ledgers` does) to a scratch directory, then compared with
    the store's lines and anchored heads there; the directory is removed."""
    with tempfile.TemporaryDirectory(prefix="hunter-ledger-") as scratch:
        exported = await export_ledgers(dsn, Path(scratch), session_id)
        if exported.problems:
            return exported
        return await verify_against_store(dsn, Path(scratch), session_id)


def _compare(ledger_id: str, found: list[SealedLine], stored: list[SealedLine]) -> list[str]:
    problems: list[str] = []
    by_seq = {x.seq: x for x in stored}
    file_seqs = {x.seq for x in found}
    for x in found:
        kept = by_seq.get(x.seq)
        if kept is None:
            problems.append(f"{ledger_id} seq {x.seq}: in the file, missing from the store")
        elif kept.line != x.line:
            problems.append(f"{ledger_id} seq {x.seq}: the file and the store differ")
    problems.extend(
        f"{ledger_id} seq {x.seq}: in the store, missing from the file"
        for x in stored
        if x.seq not in file_seqs
    )
    return problems


ledger_cli.extend(register)
