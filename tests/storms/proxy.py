"""A TCP proxy between one daemon and PostgreSQL that the nemesis can slow down or cut off.

Each daemon of a nemesis run reaches the server only through its own `Proxy` (its DSN names
the proxy's port), so a fault can hit one daemon's database traffic and not the others'. Three
knobs, set from the nemesis at any moment:

* `Proxy.set_delay`: every chunk, in both directions, is forwarded *delay* seconds after it
  was read, in order (a slow or distant network);
* `Proxy.set_black_hole`: nothing is forwarded (nor read: the bytes wait in the kernel's
  buffers, as a partition's retransmissions would) and new connections are accepted but not
  connected upstream until the hole closes again; nothing is lost if it closes in time;
* `Proxy.cut`: every connection is closed at once (the partition outlasted TCP's patience).

`Proxy.upstream_ports` are the local ports of its connections to the server: the
``client_port`` of their backends in ``pg_stat_activity``, which is how the nemesis sees that a
daemon is inside a transaction.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["Proxy", "ProxyStatistics"]

_CHUNK = 65536
#: chunks read ahead while delayed (a back-pressure bound, not a limit anyone meets)
_IN_FLIGHT = 1024


@dataclass(frozen=True, slots=True)
class ProxyStatistics:
    """A snapshot of one proxy: connections and bytes so far, and its knobs now."""

    name: str
    port: int
    connections: int
    open_connections: int
    bytes_forwarded: int
    delay_s: float
    black_hole: bool
    #: connections that ended on an unexpected error (each closed; the proxy goes on)
    errors: int


@dataclass(eq=False, slots=True)
class _Link:
    """One proxied connection: its two streams and the scope that ends both."""

    client: anyio.abc.SocketStream
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    upstream_port: int | None = None


class Proxy:
    """A TCP proxy from ``127.0.0.1:<port>`` to ``127.0.0.1:<upstream_port>`` (see the module
    docstring). Run it with ``await task_group.start(proxy.serve)``."""

    def __init__(self, name: str, *, upstream_port: int) -> None:
        self.name = name
        self.upstream_port = upstream_port
        self.port = 0
        self._delay_s = 0.0
        self._open = anyio.Event()
        self._open.set()
        self._links: set[_Link] = set()
        self._connections = 0
        self._bytes = 0
        self._errors = 0

    # -- knobs ------------------------------------------------------------------------------

    def set_delay(self, delay_s: float) -> None:
        """Forward each chunk read from now on *delay_s* seconds after it was read."""
        self._delay_s = max(0.0, delay_s)

    def set_black_hole(self, on: bool) -> None:
        """Stop (True) or resume (False) forwarding anything, in both directions."""
        if on and self._open.is_set():
            self._open = anyio.Event()
        elif not on:
            self._open.set()

    def cut(self) -> int:
        """Close every connection now; returns how many were open."""
        links = list(self._links)
        for link in links:
            link.scope.cancel()
        return len(links)

    @property
    def upstream_ports(self) -> frozenset[int]:
        return frozenset(p for link in self._links if (p := link.upstream_port) is not None)

    def statistics(self) -> ProxyStatistics:
        return ProxyStatistics(
            name=self.name,
            port=self.port,
            connections=self._connections,
            open_connections=len(self._links),
            bytes_forwarded=self._bytes,
            delay_s=self._delay_s,
            black_hole=not self._open.is_set(),
            errors=self._errors,
        )

    # -- serving ----------------------------------------------------------------------------

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on a free port of 127.0.0.1 (reported through *task_status*) until cancelled."""
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        async with listener:
            self.port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
            task_status.started(self.port)
            async with anyio.create_task_group() as tg:
                await listener.serve(self._handle, task_group=tg)

    async def _passable(self) -> None:
        while not self._open.is_set():
            await self._open.wait()

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        link = _Link(client)
        self._links.add(link)
        self._connections += 1
        try:
            await self._forward(link)
        except Exception:
            self._errors += 1
        finally:
            self._links.discard(link)

    async def _forward(self, link: _Link) -> None:
        client = link.client
        with link.scope:
            async with client:
                await self._passable()
                try:
                    upstream = await anyio.connect_tcp("127.0.0.1", self.upstream_port)
                except OSError:
                    return
                async with upstream:
                    link.upstream_port = int(upstream.extra(anyio.abc.SocketAttribute.local_port))
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._pipe, client, upstream, tg.cancel_scope)
                        tg.start_soon(self._pipe, upstream, client, tg.cancel_scope)

    async def _pipe(
        self,
        source: anyio.abc.SocketStream,
        sink: anyio.abc.SocketStream,
        both: anyio.CancelScope,
    ) -> None:
        """Forward *source* to *sink* through the delay and the black hole; when either side
        ends, the whole connection ends (*both*)."""
        send: MemoryObjectSendStream[tuple[float, bytes]]
        receive: MemoryObjectReceiveStream[tuple[float, bytes]]
        send, receive = anyio.create_memory_object_stream[tuple[float, bytes]](_IN_FLIGHT)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._write, receive, sink)
                async with send:
                    with contextlib.suppress(anyio.BrokenResourceError):  # the writer ended
                        while True:
                            await self._passable()
                            try:
                                data = await source.receive(_CHUNK)
                            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                                break
                            await send.send((anyio.current_time() + self._delay_s, data))
                        # what was read still goes out (a connection's last words), then EOF
                        await send.send((math.nan, b""))
        finally:
            both.cancel()

    async def _write(
        self,
        receive: MemoryObjectReceiveStream[tuple[float, bytes]],
        sink: anyio.abc.SocketStream,
    ) -> None:
        async with receive:
            await self._drain(receive, sink)

    async def _drain(
        self,
        receive: MemoryObjectReceiveStream[tuple[float, bytes]],
        sink: anyio.abc.SocketStream,
    ) -> None:
        async for due, data in receive:
            if math.isnan(due):
                with contextlib.suppress(anyio.BrokenResourceError, OSError):
                    await sink.send_eof()
                return
            wait = due - anyio.current_time()
            if wait > 0:
                await anyio.sleep(wait)
            await self._passable()
            try:
                await sink.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return
            self._bytes += len(data)
