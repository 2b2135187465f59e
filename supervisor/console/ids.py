"""What an id from a browser must be before the console asks the daemon about it.

A turn id is a positive integer below 2**63 (the daemon's keys, `supervisor.wire.control.
MAX_TURN_ID`: a larger one cannot even be written into a control request); a page's ``after``
cursor is 0 or a turn id; a session id has the one form the daemon gives them
(`sandbox.session_ids`: ``SES-<UTC time>-<16 hex>``); an executor cursor has an executor id's
form (`supervisor.wire.executor`). Anything else is refused here with `BadId`, never sent: 404
for an id in the path (there is no such thing), 400 for one in a query parameter. The grammars
are restated here (the console imports none of the daemon's modules);
``tests/console/test_console_parts.py`` checks that they agree with the daemon's. Pure.
"""

from __future__ import annotations

import re
from typing import Final

from supervisor.console.errors import BadId

__all__ = ["MAX_TURN_ID", "after_executor", "after_turn", "session_id", "turn_id"]

#: the largest turn id (a signed 64-bit key)
MAX_TURN_ID: Final = 2**63 - 1
_SESSION_ID: Final = re.compile(r"SES-\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{16}", re.ASCII)
_EXECUTOR_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}", re.ASCII)
#: how much of a refused id an error message repeats
_SHOWN: Final = 40


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


def _number(text: str) -> int | None:
    """*text* as an integer from 0 to `MAX_TURN_ID`, or None (ASCII digits only: ``"²"`` is a
    digit to `str.isdigit` and not to `int`)."""
    if not (text.isascii() and text.isdigit()) or len(text.lstrip("0")) > 19:
        return None
    value = int(text)
    return value if value <= MAX_TURN_ID else None


def turn_id(text: str, *, field: str = "turn_id", in_path: bool = True) -> int:
    """The turn id *text* (a path's ``{turn_id}``, or a parameter), checked. Paths take it as
    text, not as Starlette's ``:int``, which converts any run of digits (5,000 of them: a
    ``ValueError`` from `int`, a 500)."""
    number = _number(text)
    if number is None or number < 1:
        raise BadId(
            f"no turn {_shown(text)}: a turn id is a whole number from 1 to {MAX_TURN_ID}",
            field=field,
            in_path=in_path,
        )
    return number


def after_turn(text: str | None, *, field: str = "after") -> int:
    """A page's ``after`` turn cursor: absent or empty is 0 (from the start), else 0 or a turn
    id; anything else is a bad parameter (400)."""
    if not text:
        return 0
    number = _number(text)
    if number is None:
        raise BadId(
            f"{field}: {_shown(text)} is not a turn id (a whole number from 0 to {MAX_TURN_ID})",
            field=field,
            in_path=False,
        )
    return number


def session_id(text: str, *, field: str = "session_id", in_path: bool = True) -> str:
    """The session id *text*, checked against the form the daemon gives session ids."""
    if _SESSION_ID.fullmatch(text) is None:
        raise BadId(
            f"no session {_shown(text)}: a session id looks like"
            " SES-20260102T030405.678901Z-0123456789abcdef",
            field=field,
            in_path=in_path,
        )
    return text


def after_executor(text: str | None, *, field: str = "after") -> str:
    """A page's ``after`` executor cursor: absent or empty is "" (from the start), else an
    executor id's form; anything else is a bad parameter (400)."""
    if not text:
        return ""
    if _EXECUTOR_ID.fullmatch(text) is None:
        raise BadId(
            f"{field}: {_shown(text)} is not an executor id (letters, digits and . _ : @ -,"
            " at most 128)",
            field=field,
            in_path=False,
        )
    return text
