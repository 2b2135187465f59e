"""Session ids: ``SES-<UTC timestamp>-<random>`` (FR-RT-004).

The timestamp has microseconds and a fixed width, so ids sort by creation time; the random
part is 64 bits from the OS CSPRNG (``secrets``), so concurrent sessions in any number of
processes do not collide (birthday bound ~2^32 ids per microsecond).
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from typing import Final

__all__ = ["SESSION_ID_RE", "is_session_id", "new_session_id"]

#: The full grammar of a session id.
SESSION_ID_RE: Final = re.compile(r"^SES-\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{16}$")


def new_session_id(*, now: datetime | None = None) -> str:
    """Return a fresh ``SES-YYYYmmddTHHMMSS.ffffffZ-<16 hex>`` id."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return f"SES-{moment:%Y%m%dT%H%M%S.%f}Z-{secrets.token_hex(8)}"


def is_session_id(value: str) -> bool:
    """Whether *value* is a well-formed session id (safe to use as a directory name)."""
    return SESSION_ID_RE.fullmatch(value) is not None
