"""Which async PostgreSQL driver for the turn store: asyncpg or psycopg 3, on the store's hot path.

Run from the repository root: ``.venv/bin/python -m benchmarks.bench_pg_driver`` (about 30 s).
It starts a private cluster (``tests/supervisor/store/pg_cluster.py``: initdb into a temporary
directory, Unix socket, ``fsync=on``), then per driver and in the same run:

* the hot path of a turn, two transactions: **accept** (take the session's next turn number,
  insert the turn claimed with a lease and token 1) and **finish** (lock the row, check the
  fencing token, insert two ledger lines, move the turn to ``succeeded`` and release it);
* one turn in flight (latency: p50 of a whole turn, accept + finish) and 64 in flight (one
  session per worker, ``min(in flight, 16)`` connections shared through a small pool);
* the drivers' rounds interleave (A B A B) and the better of each driver's two rounds is shown.

Not a test: figures depend on the disk and on whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.abc
import asyncpg
import psycopg
from anyio.streams.stapled import StapledObjectStream

from tests.supervisor.store.pg_cluster import PgCluster, start_cluster, stop_cluster

_SCHEMA = """
CREATE TABLE sessions(session_id TEXT PRIMARY KEY, turns BIGINT NOT NULL DEFAULT 0);
CREATE TABLE turns(
    turn_id BIGSERIAL PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    turn_number BIGINT NOT NULL,
    spec BYTEA NOT NULL,
    state TEXT NOT NULL,
    accepted_us BIGINT NOT NULL,
    updated_us BIGINT NOT NULL,
    finished_us BIGINT,
    result BYTEA,
    owner TEXT,
    token BIGINT NOT NULL DEFAULT 0,
    lease_until_us BIGINT,
    UNIQUE(session_id, turn_number)
);
CREATE TABLE ledger_lines(
    ledger_id TEXT NOT NULL, seq BIGINT NOT NULL, entry_hash TEXT NOT NULL, line BYTEA NOT NULL,
    PRIMARY KEY(ledger_id, seq)
);
"""
_SPEC = b'{"kind":"instruction","command_type":"READ","parameters":{"path":"README.md"}}'
_LINE = b'{"kind":"turn","status":"succeeded","entry_hash":"' + b"a" * 64 + b'"}\n'


def _now_us() -> int:
    return time.time_ns() // 1000


class _Turns(Protocol):
    """One driver's connection running the two transactions of the hot path."""

    async def accept(self, session_id: str) -> int: ...
    async def finish(self, turn_id: int, session_id: str, seq: int) -> None: ...
    async def close(self) -> None: ...


class _Asyncpg:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self._c = conn

    async def accept(self, session_id: str) -> int:
        now = _now_us()
        async with self._c.transaction():
            number = await self._c.fetchval(
                "UPDATE sessions SET turns = turns + 1 WHERE session_id = $1 RETURNING turns",
                session_id,
            )
            turn_id = await self._c.fetchval(
                "INSERT INTO turns(session_id, turn_number, spec, state, accepted_us,"
                " updated_us, owner, token, lease_until_us)"
                " VALUES ($1, $2, $3, 'accepted', $4, $4, 'bench', 1, $5) RETURNING turn_id",
                session_id,
                number,
                _SPEC,
                now,
                now + 30_000_000,
            )
        assert isinstance(turn_id, int)
        return turn_id

    async def finish(self, turn_id: int, session_id: str, seq: int) -> None:
        async with self._c.transaction():
            row = await self._c.fetchrow(
                "SELECT state, owner, token FROM turns WHERE turn_id = $1 FOR UPDATE", turn_id
            )
            assert row is not None
            assert (row["owner"], row["token"]) == ("bench", 1)
            digest = hashlib.sha256(b"%d" % seq).hexdigest()
            await self._c.executemany(
                "INSERT INTO ledger_lines(ledger_id, seq, entry_hash, line)"
                " VALUES ($1, $2, $3, $4)",
                [(f"{session_id}/{kind}", seq, digest, _LINE) for kind in ("exec", "evidence")],
            )
            now = _now_us()
            await self._c.execute(
                "UPDATE turns SET state = 'succeeded', updated_us = $1, finished_us = $1,"
                " result = $2, owner = NULL, lease_until_us = NULL WHERE turn_id = $3",
                now,
                b"{}",
                turn_id,
            )

    async def close(self) -> None:
        await self._c.close()


class _Psycopg:
    def __init__(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        self._c = conn

    async def accept(self, session_id: str) -> int:
        now = _now_us()
        async with self._c.transaction():
            cur = await self._c.execute(
                "UPDATE sessions SET turns = turns + 1 WHERE session_id = %s RETURNING turns",
                (session_id,),
            )
            number = (await cur.fetchone() or (0,))[0]
            cur = await self._c.execute(
                "INSERT INTO turns(session_id, turn_number, spec, state, accepted_us,"
                " updated_us, owner, token, lease_until_us)"
                " VALUES (%s, %s, %s, 'accepted', %s, %s, 'bench', 1, %s) RETURNING turn_id",
                (session_id, number, _SPEC, now, now, now + 30_000_000),
            )
            row = await cur.fetchone()
        assert row is not None
        turn_id = row[0]
        assert isinstance(turn_id, int)
        return turn_id

    async def finish(self, turn_id: int, session_id: str, seq: int) -> None:
        async with self._c.transaction():
            cur = await self._c.execute(
                "SELECT state, owner, token FROM turns WHERE turn_id = %s FOR UPDATE", (turn_id,)
            )
            row = await cur.fetchone()
            assert row is not None
            assert (row[1], row[2]) == ("bench", 1)
            digest = hashlib.sha256(b"%d" % seq).hexdigest()
            async with self._c.cursor() as many:
                await many.executemany(
                    "INSERT INTO ledger_lines(ledger_id, seq, entry_hash, line)"
                    " VALUES (%s, %s, %s, %s)",
                    [(f"{session_id}/{kind}", seq, digest, _LINE) for kind in ("exec", "evidence")],
                )
            now = _now_us()
            await self._c.execute(
                "UPDATE turns SET state = 'succeeded', updated_us = %s, finished_us = %s,"
                " result = %s, owner = NULL, lease_until_us = NULL WHERE turn_id = %s",
                (now, now, b"{}", turn_id),
            )

    async def close(self) -> None:
        await self._c.close()


async def _connect_asyncpg(dsn: str) -> _Turns:
    return _Asyncpg(await asyncpg.connect(dsn))


async def _connect_psycopg(dsn: str) -> _Turns:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0)
    return _Psycopg(conn)


_DRIVERS: dict[str, Callable[[str], Awaitable[_Turns]]] = {
    "asyncpg": _connect_asyncpg,
    "psycopg": _connect_psycopg,
}


@dataclass(frozen=True, slots=True)
class _Figures:
    turns_per_s: float
    p50_ms: float


@asynccontextmanager
async def _pool(driver: str, dsn: str, size: int) -> AsyncIterator[anyio.abc.ObjectStream[_Turns]]:
    send, receive = anyio.create_memory_object_stream[_Turns](size)
    conns = [await _DRIVERS[driver](dsn) for _ in range(size)]
    for conn in conns:
        send.send_nowait(conn)
    try:
        yield StapledObjectStream(send, receive)
    finally:
        for conn in conns:
            await conn.close()


async def _round(cluster: PgCluster, driver: str, in_flight: int, turns: int) -> _Figures:
    database = f"bench_{driver}_{in_flight}_{time.monotonic_ns()}"
    cluster.psql(f"CREATE DATABASE {database}")
    dsn = cluster.dsn(database)
    setup = await asyncpg.connect(dsn)
    await setup.execute(_SCHEMA)
    await setup.executemany(
        "INSERT INTO sessions(session_id) VALUES ($1)", [(f"S{i}",) for i in range(in_flight)]
    )
    await setup.close()
    latencies: list[float] = []
    per_worker = turns // in_flight
    async with _pool(driver, dsn, min(in_flight, 16)) as pool:

        async def worker(i: int) -> None:
            session_id = f"S{i}"
            for seq in range(1, per_worker + 1):
                started = time.perf_counter()
                conn = await pool.receive()
                try:
                    turn_id = await conn.accept(session_id)
                finally:
                    await pool.send(conn)
                conn = await pool.receive()
                try:
                    await conn.finish(turn_id, session_id, seq)
                finally:
                    await pool.send(conn)
                latencies.append(time.perf_counter() - started)

        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(in_flight):
                tg.start_soon(worker, i)
        elapsed = time.perf_counter() - began
    cluster.psql(f"DROP DATABASE {database}")
    return _Figures(len(latencies) / elapsed, statistics.median(latencies) * 1000)


async def _main(turns: int, rounds: int) -> None:
    cluster = await anyio.to_thread.run_sync(start_cluster)
    try:
        print(f"private cluster: {cluster.bin_dir}, fsync=on, Unix socket")
        print(f"{'driver':<9} {'in flight':>9} {'turns/s':>9} {'p50 ms':>8}")
        best: dict[tuple[str, int], _Figures] = {}
        for in_flight in (1, 64):
            for _ in range(rounds):
                for driver in _DRIVERS:
                    n = turns if in_flight > 1 else max(turns // 4, 100)
                    got = await _round(cluster, driver, in_flight, n)
                    kept = best.get((driver, in_flight))
                    if kept is None or got.turns_per_s > kept.turns_per_s:
                        best[(driver, in_flight)] = got
        for (driver, in_flight), fig in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            print(f"{driver:<9} {in_flight:>9} {fig.turns_per_s:>9.0f} {fig.p50_ms:>8.2f}")
        for in_flight in (1, 64):
            a, p = best[("asyncpg", in_flight)], best[("psycopg", in_flight)]
            print(
                f"asyncpg / psycopg at {in_flight} in flight: throughput"
                f" {a.turns_per_s / p.turns_per_s:.2f}x, p50 {p.p50_ms / a.p50_ms:.2f}x lower"
            )
    finally:
        await anyio.to_thread.run_sync(stop_cluster, cluster)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=2048, help="turns per round at 64 in flight")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per driver (best shown)")
    args = parser.parse_args()
    anyio.run(_main, args.turns, args.rounds)


if __name__ == "__main__":
    main()
