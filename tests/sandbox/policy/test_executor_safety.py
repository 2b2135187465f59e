"""Phase-20 validate_executor_response: the five DENIED rules and hostile input (never raises)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sandbox.policy import reason_codes as rc
from sandbox.policy.envelopes import (
    ExecutionSafetyResult,
    ExecutorInstructionEnvelope,
    ExecutorResponseEnvelope,
    ExecutorResponseType,
    ExecutorStatus,
)
from sandbox.policy.safety import (
    build_executor_instruction,
    enforce_executor_safety,
    response_to_wire,
    validate_executor_response,
)

HASH = "0123456789abcdef" * 4
INSTRUCTION = build_executor_instruction(
    instruction_id="INS-1",
    execution_id="EXE-1",
    command_type="READ",
    target_selector="#price",
    timestamp="2026-01-25T15:30:00Z",
    timeout_ms=5000,
)


def _response(**changes: object) -> dict[str, Any]:
    response: dict[str, Any] = {
        "instruction_id": "INS-1",
        "response_type": "SUCCESS",
        "evidence_hash": HASH,
        "error_message": "",
        "timestamp": "2026-01-25T15:30:01Z",
        "output": {"text": "42 EUR"},
        "partial": False,
    }
    response.update(changes)
    return response


def _denied(response: object, code: str) -> ExecutionSafetyResult:
    result = validate_executor_response(INSTRUCTION, response)
    assert (result.is_safe, result.reason_code) == (False, code), result.reason_description
    assert result.response is None
    assert not enforce_executor_safety(INSTRUCTION, response)
    return result


def test_valid_success_is_accepted() -> None:
    """A SUCCESS with evidence and the right id is allowed and becomes a frozen envelope."""
    result = validate_executor_response(INSTRUCTION, _response())
    assert (result.is_safe, result.reason_code) == (True, rc.RESPONSE_ACCEPTED)
    assert result.response is not None
    assert result.response.response_type is ExecutorResponseType.SUCCESS
    assert result.response.output == {"text": "42 EUR"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.response.evidence_hash = ""  # type: ignore[misc]
    assert enforce_executor_safety(INSTRUCTION, _response())


def test_safety_result_has_the_seed_authors_field_names() -> None:
    """ExecutionSafetyResult carries is_safe, reason_code and reason_description (seed names)."""
    names = [f.name for f in dataclasses.fields(ExecutionSafetyResult)]
    assert names[:3] == ["is_safe", "reason_code", "reason_description"]
    denied = validate_executor_response(INSTRUCTION, _response(instruction_id="INS-2"))
    assert denied.is_safe is False
    assert denied.reason_code == rc.RESPONSE_INSTRUCTION_ID_MISMATCH
    assert "INS-2" in denied.reason_description
    accepted = validate_executor_response(INSTRUCTION, _response())
    assert accepted.is_safe is True
    assert accepted.reason_code == rc.RESPONSE_ACCEPTED
    assert accepted.reason_description == "SUCCESS response accepted"


def test_safety_result_built_from_the_three_seed_fields() -> None:
    """The seed's three fields are enough to build one; the frozen result cannot change."""
    result = ExecutionSafetyResult(
        is_safe=False, reason_code=rc.RESPONSE_MALFORMED, reason_description="bad"
    )
    assert (result.is_safe, result.reason_code, result.reason_description) == (
        False,
        rc.RESPONSE_MALFORMED,
        "bad",
    )
    assert result.response is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.is_safe = True  # type: ignore[misc]


@pytest.mark.parametrize("kind", ["FAILURE", "TIMEOUT", "ERROR", "REFUSED"])
def test_other_response_types_need_no_evidence(kind: str) -> None:
    """FAILURE/TIMEOUT/ERROR/REFUSED are accepted without evidence (they claim no success)."""
    result = validate_executor_response(
        INSTRUCTION, _response(response_type=kind, evidence_hash="", error_message="no")
    )
    assert result.is_safe
    assert result.response is not None
    assert result.response.response_type.value == kind


def test_minimal_response_gets_defaults() -> None:
    """Only instruction_id and response_type are required; the rest default to empty."""
    result = validate_executor_response(
        INSTRUCTION, {"instruction_id": "INS-1", "response_type": "FAILURE"}
    )
    assert result.response == ExecutorResponseEnvelope(
        "INS-1", ExecutorResponseType.FAILURE, "", "", ""
    )


def test_null_optional_strings_are_empty() -> None:
    """JSON null in evidence_hash/error_message/timestamp counts as empty."""
    result = validate_executor_response(
        INSTRUCTION, _response(response_type="ERROR", evidence_hash=None, error_message=None)
    )
    assert result.is_safe


def test_partial_success_is_flagged() -> None:
    """partial=true is accepted with RESPONSE_ACCEPTED_PARTIAL (the hub maps it to PARTIAL)."""
    result = validate_executor_response(INSTRUCTION, _response(partial=True))
    assert (result.is_safe, result.reason_code) == (True, rc.RESPONSE_ACCEPTED_PARTIAL)
    assert "partial" in result.reason_description


def test_envelope_input_is_accepted() -> None:
    """An ExecutorResponseEnvelope is validated through its wire form."""
    envelope = ExecutorResponseEnvelope(
        "INS-1", ExecutorResponseType.SUCCESS, HASH, "", "t", output={"rows": [{"a": 1}]}
    )
    assert response_to_wire(envelope)["output"] == {"rows": [{"a": 1}]}
    result = validate_executor_response(INSTRUCTION, envelope)
    assert result.response == envelope


# ----------------------------------------------------------------- the five seed rules
@pytest.mark.parametrize("evidence", ["", None])
def test_rule_success_without_evidence_hash(evidence: object) -> None:
    """Rule 1: SUCCESS without evidence_hash is DENIED (SUCCESS_WITHOUT_EVIDENCE)."""
    _denied(_response(evidence_hash=evidence), rc.SUCCESS_WITHOUT_EVIDENCE)


def test_rule_success_with_absent_evidence_key() -> None:
    """Rule 1: a SUCCESS with no evidence_hash key at all is DENIED the same way."""
    response = _response()
    del response["evidence_hash"]
    _denied(response, rc.SUCCESS_WITHOUT_EVIDENCE)


@pytest.mark.parametrize(
    "evidence", ["abc", HASH.upper(), HASH + "0", HASH[:-1] + "g", " " + HASH[1:], "sha256:" + HASH]
)
def test_evidence_hash_must_be_64_lowercase_hex(evidence: str) -> None:
    """A present evidence_hash that is not 64 lowercase hex digits is DENIED."""
    _denied(_response(evidence_hash=evidence), rc.RESPONSE_EVIDENCE_HASH_INVALID)


@pytest.mark.parametrize("value", [None, "", "absent"])
def test_rule_missing_instruction_id(value: object) -> None:
    """Rule 2: a missing (absent, null or empty) instruction_id is DENIED."""
    response = _response(instruction_id=value)
    if value == "absent":
        del response["instruction_id"]
    _denied(response, rc.RESPONSE_MISSING_INSTRUCTION_ID)


@pytest.mark.parametrize("value", ["INS-2", "ins-1", "INS-1 ", "INS-10"])
def test_rule_instruction_id_mismatch(value: str) -> None:
    """Rule 3: an instruction_id that is not the instruction's is DENIED."""
    _denied(_response(instruction_id=value), rc.RESPONSE_INSTRUCTION_ID_MISMATCH)


@pytest.mark.parametrize("value", ["success", "OK", "PARTIAL", "", "SUCCESS "])
def test_rule_unknown_response_type(value: str) -> None:
    """Rule 4: a response_type that is not a member name is DENIED."""
    _denied(_response(response_type=value), rc.RESPONSE_TYPE_UNKNOWN)


def test_rule_missing_response_type() -> None:
    """Rule 4: an absent or null response_type is DENIED as unknown."""
    response = _response()
    del response["response_type"]
    _denied(response, rc.RESPONSE_TYPE_UNKNOWN)
    _denied(_response(response_type=None), rc.RESPONSE_TYPE_UNKNOWN)


@pytest.mark.parametrize(
    "extra",
    [
        {"decision": "RETRY"},
        {"sandbox_decision": "ESCALATE"},
        {"retry_policy": "RETRY_LIMITED"},
        {"capabilities": ["write:/"]},
        {"max_retries": 100},
        {"attempt_number": 1},
        {"escalate": True},
        {"authority": "root"},
        {"grant": "network"},
        {"instruction_results": {"INS-2": "SUCCESS"}},
        {"result_for": "INS-2"},
        {"maxRetries": 9},
        {"Retry-Policy": "x"},
        {"DECISION": "TERMINATE"},
        {" verdict ": "SUCCEED"},
    ],
)
def test_rule_claims_authority_at_top_level(extra: dict[str, object]) -> None:
    """Rule 5: a top-level field that tries to set supervisor state is DENIED (authority)."""
    _denied(_response(**extra), rc.RESPONSE_CLAIMS_AUTHORITY)


@pytest.mark.parametrize(
    "output",
    [
        {"decision": "RETRY"},
        {"data": {"nested": {"retry_policy": "RETRY_LIMITED"}}},
        {"rows": [{"a": 1}, {"capabilities": ["*"]}]},
        {"deep": [[[{"max_retries": 50}]]]},
        {"instruction_id": "INS-2", "text": "their result"},
        {"results": [{"execution_id": "EXE-9", "status": "SUCCESS"}]},
        {"escalation": None},
    ],
)
def test_rule_claims_authority_nested_in_output(output: dict[str, object]) -> None:
    """Rule 5: authority keys or another instruction's result nested in output are DENIED."""
    _denied(_response(output=output), rc.RESPONSE_CLAIMS_AUTHORITY)


def test_own_ids_nested_in_output_are_not_a_claim() -> None:
    """Echoing this instruction's own ids inside output is not an authority claim."""
    output = {"instruction_id": "INS-1", "meta": {"execution_id": "EXE-1"}}
    assert validate_executor_response(INSTRUCTION, _response(output=output)).is_safe


def test_authority_claim_is_checked_before_every_other_rule() -> None:
    """A lying response is always flagged as authority, even if it breaks other rules too."""
    response = {"instruction_id": "INS-999", "response_type": "BOGUS", "decision": "RETRY"}
    _denied(response, rc.RESPONSE_CLAIMS_AUTHORITY)
    _denied({"response_type": "SUCCESS", "grant": "all", "extra": 1}, rc.RESPONSE_CLAIMS_AUTHORITY)


def test_values_are_data_not_claims() -> None:
    """Words like RETRY inside output values are data, not claims."""
    output = {"text": "decision: RETRY with max_retries 100", "list": ["ESCALATE"]}
    assert validate_executor_response(INSTRUCTION, _response(output=output)).is_safe


# ----------------------------------------------------------------- malformed responses
@pytest.mark.parametrize("response", [None, "SUCCESS", 42, 1.5, ["INS-1"], b"{}", True])
def test_non_object_response_is_malformed(response: object) -> None:
    """A response that is not a JSON object is DENIED as RESPONSE_MALFORMED."""
    _denied(response, rc.RESPONSE_MALFORMED)


def test_unknown_top_level_field_is_denied() -> None:
    """A top-level field outside the allow-list is DENIED as RESPONSE_UNKNOWN_FIELD."""
    result = _denied(_response(duration_ms=5, note="x"), rc.RESPONSE_UNKNOWN_FIELD)
    assert result.reason_description == "unknown field(s): duration_ms, note"


@pytest.mark.parametrize(
    "changes",
    [
        {"instruction_id": 1},
        {"instruction_id": ["INS-1"]},
        {"response_type": 1},
        {"response_type": ["SUCCESS"]},
        {"evidence_hash": 5},
        {"error_message": {"x": 1}},
        {"timestamp": 1700000000},
        {"output": "text"},
        {"output": ["a"]},
        {"partial": "false"},
        {"partial": 0},
    ],
)
def test_wrong_field_types_are_malformed(changes: dict[str, object]) -> None:
    """A known field with the wrong type is DENIED as RESPONSE_FIELD_TYPE_INVALID."""
    _denied(_response(**changes), rc.RESPONSE_FIELD_TYPE_INVALID)


@pytest.mark.parametrize(
    "output",
    [{1: "int key"}, {"k": {None: 1}}, {"k": object()}, {"k": {1, 2}}, {"k": b"bytes"}],
)
def test_non_json_values_are_malformed(output: dict[object, object]) -> None:
    """Non-string keys and values JSON cannot carry are DENIED as RESPONSE_MALFORMED."""
    _denied(_response(output=output), rc.RESPONSE_MALFORMED)


def test_deep_nesting_is_denied_without_recursion() -> None:
    """A response nested 100 000 levels deep is DENIED (too large), not a RecursionError."""
    deep: object = "x"
    for _ in range(100_000):
        deep = {"k": deep}
    _denied(_response(output=deep), rc.RESPONSE_TOO_LARGE)
    deep_list: object = []
    for _ in range(100_000):
        deep_list = [deep_list]
    _denied(_response(output={"k": deep_list}), rc.RESPONSE_TOO_LARGE)


def test_huge_responses_are_denied() -> None:
    """Too many values or a giant string are DENIED as RESPONSE_TOO_LARGE."""
    _denied(_response(output={"rows": list(range(20_000))}), rc.RESPONSE_TOO_LARGE)
    _denied(_response(error_message="e" * 2_000_000), rc.RESPONSE_TOO_LARGE)


def test_deeply_buried_authority_is_still_denied() -> None:
    """An authority key hidden below the depth bound is still DENIED (as too large)."""
    deep: object = {"decision": "RETRY"}
    for _ in range(40):
        deep = {"k": deep}
    result = validate_executor_response(INSTRUCTION, _response(output=deep))
    assert not result.is_safe


class HostileMapping(dict[str, object]):
    """A mapping whose items() raises, as a hostile in-process caller might pass."""

    def items(self) -> Any:
        raise RuntimeError("boom")


def test_hostile_mapping_is_denied_not_raised() -> None:
    """An object that raises while being inspected is RESPONSE_MALFORMED, never an exception."""
    result = _denied(HostileMapping(instruction_id="INS-1"), rc.RESPONSE_MALFORMED)
    assert result.reason_description == "response could not be inspected: RuntimeError"


@pytest.mark.parametrize("instruction", [None, {"instruction_id": "INS-1"}, "INS-1"])
def test_instruction_must_be_an_envelope(instruction: object) -> None:
    """A caller passing no real instruction envelope gets INSTRUCTION_INVALID, not an exception."""
    result = validate_executor_response(instruction, _response())
    assert (result.is_safe, result.reason_code) == (False, rc.INSTRUCTION_INVALID)


def test_mutating_the_input_after_validation_changes_nothing() -> None:
    """The accepted envelope is a deep copy: later changes to the dict do not leak in."""
    response = _response(output={"rows": [{"a": 1}]})
    result = validate_executor_response(INSTRUCTION, response)
    response["output"]["rows"][0]["a"] = 2
    assert result.response is not None
    assert result.response.output["rows"][0]["a"] == 1  # type: ignore[index]


def test_enums_and_records() -> None:
    """The closed enums carry their names as values; the envelopes are frozen slotted classes."""
    assert [s.value for s in ExecutorStatus] == ["READY", "BUSY", "OFFLINE", "ERROR"]
    for cls in (ExecutorInstructionEnvelope, ExecutorResponseEnvelope, ExecutionSafetyResult):
        assert getattr(cls, "__dataclass_params__").frozen  # noqa: B009  # dunder not typed
        assert hasattr(cls, "__slots__")
