"""`hunter sandbox-helper`: the root sandbox helper as a process (sandbox/helper/).

Loads the same configuration as the daemon (its ``[sandbox]`` limits and uid range), opens a
`Runtime` on the helper's own root (``--root``, else ``$STATE_DIRECTORY``), listens on the
socket systemd passes (``hunter-sandbox.socket``) or on ``--socket``, tells systemd it is
ready, and serves until SIGTERM/SIGINT. Every area still open is closed on the way out (their
turns' processes killed). docs/operations.md ("Privilege separation").
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from supervisor.config import ConfigError, load_config
from supervisor.logging import configure_logging, get_logger
from supervisor.sdnotify import listen_fds, notify

if TYPE_CHECKING:
    from sandbox.runtime.runtime import RuntimeConfig

__all__ = ["parse_user", "run_sandbox_helper"]

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_FAILED = 1


def parse_user(text: str) -> int:
    """A uid from a user name or a number (`ValueError` with what is wrong)."""
    if text.isdigit():
        return int(text)
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise ValueError(f"no user {text!r} on this machine (give a name or a uid)") from None


def _bind(path: Path, allowed: Sequence[int]) -> socket.socket:
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(str(path))
        # Owner: the one uid allowed (the daemon), mode 0600; SO_PEERCRED is checked anyway.
        owners = [uid for uid in allowed if uid != 0]
        if len(owners) == 1:
            os.chown(path, owners[0], -1)
        os.chmod(path, 0o600)
        sock.listen(256)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def _serve(
    root: Path,
    config_runtime: RuntimeConfig,
    allowed: Sequence[int],
    socket_path: Path | None,
    activated: Mapping[str, socket.socket],
) -> int:
    from sandbox.helper.server import HelperServer
    from sandbox.runtime.runtime import Runtime

    log = get_logger("supervisor.sandbox_helper")
    raw = next(iter(activated.values()), None)
    created: Path | None = None
    if raw is None:
        if socket_path is None:
            log.error("sandbox_helper_no_socket")
            sys.stderr.write(
                "hunter sandbox-helper: no socket: pass --socket PATH, set sandbox.helper_socket, "
                "or start it from hunter-sandbox.socket\n"
            )
            return EXIT_USAGE
        raw = _bind(socket_path, allowed)
        created = socket_path
    else:
        raw.setblocking(False)
    runtime = Runtime(root, config=config_runtime)
    server = HelperServer(runtime, allowed_uids=allowed)
    try:
        listener = await anyio.abc.SocketListener.from_socket(raw)
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, listener)
            log.info(
                "sandbox_helper_ready",
                root=str(runtime.root),
                socket=str(socket_path) if created else "systemd",
                allowed_uids=sorted(allowed),
                **runtime.levels,
            )
            notify("READY=1", "STATUS=serving confined attempts")
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("sandbox_helper_stopping", signal=signal.Signals(signum).name)
                    break
            notify("STOPPING=1")
            tg.cancel_scope.cancel()
    finally:
        await anyio.to_thread.run_sync(server.close)
        runtime.close()
        if created is not None:
            with contextlib.suppress(OSError):
                created.unlink()
    log.info("sandbox_helper_stopped")
    return EXIT_OK


def run_sandbox_helper(
    *,
    root: Path | None,
    socket_path: Path | None,
    allow_users: Sequence[str],
    config_path: Path | None,
    log_format: str | None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Entry point of `hunter sandbox-helper` (exit 2 on a usage or configuration error)."""
    from supervisor.server import runtime_config_of

    environ = os.environ if env is None else env
    overrides: dict[str, object] = {}
    if log_format is not None:
        overrides["log.format"] = log_format
    try:
        config = load_config(config_path, env=environ, overrides=overrides)
    except ConfigError as exc:
        sys.stderr.write(f"hunter sandbox-helper: {exc}\n")
        return EXIT_USAGE
    try:
        allowed = sorted({parse_user(u) for u in allow_users})
    except ValueError as exc:
        sys.stderr.write(f"hunter sandbox-helper: --allow-user: {exc}\n")
        return EXIT_USAGE
    if not allowed:
        sys.stderr.write(
            "hunter sandbox-helper: name the daemon's user with --allow-user (e.g. hunter)\n"
        )
        return EXIT_USAGE
    state = environ.get("STATE_DIRECTORY", "").split(":")[0]
    helper_root = root or (Path(state) if state else None)
    if helper_root is None:
        sys.stderr.write(
            "hunter sandbox-helper: --root DIR is needed (the helper's own directory, not the "
            "daemon's root; systemd's StateDirectory= sets it)\n"
        )
        return EXIT_USAGE
    if os.geteuid() != 0:
        sys.stderr.write("hunter sandbox-helper: must run as root (it builds the sandboxes)\n")
        return EXIT_USAGE
    configure_logging(fmt=config.log.format, level=config.log.level)
    activated = listen_fds()
    # The helper's powers are its uid and capabilities; groups give it nothing it needs.
    os.setgroups([])
    try:
        return anyio.run(
            _serve,
            helper_root,
            runtime_config_of(config),
            allowed,
            socket_path or config.sandbox.helper_socket,
            activated,
        )
    except KeyboardInterrupt:
        return EXIT_FAILED
    except Exception as exc:  # start-up failed: say so, exit 1
        get_logger("supervisor.sandbox_helper").exception("sandbox_helper_failed", error=str(exc))
        sys.stderr.write(f"hunter sandbox-helper: {type(exc).__name__}: {exc}\n")
        return EXIT_FAILED
