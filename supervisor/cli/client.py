"""How a client command reaches the daemon: `locate` finds the control socket (and the root)
from the flags, the environment and the configuration, in the one order below; one connection
per command, a client library `supervisor.client.Client` (no reconnecting: a command fails at
once when the daemon is not there); the daemon's refusals and absence turned into exit codes
(1 and 10).

The order, the first given wins (docs/configuration.md, "How client commands find the daemon"):

1. ``--socket PATH``: the control socket itself;
2. ``--root DIR``: ``DIR/run/control.sock`` (for the root: ``DIR``);
3. ``$HUNTER_CONTROL_SOCKET``;
4. the configuration `hunter serve` would load from the same file and environment: the file
   ``--config FILE``, else ``$HUNTER_CONFIG``, under the ``HUNTER_*`` variables, so its
   ``control_socket`` (for the root: ``root``) is ``$HUNTER_CONTROL_SOCKET``, else the file's
   ``control_socket``, else ``<runtime_dir>/control.sock`` (``$HUNTER_RUNTIME_DIR``, the file's
   ``runtime_dir``, else ``<root>/run``) with the root ``$HUNTER_ROOT``, else the file's
   ``root``, else ``./.hunter``.

Flags win over the environment (what is typed is what is meant); the environment and the file
mean what they mean to the daemon, so a shell that starts `hunter serve` reaches it without
flags. The configuration is read only when no flag or ``$HUNTER_CONTROL_SOCKET`` settles it.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Final, Literal

from supervisor.cli.exit_codes import EXIT_FAILED, EXIT_NO_DAEMON, EXIT_USAGE
from supervisor.cli.output import err
from supervisor.client.discovery import (
    CONFIG_ENV,
    CONTROL_SOCKET_ENV,
    DEFAULT_ROOT,
    ROOT_ENV,
    Located,
    locate_daemon,
)

if TYPE_CHECKING:
    from supervisor.client import Client

__all__ = [
    "CONFIG_ENV",
    "CONTROL_SOCKET_ENV",
    "DEFAULT_ROOT",
    "ROOT_ENV",
    "Located",
    "client_options",
    "locate",
    "run_client",
]

#: The help of the ``daemon`` option group: the order of `locate`, in one line.
ORDER_HELP: Final = (
    "without --socket or --root: $HUNTER_CONTROL_SOCKET, else the control_socket of the"
    " configuration `hunter serve` would read from --config FILE (else $HUNTER_CONFIG) and the"
    " HUNTER_* variables: by default <root>/run/control.sock, the root being $HUNTER_ROOT, else"
    " the file's root, else ./.hunter (docs/configuration.md)"
)


def locate(
    args: argparse.Namespace,
    want: Literal["socket", "root"] = "socket",
    env: Mapping[str, str] | None = None,
) -> Located:
    """The daemon's control socket (*want* ``"socket"``) or its root (``"root"``), from *args*'
    ``--socket``, ``--root`` and ``--config`` (those it has) and *env*: the client library's
    `supervisor.client.discovery.locate_daemon`, in the order of the module docstring."""
    return locate_daemon(
        socket=getattr(args, "socket", None),
        root=getattr(args, "root", None),
        config=getattr(args, "config", None),
        want=want,
        env=env,
    )


def client_options(parser: argparse.ArgumentParser) -> None:
    """Add the ``daemon`` options (``--root``, ``--socket``, ``--config``) to a client command."""
    group = parser.add_argument_group("daemon", ORDER_HELP)
    group.add_argument(
        "--root", metavar="DIR", help="root the daemon serves (its run/control.sock)"
    )
    group.add_argument("--socket", metavar="PATH", help="the control socket itself")
    group.add_argument(
        "--config",
        metavar="FILE",
        help="the daemon's TOML config file (default $HUNTER_CONFIG): its control socket",
    )


def decision_options(parser: argparse.ArgumentParser, *, reason_required: bool) -> None:
    """``--reason`` and ``--operator`` of a decision (`escalations resolve`, `turn cancel`,
    `drain`): recorded with it, with the caller's uid the daemon reads from the socket."""
    parser.add_argument(
        "--reason",
        metavar="TEXT",
        required=reason_required,
        help="why, in words: recorded with the decision, who took it and when"
        + (" (required)" if reason_required else ""),
    )
    parser.add_argument(
        "--operator",
        metavar="NAME",
        help="who decides (default: your user name; the daemon records your uid either way)",
    )


def run_client(args: argparse.Namespace, body: Callable[[Client], Awaitable[int]]) -> int:
    """Find the socket (`locate`), connect, run *body(client)*, map errors to exit codes: 2 a
    configuration that cannot be read, 10 no daemon there, 1 a refusal.

    The client does not reconnect (``reconnect_s=0``) and makes up no idempotency keys
    (``auto_keys=False``): a command sends what was typed, once."""
    import anyio

    from supervisor.client import Client
    from supervisor.errors import ConfigError, ControlClientError, DaemonNotRunning

    try:
        socket = locate(args)
    except ConfigError as exc:
        err(
            f"hunter: {exc}; it is read to find the daemon's control socket (fix it, or give"
            " --socket PATH or --root DIR)"
        )
        return EXIT_USAGE

    async def main() -> int:
        async with Client(socket.path, reconnect_s=0, auto_keys=False) as client:
            return await body(client)

    try:
        return anyio.run(main)
    except DaemonNotRunning as exc:
        err(f"hunter: {exc}\nhunter: the socket path came from {socket.source}")
        return EXIT_NO_DAEMON
    except ControlClientError as exc:
        extra = "".join(f"\n  {k}: {v}" for k, v in exc.details.items())
        err(f"hunter: {exc.code}: {exc.message}{extra}")
        return EXIT_FAILED
