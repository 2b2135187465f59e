"""Ledger anchoring of a fleet daemon (`supervisor.turns.anchors`) with a real session's ledger
files and the real PostgreSQL store: lines an ending committed are not read back and sent
again, while a line the runtime wrote itself is still found and anchored."""

from __future__ import annotations

import os

import pytest

from ledger.chain import content_hash
from sandbox.errors import CapabilityViolation
from sandbox.runtime.session import Session
from supervisor.store.postgres import open_postgres_store
from supervisor.store.protocol import NewSession
from supervisor.turns.anchors import LedgerAnchors
from tests.supervisor.store.conformance import LEASE_MS


@pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox session needs root")
async def test_committed_lines_are_not_read_again_and_the_runtimes_own_still_are(
    session: Session, pg_dsn: str
) -> None:
    _, evidence_id = session.ledger_ids
    async with open_postgres_store(pg_dsn) as store:
        await store.open_session(NewSession(session_id=session.session_id, package_id="pkg"))
        await store.home_session(session.session_id, "A", lease_ms=LEASE_MS)
        anchors = LedgerAnchors(store, "A")
        assert await anchors.anchor(session) == 2  # the session_opened pair
        for turn in (1, 2, 3):
            lines = session.ledgers.seal_turn(
                turn_number=turn,
                query_hash=content_hash({"n": turn}),
                result_hash=content_hash({}),
                status="succeeded",
            )
            await store.anchor_ledger_lines("A", lines)  # as TurnStore.finish commits them
            anchors.noted(lines)
            session.flush_ledgers(lines)  # ... then they reach the files
        # Before, the next process turn's ending read these six lines back and sent them again.
        assert (await anchors.pending(session)).lines == ()

        # A violation the runtime records itself (not in any ending) is in the next tail, and
        # the offset of its ledger stops before it; the exec ledger's moves on.
        with pytest.raises(CapabilityViolation):
            session.check_turn_request(["/usr/bin/env"], [], turn_number=4)
        lines = session.ledgers.seal_turn(
            turn_number=5,
            query_hash=content_hash({}),
            result_hash=content_hash({}),
            status="succeeded",
        )
        await store.anchor_ledger_lines("A", lines)
        anchors.noted(lines)
        session.flush_ledgers(lines)
        tail = await anchors.pending(session)
        assert [(x.ledger_id, x.seq) for x in tail.lines] == [(evidence_id, 5), (evidence_id, 6)]
        assert await anchors.anchor(session) == 2
        assert (await anchors.pending(session)).lines == ()

        # A daemon that adopts the session starts from the files' ends, and moves on the same way.
        adopter = LedgerAnchors(store, "A")
        adopter.adopted(session)
        lines = session.ledgers.seal_turn(
            turn_number=6,
            query_hash=content_hash({}),
            result_hash=content_hash({}),
            status="succeeded",
        )
        await store.anchor_ledger_lines("A", lines)
        adopter.noted(lines)
        session.flush_ledgers(lines)
        assert (await adopter.pending(session)).lines == ()
