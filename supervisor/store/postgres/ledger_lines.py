"""The PostgreSQL engine's ledger lines: kept as they continue their chains, read back, and
the session homes an append must hold (`check_homes`).

Apart from `operations` because the lines are the fleet's ledger of record (the anchored
chains every daemon rebuilds from): their rules are the ledger's (a fork, a broken link), not
the turn lifecycle's, and both the turns' endings and the fleet's anchoring use them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import asyncpg

from ledger.entries import SealedLine
from supervisor.errors import LedgerForkError
from supervisor.store.fleet import StaleHomeError

__all__ = ["PUT_LINES", "check_homes", "ledger_lines", "put_ledger_lines", "trim_ledger_lines"]

Conn = asyncpg.Connection


#: Keep lines that continue their chains, in one statement: a line already kept under its seq
#: must be the same line (an anchoring round re-sends lines the store has: kept once), and a line
#: whose predecessor is kept, or comes in the same call, must link to it by its previous hash.
#: Nothing is written when one line fails (the caller raises); the heads move forward only.
#: The kept neighbours of each line are read by a LATERAL range over the primary key (at most two
#: rows per line): a plain join on ``seq IN (w.seq, w.seq - 1)`` lets the planner hash-join every
#: kept line of the ledger (a scan that grows with the ledger, and with every turn it holds).
PUT_LINES: Final = (
    "WITH w AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bytea[],"
    " $5::text[]) AS w(ledger_id, seq, entry_hash, line, previous_hash)),"
    " k AS (SELECT l.ledger_id, l.seq, l.entry_hash FROM w CROSS JOIN LATERAL"
    " (SELECT x.ledger_id, x.seq, x.entry_hash FROM ledger_lines x"
    " WHERE x.ledger_id = w.ledger_id AND x.seq BETWEEN w.seq - 1 AND w.seq"
    " ORDER BY x.seq LIMIT 2) l),"
    " known AS (SELECT ledger_id, seq, entry_hash FROM k"
    " UNION ALL SELECT ledger_id, seq, entry_hash FROM w),"
    " bad AS (SELECT w.ledger_id, w.seq, 'fork' AS why"
    " FROM w JOIN k ON k.ledger_id = w.ledger_id AND k.seq = w.seq"
    " AND k.entry_hash <> w.entry_hash"
    " UNION ALL SELECT w.ledger_id, w.seq, 'link'"
    " FROM w JOIN known p ON p.ledger_id = w.ledger_id AND p.seq = w.seq - 1"
    " WHERE w.previous_hash <> '' AND p.entry_hash <> w.previous_hash),"
    " ins AS (INSERT INTO ledger_lines(ledger_id, seq, entry_hash, line)"
    " SELECT ledger_id, seq, entry_hash, line FROM w WHERE NOT EXISTS (SELECT 1 FROM bad)"
    " ON CONFLICT (ledger_id, seq) DO NOTHING RETURNING ledger_id, seq, entry_hash),"
    " hd AS (INSERT INTO ledger_heads(ledger_id, seq, entry_hash)"
    " SELECT DISTINCT ON (ledger_id) ledger_id, seq, entry_hash FROM ins"
    " ORDER BY ledger_id, seq DESC ON CONFLICT (ledger_id) DO UPDATE"
    " SET seq = excluded.seq, entry_hash = excluded.entry_hash"
    " WHERE ledger_heads.seq < excluded.seq RETURNING 1)"
    " SELECT b.ledger_id, b.seq, b.why, (SELECT count(*) FROM ins), (SELECT count(*) FROM hd)"
    " FROM (SELECT * FROM bad UNION ALL SELECT NULL, NULL, NULL) b"
    " ORDER BY b.ledger_id NULLS LAST, b.seq LIMIT 1"
)


async def put_ledger_lines(conn: Conn, lines: Sequence[SealedLine]) -> int:
    """Keep sealed ledger lines in one statement (see `PUT_LINES`); how many were new.
    ValueError, with nothing written, when a line does not continue its chain: a different
    line at its seq (a fork) or a previous hash other than its predecessor's."""
    if not lines:
        return 0
    row = await conn.fetchrow(
        PUT_LINES,
        [x.ledger_id for x in lines],
        [x.seq for x in lines],
        [x.entry_hash for x in lines],
        [x.line for x in lines],
        [x.previous_hash for x in lines],
    )
    assert row is not None
    if row[0] is not None:
        detail = (
            "already has a different line"
            if row[2] == "fork"
            else "refuses a line whose previous hash is not the hash of the line before it"
            " (it does not continue the chain)"
        )
        raise LedgerForkError(str(row[0]), int(row[1]), detail)
    return int(row[3])


async def check_homes(conn: Conn, owner: str, sessions: Sequence[str]) -> None:
    """Lock the rows of *sessions* (sorted: the order every writer locks them in; ``FOR
    SHARE``: a home cannot change hands meanwhile, and appends to one session are serialised
    across daemons); `StaleHomeError` when one is homed by another daemon. A session nobody
    homes (a store used without a fleet, or a home released) passes."""
    if not sessions:
        return
    rows = await conn.fetch(
        "SELECT session_id, home FROM sessions WHERE session_id = ANY($1::text[])"
        " ORDER BY session_id FOR SHARE",
        sorted(sessions),
    )
    for row in rows:
        home = row[1]
        if home is not None and home != owner:
            raise StaleHomeError(str(row[0]), owner=owner, home=str(home))


async def ledger_lines(conn: Conn, ledger_ids: Sequence[str]) -> list[SealedLine]:
    rows = await conn.fetch(
        "SELECT l.ledger_id, l.seq, l.entry_hash, l.line FROM ledger_lines l"
        " JOIN unnest($1::text[]) WITH ORDINALITY AS wanted(ledger_id, n)"
        " ON l.ledger_id = wanted.ledger_id ORDER BY wanted.n, l.seq",
        list(ledger_ids),
    )
    return [SealedLine(str(r[0]), int(r[1]), str(r[2]), bytes(r[3])) for r in rows]


async def trim_ledger_lines(conn: Conn, synced: Mapping[str, int]) -> int:
    status = await conn.execute(
        "DELETE FROM ledger_lines l USING unnest($1::text[], $2::bigint[]) AS s(ledger_id, seq)"
        " WHERE l.ledger_id = s.ledger_id AND l.seq <= s.seq",
        list(synced),
        list(synced.values()),
    )
    return int(status.rsplit(" ", 1)[-1])
