"""Which names the console answers to: the ``Host`` header a request must carry.

A page built from whatever ``Host`` a request names could send a browser elsewhere (a redirect
to ``http://evil.example/...``), and a console that answers any name can be reached by a page
of another site whose name was pointed at it (DNS rebinding: the browser then treats the
console as part of that site, whose pages may read it and post to it, with an ``Origin`` that
matches the ``Host``). So every request must name this console:

- on TCP, the address it listens on with its port (``127.0.0.1:8470``; without the port too
  where it is the scheme's own, 80 or 443); listening on loopback (or on every address) also
  ``localhost``, ``127.0.0.1`` and ``[::1]`` with that port;
- the names given with ``--allow-host NAME`` (any port) or ``--allow-host NAME:PORT``: the
  name a reverse proxy or DNS gives the console;
- on a Unix socket (behind a proxy, which alone reaches it) only those names, and any name
  when none is given: the proxy chose where the request went.

Pure: `AllowedHosts.permits` takes the header's text; `allowed_hosts` is built once the
console's socket is bound (its port may have been 0).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from supervisor.console.errors import ConsoleError

__all__ = ["AllowedHosts", "allowed_hosts", "parse_host"]

_LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "::1")
_WILDCARDS: Final = frozenset({"0.0.0.0", "::", ""})
#: a DNS name or an IPv4 address (letters, digits, dots, hyphens)
_NAME: Final = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,252}[a-z0-9])?", re.ASCII)


def parse_host(text: str) -> tuple[str, int | None] | None:
    """``NAME``, ``NAME:PORT``, ``[IPv6]`` or ``[IPv6]:PORT`` as (lower-case name, port or
    None), or None when *text* is none of them."""
    text = text.lower()
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        try:
            ipaddress.IPv6Address(inside)
        except ValueError:
            return None
        name = inside
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, colon, port_text_or_empty = text.partition(":")
        if _NAME.fullmatch(name) is None:
            return None
        port_text = port_text_or_empty if colon else None
    if port_text is None:
        return name, None
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5:
        return None
    port = int(port_text)
    return (name, port) if 0 < port < 65536 else None


@dataclass(frozen=True, slots=True)
class AllowedHosts:
    """The ``Host`` values a request may carry."""

    #: (name, port) pairs, a port of None being a header without one
    exact: frozenset[tuple[str, int | None]] = frozenset()
    #: names allowed with any port, or none
    names: frozenset[str] = frozenset()
    #: any ``Host`` at all (a Unix socket with no configured name: the proxy decides)
    anything: bool = False

    def permits(self, header: str | None) -> bool:
        """Whether a request whose ``Host`` header is *header* (None: it has none) names this
        console."""
        if self.anything:
            return True
        if header is None:
            return False
        parsed = parse_host(header)
        if parsed is None:
            return False
        name, _port = parsed
        return name in self.names or parsed in self.exact


def allowed_hosts(
    *,
    listening: Iterable[str] = (),
    port: int | None = None,
    tls: bool = False,
    extra: Iterable[str] = (),
) -> AllowedHosts:
    """The names a console answers to when it listens on *port* (None: a Unix socket) at the
    addresses or names *listening* (what ``--listen`` named and what the socket is bound to),
    with the *extra* ``--allow-host`` names; `ConsoleError` names an extra that is no host."""
    names: set[str] = set()
    exact: set[tuple[str, int | None]] = set()
    for given in extra:
        parsed = parse_host(given)
        if parsed is None:
            raise ConsoleError(
                f"--allow-host {given!r}: give a host name or address, with a port or without"
                " (console.example.com, console.example.com:8470, [2001:db8::1]:8470)"
            )
        if parsed[1] is None:
            names.add(parsed[0])
        else:
            exact.add(parsed)
    if port is None:  # a Unix socket: the proxy's names, or whatever the proxy sends
        return AllowedHosts(frozenset(exact), frozenset(names), anything=not (exact or names))
    own: set[str] = set()
    for host in (h.lower() for h in listening):
        if host in _WILDCARDS or _loopback(host):
            own.update(_LOOPBACK_NAMES)
        if host not in _WILDCARDS:
            own.add(host)
    for name in own:
        exact.add((name, port))
        if port == (443 if tls else 80):  # a browser leaves the scheme's own port out
            exact.add((name, None))
    return AllowedHosts(frozenset(exact), frozenset(names))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
