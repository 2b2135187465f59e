"""The WHERE clause of a turn listing on SQLite (`supervisor.store.turn_filter.TurnFilter`)."""

from __future__ import annotations

from supervisor.store.turn_filter import TurnFilter

__all__ = ["turn_conditions"]


def turn_conditions(where: TurnFilter, after_turn_id: int) -> tuple[str, list[object]]:
    """The conditions (joined by AND) and their arguments for the turns after *after_turn_id*
    that *where* keeps."""
    conditions = ["turn_id > ?"]
    args: list[object] = [after_turn_id]
    if where.session_id is not None:
        # No index is led by the session (`turns_table`): its turns lie between the first and
        # the last it took, read by id.
        conditions.append(
            "turn_id BETWEEN (SELECT first_turn_id FROM sessions WHERE session_id = ?)"
            " AND (SELECT last_turn_id FROM sessions WHERE session_id = ?) AND session_id = ?"
        )
        args.extend((where.session_id,) * 3)
    states = where.state_values()
    if states is not None:
        conditions.append(f"state IN ({', '.join('?' * len(states))})")
        args.extend(states)
    if where.package_id is not None:
        conditions.append("session_id IN (SELECT session_id FROM sessions WHERE package_id = ?)")
        args.append(where.package_id)
    if where.accepted_since_us is not None:
        conditions.append("accepted_us >= ?")
        args.append(where.accepted_since_us)
    if where.accepted_until_us is not None:
        conditions.append("accepted_us < ?")
        args.append(where.accepted_until_us)
    return " AND ".join(conditions), args
