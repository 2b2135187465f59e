"""Quarantine after a security breach (``supervisor.executors.quarantine``): the deadline
bookkeeping by executor id and by peer.

The end-to-end case (an authority claim, then refused reconnects) is in test_hub.py (named
there by ``docs/requirements-coverage.md``)."""

from __future__ import annotations

from supervisor.executors.clock import now_us
from supervisor.executors.peercred import PeerCredentials
from supervisor.executors.quarantine import Quarantine

# --------------------------------------------------------------------------- bookkeeping


def test_quarantine_holds_the_id_and_the_peer() -> None:
    """A quarantine refuses the executor id, and the same process under any other id."""
    quarantine = Quarantine()
    creds = PeerCredentials(pid=10, uid=1000, gid=1000)
    assert quarantine.remaining_s("ex-1", creds) <= 0
    assert quarantine.until_us("ex-1") is None
    quarantine.impose("ex-1", creds, 60.0)
    assert 59.0 < quarantine.remaining_s("ex-1", None) <= 60.0
    assert 59.0 < quarantine.remaining_s("other-id", creds) <= 60.0
    assert quarantine.remaining_s("other-id", PeerCredentials(pid=11, uid=1000, gid=1000)) <= 0
    until = quarantine.until_us("ex-1")
    assert until is not None
    assert 59_000_000 < until - now_us() <= 60_000_000
    assert (quarantine.active(), quarantine.imposed) == (1, 1)


def test_an_expired_quarantine_lets_the_executor_in() -> None:
    """Once ``quarantine_s`` has passed the executor is let in; the count of quarantines stays."""
    quarantine = Quarantine()
    quarantine.impose("ex-1", None, 0.0)
    assert quarantine.remaining_s("ex-1", None) <= 0
    assert quarantine.until_us("ex-1") is None
    quarantine.impose("ex-2", None, 60.0)  # prunes the expired entry
    assert (quarantine.active(), quarantine.imposed) == (1, 2)
