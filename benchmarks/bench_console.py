"""What the console's live streams cost the daemon: N browsers following ``GET /events`` while
the daemon runs ``bench_daemon.py``'s throughput load, against no console in the same run.

Run: ``.venv/bin/python benchmarks/bench_console.py`` (about three minutes on 2 cores;
``--streams 0,10,50,100``, ``--rounds 3``); ``--quick`` (about 40 s): streams 0,50, one round.

One daemon (``harness.running_daemon``: embedded store, 8 no-op SDK executors of 8 slots in one
process, a session), loaded by ``bench_daemon.py``'s throughput phase itself (its
``_throughput``: ``turn.submit`` + wait with the full answer, 64 in flight over 8 connections,
one window of ``THROUGHPUT_SECONDS``). Each row is one window:

* ``none``: no console process running;
* ``N`` (each N of ``--streams``, 0 included): ``hunter console`` (``python -m supervisor
  console --operators FILE --listen 127.0.0.1:0 --socket <control.sock> --log-format json``) as
  a process of its own, its operators file written here with ``hash_password``, linked to the
  daemon (one event subscription), and N browsers following the overview's stream
  (``GET /events`` without a filter: every event, the heaviest stream).

The browsers are one child process for all of them (``--child``, "the readers"): once per
start of the console it signs in as many browsers as the largest N, each with an
``httpx.AsyncClient`` of its own (its own cookie jar: the sign-in form and its ``form_token``
cookie, the password, the sign-in cookie). Per row it opens N streams, each on a connection of
its own carrying its browser's sign-in cookie, waits until every one has its ``: live`` line
(the stream is registered with the console's feed), and counts each stream's changes as the
raw bytes arrive: the ``changes`` of each message (the console sends a page one message per
burst of changes, at most four a second, ``supervisor/console/stream.py``), read with a regular
expression rather than a JSON parser, so that the readers compete with the daemon for the cores
no more than reading must, as in ``bench_events.py``. When the window ends it notes each
stream's count ("live": how far the streams keep up while the daemon runs), then gives the
streams up to `CATCHUP_MAX_S` to have been told of every event the daemon published in the
window ("catch-up"), and closes them. A stream that the console ended meanwhile was dropped; a
browser would reconnect, these do not, and the table counts them.

Rounds interleave the rows, their order rotated each round (the console is started or stopped
as the order needs, its browsers signed in anew at each start); the table gives each row's
median over the rounds: turns/s, the ratio to the ``none`` row and the cost in %, the daemon's
events per turn (4 for a READ turn: accepted, attempt started, attempt ended, ended), the events
a stream got, live, the least any stream got (shares of what the daemon published in the
window), catch-up, streams dropped, the console's subscriptions the daemon cut off, the CPU per
turn of the daemon (the window), of the console process and of the readers (the window and the
catch-up), and the share of a core the console took during the window. The target (issue 22):
50 browsers' streams cost the daemon less than 5 % of its throughput.

On a 2-core machine the console process and the readers share the two cores with the daemon,
its executors and the submitting client: the cost measured includes that CPU contention, and is
an upper bound of what the streams cost a daemon on a host of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import httpx
import psutil
from anyio.streams.buffered import BufferedByteReceiveStream

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # ``benchmarks.*`` below, run as a script

from benchmarks.bench_daemon import (  # noqa: E402
    EXECUTORS,
    IN_FLIGHT,
    SLOTS,
    THROUGHPUT_SECONDS,
    _throughput,
)
from benchmarks.harness import BenchDaemon, noop, running_daemon  # noqa: E402
from supervisor.console.guard import COOKIE  # noqa: E402

OPERATOR = "bench"
#: the benchmark's own operator, on a console that listens on loopback for the run only
PASSWORD = "bench console password"
#: browsers signing in at once (the console checks two scrypt hashes at a time)
SIGNIN_CONCURRENCY = 4
#: after the window, the streams get this long to catch up with what the daemon published
CATCHUP_MAX_S = 5.0
#: and are given up on sooner when their counts stop moving for this long (events were lost)
STALLED_S = 2.0
_FORM_TOKEN = re.compile(r'name="form_token" value="([^"]+)"')
#: a stream's message: how many changes it stands for (a burst is one message)
_CHANGES = re.compile(rb'\{"changes":(\d+)')


def _rows(streams: list[int]) -> list[int | None]:
    """The rows of a round: None (no console), then each stream count."""
    return [None, *streams]


def _label(row: int | None) -> str:
    return "none" if row is None else str(row)


# --------------------------------------------------------------------------- the readers (child)


async def _sign_in(http: httpx.AsyncClient) -> str:
    """Sign *http* in as a browser does (the form and its cookie, then the password); the
    sign-in cookie's value."""
    form = await http.get("/login")
    token = _FORM_TOKEN.search(form.text)
    if token is None:
        raise RuntimeError(f"GET /login: {form.status_code}, no form_token")
    done = await http.post(
        "/login",
        data={"form_token": token.group(1), "name": OPERATOR, "password": PASSWORD, "next": "/"},
    )
    cookie = http.cookies.get(COOKIE)
    if done.status_code != 303 or cookie is None:
        raise RuntimeError(f"POST /login: {done.status_code} {done.text[:200]!r}")
    return cookie


@dataclass
class _Stream:
    """One browser's ``GET /events``, as the readers see it."""

    events: int = 0
    bytes: int = 0
    #: the console ended it (a dropped stream) before the readers closed it
    ended: bool = False
    error: str | None = None


async def _read(
    host: str, port: int, cookie: str, stream: _Stream, opened: Callable[[], None]
) -> None:
    """Follow ``/events`` with the sign-in *cookie* on a connection of its own, counting the
    events as the bytes arrive; *opened* once ``: live`` arrived (the stream is registered)."""
    told = False
    try:
        async with await anyio.connect_tcp(host, port) as conn:
            await conn.send(
                f"GET /events HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n"
                f"Cookie: {COOKIE}={cookie}\r\nConnection: close\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                head += await conn.receive()
            head, _, data = head.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                stream.error = head.split(b"\r\n", 1)[0].decode(errors="replace")
                return
            stream.bytes += len(data)
            buffer = data
            while True:
                # one SSE message per blank line; the last part may be a message's beginning
                *complete, buffer = buffer.split(b"\n\n")
                for message in complete:  # each behind its chunk's size line (chunked body)
                    if b"data: " in message:
                        changes = _CHANGES.search(message)
                        stream.events += int(changes.group(1)) if changes else 1
                    elif not told and b": live" in message:
                        told = True
                        opened()
                data = await conn.receive(1 << 20)
                stream.bytes += len(data)
                buffer += data
    except anyio.EndOfStream:
        stream.ended = True  # Connection: close: the console ended the response
    except OSError as exc:
        stream.error = f"{type(exc).__name__}: {exc}"
    finally:
        if not told:
            opened()  # an answer (refused, failed): the row sees it in the stream's error


async def _follow(
    address: tuple[str, int],
    cookies: list[str],
    say: Callable[[dict[str, Any]], None],
    line: _Lines,
) -> None:
    """Open a stream with each of *cookies*; say "opened"; on "close E" (E: the events the
    daemon published in the window) note the counts, wait until every stream has E events (or
    the counts stop moving, or `CATCHUP_MAX_S`), close the streams and say what each got."""
    streams = [_Stream() for _ in cookies]
    waiting = [len(cookies)]
    all_open = anyio.Event()

    def opened() -> None:
        waiting[0] -= 1
        if waiting[0] == 0:
            all_open.set()

    caught_up: float | None = None
    async with anyio.create_task_group() as tg:
        for cookie, stream in zip(cookies, streams, strict=True):
            tg.start_soon(_read, *address, cookie, stream, opened)
        if cookies:
            with anyio.fail_after(60):
                await all_open.wait()
        say({"opened": len(cookies), "errors": [s.error for s in streams if s.error]})
        command = (await line()).split()
        if command[:1] != ["close"]:
            raise RuntimeError(f"readers: expected close, got {command!r}")
        expected = int(command[1])
        at_end = [s.events for s in streams]
        start = time.monotonic()
        last, still_since = -1, start
        while time.monotonic() - start < CATCHUP_MAX_S:
            if all(s.events >= expected or s.ended or s.error for s in streams):
                caught_up = time.monotonic() - start
                break
            total = sum(s.events for s in streams)
            if total != last:
                last, still_since = total, time.monotonic()
            elif time.monotonic() - still_since >= STALLED_S:
                break  # nothing more is coming: events were lost
            await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    say(
        {
            "events": [s.events for s in streams],
            "at_end": at_end,
            "caught_up_s": caught_up,
            "bytes": sum(s.bytes for s in streams),
            "dropped": sum(1 for s in streams if s.ended),
            "errors": [s.error for s in streams if s.error],
        }
    )


_Lines = Callable[[], Coroutine[Any, Any, str]]


async def _readers(url: str, browsers: int) -> None:
    """The child: sign in *browsers* browsers; then, per "open N" on stdin, follow N streams
    until "close E"; "quit" (or the end of stdin) ends it. Answers are JSON lines on stdout."""

    def say(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    async def line() -> str:
        return str(await anyio.to_thread.run_sync(sys.stdin.readline)).strip()

    parsed = urllib.parse.urlsplit(url)
    address = (parsed.hostname or "127.0.0.1", parsed.port or 80)
    cookies: list[str] = []
    limiter = anyio.CapacityLimiter(SIGNIN_CONCURRENCY)

    async def sign() -> None:
        async with (
            limiter,
            httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30.0)) as http,  # a cookie jar
        ):
            cookies.append(await _sign_in(http))

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(browsers):
            tg.start_soon(sign)
    say({"ready": browsers, "signin_s": time.perf_counter() - started})
    while True:
        command = await line()
        if command.startswith("open "):
            await _follow(address, cookies[: int(command.split()[1])], say, line)
        else:  # "quit" or the end of stdin
            return


# --------------------------------------------------------------------------- the console


@dataclass
class Console:
    """A ``hunter console`` process and the readers' process signed in to it."""

    process: anyio.abc.Process
    url: str
    log: Path
    readers: anyio.abc.Process
    _replies: BufferedByteReceiveStream
    signin_s: float = 0.0
    _ps: list[Any] = field(default_factory=list)

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far of the console process and of the readers' process."""
        out: list[float] = []
        for proc in self._ps:
            times = proc.cpu_times()
            out.append(float(times.user + times.system))
        return out[0], out[1]

    async def idle(self, timeout_s: float = 30.0) -> None:
        """Return once the console process is idle (it has read its backlog of events, if it
        fell behind: the next row's streams must not get this row's events)."""
        deadline = time.monotonic() + timeout_s
        last = self.cpu()[0]
        while time.monotonic() < deadline:
            await anyio.sleep(0.25)
            now = self.cpu()[0]
            if now - last < 0.025:  # under 10 % of a core
                return
            last = now

    async def ask(self, command: str, *, timeout_s: float = 90.0) -> dict[str, Any]:
        assert self.readers.stdin is not None
        await self.readers.stdin.send(command.encode() + b"\n")
        return await self._reply(timeout_s)

    async def _reply(self, timeout_s: float) -> dict[str, Any]:
        with anyio.fail_after(timeout_s):
            line = await self._replies.receive_until(b"\n", 1 << 24)
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            if self.readers.returncode is None:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    assert self.readers.stdin is not None
                    await self.readers.stdin.send(b"quit\n")
                with anyio.move_on_after(10):
                    await self.readers.wait()
                if self.readers.returncode is None:
                    self.readers.kill()
            await self.readers.wait()
            await self.readers.aclose()
            if self.process.returncode is None:
                self.process.send_signal(signal.SIGTERM)
                with anyio.move_on_after(10):
                    await self.process.wait()
                if self.process.returncode is None:
                    self.process.kill()
            await self.process.wait()
            await self.process.aclose()


def write_operators(path: Path) -> Path:
    from supervisor.console.operators import hash_password

    path.write_text(
        f'[operators.{OPERATOR}]\nrole = "reader"\npassword = "{hash_password(PASSWORD)}"\n',
        encoding="utf-8",
    )
    return path


async def _listening(log: Path, process: anyio.abc.Process) -> str:
    """The URL of the console's ``console_started`` log line."""
    with anyio.fail_after(30):
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"the console exited ({process.returncode}); see {log}")
            text = await anyio.Path(log).read_text(encoding="utf-8", errors="replace")
            for line in text.splitlines():
                if "console_started" in line:
                    return str(json.loads(line)["listen"])
            await anyio.sleep(0.05)


async def start_console(daemon: BenchDaemon, operators: Path, log: Path, browsers: int) -> Console:
    """The console on a free loopback port, linked to *daemon*, and *browsers* signed in."""
    with log.open("ab") as sink:
        process = await anyio.open_process(
            [
                sys.executable, "-m", "supervisor", "console",
                "--operators", str(operators),
                "--listen", "127.0.0.1:0",
                "--socket", str(daemon.control_socket),
                "--log-format", "json",
            ],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
        )  # fmt: skip
    readers: anyio.abc.Process | None = None
    try:
        url = await _listening(log, process)
        async with httpx.AsyncClient(base_url=url) as http:
            with anyio.fail_after(30):
                while True:
                    if (await http.get("/healthz")).status_code == 200:  # linked to the daemon
                        break
                    await anyio.sleep(0.05)
        readers = await anyio.open_process(
            [sys.executable, __file__, "--child", url, str(browsers)], stderr=None
        )
        assert readers.stdout is not None
        console = Console(
            process=process,
            url=url,
            log=log,
            readers=readers,
            _replies=BufferedByteReceiveStream(readers.stdout),
            _ps=[psutil.Process(process.pid), psutil.Process(readers.pid)],
        )
        ready = await console._reply(120.0)
        console.signin_s = float(ready["signin_s"])
        return console
    except BaseException:
        with anyio.CancelScope(shield=True):
            for proc in (readers, process):
                if proc is not None and proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        raise


# --------------------------------------------------------------------------- the rows


def _queued_bytes(url: str) -> int:
    """Bytes waiting in the kernel on the console's TCP connections (its unsent, the readers'
    unread), from ``/proc/net/tcp``; 0 where that is not there. Little: the readers keep up with
    what the console writes, and any lag of the streams is inside the console."""
    port = urllib.parse.urlsplit(url).port
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                local, remote, queues = fields[1], fields[2], fields[4]
                tx, rx = (int(q, 16) for q in queues.split(":"))
                if int(local.rsplit(":", 1)[1], 16) == port:
                    total += tx
                elif int(remote.rsplit(":", 1)[1], 16) == port:
                    total += rx
    return total


async def measure(daemon: BenchDaemon, console: Console | None, streams: int) -> dict[str, Any]:
    """One window of bench_daemon's load with *console* (None: none) and *streams* open."""
    if console is not None:
        opened = await console.ask(f"open {streams}")
        if opened["errors"]:
            raise RuntimeError(f"opening {streams} streams: {opened['errors'][:3]}")
    before = await daemon.call("status")
    cpu0 = daemon.cpu_s()
    console0 = console.cpu() if console is not None else (0.0, 0.0)
    done, failed, elapsed = await _throughput(daemon.control_socket, [daemon.sid], IN_FLIGHT)
    cpu = daemon.cpu_s() - cpu0
    console1 = console.cpu() if console is not None else (0.0, 0.0)
    queued = _queued_bytes(console.url) if console is not None else 0
    after = await daemon.call("status")
    published = after["events"]["published"] - before["events"]["published"]
    got: dict[str, Any] = {
        "events": [], "at_end": [], "caught_up_s": 0.0, "bytes": 0, "dropped": 0, "errors": [],
    }  # fmt: skip
    console2 = console1
    if console is not None:  # the streams catch up (or not), then are closed
        got = await console.ask(f"close {published}", timeout_s=CATCHUP_MAX_S + 60)
        await console.idle()
        console2 = console.cpu()
    turns = max(1, done + failed)
    counts: list[int] = got["events"]
    at_end: list[int] = got["at_end"]
    return {
        "row": None if console is None else streams,
        "turns_s": done / elapsed,
        "failed": failed,
        "published": published,
        "events_turn": published / turns,
        "stream_median": statistics.median(counts) if counts else 0.0,
        "live_share": statistics.median(at_end) / max(1, published) if at_end else 1.0,
        "least_share": min(counts) / max(1, published) if counts else 1.0,
        "caught_up_s": got["caught_up_s"],
        "bytes": got["bytes"],
        "dropped": got["dropped"],
        "errors": got["errors"],
        "cut": after["events"]["cut_off"] - before["events"]["cut_off"],
        "daemon_us": cpu * 1e6 / turns,
        "console_us": (console2[0] - console0[0]) * 1e6 / turns,
        "readers_us": (console2[1] - console0[1]) * 1e6 / turns,
        "console_core": (console1[0] - console0[0]) / elapsed,
        "queued_kb": queued / 1000,
        #: the console's CPU per event it wrote to a browser's stream
        "console_us_delivery": (console2[0] - console0[0]) * 1e6 / max(1, sum(counts)),
    }


#: the columns of a row, after its label: (heading, width)
COLUMNS = (
    ("turns/s", 7), ("ev/turn", 7), ("ev/stream", 9), ("live", 7), ("least", 7),
    ("catch-up", 8), ("dropped", 7), ("cut", 3), ("daemon", 6), ("console", 7),
    ("readers", 7), ("console", 7),
)  # fmt: skip
HEADINGS = "  ".join(f"{h:>{w}}" for h, w in COLUMNS)
SUBHEADINGS = f"{'':>{len(HEADINGS) - 35}}CPU us/turn (window + catch-up)  core"


def _cells(row: int | None, results: list[dict[str, Any]]) -> str:
    """The row's columns: medians over *results* (one or more windows of the row)."""

    def med(key: str) -> float:
        return statistics.median(float(x[key]) for x in results)

    opened = len(results) * (row or 0)
    if row:
        dropped = sum(int(x["dropped"]) for x in results)
        caught = [x["caught_up_s"] for x in results]
        catch = (
            f"{statistics.median(caught):6.1f} s"
            if None not in caught
            else f">{CATCHUP_MAX_S:4.0f} s ({sum(c is None for c in caught)}x)"
        )
        streams = (
            f"{med('stream_median'):9.0f}  {med('live_share') * 100:5.1f} %"
            f"  {min(float(x['least_share']) for x in results) * 100:5.1f} %"
            f"  {catch:>8}  {f'{dropped}/{opened}':>7}"
        )
    else:
        streams = f"{'':>9}  {'':>7}  {'':>7}  {'':>8}  {'':>7}"
    return (
        f"{med('turns_s'):7.0f}  {med('events_turn'):7.2f}  {streams}"
        f"  {sum(int(x['cut']) for x in results):3d}  {med('daemon_us'):6.0f}"
        f"  {med('console_us'):7.0f}  {med('readers_us'):7.0f}"
        f"  {med('console_core') * 100:5.0f} %"
    )


def _show(result: dict[str, Any], round_no: int) -> None:
    print(f"  {round_no:5d}  {_label(result['row']):>7}  {_cells(result['row'], [result])}")


async def run(streams: list[int], rounds: int, directory: Path) -> None:
    rows = _rows(streams)
    browsers = max(streams, default=0)
    operators = write_operators(directory / "operators.toml")
    results: list[dict[str, Any]] = []
    logs: list[Path] = []
    signins: list[float] = []
    print(
        f"console benchmark (python {sys.version.split()[0]}, {os.cpu_count()} cpus;"
        f" load average {os.getloadavg()[0]:.2f} at the start)"
    )
    print(
        f"daemon: {EXECUTORS} no-op executors x {SLOTS} slots, turn.submit(wait) at {IN_FLIGHT}"
        f" in flight, {THROUGHPUT_SECONDS:.0f} s windows; {rounds} round(s), rows"
        f" {', '.join(_label(r) for r in rows)} (order rotated per round)"
    )
    print(f"  {'round':>5}  {'streams':>7}  {HEADINGS}")
    print(f"  {'':>5}  {'':>7}  {SUBHEADINGS}")
    started = time.perf_counter()
    async with running_daemon(
        base=directory,
        executors=[[f"noop-{i}" for i in range(EXECUTORS)]],
        spawn=noop(SLOTS),
    ) as daemon:
        await _throughput(daemon.control_socket, [daemon.sid], IN_FLIGHT)  # warm up
        console: Console | None = None
        try:
            for r in range(rounds):
                shift = r % len(rows)
                for row in rows[shift:] + rows[:shift]:
                    if row is None and console is not None:
                        await console.aclose()
                        console = None
                    elif row is not None and console is None:
                        log = directory / f"console-{len(logs)}.log"
                        logs.append(log)
                        console = await start_console(daemon, operators, log, browsers)
                        signins.append(console.signin_s)
                    result = await measure(daemon, console, row or 0)
                    results.append(result)
                    _show(result, r + 1)
        finally:
            if console is not None:
                await console.aclose()
    total = time.perf_counter() - started
    _summary(rows, results, browsers, signins, total)
    _console_logs(logs)


def _summary(
    rows: list[int | None],
    results: list[dict[str, Any]],
    browsers: int,
    signins: list[float],
    total: float,
) -> None:
    def med(row: int | None, key: str) -> float:
        return statistics.median(float(x[key]) for x in results if x["row"] == row)

    base = med(None, "turns_s")
    idle = med(0, "turns_s") if 0 in rows else None
    print("medians per row; ratio and cost against no console")
    print(f"  {'streams':>7}  {'ratio':>6}  {'cost':>7}  {HEADINGS}")
    print(f"  {'':>7}  {'':>6}  {'':>7}  {SUBHEADINGS}")
    for row in rows:
        tput = med(row, "turns_s")
        cells = _cells(row, [x for x in results if x["row"] == row])
        print(f"  {_label(row):>7}  {tput / base:5.3f}x  {(1 - tput / base) * 100:5.1f} %  {cells}")
    for row in rows:
        if not row:
            continue
        tput = med(row, "turns_s")
        line = (
            f"{row} streams cost the daemon {(1 - tput / base) * 100:.1f} % of its throughput"
            f" ({tput:.0f} turns/s against {base:.0f} with no console"
        )
        if idle is not None:
            line += f"; {(1 - tput / idle) * 100:.1f} % against the console with 0 streams"
        target = "  (target < 5 %)" if row == 50 else ""
        print(line + ")" + target)
        print(
            f"  a stream had {med(row, 'live_share') * 100:.1f} % of the window's events when it"
            f" ended ({_label(row)} streams, median; {med(row, 'queued_kb'):.1f} KB were"
            " waiting in the sockets then: the rest of the lag is inside the console)"
        )
        print(
            f"  the console spent {med(row, 'console_us_delivery'):.1f} us of CPU per event"
            " written to a stream (window and catch-up)"
        )
    if idle is not None:
        print(
            f"the console with 0 streams costs the daemon {(1 - idle / base) * 100:.1f} %"
            " of its throughput (its one event subscription)"
        )
    failed = sum(int(x["failed"]) for x in results)
    errors = [e for x in results for e in x["errors"]]
    print(
        "streams: unfiltered GET /events, all read by one child process as raw bytes"
        f" ({browsers} browsers signed in per console start in"
        f" {statistics.median(signins or [0.0]):.1f} s, median)"
    )
    print(
        "  ev/stream: events a stream got (median); live: share of the window's events a stream"
        " had when the window ended (median); least: the fewest any stream got in the end;"
        f" catch-up: seconds after the window until every stream had them all (given up after"
        f" {CATCHUP_MAX_S:.0f} s); dropped: streams the console closed for falling behind;"
        " cut: the console's subscriptions the daemon cut off"
    )
    print(f"turns not succeeded: {failed}; stream errors: {len(errors)}")
    for error in sorted(set(errors))[:5]:
        print(f"  stream error: {error}")
    print(
        "on a 2-core machine the console and the readers share the cores with the daemon, its"
        " executors and the client: the cost includes that contention (an upper bound)"
    )
    print(
        f"total benchmark time {total:.1f} s; load average {os.getloadavg()[0]:.2f} at the end"
        " (other work on the machine makes the rows noisy: compare the rounds)"
    )


def _console_logs(logs: list[Path]) -> None:
    """The console's warnings and errors over the run, by event, if any."""
    seen: dict[str, int] = {}
    other = 0
    for log in logs:
        for text in log.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(text)
            except ValueError:
                other += 1
                continue
            if entry.get("level") in ("warning", "error", "critical"):
                key = f"{entry.get('level')} {entry.get('event')}"
                seen[key] = seen.get(key, 0) + 1
    if seen or other:
        print("console log: " + ", ".join(f"{k} x{n}" for k, n in sorted(seen.items())), end="")
        print(f"; {other} line(s) not JSON" if other else "")
    else:
        print("console log: no warnings or errors")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:
        anyio.run(_readers, args[1], int(args[2]))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument(
        "--streams", default="0,10,50,100", help="stream counts, 0 included (default 0,10,50,100)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: streams 0,50, one round (~40 s)"
    )
    parsed = parser.parse_args(args)
    streams = [0, 50] if parsed.quick else sorted({int(s) for s in parsed.streams.split(",")})
    rounds = 1 if parsed.quick else parsed.rounds
    if any(n < 0 for n in streams) or rounds < 1:
        parser.error("--streams: counts >= 0; --rounds: >= 1")
    from supervisor.logging import configure_logging

    configure_logging(fmt="json", level="error", stream=sys.stderr)
    directory = Path(tempfile.mkdtemp(prefix="hh-bench-console-"))
    os.chmod(directory, 0o711)  # process turns would run as another uid: keep it traversable
    try:
        anyio.run(functools.partial(run, streams, rounds, directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
