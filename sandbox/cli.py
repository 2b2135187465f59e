"""``hunter turn run`` (an embedded sandboxed process turn) and ``hunter package``
(``check``, ``install``, ``list``).

Exit codes of ``hunter turn run`` (docs/sandbox.md): 0 succeeded, 1 failed, 2 usage (also a
malformed declaration), 3 timeout, 4 violation or rejected by capabilities, 5 exhausted,
6 escalated, 7 terminated (another fault, e.g. a crash not retried).
``hunter package check DIR``: 0 valid (prints the effective capabilities), 1 invalid, 2 usage.
``hunter package install DIR|manifest.json``: 0 installed, replaced or already there with the same
content; 1 invalid manifest, different package already installed (without ``--replace``) or a
copy that failed. ``hunter package list``: 0 (a broken package is listed with its error).
Both take ``--root`` (default ``$HUNTER_ROOT``, else ``./.hunter``; the daemon's CLI, through
`extend`, adds ``--config`` and the root of the daemon's configuration).
Heavy imports happen inside the handlers so ``hunter --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeAlias

if TYPE_CHECKING:
    from sandbox.capabilities import CompiledCapabilities, Pattern
    from sandbox.packages import Capabilities

__all__ = ["EXIT_CODES", "add_parser", "exit_code_for", "extend"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
#: What `add_parser` is handed: the top-level ``hunter`` sub-command registry.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
#: ``TurnResult.status`` -> exit code of ``hunter turn run``.
EXIT_CODES: Final = {
    "succeeded": 0,
    "failed": 1,
    "timeout": 3,
    "violation": 4,
    "rejected": 4,
    "exhausted": 5,
    "escalated": 6,
    "terminated": 7,
}


#: Registrars from packages above this one (the daemon's CLI adds ``--config`` and finds the
#: root as its client commands do): each gets the parsers of ``package install`` and ``list``.
_ROOT_EXTENSIONS: list[Callable[[Sequence[argparse.ArgumentParser]], None]] = []


def extend(registrar: Callable[[Sequence[argparse.ArgumentParser]], None]) -> None:
    """Let *registrar* add options (and a handler around theirs) to the commands taking a root."""
    if registrar not in _ROOT_EXTENSIONS:
        _ROOT_EXTENSIONS.append(registrar)


def exit_code_for(status: str, reason_code: str = "") -> int:
    """The exit code for a turn's final status (a malformed declaration is a usage error)."""
    if status == "rejected" and reason_code == "DECLARATION_INVALID":
        return EXIT_USAGE
    return EXIT_CODES.get(status, 7)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _quiet_logging(verbose: bool) -> None:
    import logging

    import structlog

    if not structlog.is_configured():
        structlog.configure(
            # resolve sys.stderr at each use (it may be replaced, e.g. under test capture)
            logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
            wrapper_class=structlog.make_filtering_bound_logger(
                logging.INFO if verbose else logging.WARNING
            ),
        )


def _parse_output(text: str) -> dict[str, str]:
    path, sep, role = text.partition(":")
    return {"path": path, "role": role if sep and role else "output"}


def _cmd_turn_run(args: argparse.Namespace) -> int:
    import anyio
    import orjson

    from sandbox.errors import ManifestError, PackageNotFoundError, SandboxError
    from sandbox.policy.attempts import AgentPhase, RetryOptions
    from sandbox.runtime.runtime import Runtime, RuntimeConfig

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        sys.stderr.write("hunter turn run: no command given (put it after --)\n")
        return EXIT_USAGE
    _quiet_logging(args.verbose)
    phase = AgentPhase[args.phase] if args.phase else None
    config = RuntimeConfig(enforcement=args.enforcement)
    outputs = [_parse_output(o) for o in args.declare_output]
    timeout_ms = None if args.timeout is None else int(args.timeout * 1000)

    async def run() -> int:
        runtime = Runtime(args.root, config=config)
        try:
            if args.session:
                session = runtime.resume_session(args.session, tier=args.tier)
            else:
                session = runtime.open_session(
                    args.package,
                    tier=args.tier,
                    work_order_id=args.work_order,
                    workspace=args.workspace,
                )
            try:
                result = await session.run_process_turn(
                    command,
                    declared_outputs=outputs,
                    phase=phase,
                    timeout_ms=timeout_ms,
                    options=RetryOptions(max_attempts=args.max_attempts),
                )
            finally:
                await session.aclose()
        finally:
            runtime.close()
        if args.json:
            _write(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
        else:
            lines = [
                f"session {result.session_id} turn {result.turn_number}: {result.status}",
                f"  exit code {result.exit_code}  verdict {result.verdict}  "
                f"reason {result.reason_code}",
                f"  {result.reason}",
                f"  attempts {len(result.attempts)}  duration {result.duration_ms} ms",
            ]
            lines += [f"  violation: {v}" for v in result.violations]
            lines += [f"  promoted: {p.path} -> {p.destination}" for p in result.promoted_outputs]
            lines.append(
                "  enforcement: "
                + ", ".join(f"{k}={v}" for k, v in sorted(result.enforcement.items()))
            )
            if result.stdout:
                lines.append("--- stdout ---\n" + result.stdout.rstrip("\n"))
            if result.stderr:
                lines.append("--- stderr ---\n" + result.stderr.rstrip("\n"))
            _write("\n".join(lines) + "\n")
        return exit_code_for(result.status, result.reason_code)

    if not args.session and not args.package:
        sys.stderr.write("hunter turn run: --package is required without --session\n")
        return EXIT_USAGE
    if not args.session:
        refusal = _package_refusal(Path(args.root), args.package)
        if refusal is not None:  # before the runtime: nothing is created under the root
            sys.stderr.write(refusal)
            return EXIT_USAGE
    try:
        return anyio.run(run)
    except (PackageNotFoundError, ManifestError) as exc:
        sys.stderr.write(f"hunter turn run: {exc}\n")
        return EXIT_USAGE
    except SandboxError as exc:
        sys.stderr.write(f"hunter turn run: {exc}\n")
        return 7


def _package_refusal(root: Path, package_id: str) -> str | None:
    """Why ``turn run --package`` cannot start (the package is not installed, or its manifest is
    invalid), with how to install one; None when it can. Reads only: the root is left as it is."""
    from sandbox.errors import ManifestError, PackageNotFoundError
    from sandbox.packages import load_package

    try:
        load_package(root, package_id)
    except PackageNotFoundError as exc:
        return (
            f"hunter turn run: {exc}\n"
            f"  install it first: hunter package install DIR --root {root}"
            " (DIR: the package's directory, with its manifest.json; docs/sandbox.md)\n"
            f"  installed packages: hunter package list --root {root}\n"
        )
    except ManifestError as exc:
        return (
            f"hunter turn run: {exc}\n"
            f"  fix the manifest, then: hunter package install DIR --root {root} --replace\n"
        )
    return None


def _listed(entries: list[tuple[object, str, str, bool]]) -> list[str]:
    """The lines of one capability list of ``package check``: ``(key, declared, resolved,
    plain)`` per declared pattern, where *key* says what it grants once resolved and *plain*
    whether *declared* is already spelled as *resolved*. Patterns that resolve alike (``/bin/*``
    and ``/usr/bin/*`` where ``/bin`` links to ``/usr/bin``) are one line, in declaration order,
    with every spelling declared: ``/bin/*, /usr/bin/* (= /usr/bin/*)``."""
    groups: dict[object, tuple[str, list[str], list[bool]]] = {}
    for key, declared, resolved, plain in entries:
        _, spellings, plains = groups.setdefault(key, (resolved, [], []))
        if declared not in spellings:
            spellings.append(declared)
            plains.append(plain)
    return [
        spellings[0] if all(plains) else f"{', '.join(spellings)} (= {resolved})"
        for resolved, spellings, plains in groups.values()
    ]


def _effective_lines(compiled: CompiledCapabilities) -> dict[str, list[str]]:
    """What ``package check`` lists per capability (see `_listed`)."""
    from sandbox.capabilities import parse_execute_entry

    def spelled(source: str) -> str:  # anchored, lexically tidied, symlinks untouched
        text = source if source.startswith("/") else f"{compiled.workspace}/{source}"
        return "/" + "/".join(s for s in text.split("/") if s not in ("", "."))

    def paths(patterns: tuple[Pattern, ...]) -> list[str]:
        entries = [(p.absolute, spelled(p.source), p.absolute) for p in patterns]
        return _listed([(key, declared, real, declared == real) for key, declared, real in entries])

    lines = {
        "read": paths(compiled.read),
        "write": paths(compiled.write),
        "forbidden": paths(compiled.forbidden),
    }
    rules: list[tuple[object, str, str, bool]] = []
    for rule in compiled.execute_rules:
        program, _ = parse_execute_entry(rule.source)
        absolute = rule.program.absolute
        relative = "/" in program and not program.startswith("/")  # anchored at the workspace
        declared = f"{compiled.workspace}/{rule.source.strip()}" if relative else rule.source
        plain = "/" in program and spelled(program) == absolute  # not a bare command name
        rules.append(((absolute, rule.args), declared.strip(), absolute, plain))
    lines["execute"] = _listed(rules)
    return lines


def _cmd_package_check(args: argparse.Namespace) -> int:
    import orjson

    from sandbox.capabilities import compile_capabilities
    from sandbox.errors import ManifestError
    from sandbox.packages import load_manifest

    target: Path = args.directory
    manifest_path = target / "manifest.json" if target.is_dir() else target
    try:
        manifest = load_manifest(manifest_path)
    except ManifestError as exc:
        sys.stderr.write(f"invalid manifest: {exc}\n")
        return 1
    if (
        manifest.package_id is not None
        and target.is_dir()
        and manifest.package_id != (target.resolve().name)
    ):
        sys.stderr.write(
            f"invalid manifest: {manifest_path}: $.id: {manifest.package_id!r} does not match "
            f"the directory {target.resolve().name!r}\n"
        )
        return 1
    workspace = Path("/WORKSPACE")
    caps = manifest.capabilities
    compiled = compile_capabilities(
        read=caps.read,
        write=caps.write,
        execute=caps.execute,
        forbidden=caps.forbidden,
        workspace=workspace,
    )
    data = manifest.to_dict()
    # Each resolved pattern once: /bin/* and /usr/bin/* are one where /bin links to /usr/bin.
    data["effective"] = {
        "workspace": "relative patterns are anchored at the session workspace (/WORKSPACE)",
        "read": list(dict.fromkeys(p.absolute for p in compiled.read)),
        "write": list(dict.fromkeys(p.absolute for p in compiled.write)),
        "execute": list(dict.fromkeys(p.absolute for p in compiled.execute)),
        "forbidden": list(dict.fromkeys(p.absolute for p in compiled.forbidden)),
        "network": caps.network,
    }
    if args.json:
        _write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
        return EXIT_OK
    listed = _effective_lines(compiled)
    lines = [f"{manifest_path}: valid (package {manifest.package_id or target.name})"]
    for key in ("read", "write", "execute", "forbidden"):
        lines.append(f"  {key}:")
        lines += [f"    {p}" for p in listed[key]] or ["    (none)"]
    lines.append(f"  network: {'granted' if caps.network else 'denied'}")
    lim = {
        k: v
        for k, v in manifest.to_dict()["limits"].items()  # type: ignore[attr-defined]
        if v is not None
    }
    lines.append("  limits: " + (", ".join(f"{k}={v}" for k, v in lim.items()) or "defaults"))
    if manifest.env_allow:
        lines.append("  env_allow: " + ", ".join(manifest.env_allow))
    _write("\n".join(lines) + "\n")
    return EXIT_OK


def _default_root() -> Path:
    """``--root`` of the package commands when not given: ``$HUNTER_ROOT``, else ``.hunter``."""
    return Path(os.environ.get("HUNTER_ROOT") or ".hunter")


def _cmd_package_install(args: argparse.Namespace) -> int:
    import orjson

    from sandbox.errors import ManifestError
    from sandbox.installer import PackageInstallError, install_package

    root: Path = args.root or _default_root()
    try:
        result = install_package(args.source, root=root, replace=args.replace)
    except ManifestError as exc:
        sys.stderr.write(f"hunter package install: invalid manifest: {exc}\n")
        return EXIT_FAILED
    except PackageInstallError as exc:
        sys.stderr.write(f"hunter package install: {exc}\n")
        return EXIT_FAILED
    except OSError as exc:
        where = exc.filename or root
        sys.stderr.write(
            f"hunter package install: {where}: {exc.strerror or exc}; nothing was installed "
            "(check that you may write under <root>/installed/)\n"
        )
        return EXIT_FAILED
    if args.json:
        _write(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return EXIT_OK
    what = result.package_id + (f" {result.version}" if result.version else "")
    if result.action == "unchanged":
        line = f"{what} is already installed at {result.directory} with the same content"
    else:
        line = f"{result.action} {what} at {result.directory}"
    _write(f"{line} ({result.files} files, sha256 {result.digest[:16]})\n")
    return EXIT_OK


def _capabilities_summary(caps: Capabilities) -> str:
    """``read 2, write 1, execute 3, forbidden 0, network denied``."""
    counts = ", ".join(
        f"{key} {len(getattr(caps, key))}" for key in ("read", "write", "execute", "forbidden")
    )
    return f"{counts}, network {'granted' if caps.network else 'denied'}"


def _cmd_package_list(args: argparse.Namespace) -> int:
    import orjson

    from sandbox.installer import list_packages

    root: Path = args.root or _default_root()
    packages = list_packages(root)
    if args.json:
        data = {"root": str(root), "packages": [p.to_dict() for p in packages]}
        _write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
        return EXIT_OK
    if not packages:
        _write(
            f"no packages installed under {root / 'installed'}"
            " (install one with `hunter package install DIR`)\n"
        )
        return EXIT_OK
    rows = [("PACKAGE", "VERSION", "CAPABILITIES")]
    for package in packages:
        manifest = package.manifest
        rows.append(
            (package.package_id, "-", f"INVALID: {package.error}")
            if manifest is None
            else (
                package.package_id,
                manifest.version or "-",
                _capabilities_summary(manifest.capabilities),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}" for r in rows]
    lines.insert(1, f"{'-' * widths[0]}  {'-' * widths[1]}  {'-' * len(rows[0][2])}")
    _write("\n".join(lines) + "\n")
    return EXIT_OK


def _turn_actions(subparsers: Subparsers) -> Subparsers:
    existing = subparsers.choices.get("turn")
    if existing is None:
        parser = subparsers.add_parser("turn", help="run or inspect turns")
        return parser.add_subparsers(dest="turn_command", metavar="ACTION", required=True)
    for action in existing._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return existing.add_subparsers(dest="turn_command", metavar="ACTION", required=True)


def add_parser(subparsers: Subparsers) -> None:
    """Register ``turn run`` (under an existing ``turn`` command if any) and ``package``."""
    actions = _turn_actions(subparsers)
    run = actions.add_parser(
        "run",
        help="run one sandboxed process turn here, without a daemon",
        description="Run one process turn in a session sandbox (no daemon needed). Exit "
        "codes: 0 succeeded, 1 failed, 2 usage, 3 timeout, 4 violation/rejected, "
        "5 exhausted, 6 escalated, 7 terminated.",
    )
    run.add_argument("--root", type=Path, default=Path(".hunter"), help="root directory")
    run.add_argument("--package", help="installed package id (new session)")
    run.add_argument("--tier", default="default", help="the session's tier (default: default)")
    run.add_argument("--session", help="run in this existing session instead of a new one")
    run.add_argument("--workspace", type=Path, help="where outputs are promoted")
    run.add_argument("--work-order", help="work order id recorded in evidence")
    run.add_argument(
        "--phase",
        choices=["RED", "GREEN", "VERIFY", "REFACTOR"],
        help="the agent's phase: automatic retries only in GREEN and VERIFY",
    )
    run.add_argument("--timeout", type=float, metavar="SECONDS", help="deadline of each attempt")
    run.add_argument(
        "--max-attempts", type=int, default=3, help="attempts, counting the first (default 3)"
    )
    run.add_argument(
        "--enforcement",
        choices=["strict", "best-effort"],
        default="strict",
        help="strict: refuse to run without every confinement mechanism; best-effort: run"
        " with those available (default strict)",
    )
    run.add_argument(
        "--declare-output",
        action="append",
        default=[],
        metavar="PATH[:ROLE]",
        help="a file the command writes under its output dir (repeatable)",
    )
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--verbose", action="store_true", help="log events to stderr")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    run.set_defaults(handler=_cmd_turn_run)

    pkg = subparsers.add_parser("package", help="validate, install and list agent packages")
    pkg_actions = pkg.add_subparsers(dest="package_command", metavar="ACTION", required=True)
    check = pkg_actions.add_parser(
        "check", help="validate a package dir (or manifest) and print its capabilities"
    )
    check.add_argument(
        "directory", type=Path, metavar="DIR", help="the package directory, or its manifest"
    )
    check.add_argument(
        "--json", action="store_true", help="print the manifest and what it grants as JSON"
    )
    check.set_defaults(handler=_cmd_package_check)
    root_help = "the root (default $HUNTER_ROOT, else ./.hunter)"
    install = pkg_actions.add_parser(
        "install",
        help="validate a package and copy it into <root>/installed/<id>/ atomically",
        description="Validate the manifest, then copy the package directory into "
        "<root>/installed/<id>/ (a temporary copy beside it, synced, then renamed). The id is "
        "the manifest's id, else the directory's name. The same content already installed is a "
        "no-op; different content is refused unless --replace. Exit codes: 0 done, 1 refused.",
    )
    install.add_argument(
        "source",
        type=Path,
        metavar="DIR|manifest.json",
        help="the package directory, or its manifest",
    )
    install.add_argument("--root", type=Path, metavar="DIR", help=root_help)
    install.add_argument(
        "--replace", action="store_true", help="replace an installed package of that id"
    )
    install.add_argument("--json", action="store_true", help="print the result as JSON")
    install.set_defaults(handler=_cmd_package_install)
    listing = pkg_actions.add_parser(
        "list", help="list installed packages (id, version, capabilities)"
    )
    listing.add_argument("--root", type=Path, metavar="DIR", help=root_help)
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    listing.set_defaults(handler=_cmd_package_list)
    for registrar in _ROOT_EXTENSIONS:
        registrar((install, listing))
