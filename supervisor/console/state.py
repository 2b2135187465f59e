"""What the console's request handlers share: its settings, the link to the daemon, the live
feed, who is signed in. One `ConsoleState` per console process, on ``app.state.console``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import anyio

from supervisor.console.hosts import AllowedHosts
from supervisor.console.live import DaemonLink, LiveFeed
from supervisor.console.operators import Operators
from supervisor.console.signins import SignInLimit, SignIns
from supervisor.console.snapshot import Snapshot

__all__ = ["ConsoleSettings", "ConsoleState"]


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    #: the daemon's control socket (any daemon of a fleet: every daemon appears)
    socket: Path
    operators: Operators
    #: behind an authenticating reverse proxy: the header naming the signed-in user (only on a
    #: Unix socket that only the proxy can reach; `supervisor.console.server` enforces it)
    user_header: str | None = None
    #: mark cookies Secure: None, when the request came over TLS
    secure_cookies: bool | None = None
    #: names (``NAME`` or ``NAME:PORT``) the console answers to beside the address it listens
    #: on (``--allow-host``): a reverse proxy's or DNS name; `supervisor.console.hosts`
    allowed_hosts: tuple[str, ...] = ()
    #: rows per page of every list
    page_size: int = 50


@dataclass(slots=True)
class ConsoleState:
    settings: ConsoleSettings
    feed: LiveFeed
    link: DaemonLink
    #: the ``Host`` headers a request may carry (known once the console's socket is bound)
    hosts: AllowedHosts
    signins: SignIns = field(default_factory=SignIns)
    limit: SignInLimit = field(default_factory=SignInLimit)
    #: the daemon's status, shared by every overview for a second
    status: Snapshot[dict[str, object]] = field(default_factory=Snapshot)
    #: password checks (scrypt: 16 MiB, about 50 ms each) running at once
    checks: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(2))

    @classmethod
    def create(cls, settings: ConsoleSettings, *, hosts: AllowedHosts) -> ConsoleState:
        feed = LiveFeed()
        link = DaemonLink(str(settings.socket), feed)
        return cls(settings=settings, feed=feed, link=link, hosts=hosts)
