"""How a client command reaches the daemon: `--root`/`--socket`, one connection per command,
and the daemon's refusals and absence turned into exit codes (1 and 10)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from supervisor.cli.exit_codes import EXIT_FAILED, EXIT_NO_DAEMON
from supervisor.cli.output import err

if TYPE_CHECKING:
    from supervisor.control.client import ControlClient

__all__ = ["DEFAULT_ROOT", "client_options", "run_client", "socket_path"]

DEFAULT_ROOT: Final = Path(".hunter")


def socket_path(args: argparse.Namespace) -> Path:
    """The control socket: `--socket`, else `<--root or ./.hunter>/run/control.sock`."""
    from supervisor.control.client import socket_for_root

    if getattr(args, "socket", None):
        return Path(args.socket)
    return socket_for_root(Path(args.root or DEFAULT_ROOT).absolute())


def client_options(parser: argparse.ArgumentParser) -> None:
    """Add the `daemon` options (`--root`, `--socket`) to a client command."""
    group = parser.add_argument_group("daemon")
    group.add_argument("--root", metavar="DIR", help="root the daemon serves (default ./.hunter)")
    group.add_argument("--socket", metavar="PATH", help="the control socket itself")


def run_client(args: argparse.Namespace, body: Callable[[ControlClient], Awaitable[int]]) -> int:
    """Connect, run *body(client)*, map errors to exit codes."""
    import anyio

    from supervisor.control.client import ControlClient, ControlClientError, DaemonNotRunning

    async def main() -> int:
        async with ControlClient(socket_path(args)) as client:
            return await body(client)

    try:
        return anyio.run(main)
    except DaemonNotRunning as exc:
        err(f"hunter: {exc}")
        return EXIT_NO_DAEMON
    except ControlClientError as exc:
        extra = "".join(f"\n  {k}: {v}" for k, v in exc.details.items())
        err(f"hunter: {exc.code}: {exc.message}{extra}")
        return EXIT_FAILED
