"""How a client command reaches the daemon: `locate` finds the control socket (and the root)
from the flags, the environment and the configuration, in the one order below; one connection
per command; the daemon's refusals and absence turned into exit codes (1 and 10).

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
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from supervisor.cli.exit_codes import EXIT_FAILED, EXIT_NO_DAEMON, EXIT_USAGE
from supervisor.cli.output import err

if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.control.client import ControlClient

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

DEFAULT_ROOT: Final = Path(".hunter")
#: The control socket's path; the same variable sets the daemon's ``control_socket`` key.
CONTROL_SOCKET_ENV: Final = "HUNTER_CONTROL_SOCKET"
#: The root; the same variable sets the daemon's ``root`` key.
ROOT_ENV: Final = "HUNTER_ROOT"
#: The configuration file; the same variable names the daemon's.
CONFIG_ENV: Final = "HUNTER_CONFIG"
#: The help of the ``daemon`` option group: the order of `locate`, in one line.
ORDER_HELP: Final = (
    "without --socket or --root: $HUNTER_CONTROL_SOCKET, else the control_socket of the"
    " configuration `hunter serve` would read from --config FILE (else $HUNTER_CONFIG) and the"
    " HUNTER_* variables: by default <root>/run/control.sock, the root being $HUNTER_ROOT, else"
    " the file's root, else ./.hunter (docs/configuration.md)"
)


@dataclass(frozen=True, slots=True)
class Located:
    """What `locate` found: the control socket or the root, and where the path came from."""

    path: Path
    #: e.g. ``--socket``, ``$HUNTER_CONTROL_SOCKET``, ``the root /srv/r (the root key of
    #: /etc/hunter.toml, named by $HUNTER_CONFIG)``: said when nothing answers there.
    source: str


def locate(
    args: argparse.Namespace,
    want: Literal["socket", "root"] = "socket",
    env: Mapping[str, str] | None = None,
) -> Located:
    """The daemon's control socket (*want* ``"socket"``) or its root (``"root"``), found from
    *args*' ``--socket``, ``--root`` and ``--config`` (those it has) and *env* in the order of
    the module docstring. Raises `ConfigError` when the configuration it has to read is invalid
    (a missing file included)."""
    from supervisor.control.client import socket_for_root

    env = os.environ if env is None else env
    if want == "socket" and getattr(args, "socket", None):
        return Located(Path(args.socket), "--socket")
    if getattr(args, "root", None):
        root = Path(args.root).absolute()
        return Located(socket_for_root(root) if want == "socket" else root, "--root")
    if want == "socket" and env.get(CONTROL_SOCKET_ENV):
        return Located(Path(env[CONTROL_SOCKET_ENV]).absolute(), f"${CONTROL_SOCKET_ENV}")
    config, file = _configuration(args, env)
    root_source = _root_source(config, file, env)
    if want == "root":
        return Located(config.root, root_source)
    if config.control_socket == socket_for_root(config.root):
        return Located(config.control_socket, f"the root {config.root} ({root_source})")
    if env.get("HUNTER_RUNTIME_DIR"):
        source = "$HUNTER_RUNTIME_DIR"
    elif file:
        source = f"the control_socket or runtime_dir key of {file}"
    else:
        source = "$RUNTIME_DIRECTORY"
    return Located(config.control_socket, source)


def _configuration(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Config, str]:
    """The configuration `hunter serve` would load here, and its file as a message names it
    (``''`` when there is none)."""
    from supervisor.config import load_config

    if getattr(args, "config", None):
        path: Path | None = Path(args.config)
        file = f"{path}, named by --config"
    elif env.get(CONFIG_ENV):
        path = Path(env[CONFIG_ENV])
        file = f"{path}, named by ${CONFIG_ENV}"
    else:
        path, file = None, ""
    return load_config(path, env=env), file


def _root_source(config: Config, file: str, env: Mapping[str, str]) -> str:
    """Where the configuration's root came from, as the no-daemon message says it."""
    if env.get(ROOT_ENV):
        return f"${ROOT_ENV}"
    state_dir = (env.get("STATE_DIRECTORY") or "").split(":", 1)[0]
    if state_dir and config.root == Path(os.path.abspath(state_dir)):
        return "$STATE_DIRECTORY"
    if config.root != DEFAULT_ROOT.absolute():
        return f"the root key of {file}"
    if file:
        return f"the default ./{DEFAULT_ROOT}: {file}, sets no root"
    return (
        f"the default ./{DEFAULT_ROOT}: none of --socket, --root, --config,"
        f" ${CONTROL_SOCKET_ENV}, ${CONFIG_ENV}, ${ROOT_ENV} is given"
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


def decision_params(args: argparse.Namespace) -> dict[str, str]:
    """The ``reason`` and ``operator`` params of a decision's request, those given."""
    return {k: getattr(args, k) for k in ("reason", "operator") if getattr(args, k) is not None}


def run_client(args: argparse.Namespace, body: Callable[[ControlClient], Awaitable[int]]) -> int:
    """Find the socket (`locate`), connect, run *body(client)*, map errors to exit codes: 2 a
    configuration that cannot be read, 10 no daemon there, 1 a refusal."""
    import anyio

    from supervisor.control.client import ControlClient, ControlClientError, DaemonNotRunning
    from supervisor.errors import ConfigError

    try:
        socket = locate(args)
    except ConfigError as exc:
        err(
            f"hunter: {exc}; it is read to find the daemon's control socket (fix it, or give"
            " --socket PATH or --root DIR)"
        )
        return EXIT_USAGE

    async def main() -> int:
        async with ControlClient(socket.path) as client:
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
