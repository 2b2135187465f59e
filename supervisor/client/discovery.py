"""Where a client finds the daemon: the control socket (and the root) from what it was given,
the environment and the configuration `hunter serve` would read, in one order (the `hunter`
commands and the client library alike; docs/configuration.md, "How client commands find the
daemon"):

1. a socket given (``--socket PATH``, ``socket=``): the control socket itself;
2. a root given (``--root DIR``, ``root=``): ``DIR/run/control.sock``, or where the file
   ``hunter serve --root DIR`` reads (``--config``, ``$HUNTER_CONFIG``, else
   ``DIR/hunter.toml``) puts the socket (for the root: ``DIR``);
3. ``$HUNTER_CONTROL_SOCKET``;
4. the configuration `hunter serve` would load from the same file and environment: the file
   given (``--config FILE``, ``config=``), else ``$HUNTER_CONFIG``, under the ``HUNTER_*``
   variables, so its ``control_socket`` (for the root: ``root``) is ``$HUNTER_CONTROL_SOCKET``,
   else the file's ``control_socket``, else ``<runtime_dir>/control.sock`` (``$HUNTER_RUNTIME_DIR``,
   the file's ``runtime_dir``, else ``<root>/run``) with the root ``$HUNTER_ROOT``, else the
   file's ``root``, else ``./.hunter``.

What is given wins over the environment; the environment and the file mean what they mean to
the daemon. The configuration is read only when nothing given or ``$HUNTER_CONTROL_SOCKET``
settles it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from supervisor.config import Config

__all__ = [
    "CONFIG_ENV",
    "CONTROL_SOCKET_ENV",
    "DEFAULT_ROOT",
    "ROOT_ENV",
    "Located",
    "locate_daemon",
]

DEFAULT_ROOT: Final = Path(".hunter")
#: The control socket's path; the same variable sets the daemon's ``control_socket`` key.
CONTROL_SOCKET_ENV: Final = "HUNTER_CONTROL_SOCKET"
#: The root; the same variable sets the daemon's ``root`` key.
ROOT_ENV: Final = "HUNTER_ROOT"
#: The configuration file; the same variable names the daemon's.
CONFIG_ENV: Final = "HUNTER_CONFIG"


@dataclass(frozen=True, slots=True)
class Located:
    """What `locate` found: the control socket or the root, and where the path came from."""

    path: Path
    #: e.g. ``--socket``, ``$HUNTER_CONTROL_SOCKET``, ``the root /srv/r (the root key of
    #: /etc/hunter.toml, named by $HUNTER_CONFIG)``: said when nothing answers there.
    source: str


def locate_daemon(
    *,
    socket: Path | str | None = None,
    root: Path | str | None = None,
    config: Path | str | None = None,
    want: Literal["socket", "root"] = "socket",
    env: Mapping[str, str] | None = None,
) -> Located:
    """The daemon's control socket (*want* ``"socket"``) or its root (``"root"``), found from
    what is given and *env* in the order of the module docstring. Raises `ConfigError` when the
    configuration it has to read is invalid (a missing file included)."""
    from supervisor.control.client import socket_for_root

    env = os.environ if env is None else env
    if want == "socket" and socket:
        return Located(Path(socket), "--socket")
    if root:
        path = Path(root).absolute()
        if want == "root":
            return Located(path, "--root")
        return _socket_of_root(path, config, env)
    if want == "socket" and env.get(CONTROL_SOCKET_ENV):
        return Located(Path(env[CONTROL_SOCKET_ENV]).absolute(), f"${CONTROL_SOCKET_ENV}")
    loaded, file = _configuration(config, env)
    root_source = _root_source(loaded, file, env)
    if want == "root":
        return Located(loaded.root, root_source)
    if loaded.control_socket == socket_for_root(loaded.root):
        return Located(loaded.control_socket, f"the root {loaded.root} ({root_source})")
    if env.get("HUNTER_RUNTIME_DIR"):
        source = "$HUNTER_RUNTIME_DIR"
    elif file:
        source = f"the control_socket or runtime_dir key of {file}"
    else:
        source = "$RUNTIME_DIRECTORY"
    return Located(loaded.control_socket, source)


def _socket_of_root(root: Path, config: Path | str | None, env: Mapping[str, str]) -> Located:
    """The control socket of the daemon `hunter serve --root ROOT` starts: ``ROOT/run/
    control.sock``, unless the file it reads (``--config``, ``$HUNTER_CONFIG``, else
    ``ROOT/hunter.toml``) puts the socket elsewhere (its ``control_socket`` or
    ``runtime_dir`` key)."""
    from supervisor.config import config_file_for, load_config
    from supervisor.control.client import socket_for_root

    file = config_file_for(config=Path(config) if config else None, root=root, env=env)
    if file is None:
        return Located(socket_for_root(root), "--root")
    # the root is given: the environment's socket and root do not override it here
    rest = {k: v for k, v in env.items() if k not in (CONTROL_SOCKET_ENV, ROOT_ENV, CONFIG_ENV)}
    loaded = load_config(file, env=rest, overrides={"root": root})
    if loaded.control_socket == socket_for_root(root):
        return Located(loaded.control_socket, "--root")
    return Located(
        loaded.control_socket, f"--root: the control_socket or runtime_dir key of {file}"
    )


def _configuration(config: Path | str | None, env: Mapping[str, str]) -> tuple[Config, str]:
    """The configuration `hunter serve` would load here, and its file as a message names it
    (``''`` when there is none)."""
    from supervisor.config import load_config

    if config:
        path: Path | None = Path(config)
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
