"""The statement of a turn listing on PostgreSQL (`supervisor.store.turn_filter.TurnFilter`):
one text for every filter (an absent one is a NULL argument), so it is prepared once."""

from __future__ import annotations

from typing import Final

from supervisor.store.postgres.schema import TURN_COLUMNS
from supervisor.store.turn_filter import TurnFilter

__all__ = ["LIST_TURNS", "list_turns_args"]

#: $1 after turn id, $2 session, $3 states, $4 package, $5 since, $6 until, $7 limit
LIST_TURNS: Final = (
    f"SELECT {TURN_COLUMNS} FROM turns WHERE turn_id > $1"
    " AND ($2::text IS NULL OR session_id = $2)"
    " AND ($3::text[] IS NULL OR state = ANY($3::text[]))"
    " AND ($4::text IS NULL OR session_id IN"
    " (SELECT session_id FROM sessions WHERE package_id = $4))"
    " AND ($5::bigint IS NULL OR accepted_us >= $5)"
    " AND ($6::bigint IS NULL OR accepted_us < $6)"
    " ORDER BY turn_id LIMIT $7"
)


def list_turns_args(where: TurnFilter, after_turn_id: int, limit: int) -> tuple[object, ...]:
    """`LIST_TURNS`'s arguments for the turns after *after_turn_id* that *where* keeps."""
    return (
        after_turn_id,
        where.session_id,
        where.state_values(),
        where.package_id,
        where.accepted_since_us,
        where.accepted_until_us,
        limit,
    )
