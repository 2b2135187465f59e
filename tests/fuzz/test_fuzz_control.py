"""Fuzz: every control request, as bytes and as dicts, through the one-step decoder."""

from __future__ import annotations

import json
from collections.abc import Callable

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.wire.control import (
    MAX_TURN_ID,
    OPERATIONS,
    RequestDecodeError,
    convert_request,
    decode_request,
    op_of,
)
from supervisor.wire.frames import FrameDecodeError

FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CODES = {"bad_request", "unknown_op", "unknown_turn"}
FIELDS = [
    "session_id", "package_id", "tier", "workspace", "work_order_id", "turn_id", "kind",
    "declared_outputs", "declared_inputs", "phase", "idempotency_key", "timeout_ms", "wait_s",
    "command_type", "target_url", "target_selector", "parameters", "argv", "timeout_s", "until",
    "action", "executor_id", "status",
]  # fmt: skip
INTERESTING: list[object] = [
    None, True, False, 0, -1, 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 1.5, -0.0,
    1e308, "", "x", "42", "9" * 5000, "0", "-1", "\u0000", "\ud7ff", [], [1], {}, {"a": 1},
    [[[]]], "RED", "instruction", "process", ["GREEN"], {"path": 1}, {"path": "out.txt"},
    ["out.txt"], "READY", "retry", "terminate", "accepted", ["succeeded"], "READ", ["/bin/true"],
]  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(INTERESTING)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
params = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), json_values, max_size=6)
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "op": st.sampled_from(OPERATIONS)
        | st.sampled_from(["", "turn.explode", "PING"])
        | json_values,
        "params": params | json_values,
    },
)


def _check_error(exc: RequestDecodeError) -> None:
    wire = exc.to_wire()
    assert wire["code"] in CODES, wire
    assert isinstance(wire["message"], str)
    assert wire["message"]
    assert len(wire["message"]) < 2000
    if "field" in wire:
        assert wire["message"].startswith(f"{wire['field']}:"), wire
    assert exc.request_id is None or isinstance(exc.request_id, int | str)


def _outcome(decode: Callable[[], object]) -> str:
    try:
        request = decode()
    except RequestDecodeError as exc:
        _check_error(exc)
        return str(exc.code)
    except FrameDecodeError:
        return "frame"
    assert isinstance(request, msgspec.Struct)
    with pytest.raises(AttributeError):
        request.id = 5  # type: ignore[attr-defined]  # frozen
    return "ok:" + op_of(request)  # type: ignore[arg-type]


def test_random_bytes(record: Callable[..., None]) -> None:
    """Arbitrary bytes: a request, a RequestDecodeError or a FrameDecodeError, nothing else."""
    count = 0

    @settings(FUZZ, max_examples=800)
    @given(
        st.binary(max_size=300)
        | st.text(max_size=200).map(str.encode)
        # a JSON object followed by junk (atheris found the decoder stopping before the junk)
        | st.tuples(envelopes.map(json.dumps), st.binary(min_size=1, max_size=8)).map(
            lambda t: t[0].encode() + t[1]
        )
    )
    def run(body: bytes) -> None:
        nonlocal count
        count += 1
        _outcome(lambda: decode_request(body))

    run()
    record("control: random bytes", count, minimum=500)


def test_random_requests(record: Callable[..., None]) -> None:
    """Random envelopes of every operation with random params: only documented errors, the
    same outcome from bytes and from a dict, and messages that name the field."""
    count = 0
    seen: dict[str, int] = {}

    @settings(FUZZ, max_examples=1200)
    @given(envelopes)
    def run(frame: dict[str, object]) -> None:
        nonlocal count
        count += 1
        body = json.dumps(frame).encode()
        from_bytes = _outcome(lambda: decode_request(body))
        from_dict = _outcome(lambda: convert_request(frame))
        seen[from_bytes] = seen.get(from_bytes, 0) + 1
        if from_dict != "frame":  # convert() never sees a non-object body
            # Both paths accept or refuse alike (the error code may differ: a frame with no
            # params is judged on `op` by one and on the missing object by the other).
            assert from_bytes.startswith("ok:") == from_dict.startswith("ok:"), (
                frame,
                from_bytes,
                from_dict,
            )

    run()
    record("control: random requests", count, minimum=1000)
    assert seen.get("bad_request", 0) > 100
    assert any(key.startswith("ok:") for key in seen)


def test_valid_turn_ids_decode_to_ints(record: Callable[..., None]) -> None:
    """Every id a turn can have decodes, as an int or a string of digits."""
    count = 0
    ids = st.integers(min_value=1, max_value=MAX_TURN_ID)

    @settings(FUZZ, max_examples=300)
    @given(ids | ids.map(str), st.sampled_from(["turn.get", "turn.cancel", "turn.wait"]))
    def run(turn_id: int | str, op: str) -> None:
        nonlocal count
        count += 1
        body = json.dumps({"id": 1, "op": op, "params": {"turn_id": turn_id}}).encode()
        request = decode_request(body)
        assert request.params.id == int(turn_id)  # type: ignore[union-attr]

    run()
    record("control: valid turn ids", count, minimum=200)


def test_impossible_turn_ids_are_no_such_turn(record: Callable[..., None]) -> None:
    """Ids no turn can have are unknown_turn (never bad_request, never internal)."""
    count = 0
    too_big = st.integers(min_value=MAX_TURN_ID + 1)

    @settings(FUZZ, max_examples=300)
    @given(
        st.integers(max_value=0)
        | too_big
        | too_big.map(str)
        | st.integers(min_value=20, max_value=5000).map(lambda n: "9" * n)
    )
    def run(turn_id: int | str) -> None:
        nonlocal count
        count += 1
        body = json.dumps({"id": 1, "op": "turn.get", "params": {"turn_id": turn_id}}).encode()
        with pytest.raises(RequestDecodeError) as info:
            decode_request(body)
        assert info.value.code == "unknown_turn"
        assert info.value.message.startswith("no turn ")
        assert len(info.value.message) < 200

    run()
    record("control: impossible turn ids", count, minimum=200)
