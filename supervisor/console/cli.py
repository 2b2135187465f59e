"""``hunter console``: serve the operators' console, and manage its operators file.

    hunter console --operators FILE [--listen 127.0.0.1:8470] [--allow-host NAME[:PORT]]
                   [--root DIR | --socket PATH]
    hunter console add-operator NAME --role reader|resolver --operators FILE
    hunter console hash-password

Exit codes: 0 stopped by a signal; 2 a bad flag, operators file or configuration (the message
names it). Started before the daemon, it serves and connects once the daemon is up.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Final

from supervisor.cli.client import client_options, locate
from supervisor.cli.exit_codes import EXIT_OK, EXIT_USAGE
from supervisor.cli.output import err, out
from supervisor.console.errors import ConsoleError
from supervisor.console.operators import Role, hash_password, load_operators

if TYPE_CHECKING:
    from supervisor.cli.main import Subparsers

__all__ = ["add_parser"]

OPERATORS_ENV: Final = "HUNTER_CONSOLE_OPERATORS"


def add_parser(subparsers: Subparsers) -> None:
    from supervisor.console.server import DEFAULT_LISTEN

    parser = subparsers.add_parser(
        "console",
        help="serve the operators' web console (a client of the daemon's control socket)",
        description="Serve the operators' web console: turns, sessions, executors, escalations"
        " and ledgers, live. It is a client of the daemon's control socket and needs no more"
        " privilege than reaching it. docs/console.md.",
    )
    parser.add_argument(
        "--listen",
        metavar="ADDR",
        default=DEFAULT_LISTEN,
        help=f"HOST:PORT or unix:PATH (default {DEFAULT_LISTEN}, loopback only)",
    )
    parser.add_argument(
        "--operators",
        metavar="FILE",
        type=Path,
        help=f"the operators file: names, roles, scrypt password hashes (default ${OPERATORS_ENV})",
    )
    parser.add_argument(
        "--user-header",
        metavar="HEADER",
        help="trust this header of an authenticating reverse proxy for the operator's name"
        " (only with --listen unix:PATH)",
    )
    parser.add_argument(
        "--allow-host",
        metavar="NAME[:PORT]",
        action="append",
        default=[],
        help="answer requests that name this host too (a reverse proxy's or DNS name; any port"
        " unless one is given; repeatable). Without it only the listen address answers (and"
        " localhost on loopback); on unix:PATH, any name unless this is given",
    )
    parser.add_argument("--certfile", metavar="FILE", type=Path, help="serve HTTPS: certificate")
    parser.add_argument("--keyfile", metavar="FILE", type=Path, help="serve HTTPS: private key")
    parser.add_argument(
        "--secure-cookies",
        action="store_true",
        default=None,
        help="mark cookies Secure even over plain HTTP (behind a TLS-terminating proxy)",
    )
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="log lines as JSON, readable text, or by the terminal (default auto)",
    )
    client_options(parser)
    parser.set_defaults(handler=_serve)
    actions = parser.add_subparsers(dest="console_action", metavar="ACTION")
    add = actions.add_parser(
        "add-operator",
        help="add an operator (or change one's role or password) in the operators file",
        description="Add an operator to the operators file, or change one's role or password;"
        " the password is asked twice without echo and stored as a scrypt hash.",
    )
    add.add_argument("name", help="the operator's name (letters, digits, . _ - @)")
    add.add_argument(
        "--role", required=True, choices=[r.value for r in Role], help="what they may do"
    )
    add.add_argument(
        "--operators", metavar="FILE", type=Path, help=f"the file (default ${OPERATORS_ENV})"
    )
    add.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin (one line)"
    )
    add.add_argument(
        "--no-password",
        action="store_true",
        help="no password: the operator signs in only through the proxy (--user-header)",
    )
    add.set_defaults(handler=_add_operator)
    hashed = actions.add_parser(
        "hash-password",
        help="print the scrypt hash of a password, for the operators file",
        description="Print the scrypt hash of a password (asked without echo), for the"
        " operators file's password field.",
    )
    hashed.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin (one line)"
    )
    hashed.set_defaults(handler=_hash_password)


def _operators_path(args: argparse.Namespace) -> Path | None:
    given: Path | None = args.operators
    if given is None and os.environ.get(OPERATORS_ENV):
        given = Path(os.environ[OPERATORS_ENV])
    return given


def _read_password(from_stdin: bool) -> str | None:
    if from_stdin:
        return sys.stdin.readline().rstrip("\n")
    first = getpass.getpass("password: ")
    if first != getpass.getpass("again: "):
        err("hunter: the two passwords differ; nothing was changed")
        return None
    return first


def _hash_password(args: argparse.Namespace) -> int:
    password = _read_password(args.password_stdin)
    if not password:
        err("hunter: an empty password cannot be hashed")
        return EXIT_USAGE
    out(hash_password(password))
    return EXIT_OK


def _add_operator(args: argparse.Namespace) -> int:
    path = _operators_path(args)
    if path is None:
        err(f"hunter: give --operators FILE (or set ${OPERATORS_ENV})")
        return EXIT_USAGE
    encoded = None
    if not args.no_password:
        password = _read_password(args.password_stdin)
        if not password:
            err("hunter: an empty password is not a password (or use --no-password)")
            return EXIT_USAGE
        encoded = hash_password(password)
    try:
        current = tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        err(f"hunter: {path}: cannot be read: {exc}")
        return EXIT_USAGE
    table = dict(current.get("operators", {}))
    table[args.name] = {"role": args.role, **({"password": encoded} if encoded else {})}
    lines = ["# hunter console operators: roles and scrypt password hashes only", ""]
    for name, entry in sorted(table.items()):
        lines.append(f'[operators."{name}"]')
        lines.append(f'role = "{entry["role"]}"')
        if entry.get("password"):
            lines.append(f'password = "{entry["password"]}"')
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    os.replace(tmp, path)
    try:
        load_operators(path)  # what we wrote reads back
    except ConsoleError as exc:
        err(f"hunter: {exc}")
        return EXIT_USAGE
    out(f"{args.name}: {args.role} in {path}")
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    import anyio

    from supervisor.console.server import parse_listen, run_console
    from supervisor.console.state import ConsoleSettings
    from supervisor.errors import ConfigError
    from supervisor.logging import configure_logging

    configure_logging(fmt=args.log_format)
    path = _operators_path(args)
    if path is None:
        err(
            f"hunter: give --operators FILE (or set ${OPERATORS_ENV}); create one with"
            " `hunter console add-operator NAME --role resolver --operators FILE`"
        )
        return EXIT_USAGE
    try:
        operators = load_operators(path)
        listen = parse_listen(args.listen)
        socket = locate(args)
    except (ConsoleError, ConfigError) as exc:
        err(f"hunter: {exc}")
        return EXIT_USAGE
    if args.certfile is not None and args.keyfile is None:
        err("hunter: --certfile needs --keyfile")
        return EXIT_USAGE
    if not socket.path.exists():
        err(
            f"hunter: warning: no daemon's control socket at {socket.path} yet (from"
            f" {socket.source}); the console serves and connects once `hunter serve` is up"
        )
    settings = ConsoleSettings(
        socket=socket.path,
        operators=operators,
        user_header=args.user_header,
        secure_cookies=args.secure_cookies,
        allowed_hosts=tuple(args.allow_host),
    )
    try:
        anyio.run(
            lambda: run_console(settings, listen, certfile=args.certfile, keyfile=args.keyfile)
        )
    except ConsoleError as exc:
        err(f"hunter: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        pass
    return EXIT_OK
