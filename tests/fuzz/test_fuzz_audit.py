"""Fuzz: the kernel audit records a turn can influence (the paths it names are its own choice)
are parsed without an exception, whatever bytes they hold, and routed only to their domain."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.confine.audit import MAX_DENIALS, KernelAudit, parse_record

FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ACCESS, DOMAIN = 1423, 1424

fields = st.lists(
    st.tuples(
        st.sampled_from(["domain", "blockers", "path", "pid", "status", "dev", "ino", "x"]),
        st.text(max_size=30) | st.binary(max_size=20).map(bytes.hex),
        st.sampled_from(["", '"', "'"]),
    ),
    max_size=8,
)


def _text(serial: str, items: list[tuple[str, str, str]]) -> bytes:
    body = " ".join(f"{k}={q}{v}{q}" for k, v, q in items)
    return f"audit(1795671460.125:{serial}): {body}".encode("utf-8", "surrogatepass")


def _message(kind: int, payload: bytes) -> bytes:
    return struct.pack("=LHHLL", 16 + len(payload), kind, 0, 0, 0) + payload


def test_records_parse_or_are_refused(record: Callable[..., None]) -> None:
    count = 0

    @settings(FUZZ, max_examples=1500)
    @given(st.binary(max_size=200) | st.builds(_text, st.text(max_size=8), fields))
    def run(payload: bytes) -> None:
        nonlocal count
        count += 1
        parsed = parse_record(ACCESS, payload)
        assert parsed is None or parsed.serial >= 0

    run()
    record("audit record parser", count, minimum=1500)


def test_routing_never_raises_and_attributes_only_watched_domains(
    record: Callable[..., None],
) -> None:
    """Arbitrary messages (any type, any length field, any text) go through the router; only a
    domain whose ``allocated`` record names the watched pid ever reaches its watch."""
    count = 0
    left, right = socket.socketpair()
    try:
        audit = KernelAudit(left, right)
        watch = audit.watch(4242)

        @settings(FUZZ, max_examples=1500)
        @given(
            st.lists(
                st.binary(max_size=120)
                | st.builds(
                    _message, st.sampled_from([ACCESS, DOMAIN, 1005, 2]), st.binary(max_size=80)
                )
                | st.builds(
                    _message,
                    st.sampled_from([ACCESS, DOMAIN]),
                    st.builds(_text, st.sampled_from(["1", "2", "x"]), fields),
                ),
                max_size=6,
            )
        )
        def run(messages: list[bytes]) -> None:
            nonlocal count
            count += 1
            for data in messages:
                audit._route(data)

        run()
        # whatever came in, what is kept stays bounded
        assert len(watch.denials) <= MAX_DENIALS
        assert len(audit._pending) <= 4096
    finally:
        left.close()
        right.close()
    record("audit record router", count, minimum=1500)
