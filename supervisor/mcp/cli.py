"""``hunter mcp``: serve the daemon to an agent host as an MCP server (docs/agents.md).

    hunter mcp [--root DIR | --socket PATH] [--settings FILE] [--allow-package ID ...]
    hunter mcp --http --listen unix:PATH|127.0.0.1:PORT --token-file FILE [...]

Stdio by default: the host starts it and speaks MCP on its stdin and stdout (logs go to
stderr). Exit codes: 0 the client closed, or a signal in the HTTP form; 2 a bad flag, settings
file or token file (the message names it); 10 no daemon answers on the control socket.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

from supervisor.cli.client import client_options, locate
from supervisor.cli.exit_codes import EXIT_NO_DAEMON, EXIT_OK, EXIT_USAGE
from supervisor.cli.output import err

if TYPE_CHECKING:
    from supervisor.cli.main import Subparsers

__all__ = ["add_parser"]

DEFAULT_HTTP_LISTEN: Final = "127.0.0.1:8471"


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "mcp",
        help="serve the daemon to agent hosts as an MCP server (each tool call a turn)",
        description="Serve the daemon as a Model Context Protocol server: an agent's commands"
        " and executor instructions become supervised, sandboxed, ledgered turns. A client of"
        " the daemon's control socket, needing no more privilege than reaching it."
        " docs/agents.md.",
    )
    parser.add_argument(
        "--http",
        action="store_true",
        help="serve streamable HTTP (at /mcp) instead of stdio; needs --token-file",
    )
    parser.add_argument(
        "--listen",
        metavar="ADDR",
        default=DEFAULT_HTTP_LISTEN,
        help=f"with --http: 127.0.0.1:PORT or unix:PATH (default {DEFAULT_HTTP_LISTEN})",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        type=Path,
        help="with --http: a file holding the bearer token every request must carry",
    )
    parser.add_argument(
        "--settings",
        metavar="FILE",
        type=Path,
        help="a TOML file whose [mcp] table sets the limits and allowed_packages",
    )
    parser.add_argument(
        "--allow-package",
        metavar="ID",
        action="append",
        help="a package agents may open sessions on (repeatable; default: every installed one)",
    )
    parser.add_argument(
        "--max-turns-in-flight", type=int, metavar="N", help="per MCP session (default 4)"
    )
    parser.add_argument(
        "--max-output-bytes", type=int, metavar="N", help="returned per tool call (default 65536)"
    )
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="log lines (on stderr) as JSON, readable text, or by the terminal (default auto)",
    )
    client_options(parser)
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    import anyio

    from supervisor.console.errors import ConsoleError
    from supervisor.console.server import parse_listen
    from supervisor.errors import ConfigError, DaemonNotRunning
    from supervisor.logging import configure_logging
    from supervisor.mcp.config import load_settings

    configure_logging(fmt=args.log_format, stream=sys.stderr)  # stdout is the MCP stream
    try:
        socket = locate(args)
        settings = load_settings(
            socket.path,
            path=args.settings,
            allowed_packages=args.allow_package,
            max_turns_in_flight=args.max_turns_in_flight,
            max_output_bytes=args.max_output_bytes,
        )
    except ConfigError as exc:
        err(f"hunter: {exc}")
        return EXIT_USAGE
    try:
        if args.http:
            from supervisor.mcp.http import read_token, serve_http

            if args.token_file is None:
                err("hunter: --http needs --token-file FILE (the bearer token clients send)")
                return EXIT_USAGE
            token = read_token(args.token_file)
            listen = parse_listen(args.listen)
            anyio.run(lambda: serve_http(settings, listen, token))
        else:
            from supervisor.mcp.app import serve_stdio

            anyio.run(serve_stdio, settings)
    except (ValueError, ConsoleError) as exc:
        err(f"hunter: {exc}")
        return EXIT_USAGE
    except DaemonNotRunning as exc:
        err(f"hunter: {exc}")
        return EXIT_NO_DAEMON
    except KeyboardInterrupt:
        pass
    return EXIT_OK
