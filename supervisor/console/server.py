"""Serving the console: hypercorn on anyio's asyncio backend, beside the link to the daemon,
until SIGTERM or SIGINT (then open streams are closed within `GRACE_S`).

It listens on loopback by default (``127.0.0.1:8470``). ``unix:PATH`` listens on a Unix socket
(mode 0660: for a reverse proxy in the socket's group); only there may ``user_header`` name the
proxy's authenticated-user header, since anyone who can reach a TCP port could send it. It
answers only requests whose ``Host`` names it (`supervisor.console.hosts`): the address it is
bound to, and the settings' ``allowed_hosts``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config, Sockets
from hypercorn.typing import AppWrapper
from hypercorn.utils import wrap_app

from supervisor.console.app import build_app
from supervisor.console.errors import ConsoleError
from supervisor.console.hosts import AllowedHosts, allowed_hosts
from supervisor.console.state import ConsoleSettings, ConsoleState
from supervisor.logging import get_logger
from supervisor.sdnotify import notify

__all__ = ["DEFAULT_LISTEN", "Listen", "parse_listen", "run_console"]

DEFAULT_LISTEN: Final = "127.0.0.1:8470"
#: open requests (live streams among them) get this long to end at a stop
GRACE_S: Final = 3.0
_LOOPBACK: Final = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True, slots=True)
class Listen:
    """Where the console listens: a TCP host and port, or a Unix socket's path."""

    host: str | None = None
    port: int | None = None
    path: Path | None = None

    @property
    def bind(self) -> str:
        if self.path is not None:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if self.host is not None and ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return self.path is not None or self.host in _LOOPBACK


def parse_listen(text: str) -> Listen:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``unix:PATH``; `ConsoleError` names what is wrong."""
    if text.startswith("unix:"):
        path = Path(text[5:])
        if not text[5:]:
            raise ConsoleError("--listen unix:PATH: the path is missing")
        return Listen(path=path)
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConsoleError(
            f"--listen {text!r}: give HOST:PORT (e.g. {DEFAULT_LISTEN}) or unix:PATH"
        )
    return Listen(host=host, port=int(port))


def _config(listen: Listen, *, certfile: Path | None, keyfile: Path | None) -> Config:
    config = Config()
    config.bind = [listen.bind]
    config.umask = 0o117  # a Unix socket of mode 0660
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # into our JSON log lines
    config.graceful_timeout = GRACE_S
    config.include_server_header = False
    config.h11_max_incomplete_size = 16 * 1024
    if certfile is not None:
        config.certfile, config.keyfile = str(certfile), str(keyfile) if keyfile else None
    return config


async def run_console(
    settings: ConsoleSettings,
    listen: Listen,
    *,
    certfile: Path | None = None,
    keyfile: Path | None = None,
    handle_signals: bool = True,
    stop: anyio.Event | None = None,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the console until SIGTERM/SIGINT (with *handle_signals*) or *stop* is set;
    *task_status* is started, once it accepts connections, with where it listens (a URL, or
    ``unix:PATH``)."""
    if settings.user_header is not None and listen.path is None:
        raise ConsoleError(
            "--user-header trusts whoever can reach the console: it is allowed only with"
            " --listen unix:PATH, a socket that only the reverse proxy can reach"
        )
    log = get_logger("supervisor.console")
    allowed_hosts(extra=settings.allowed_hosts)  # a bad --allow-host is named before binding
    config = _config(listen, certfile=certfile, keyfile=keyfile)
    try:
        sockets = config.create_sockets()
    except OSError as exc:
        raise ConsoleError(f"cannot listen on {listen.bind}: {exc}") from None
    where = _where(sockets, config.ssl_enabled)
    hosts = _hosts(listen, sockets, settings, tls=config.ssl_enabled)
    state = ConsoleState.create(settings, hosts=hosts)
    app = wrap_app(build_app(state), 16 * 1024, "asgi")  # type: ignore[arg-type]
    stop = stop if stop is not None else anyio.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(state.link.run)
        if handle_signals:
            tg.start_soon(_on_signals, stop)
        tg.start_soon(_serve, app, config, sockets, stop, tg.cancel_scope)
        await _until_listening(sockets)
        log.info(
            "console_started",
            listen=where,
            socket=str(settings.socket),
            operators=len(settings.operators.by_name),
            proxy_header=settings.user_header,
        )
        if not listen.loopback:
            log.warning(
                "console_not_loopback",
                listen=where,
                detail="reachable from other hosts: serve it over TLS (--certfile) or behind a"
                " proxy; browsers must use the address it listens on, or a name given with"
                " --allow-host",
            )
        notify("READY=1", f"STATUS=serving on {where}")
        task_status.started(where)
        await stop.wait()
        log.info("console_stopping")
        notify("STOPPING=1")


def _hosts(
    listen: Listen, sockets: Sockets, settings: ConsoleSettings, *, tls: bool
) -> AllowedHosts:
    """The ``Host`` names the console answers to, now that its socket is bound."""
    if listen.path is not None:
        return allowed_hosts(extra=settings.allowed_hosts)
    sock = (sockets.secure_sockets or sockets.insecure_sockets)[0]
    address, port = sock.getsockname()[:2]
    listening = [str(address)] if listen.host is None else [listen.host, str(address)]
    return allowed_hosts(listening=listening, port=port, tls=tls, extra=settings.allowed_hosts)


def _where(sockets: Sockets, tls: bool) -> str:
    sock = (sockets.secure_sockets or sockets.insecure_sockets)[0]
    name = sock.getsockname()
    if isinstance(name, str):
        return f"unix:{name}"
    host, port = name[0], name[1]
    host = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{host}:{port}"


async def _until_listening(sockets: Sockets) -> None:
    """Return once the server's sockets listen (hypercorn binds them, then starts listening)."""
    sock = (sockets.secure_sockets or sockets.insecure_sockets)[0]
    with anyio.fail_after(10):
        while True:
            try:
                name = sock.getsockname()
                if isinstance(name, str):
                    stream: anyio.abc.ByteStream = await anyio.connect_unix(name)
                else:
                    stream = await anyio.connect_tcp(name[0], name[1])
            except OSError:
                await anyio.sleep(0.01)
                continue
            await stream.aclose()
            return


async def _serve(
    app: AppWrapper, config: Config, sockets: Sockets, stop: anyio.Event, scope: anyio.CancelScope
) -> None:
    try:
        await worker_serve(app, config, sockets=sockets, shutdown_trigger=stop.wait)
    except asyncio.InvalidStateError:
        # hypercorn, cancelled during its graceful wait, raises this in place of the
        # cancellation; while this task is being cancelled that is the cancellation itself
        if anyio.current_effective_deadline() != -math.inf:
            raise
    finally:
        stop.set()
        scope.cancel()


async def _on_signals(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            stop.set()
            return
