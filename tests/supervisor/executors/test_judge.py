"""Judging responses (``supervisor.executors.judge``): end to end through real executors, and
the pure mapping of a response body (or its absence) to a verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempts import OutcomeKind
from sandbox.policy.envelopes import ExecutorInstructionEnvelope, ExecutorStatus
from sandbox.policy.faults import ExecutionFaultType
from supervisor.executors.hub import HubReason
from supervisor.executors.judge import (
    bad_frame,
    deadline_exceeded,
    disconnected,
    hub_closed,
    judge_response,
    protocol_breach,
    queue_wait_expired,
    unattributable,
)
from supervisor.sdk import sha256_hex
from tests.supervisor.executors.harness import fault_type_of, instruction, running_hub


async def test_failure_answer_is_a_failure_outcome(socket_dir: Path) -> None:
    """FAILURE maps to a failure outcome (no exit code) with the executor's message."""
    async with running_hub(socket_dir) as h:
        await h.spawn("fail-1", "failure")
        report = await h.hub.run_attempt(instruction())
    assert report.outcome.kind is OutcomeKind.FAILURE
    assert report.outcome.exit_code is None
    assert report.outcome.message.startswith("chaos failure of ins-")


@pytest.mark.parametrize(
    ("behaviour", "code"),
    [
        ("wrong-id", rc.RESPONSE_INSTRUCTION_ID_MISMATCH),
        ("missing-id", rc.RESPONSE_MISSING_INSTRUCTION_ID),
        ("no-evidence", rc.SUCCESS_WITHOUT_EVIDENCE),
        ("unknown-type", rc.RESPONSE_TYPE_UNKNOWN),
        ("malformed", rc.RESPONSE_UNKNOWN_FIELD),
    ],
)
async def test_invalid_responses_are_invalid_response(
    socket_dir: Path, behaviour: str, code: str
) -> None:
    """Wrong/missing id, SUCCESS without evidence, unknown type → INVALID_RESPONSE."""
    async with running_hub(socket_dir) as h:
        await h.spawn(f"{behaviour}-1", behaviour)
        env = instruction()
        report = await h.hub.run_attempt(env)
        rejected = h.log.find("response_rejected", instruction_id=env.instruction_id)
        info = h.hub.executor(f"{behaviour}-1")
    assert fault_type_of(report) is ExecutionFaultType.INVALID_RESPONSE
    assert report.safety_reason_code == code
    assert report.response is None
    assert rejected[0]["reason_code"] == code
    assert info is not None
    assert info.status is ExecutorStatus.READY  # lying once is not a security matter


async def test_partial_output_is_partial(socket_dir: Path) -> None:
    """SUCCESS with partial=true → PARTIAL fault, response kept for the evidence."""
    async with running_hub(socket_dir) as h:
        await h.spawn("partial-1", "partial")
        report = await h.hub.run_attempt(instruction())
    assert fault_type_of(report) is ExecutionFaultType.PARTIAL
    assert report.safety_reason_code == rc.RESPONSE_ACCEPTED_PARTIAL
    assert report.response is not None
    assert report.response.partial


async def test_refused_is_a_refused_outcome(socket_dir: Path) -> None:
    """REFUSED → the refused outcome (the policy terminates without retry)."""
    async with running_hub(socket_dir) as h:
        await h.spawn("no-1", "refuse")
        report = await h.hub.run_attempt(instruction())
    assert report.outcome.kind is OutcomeKind.REFUSED
    assert report.outcome.message.startswith("chaos refuses ins-")


async def test_executor_timeout_answer_is_timeout(socket_dir: Path) -> None:
    """An executor answering TIMEOUT itself (here: to a cancel) is a TIMEOUT outcome."""
    async with running_hub(socket_dir) as h:
        await h.spawn("t-1", "hang")
        report = await h.hub.run_attempt(instruction(timeout_ms=100))
    assert fault_type_of(report) is ExecutionFaultType.TIMEOUT


# --------------------------------------------------------------------------- pure verdicts


def _body(envelope: ExecutorInstructionEnvelope, **changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "instruction_id": envelope.instruction_id,
        "response_type": "SUCCESS",
        "evidence_hash": sha256_hex("evidence"),
        "error_message": "",
        "timestamp": "2026-01-01T00:00:00Z",
        "output": {},
        "partial": False,
    }
    body.update(changes)
    return body


def test_accepted_success_is_a_success_verdict() -> None:
    """An answer the safety rules allow carries the response and the Phase-20 code."""
    env = instruction()
    verdict = judge_response(env, _body(env))
    assert verdict.accepted
    assert verdict.outcome.kind is OutcomeKind.SUCCESS
    assert verdict.reason_code == rc.RESPONSE_ACCEPTED
    assert verdict.response is not None
    assert verdict.response.instruction_id == env.instruction_id
    assert not verdict.breaches_security


def test_authority_claim_breaches_security() -> None:
    """An answer that tries to decide the retry is denied as a security violation."""
    env = instruction()
    verdict = judge_response(env, _body(env, decision="RETRY"))
    assert not verdict.accepted
    assert verdict.outcome.fault_type is ExecutionFaultType.SECURITY_VIOLATION
    assert verdict.reason_code == rc.RESPONSE_CLAIMS_AUTHORITY
    assert verdict.response is None
    assert verdict.breaches_security


@pytest.mark.parametrize("body", [None, "garbage", 42, ["a", "list"]])
def test_garbage_is_an_invalid_response(body: object) -> None:
    """Anything but a JSON object is INVALID_RESPONSE (RESPONSE_MALFORMED), never an exception."""
    verdict = judge_response(instruction(), body)
    assert verdict.outcome.fault_type is ExecutionFaultType.INVALID_RESPONSE
    assert verdict.reason_code == rc.RESPONSE_MALFORMED
    assert not verdict.accepted
    assert not verdict.breaches_security


def test_verdicts_the_hub_decides_itself() -> None:
    """No answer, a lost executor, a bad frame...: each verdict has its fault and HubReason."""
    cases = [
        (
            deadline_exceeded(250),
            ExecutionFaultType.TIMEOUT,
            HubReason.DEADLINE_EXCEEDED,
            "no response within timeout_ms=250",
        ),
        (
            disconnected("ex-1", HubReason.HEARTBEAT_LOST, "silent"),
            ExecutionFaultType.CRASH,
            HubReason.HEARTBEAT_LOST,
            "executor ex-1 disconnected mid-instruction: silent",
        ),
        (
            bad_frame("frame of 9 bytes exceeds the 4-byte limit"),
            ExecutionFaultType.INVALID_RESPONSE,
            HubReason.FRAME_ERROR,
            "bad frame instead of a response: frame of 9 bytes exceeds the 4-byte limit",
        ),
        (
            protocol_breach("unknown message type"),
            ExecutionFaultType.INVALID_RESPONSE,
            HubReason.PROTOCOL_ERROR,
            "unknown message type",
        ),
        (
            unattributable("x" * 200, 3),
            ExecutionFaultType.INVALID_RESPONSE,
            HubReason.UNATTRIBUTABLE_RESPONSE,
            f"response names instruction {'x' * 128!r}, which is not one of the 3 in flight "
            "on this executor",
        ),
        (
            queue_wait_expired("no slot"),
            ExecutionFaultType.TIMEOUT,
            HubReason.QUEUE_WAIT_EXPIRED,
            "no slot",
        ),
        (
            hub_closed(),
            ExecutionFaultType.CRASH,
            HubReason.HUB_CLOSED,
            "the executor hub closed before the instruction was sent",
        ),
    ]
    for verdict, fault, reason, detail in cases:
        assert (verdict.outcome.fault_type, verdict.reason_code, verdict.detail) == (
            fault,
            reason,
            detail,
        )
        assert verdict.outcome.message == detail
        assert verdict.response is None
        assert not verdict.accepted
