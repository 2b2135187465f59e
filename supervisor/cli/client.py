"""How a client command reaches the daemon: `--socket`, `--root`, the environment
(``HUNTER_CONTROL_SOCKET``, ``HUNTER_ROOT``), one connection per command, and the daemon's
refusals and absence turned into exit codes (1 and 10)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from supervisor.cli.exit_codes import EXIT_FAILED, EXIT_NO_DAEMON
from supervisor.cli.output import err

if TYPE_CHECKING:
    from supervisor.control.client import ControlClient

__all__ = [
    "CONTROL_SOCKET_ENV",
    "DEFAULT_ROOT",
    "ROOT_ENV",
    "client_options",
    "run_client",
    "socket_path",
]

DEFAULT_ROOT: Final = Path(".hunter")
#: The control socket's path; the same variable sets the daemon's ``control_socket`` key.
CONTROL_SOCKET_ENV: Final = "HUNTER_CONTROL_SOCKET"
#: The root; the same variable sets the daemon's ``root`` key.
ROOT_ENV: Final = "HUNTER_ROOT"


def socket_path(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Path:
    """The control socket, the first given of: `--socket`; `--root` (its
    ``run/control.sock``); ``$HUNTER_CONTROL_SOCKET``; ``$HUNTER_ROOT/run/control.sock``;
    ``./.hunter/run/control.sock``. The variables are those that configure the daemon, so a
    shell that exports them for `hunter serve` reaches that daemon without flags."""
    from supervisor.control.client import socket_for_root

    env = os.environ if env is None else env
    if getattr(args, "socket", None):
        return Path(args.socket)
    if getattr(args, "root", None):
        return socket_for_root(Path(args.root).absolute())
    if env.get(CONTROL_SOCKET_ENV):
        return Path(env[CONTROL_SOCKET_ENV]).absolute()
    return socket_for_root(Path(env.get(ROOT_ENV) or DEFAULT_ROOT).absolute())


def _socket_source(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """The environment variable `socket_path` took the socket from, if it took it from one."""
    if getattr(args, "socket", None) or getattr(args, "root", None):
        return None
    for name in (CONTROL_SOCKET_ENV, ROOT_ENV):
        if env.get(name):
            return name
    return None


def client_options(parser: argparse.ArgumentParser) -> None:
    """Add the `daemon` options (`--root`, `--socket`) to a client command."""
    group = parser.add_argument_group(
        "daemon",
        "without these: $HUNTER_CONTROL_SOCKET, else $HUNTER_ROOT/run/control.sock, else "
        "./.hunter/run/control.sock",
    )
    group.add_argument(
        "--root", metavar="DIR", help="root the daemon serves (its run/control.sock)"
    )
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
        source = _socket_source(args, os.environ)
        err(f"hunter: {exc}" + (f" (the socket path came from ${source})" if source else ""))
        return EXIT_NO_DAEMON
    except ControlClientError as exc:
        extra = "".join(f"\n  {k}: {v}" for k, v in exc.details.items())
        err(f"hunter: {exc.code}: {exc.message}{extra}")
        return EXIT_FAILED
