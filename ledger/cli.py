"""``hunter ledger verify|show``: verification and display of ledgers from the command line.

Exit codes: 0 every ledger intact, 1 any integrity error (each printed as
``<file>:<line>: seq <n>: <reason>``), 2 usage errors (argparse's own errors, a path that does
not exist, a directory that holds no ledgers). Imports nothing from ``supervisor``; heavy
imports happen inside the handlers so ``hunter --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TextIO

__all__ = ["EXIT_INTEGRITY", "EXIT_OK", "EXIT_USAGE", "add_parser", "main"]

EXIT_OK: Final = 0
EXIT_INTEGRITY: Final = 1
EXIT_USAGE: Final = 2
_PARALLEL_MIN_TARGETS: Final = 8


#: Registrars of further ``ledger`` actions, from packages above this one (the daemon adds
#: ``export`` and ``verify --store``): each gets the actions and the ``verify`` parser.
_EXTENSIONS: list[Callable[[Any, argparse.ArgumentParser], None]] = []


def extend(registrar: Callable[[Any, argparse.ArgumentParser], None]) -> None:
    """Add ``ledger`` actions (or ``verify`` options) when the parser is built."""
    if registrar not in _EXTENSIONS:
        _EXTENSIONS.append(registrar)


def add_parser(subparsers: Any) -> None:
    """Register ``ledger verify`` and ``ledger show`` on the top-level subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "ledger",
        help="verify or show hash-chained session ledgers",
        description="Verify or show hash-chained session ledgers (exec.jsonl, evidence.jsonl).",
    )
    actions = parser.add_subparsers(dest="ledger_action", metavar="ACTION", required=True)
    verify = actions.add_parser(
        "verify",
        help="verify ledger files, session directories or every session under a root",
        description=(
            "Recompute every hash and link and check the anchored head. Exit 0 when intact, "
            "1 on any integrity error, 2 on usage errors."
        ),
    )
    verify.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="a ledger file, a session directory, or a root directory (holding planes/)",
    )
    verify.add_argument("--root", type=Path, help="verify every session under this root")
    verify.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: one per usable CPU when there are many targets)",
    )
    verify.add_argument("--quiet", "-q", action="store_true", help="print only failures")
    verify.set_defaults(handler=_verify_command)
    show = actions.add_parser(
        "show",
        help="print a ledger's entries readably",
        description="Print a ledger's entries (a file, or both ledgers of a session directory).",
    )
    show.add_argument(
        "path", type=Path, metavar="PATH", help="a ledger file, or a session directory"
    )
    show.add_argument("--json", action="store_true", help="print the raw JSON lines")
    show.set_defaults(handler=_show_command)
    for registrar in _EXTENSIONS:
        registrar(actions, verify)


def main(argv: list[str] | None = None) -> int:
    """Run ``ledger ...`` on its own (``python -m ledger.cli verify PATH``)."""
    parser = argparse.ArgumentParser(prog="ledger")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["ledger", *(sys.argv[1:] if argv is None else argv)])
    return int(args.handler(args))


def _usage(message: str) -> int:
    sys.stderr.write(f"hunter ledger: error: {message}\n")
    return EXIT_USAGE


def _log_to_stderr() -> None:
    import structlog

    if not structlog.is_configured():
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))


def _targets(paths: list[Path], root: Path | None) -> list[Path] | str:
    """Expand arguments into ledger files and session directories, or return a usage error."""
    from ledger.verify import session_dirs

    targets: list[Path] = []
    roots = [] if root is None else [root]
    for path in paths:
        if not path.exists():
            return f"no such file or directory: {path}"
        if path.is_file():
            targets.append(path)
        elif (path / "planes").is_dir():
            roots.append(path)
        elif path.name == "ledger" or (path / "ledger").is_dir():
            targets.append(path)
        else:
            return f"{path} is not a ledger file, a session directory or a root (with planes/)"
    for directory in roots:
        if not directory.is_dir():
            return f"no such directory: {directory}"
        targets.extend(session_dirs(directory))
    return targets


class _ProgressBar:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __call__(self, done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        self._stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            self._stream.write("\n")
        self._stream.flush()


def _verify_command(args: argparse.Namespace) -> int:
    from ledger.verify import verify_many

    paths: list[Path] = args.paths
    root: Path | None = args.root
    if not paths and root is None:
        return _usage("give at least one PATH or --root DIR")
    if args.workers is not None and args.workers < 1:
        return _usage("--workers must be at least 1")
    if root is not None and not root.is_dir():
        return _usage(f"no such directory: {root}")
    targets = _targets(paths, root)
    if isinstance(targets, str):
        return _usage(targets)
    _log_to_stderr()
    if not targets:
        sys.stderr.write("hunter ledger: no sessions found\n")
    workers = args.workers
    if workers is None and len(targets) < _PARALLEL_MIN_TARGETS:
        workers = 1
    progress = _ProgressBar(sys.stderr) if sys.stderr.isatty() and len(targets) > 1 else None
    batch = verify_many(targets, workers=workers, progress=progress)
    out = sys.stdout
    for report in batch.reports:
        for warning in report.warnings:
            sys.stderr.write(f"warning: {report.path}: {warning}\n")
        if not args.quiet:
            legacy = f", {report.legacy_entries} legacy" if report.legacy_entries else ""
            anchored = "" if report.anchored_seq is None else f", anchored {report.anchored_seq}"
            out.write(
                f"ok {report.path}: {report.entries} entries{legacy}, "
                f"head seq {report.head_seq}{anchored}\n"
            )
    for error in batch.errors:
        out.write(f"{error}\n")
    if not args.quiet or batch.errors:
        failed = len(batch.errors)
        out.write(
            f"{len(batch.reports)} ledgers intact, {failed} target{'s' if failed != 1 else ''} "
            "failed\n"
        )
    return EXIT_OK if batch.ok else EXIT_INTEGRITY


def _format_ts(ts_us: object) -> str:
    import datetime

    if type(ts_us) is not int:
        return "-"
    moment = datetime.datetime.fromtimestamp(ts_us / 1_000_000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_HIDDEN: Final = frozenset(
    {"v", "ledger_id", "seq", "previous_hash", "entry_hash", "ts_us", "kind"}
)


def _describe_entry(entry: dict[str, object]) -> str:
    import orjson

    parts: list[str] = []
    for key in sorted(entry):
        if key in _HIDDEN:
            continue
        value = entry[key]
        if isinstance(value, str):
            text = value
            if len(text) == 64 and key.endswith("hash"):
                text = text[:12] + "..."
        else:
            text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
        parts.append(f"{key}={text}")
    return " ".join(parts)


def _show_file(path: Path, *, raw: bool, out: TextIO) -> int:
    import orjson

    from ledger.errors import IntegrityError
    from ledger.verify import verify

    data = path.read_bytes()
    for number, line in enumerate(data.splitlines(), start=1):
        if raw:
            out.write(line.decode("utf-8", errors="replace") + "\n")
            continue
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            out.write(f"{number:>6}  (undecodable line)\n")
            continue
        if not isinstance(entry, dict):
            out.write(f"{number:>6}  (not an object)\n")
            continue
        seq = entry.get("seq", "legacy")
        digest = entry.get("entry_hash")
        short = digest[:12] if isinstance(digest, str) else "-" * 12
        out.write(
            f"{seq!s:>6}  {_format_ts(entry.get('ts_us'))}  {short}  "
            f"{entry.get('kind', '-')!s:<20}  {_describe_entry(entry)}\n"
        )
    try:
        report = verify(path)
    except IntegrityError as exc:
        sys.stderr.write(f"{exc}\n")
        return EXIT_INTEGRITY
    if not raw:
        sys.stderr.write(
            f"verified {path}: {report.entries} entries, head seq {report.head_seq}"
            f"{'' if report.anchored_seq is None else f', anchored {report.anchored_seq}'}\n"
        )
    return EXIT_OK


def _show_command(args: argparse.Namespace) -> int:
    from ledger.verify import session_ledger_paths

    path: Path = args.path
    if not path.exists():
        return _usage(f"no such file or directory: {path}")
    _log_to_stderr()
    files = [path] if path.is_file() else [p for p in session_ledger_paths(path) if p.is_file()]
    if not files:
        return _usage(f"{path} holds no ledger files")
    status = EXIT_OK
    for index, file in enumerate(files):
        if len(files) > 1:
            sys.stdout.write(f"{'' if index == 0 else os.linesep}== {file}\n")
        status = max(status, _show_file(file, raw=args.json, out=sys.stdout))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
