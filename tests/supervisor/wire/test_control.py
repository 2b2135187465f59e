"""Tests of supervisor.wire.control: one-step decoding of control requests and its errors."""

from __future__ import annotations

import json

import msgspec
import pytest

from sandbox.policy.declarations import DeclaredOutput
from sandbox.policy.envelopes import ExecutorStatus
from sandbox.policy.lifecycle import TurnKind, TurnState
from supervisor.control.server import ERROR_CODES
from supervisor.turns.requests import turn_request
from supervisor.wire.control import (
    EVIDENCE_CHUNK_MAX,
    OPERATIONS,
    EscalationsResolve,
    EventsSubscribe,
    ExecutorsWait,
    Ping,
    RequestDecodeError,
    SessionOpen,
    TurnEvidence,
    TurnGet,
    TurnSubmit,
    TurnWait,
    convert_request,
    decode_request,
    op_of,
)
from supervisor.wire.frames import FrameDecodeError
from supervisor.wire.turn_spec import ProcessSpec


def _body(**frame: object) -> bytes:
    return json.dumps(frame).encode()


def _error(body: bytes) -> RequestDecodeError:
    with pytest.raises(RequestDecodeError) as info:
        decode_request(body)
    assert info.value.code in ERROR_CODES
    return info.value


def test_every_operation_decodes() -> None:
    """Each operation decodes to its own Struct; params default when optional."""
    assert op_of(decode_request(_body(op="ping"))) == "ping"
    assert isinstance(decode_request(_body(id=7, op="ping", params={})), Ping)
    assert len(OPERATIONS) == 20
    assert (
        op_of(decode_request(_body(op="session.get", params={"session_id": "S"}))) == "session.get"
    )
    evidence = decode_request(_body(op="turn.evidence", params={"turn_id": "7", "offset": 5}))
    assert isinstance(evidence, TurnEvidence)
    assert (evidence.params.id, evidence.params.offset) == (7, 5)
    assert evidence.params.length == EVIDENCE_CHUNK_MAX
    too_much = {"turn_id": 7, "length": EVIDENCE_CHUNK_MAX + 1}
    assert _error(_body(op="turn.evidence", params=too_much)).code == "bad_request"
    subscribe = decode_request(
        _body(id=3, op="events.subscribe", params={"turns": [4, 5], "kinds": ["turn.ended"]})
    )
    assert isinstance(subscribe, EventsSubscribe)
    assert subscribe.params.turns == frozenset({4, 5})
    assert subscribe.params.sessions is None
    assert op_of(decode_request(_body(op="events.subscribe"))) == "events.subscribe"
    assert _error(_body(op="events.unsubscribe")).code == "bad_request"  # names no subscription
    for op in ("session.list", "status", "executors.list", "escalations.list", "drain"):
        assert op_of(decode_request(_body(op=op))) == op
    for op in ("turns.list", "ledger.verify"):
        request = decode_request(_body(op=op, params={"session_id": "SES-1"}))
        assert request.params.session_id == "SES-1"  # type: ignore[union-attr]


def test_requests_are_typed_and_frozen() -> None:
    """Decoded values carry their types (ints, enums, frozensets) and cannot be changed."""
    request = decode_request(
        _body(id="a", op="turn.wait", params={"turn_id": "42", "until": ["running"]})
    )
    assert isinstance(request, TurnWait)
    assert request.id == "a"
    assert request.params.id == 42
    assert request.params.until == frozenset({TurnState.RUNNING})
    assert request.params.timeout_s is None
    with pytest.raises(AttributeError):
        request.id = "b"  # type: ignore[misc]
    wait = decode_request(_body(op="executors.wait", params={"executor_id": "web-1"}))
    assert isinstance(wait, ExecutorsWait)
    assert (wait.params.status, wait.params.timeout_s) == (ExecutorStatus.READY, 10.0)
    resolve = decode_request(
        _body(
            op="escalations.resolve",
            params={"turn_id": 3, "action": "terminate", "reason": "stuck"},
        )
    )
    assert isinstance(resolve, EscalationsResolve)
    assert (resolve.params.id, resolve.params.action) == (3, "terminate")
    assert (resolve.params.reason, resolve.params.operator) == ("stuck", None)


def test_turn_submit_params_become_one_typed_spec() -> None:
    """turn.submit keeps every field typed; the intake rules turn them into the turn's spec
    (the declared outputs with their roles, the turn core's default timeout when none)."""
    request = decode_request(
        _body(
            op="turn.submit",
            params={
                "session_id": "SES-1",
                "kind": "process",
                "argv": ["/bin/true"],
                "declared_outputs": ["a.txt", {"path": "b.txt", "role": "log"}],
                "wait_s": 2,
            },
        )
    )
    assert isinstance(request, TurnSubmit)
    assert request.params.kind is TurnKind.PROCESS
    assert request.params.wait_s == 2.0
    turn = turn_request(request.params, default_timeout_ms=4_321)
    assert turn.spec == ProcessSpec(
        timeout_ms=4_321,
        declared_outputs=(DeclaredOutput("a.txt"), DeclaredOutput("b.txt", "log")),
        argv=("/bin/true",),
    )


def test_answer_defaults_to_full_and_may_be_compact() -> None:
    """turn.submit and turn.wait take ``answer`` ("full" unless given); the turn's spec
    never holds it."""
    submit: dict[str, object] = {"session_id": "S", "kind": "process", "declared_outputs": []}
    for params, form in ((submit, "full"), ({**submit, "answer": "compact"}, "compact")):
        request = decode_request(_body(op="turn.submit", params=params))
        assert isinstance(request, TurnSubmit)
        assert request.params.answer == form
    wait_params: list[tuple[dict[str, object], str]] = [
        ({"turn_id": 1}, "full"),
        ({"turn_id": 1, "answer": "compact"}, "compact"),
    ]
    for params, form in wait_params:
        wait = decode_request(_body(op="turn.wait", params=params))
        assert isinstance(wait, TurnWait)
        assert wait.params.answer == form


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        ({"id": 1, "op": {}}, "op"),
        ({"id": 1, "op": 7}, "op"),
        ({"id": 1, "op": "turn.get", "params": []}, "params"),
        ({"id": 1, "op": "turn.get"}, "params"),
        ({"id": 1, "op": "session.close", "params": {"session_id": {}}}, "session_id"),
        ({"id": 1, "op": "session.close", "params": {"session_id": ""}}, "session_id"),
        ({"id": 1, "op": "session.open", "params": {"package_id": "x" * 300}}, "package_id"),
        ({"id": 1, "op": "session.open", "params": {"package_id": "p", "tenant": "a b"}},
         "tenant"),
        ({"id": 1, "op": "session.open", "params": {"package_id": "p", "tenant": ""}}, "tenant"),
        ({"id": 1, "op": "session.open", "params": {"package_id": "p", "tenant": "t" * 129}},
         "tenant"),
        ({"id": 1, "op": "session.open", "params": {"package_id": "p", "priority": 0}},
         "priority"),
        ({"id": 1, "op": "session.open", "params": {"package_id": "p", "priority": 11}},
         "priority"),
        ({"id": 1, "op": "session.open", "params": {"package_id": "p", "priority": "high"}},
         "priority"),
        ({"id": 1, "op": "turn.get", "params": {"turn_id": "x"}}, "turn_id"),
        ({"id": 1, "op": "turn.get", "params": {"turn_id": True}}, "turn_id"),
        ({"id": 1, "op": "turn.wait", "params": {"turn_id": 1, "timeout_s": -1}}, "timeout_s"),
        ({"id": 1, "op": "turn.wait", "params": {"turn_id": 1, "until": ["x"]}}, "until[0]"),
        ({"id": 1, "op": "escalations.resolve", "params": {"turn_id": 1, "action": 1}}, "action"),
        ({"id": 1, "op": "escalations.resolve", "params": {"turn_id": 1, "action": "retry"}},
         "reason"),
        ({"id": 1, "op": "escalations.resolve",
          "params": {"turn_id": 1, "action": "retry", "reason": ""}}, "reason"),
        ({"id": 1, "op": "escalations.resolve",
          "params": {"turn_id": 1, "action": "retry", "reason": " \n "}}, "reason"),
        ({"id": 1, "op": "escalations.resolve",
          "params": {"turn_id": 1, "action": "retry", "reason": "r", "operator": 7}}, "operator"),
        ({"id": 1, "op": "turn.cancel", "params": {"turn_id": 1, "reason": 3}}, "reason"),
        ({"id": 1, "op": "turn.cancel", "params": {"turn_id": 1, "operator": "  "}}, "operator"),
        ({"id": 1, "op": "drain", "params": {"reason": "x" * 2001}}, "reason"),
        ({"op": "turn.submit", "params": {"session_id": "S", "kind": "process"}},
         "declared_outputs"),
        ({"op": "turn.submit", "params": {"session_id": "S", "kind": "process",
          "declared_outputs": [], "wait_s": "soon"}}, "wait_s"),
        ({"op": "executors.wait", "params": {"executor_id": "e", "status": "NOPE"}}, "status"),
        ({"id": 1, "op": "turn.wait", "params": {"turn_id": 1, "answer": "tiny"}}, "answer"),
        ({"id": 1, "op": "turn.wait", "params": {"turn_id": 1, "answer": None}}, "answer"),
        ({"op": "turn.submit", "params": {"session_id": "S", "kind": "process",
          "declared_outputs": [], "answer": 3}}, "answer"),
        ({"op": "turn.submit", "params": {"session_id": "S", "kind": "process",
          "declared_outputs": [], "answer": "FULL"}}, "answer"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(frame: dict[str, object], field: str) -> None:
    """An ill-typed request is bad_request; the message starts with the field and says what
    to do; the answer carries the request's id when that was valid."""
    error = _error(json.dumps(frame).encode())
    assert error.code == "bad_request"
    assert error.field == field
    wire = error.to_wire()
    assert wire["field"] == field
    assert str(wire["message"]).startswith(f"{field}: ")
    assert error.request_id == frame.get("id")


@pytest.mark.parametrize("bad_id", [{}, [], True, 1.5])
def test_a_bad_id_is_reported_without_an_id(bad_id: object) -> None:
    error = _error(_body(id=bad_id, op="ping"))
    assert (error.code, error.field, error.request_id) == ("bad_request", "id", None)


@pytest.mark.parametrize("turn_id", [0, -1, 2**63, 2**64, "9" * 5000, "18446744073709551616"])
def test_impossible_turn_ids_are_unknown_turn(turn_id: object) -> None:
    body = json.dumps({"id": 4, "op": "turn.get", "params": {"turn_id": turn_id}}).encode()
    error = _error(body)
    assert error.code == "unknown_turn"
    assert error.message.startswith("no turn ")
    assert len(error.message) < 200
    assert error.request_id == 4


def test_a_5000_digit_json_number_is_unknown_turn() -> None:
    error = _error(b'{"id":1,"op":"turn.get","params":{"turn_id":' + b"9" * 5000 + b"}}")
    assert error.code == "unknown_turn"


def test_unknown_operation_lists_the_known_ones() -> None:
    error = _error(_body(id=3, op="turn.explode"))
    assert error.code == "unknown_op"
    assert error.details["operations"] == list(OPERATIONS)
    assert error.request_id == 3


@pytest.mark.parametrize(
    "body", [b"[]", b'"x"', b"null", b"{", b"\xff\xfe", b"1", b"{}\x845", b'{"id":1}x']
)
def test_a_body_that_is_not_an_object_is_a_frame_error(body: bytes) -> None:
    with pytest.raises(FrameDecodeError):
        decode_request(body)


def test_unknown_params_are_ignored() -> None:
    request = decode_request(_body(op="session.open", params={"package_id": "demo", "new": 1}))
    assert isinstance(request, SessionOpen)
    assert request.params.tier is None


def test_convert_request_matches_decode_request() -> None:
    frame: dict[str, object] = {"id": 9, "op": "turn.get", "params": {"turn_id": 5}}
    assert convert_request(frame) == decode_request(json.dumps(frame).encode())
    assert isinstance(convert_request(frame), TurnGet)
    with pytest.raises(RequestDecodeError) as info:
        convert_request({"id": 9, "op": "turn.get", "params": {"turn_id": "x"}})
    assert (info.value.field, info.value.request_id) == ("turn_id", 9)
    assert isinstance(decode_request(json.dumps(frame).encode()), msgspec.Struct)


@pytest.mark.parametrize(
    "body",
    [
        b'{"id":1,"op":"ping","params":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"id":1,"op":"session.open","params":{"package_id":' + b"[" * 100_000 + b"}}",
        b'{"id":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
    ids=["params", "field", "id"],
)
def test_json_nested_too_deep_is_a_clear_frame_error(body: bytes) -> None:
    """msgspec raises RecursionError for JSON nested 100,000 deep; the request is a
    FrameDecodeError that names the problem (before, the RecursionError escaped)."""
    with pytest.raises(FrameDecodeError, match=r"nested too deep|not valid UTF-8 JSON"):
        decode_request(body)


def test_a_traceparent_with_a_trailing_newline_is_refused() -> None:
    """The traceparent must be the whole string: a trailing newline is not stored with it."""
    params = {
        "session_id": "SES-1",
        "kind": "instruction",
        "declared_outputs": [],
        "command_type": "READ",
        "target_selector": "#t",
        "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01\n",
    }
    body = json.dumps({"id": 1, "op": "turn.submit", "params": params}).encode()
    with pytest.raises(RequestDecodeError, match=r"^traceparent: "):
        decode_request(body)
