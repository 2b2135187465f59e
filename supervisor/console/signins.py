"""Who is signed in: opaque tokens held in memory, each with its operator, its CSRF token and an
expiry; and the limit on failed sign-ins.

A token is 32 random bytes (``secrets``), sent to the browser in an ``HttpOnly``, ``SameSite=
Strict`` cookie and never anywhere else; the server keeps only its sha256, so a memory dump
shows no usable cookie. A restart of the console signs everyone out. Pure bookkeeping: times
come in as arguments (monotonic seconds), nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from supervisor.console.operators import Role

__all__ = ["SignIn", "SignInLimit", "SignIns"]

#: a sign-in lasts this long after its last request (an on-call shift's quiet hour)
IDLE_S: Final = 3600.0
#: and never longer than this after it began
ABSOLUTE_S: Final = 12 * 3600.0
#: sign-ins held at most (the oldest is dropped first): a flood of sign-ins cannot grow memory
MAX_SIGNINS: Final = 10_000


@dataclass(slots=True)
class SignIn:
    operator: str
    role: Role
    csrf: str
    began: float
    seen: float
    #: signed in by a proxy's user header (no password, no sign-out page)
    by_proxy: bool = False

    def csrf_ok(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.csrf.encode())


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(slots=True)
class SignIns:
    """The signed-in browsers, by the digest of their cookie's token."""

    idle_s: float = IDLE_S
    absolute_s: float = ABSOLUTE_S
    _by_digest: dict[str, SignIn] = field(default_factory=dict)

    def begin(
        self, operator: str, role: Role, now: float, *, by_proxy: bool = False
    ) -> tuple[str, SignIn]:
        """A new sign-in: the cookie's token (to send once) and the sign-in."""
        while len(self._by_digest) >= MAX_SIGNINS:
            self._by_digest.pop(next(iter(self._by_digest)))
        token = secrets.token_urlsafe(32)
        signin = SignIn(operator, role, secrets.token_urlsafe(32), now, now, by_proxy)
        self._by_digest[_digest(token)] = signin
        return token, signin

    def find(self, token: str | None, now: float) -> SignIn | None:
        """The live sign-in of *token* (its idle clock restarted), or None."""
        if not token or len(token) > 128:
            return None
        key = _digest(token)
        signin = self._by_digest.get(key)
        if signin is None:
            return None
        if now - signin.seen > self.idle_s or now - signin.began > self.absolute_s:
            del self._by_digest[key]
            return None
        signin.seen = now
        return signin

    def end(self, token: str | None) -> None:
        if token:
            self._by_digest.pop(_digest(token), None)

    def __len__(self) -> int:
        return len(self._by_digest)


@dataclass(slots=True)
class SignInLimit:
    """Failed sign-ins allowed per client address and per operator name in a sliding window:
    past the limit, sign-ins from there (or as that name) are refused until the window moves
    on, whatever the password (a guesser learns nothing)."""

    failures: int = 5
    window_s: float = 60.0
    _seen: dict[str, deque[float]] = field(default_factory=dict)

    def retry_after(self, keys: tuple[str, ...], now: float) -> float:
        """Seconds until a sign-in for *keys* may be tried again; 0: now."""
        wait = 0.0
        for key in keys:
            times = self._trim(key, now)
            if times is not None and len(times) >= self.failures:
                wait = max(wait, times[0] + self.window_s - now)
        return wait

    def failed(self, keys: tuple[str, ...], now: float) -> None:
        if len(self._seen) > MAX_SIGNINS:  # a spray of names: forget the quiet ones
            for key in [k for k, t in self._seen.items() if not t or t[-1] < now - self.window_s]:
                del self._seen[key]
        for key in keys:
            self._seen.setdefault(key, deque(maxlen=self.failures)).append(now)

    def _trim(self, key: str, now: float) -> deque[float] | None:
        times = self._seen.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._seen[key]
            return None
        return times
