"""Fuzz: the sandbox helper's decoder (what the daemon's uid may send to a root process).

Random bytes, random MessagePack values and mutated valid requests: each decodes into a
typed request or raises `HelperWireError`, never anything else; a request that decodes
round-trips to the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.helper import wire

FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SID = "SES-20260101T000000.000000Z-0123456789abcdef"
VALID = [
    wire.Hello(),
    wire.Confine(session_id=SID),
    wire.Empty(session_id=SID),
    wire.Close(session_id=SID),
    wire.Run(
        session_id=SID, exe="/bin/sh", argv=("sh", "-c", "true"), declared=(), turn=1,
        attempt_no=1, timeout_s=5.0,
    ),
    wire.Promote(session_id=SID, paths=("a.txt",), workspace="/w"),
    wire.Open(
        session=wire.SessionSpec(
            session_id=SID, package_id="p", package_dir="/p", manifest={"capabilities": {}},
            workspace="/w",
        )
    ),
]  # fmt: skip
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.sampled_from(["op", "run", "open", "promote", SID, "../..", "/bin/sh"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


def _decodes_or_refuses(body: bytes) -> None:
    try:
        request = wire.decode_request(body)
    except wire.HelperWireError:
        return
    assert wire.decode_request(wire.encode(request)[wire.HEADER_SIZE :]) == request


def test_helper_requests_decode_or_are_refused(record: Callable[..., None]) -> None:
    count = 0

    @settings(FUZZ, max_examples=1500)
    @given(
        st.binary(max_size=300)
        | values.map(msgspec.msgpack.encode)
        | st.builds(
            lambda m, key, value: msgspec.msgpack.encode(
                {**msgspec.to_builtins(m), key: value}
            ),
            st.sampled_from(VALID),
            st.sampled_from(["op", "session_id", "argv", "exe", "turn", "timeout_s", "paths",
                             "declared", "workspace", "session", "attempt_no"]),
            values,
        )
    )  # fmt: skip
    def run(body: bytes) -> None:
        nonlocal count
        count += 1
        _decodes_or_refuses(body)

    run()
    record("helper request decoder", count, minimum=1500)
