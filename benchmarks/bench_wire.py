"""Benchmark: decoding + validating wire messages, today's path vs the one-step msgspec path.

Run: ``.venv/bin/python benchmarks/bench_wire.py`` (a few seconds).

Both paths start from the same frame body bytes and end with a validated message, in the same
run on the same machine:

* before: ``orjson.loads`` to a dict, then the hand-written field checks (a faithful copy of the
  control server's checks before the change, and the ``parse_*`` functions of
  ``supervisor.wire.executor`` with the hub's ``"type"`` dispatch);
* msgspec: ``supervisor.wire.control.decode_request`` and
  ``supervisor.wire.executor.decode_hello`` / ``decode_executor_message``.

Prints µs per message for each and the ratio (before / msgspec; > 1 means msgspec is faster).
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson

from sandbox.policy.envelopes import ExecutorStatus
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import RequestError
from supervisor.wire.control import decode_request
from supervisor.wire.executor import (
    MessageType,
    decode_executor_message,
    decode_hello,
    parse_hello,
    parse_status,
)
from supervisor.wire.frames import decode_body

_MAX_TURN_ID: Final = 2**63 - 1


# --- today's path (before the change), copied from supervisor/control/server.py -------------


def _turn_id(params: Mapping[str, Any]) -> int:
    value = params.get("turn_id")
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value) if len(value) <= 19 else _MAX_TURN_ID + 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError("bad_request", "turn_id: must be an integer turn id", field="turn_id")
    if not 1 <= value <= _MAX_TURN_ID:
        raise RequestError("unknown_turn", f"no turn {value}")
    return value


def _str(params: Mapping[str, Any], key: str, *, required: bool = True) -> str | None:
    value = params.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise RequestError("bad_request", f"{key}: must be a non-empty string", field=key)
    return value


def _legacy_params(op: str, params: Mapping[str, Any]) -> object:
    if op in {"turn.get", "turn.cancel"}:
        return _turn_id(params)
    if op == "turn.wait":
        timeout = params.get("timeout_s")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float)
        ):
            raise RequestError("bad_request", "timeout_s: must be a number", field="timeout_s")
        until = frozenset(TurnState(v) for v in params.get("until", []))
        return _turn_id(params), timeout, until
    if op == "session.open":
        return (
            _str(params, "package_id"),
            _str(params, "tier", required=False),
            _str(params, "work_order_id", required=False),
            _str(params, "workspace", required=False),
        )
    if op == "session.close":
        return _str(params, "session_id")
    if op == "executors.wait":
        status_value = params.get("status", "READY")
        status = None if status_value is None else ExecutorStatus(status_value)
        timeout = params.get("timeout_s", 10.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise RequestError("bad_request", "timeout_s: must be a number", field="timeout_s")
        return _str(params, "executor_id"), status, timeout
    if op == "escalations.resolve":
        return _turn_id(params), _str(params, "action")
    return None


def legacy_request(body: bytes) -> object:
    frame = decode_body(body)
    req_id = frame.get("id")
    op = frame.get("op")
    params = frame.get("params", {})
    if isinstance(req_id, bool) or not isinstance(req_id, str | int | None):
        raise RequestError("bad_request", "id: must be an integer or a string", field="id")
    if not isinstance(op, str):
        raise RequestError("bad_request", "op: every request needs an 'op' string")
    if not isinstance(params, Mapping):
        raise RequestError("bad_request", "params: must be an object", field="params")
    return _legacy_params(op, params)


def legacy_executor(body: bytes) -> object:
    frame = decode_body(body)
    kind = frame.get("type")
    if kind == MessageType.RESPONSE:
        return frame.get("response")
    if kind == MessageType.HEARTBEAT:
        return None
    if kind == MessageType.STATUS:
        return parse_status(frame)
    raise AssertionError(kind)


def legacy_hello(body: bytes) -> object:
    return parse_hello(decode_body(body))


# --- the messages ------------------------------------------------------------------------------

CONTROL: Final[dict[str, bytes]] = {
    name: orjson.dumps(obj)
    for name, obj in {
        "ping": {"id": 1, "op": "ping", "params": {}},
        "turn.get": {"id": 2, "op": "turn.get", "params": {"turn_id": 123456}},
        "turn.wait": {
            "id": 3,
            "op": "turn.wait",
            "params": {"turn_id": 42, "timeout_s": 30, "until": ["escalated", "running"]},
        },
        "session.open": {
            "id": "c-4",
            "op": "session.open",
            "params": {"package_id": "demo", "tier": "default", "workspace": "ws-1"},
        },
        "executors.wait": {
            "id": 5,
            "op": "executors.wait",
            "params": {"executor_id": "web-1", "status": "READY", "timeout_s": 5},
        },
        "escalations.resolve": {
            "id": 6,
            "op": "escalations.resolve",
            "params": {"turn_id": 9, "action": "retry", "reason": "disk freed"},
        },
    }.items()
}
EXECUTOR: Final[dict[str, bytes]] = {
    "response": orjson.dumps(
        {
            "type": "response",
            "response": {
                "instruction_id": "INS-17-3",
                "execution_id": "EXE-17",
                "status": "SUCCESS",
                "timestamp": "2026-01-01T00:00:00.000000Z",
                "duration_ms": 12,
                "result": {"text": "hello world " * 8, "items": [1, 2, 3]},
                "error": None,
            },
        }
    ),
    "heartbeat": orjson.dumps({"type": "heartbeat", "ts_us": 1_767_225_600_000_000}),
    "status": orjson.dumps({"type": "status", "status": "BUSY", "detail": "draining a page"}),
}
HELLO: Final = orjson.dumps(
    {
        "type": "hello",
        "executor_id": "web-1",
        "protocol_version": 1,
        "commands": ["READ", "NAVIGATE", "CLICK"],
        "slots": 8,
        "software": "sdk/1.0",
    }
)


def _us(fn: Callable[[bytes], object], body: bytes, number: int) -> float:
    best = min(timeit.repeat(lambda: fn(body), number=number, repeat=9))
    return best / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=50_000, help="calls per timing")
    args = parser.parse_args()
    rows: list[tuple[str, float, float]] = []
    for name, body in CONTROL.items():
        rows.append(
            (f"control {name}", _us(legacy_request, body, args.number),
             _us(decode_request, body, args.number))
        )  # fmt: skip
    for name, body in EXECUTOR.items():
        rows.append(
            (f"executor {name}", _us(legacy_executor, body, args.number),
             _us(decode_executor_message, body, args.number))
        )  # fmt: skip
    rows.append(
        ("executor hello", _us(legacy_hello, HELLO, args.number),
         _us(decode_hello, HELLO, args.number))
    )  # fmt: skip
    print(f"{'message':<30} {'before µs':>10} {'msgspec µs':>11} {'ratio':>7}")
    for name, before, after in rows:
        print(f"{name:<30} {before:>10.3f} {after:>11.3f} {before / after:>6.2f}x")
    total_before = sum(r[1] for r in rows)
    total_after = sum(r[2] for r in rows)
    print(
        f"{'all (sum)':<30} {total_before:>10.3f} {total_after:>11.3f} "
        f"{total_before / total_after:>6.2f}x"
    )


if __name__ == "__main__":
    main()
