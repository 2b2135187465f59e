"""Evidence bytes beside a response (``docs/protocol.md`` 3.5): the judge accepts exactly the
bytes whose sha256 is the response's ``evidence_hash``; anything else is INVALID_RESPONSE."""

from __future__ import annotations

import base64
import re

import pytest

from sandbox.policy.attempts import OutcomeKind
from sandbox.policy.envelopes import ExecutorInstructionEnvelope
from sandbox.policy.faults import ExecutionFaultType
from supervisor.executors.judge import EVIDENCE_INVALID, judge_response
from supervisor.sdk import Result, sha256_hex
from supervisor.wire.executor import MAX_EVIDENCE_BYTES
from tests.supervisor.executors.harness import instruction

PAGE = b"<h1>Welcome</h1>"


def _body(envelope: ExecutorInstructionEnvelope, **changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "instruction_id": envelope.instruction_id,
        "response_type": "SUCCESS",
        "evidence_hash": sha256_hex(PAGE),
        "error_message": "",
        "timestamp": "2026-01-01T00:00:00Z",
        "output": {},
        "partial": False,
    }
    body.update(changes)
    return body


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_matching_evidence_rides_on_the_verdict() -> None:
    """Bytes that hash to evidence_hash are accepted and handed on for storage."""
    env = instruction()
    verdict = judge_response(env, _body(env), b64(PAGE))
    assert verdict.accepted
    assert verdict.outcome.kind is OutcomeKind.SUCCESS
    assert verdict.evidence == PAGE


def test_no_evidence_is_still_a_success() -> None:
    """Sending the bytes is optional: the hash alone is a SUCCESS without stored evidence."""
    env = instruction()
    verdict = judge_response(env, _body(env))
    assert (verdict.accepted, verdict.evidence) == (True, None)


@pytest.mark.parametrize(
    ("evidence", "changes", "problem"),
    [
        (b64(b"forged"), {}, r"^evidence sha256 [0-9a-f]{64} does not match [0-9a-f]{64}$"),
        ("not base64!", {}, r"^evidence is not valid base64"),
        ("QUJD\nRA==", {}, r"^evidence is not valid base64"),
        (123, {}, r"^evidence must be a base64 string, got int$"),
        (b64(b"x" * (MAX_EVIDENCE_BYTES + 1)), {}, rf"^evidence larger than {MAX_EVIDENCE_BYTES}"),
        (
            b64(PAGE),
            {"response_type": "FAILURE", "evidence_hash": "", "error_message": "no"},
            r"does not match no evidence_hash$",
        ),
    ],
)
def test_bad_evidence_is_an_invalid_response(
    evidence: object, changes: dict[str, object], problem: str
) -> None:
    """Bytes that are not base64, too large, of the wrong type or not what the hash says make
    the attempt an INVALID_RESPONSE fault; nothing is accepted."""
    env = instruction()
    verdict = judge_response(env, _body(env, **changes), evidence)
    assert not verdict.accepted
    assert verdict.outcome.fault_type is ExecutionFaultType.INVALID_RESPONSE
    assert verdict.reason_code == EVIDENCE_INVALID
    assert verdict.evidence is None
    assert verdict.response is None
    assert re.search(problem, verdict.detail), verdict.detail


def test_evidence_does_not_rescue_a_denied_response() -> None:
    """A response the safety rules deny stays denied for its own reason, evidence or not."""
    env = instruction()
    verdict = judge_response(env, _body(env, evidence_hash=""), b64(PAGE))
    assert not verdict.accepted
    assert verdict.reason_code != EVIDENCE_INVALID


def test_sdk_attaches_evidence_within_the_bound() -> None:
    """``Result.success`` sends only the hash unless asked to attach the bytes; attached bytes
    over the bound are refused with a message saying how to send the hash only."""
    assert Result.success("text", attach_evidence=True).evidence == b"text"
    assert Result.success(PAGE).evidence is None
    big = b"x" * (MAX_EVIDENCE_BYTES + 1)
    with pytest.raises(ValueError, match=r"^evidence of \d+ bytes exceeds MAX_EVIDENCE_BYTES"):
        Result.success(big, attach_evidence=True)
    assert Result.success(big, attach_evidence=False).evidence_hash == sha256_hex(big)
