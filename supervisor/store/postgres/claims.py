"""The PostgreSQL engine's claims of turns: claim, recover, renew, release.

Claims pick the oldest claimable rows with ``FOR NO KEY UPDATE SKIP LOCKED`` (a materialized
CTE, so the pick runs once) and update those: two daemons claiming at once take different
turns and never wait for each other. Every claim adds one to the row's token. Renewals run on
the renewal connection, outside a transaction (`renew_held`, shared with the homes of
`fleet_ops`).

Apart from `operations` because claims decide who holds a turn (the leases), not what
happens to it: they change with the fleet's rules, the fenced writes with the lifecycle's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Final

import asyncpg

from supervisor.store.postgres.reads import now_us, turns_from_rows
from supervisor.store.postgres.schema import TURN_COLUMNS, UNFINISHED
from supervisor.store.protocol import Claim, ClaimFilter

__all__ = ["claim_turns", "recover", "release", "renew", "renew_held"]

Conn = asyncpg.Connection

UNFINISHED_SQL: Final = f"state IN ({', '.join(repr(s) for s in UNFINISHED)})"
#: ``TURN_COLUMNS`` of the updated table, in an ``UPDATE ... FROM`` that joins another
TURN_RETURNING: Final = ", ".join(f"turns.{c.strip()}" for c in TURN_COLUMNS.split(","))


async def _claims(conn: Conn, rows: Sequence[asyncpg.Record]) -> list[Claim]:
    ordered = sorted(rows, key=lambda r: int(r[0]))  # RETURNING promises no order
    return [
        Claim(turn=t, owner=str(r[17]), token=t.token, lease_until_us=int(r[19]))
        for t, r in zip(await turns_from_rows(conn, ordered), ordered, strict=True)
    ]


async def claim_turns(
    conn: Conn, owner: str, limit: int, lease_ms: int, only: ClaimFilter | None
) -> list[Claim]:
    now = now_us()
    where = [
        UNFINISHED_SQL,
        "((owner IS NULL AND (state <> 'waiting_retry' OR coalesce(next_attempt_us, 0) <= $3))"
        " OR (owner IS NOT NULL AND lease_until_us < $3))",
    ]
    args: list[object] = [owner, now + lease_ms * 1000, now, limit]
    if only is not None:
        args.append(sorted(k.value for k in only.kinds))
        where.append(f"kind = ANY(${len(args)}::text[])")
        if only.command_types is not None:
            args.append(sorted(only.command_types))
            where.append(f"(kind <> 'instruction' OR command_type = ANY(${len(args)}::text[]))")
        if only.process_sessions is not None:
            args.append(sorted(only.process_sessions))
            where.append(f"(kind <> 'process' OR session_id = ANY(${len(args)}::text[]))")
        if only.sessions is not None:
            args.append(sorted(only.sessions))
            where.append(f"session_id = ANY(${len(args)}::text[])")
    rows = await conn.fetch(
        "WITH c AS MATERIALIZED (SELECT turn_id FROM turns"
        f" WHERE {' AND '.join(where)} ORDER BY turn_id LIMIT $4 FOR NO KEY UPDATE SKIP LOCKED)"
        " UPDATE turns SET owner = $1, token = token + 1, lease_until_us = $2 FROM c"
        f" WHERE turns.turn_id = c.turn_id RETURNING {TURN_RETURNING}",
        *args,
    )
    return await _claims(conn, rows)


async def recover(conn: Conn, owner: str, lease_ms: int) -> list[Claim]:
    """Every unfinished turn this owner held, nobody holds, or whose lease expired (the shared
    engine's reading of a restart: another daemon's live claims are left alone)."""
    now = now_us()
    rows = await conn.fetch(
        f"WITH c AS MATERIALIZED (SELECT turn_id FROM turns WHERE {UNFINISHED_SQL}"
        " AND (owner IS NULL OR owner = $1 OR lease_until_us < $3) ORDER BY turn_id"
        " FOR NO KEY UPDATE SKIP LOCKED)"
        " UPDATE turns SET owner = $1, token = token + 1, lease_until_us = $2 FROM c"
        f" WHERE turns.turn_id = c.turn_id RETURNING {TURN_RETURNING}",
        owner,
        now + lease_ms * 1000,
        now,
    )
    return await _claims(conn, rows)


#: The claims' rows still held (owner and token), locked by id (``{wait}``: ``SKIP LOCKED``
#: or waiting), given the new lease; the answer lists every held row with whether it was.
_RENEW: Final = (
    "WITH held AS (SELECT * FROM unnest($2::bigint[], $3::text[], $4::bigint[])"
    " AS h(turn_id, owner, token)),"
    " l AS (SELECT t.turn_id FROM turns t JOIN held h ON t.turn_id = h.turn_id"
    " AND t.owner = h.owner AND t.token = h.token ORDER BY t.turn_id FOR NO KEY UPDATE OF t"
    "{wait}),"
    " u AS (UPDATE turns SET lease_until_us = $1 FROM l WHERE turns.turn_id = l.turn_id"
    " RETURNING turns.turn_id)"
    " SELECT t.turn_id, u.turn_id IS NOT NULL FROM turns t JOIN held h ON t.turn_id = h.turn_id"
    " AND t.owner = h.owner AND t.token = h.token LEFT JOIN u ON u.turn_id = t.turn_id"
)
_RENEW_SKIPPING: Final = _RENEW.format(wait=" SKIP LOCKED")
_RENEW_WAITING: Final = _RENEW.format(wait="")


async def renew(conn: Conn, claims: tuple[Claim, ...], lease_ms: int) -> list[Claim]:
    """The claims still held, renewed (a claim whose row stays locked by another transaction
    comes back as it was: `renew_held`); runs outside a transaction."""
    until = now_us() + lease_ms * 1000
    renewed, busy = await renew_held(
        conn,
        (_RENEW_SKIPPING, _RENEW_WAITING),
        until,
        ids=[c.turn_id for c in claims],
        owners=[c.owner for c in claims],
        tokens=[c.token for c in claims],
    )
    return [
        replace(c, lease_until_us=until) if c.turn_id in renewed else c
        for c in claims
        if c.turn_id in renewed or c.turn_id in busy
    ]


async def renew_held(
    conn: Conn,
    statements: tuple[str, str],
    until: int,
    *,
    ids: Sequence[object],
    owners: Sequence[str],
    tokens: Sequence[int],
) -> tuple[set[object], set[object]]:
    """Renew leases on the renewal connection, outside a transaction (each statement commits
    by itself): the rows nobody else has locked at once (*statements*' first, ``SKIP
    LOCKED``), then the others, waiting for them at most the connection's ``lock_timeout``
    (the second). (renewed, held but not renewed): a row still locked by another transaction
    then (the daemon's own batch writing it, a paused daemon's until the server cuts its
    connection) is still held as far as anyone knows, and the next round renews it; a row
    held by nobody's claim or home any more is in neither."""
    skipping, waiting = statements
    rows = await conn.fetch(skipping, until, list(ids), list(owners), list(tokens))
    renewed = {r[0] for r in rows if r[1]}
    busy = {r[0] for r in rows if not r[1]}
    if not busy:
        return renewed, busy
    keep = [i for i, key in enumerate(ids) if key in busy]
    try:
        again = await conn.fetch(
            waiting,
            until,
            [ids[i] for i in keep],
            [owners[i] for i in keep],
            [tokens[i] for i in keep],
        )
    except (asyncpg.exceptions.LockNotAvailableError, asyncpg.exceptions.QueryCanceledError):
        return renewed, busy  # still locked: renewed next round
    # waiting, every row still held was locked and renewed; one its lock holder took is gone
    return renewed | {r[0] for r in again if r[1]}, set()


async def release(conn: Conn, claim: Claim) -> None:
    await conn.execute(
        "UPDATE turns SET owner = NULL, lease_until_us = NULL"
        " WHERE turn_id = $1 AND owner = $2 AND token = $3",
        claim.turn_id,
        claim.owner,
        claim.token,
    )
