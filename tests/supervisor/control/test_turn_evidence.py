"""``turn.evidence``: the evidence bytes an executor sent, read back through the control
socket a slice at a time (what the console's download uses, with no access to the daemon's
files), against a real daemon and a real executor."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.control.client import ControlClient, ControlClientError
from supervisor.sdk import Executor, Instruction, Result
from tests.live_daemon import WAIT_S, demo_root, serving

#: near the SDK's evidence limit (512 KiB, one default slice), read in slices of 150,000
_BIG = bytes(range(256)) * 1600
_SLICE = 150_000


class Evidence(Executor):
    def __init__(self) -> None:
        super().__init__(executor_id="evidence")

    async def read(self, instruction: Instruction) -> Result:
        if instruction.target_selector == "#hash-only":
            return Result.success(b"kept by the executor")
        return Result.success(_BIG, attach_evidence=True)


@pytest.fixture
def root() -> Iterator[Path]:
    yield from demo_root("hh-evidence-")


async def _submit(client: ControlClient, sid: str, selector: str) -> dict[str, object]:
    answer = await client.call(
        "turn.submit",
        session_id=sid,
        kind="instruction",
        command_type="READ",
        target_selector=selector,
        declared_outputs=[],
        wait_s=WAIT_S,
    )
    turn: dict[str, object] = answer["turn"]
    assert turn["state"] == "succeeded", turn
    return turn


async def test_evidence_comes_back_in_slices_and_matches_its_hash(root: Path) -> None:
    async with serving(root, Evidence()) as (client, sid):
        turn = await _submit(client, sid, "#page")
        got = bytearray()
        answers = []
        while True:
            answer = await client.call(
                "turn.evidence", turn_id=turn["turn_id"], offset=len(got), length=_SLICE
            )
            answers.append(answer)
            got.extend(base64.b64decode(answer["data"]))
            if not answer["more"]:
                break
        # a slice from the middle, as asked
        middle = await client.call("turn.evidence", turn_id=turn["turn_id"], offset=1000, length=16)
    assert bytes(got) == _BIG
    assert len(answers) == 3
    assert answers[0]["size"] == len(_BIG)
    assert answers[0]["sha256"] == hashlib.sha256(_BIG).hexdigest()
    assert base64.b64decode(middle["data"]) == _BIG[1000:1016]
    assert middle["more"] is True


async def test_a_turn_without_stored_bytes_says_so(root: Path) -> None:
    async with serving(root, Evidence()) as (client, sid):
        turn = await _submit(client, sid, "#hash-only")
        with pytest.raises(ControlClientError) as refused:
            await client.call("turn.evidence", turn_id=turn["turn_id"])
        with pytest.raises(ControlClientError) as unknown:
            await client.call("turn.evidence", turn_id=999_999)
    assert refused.value.code == "no_evidence"
    assert "only a hash" in refused.value.message
    assert refused.value.details["turn_id"] == turn["turn_id"]
    assert unknown.value.code == "unknown_turn"
