"""`requested_by`: typed and bounded on the wire, kept in the spec, left out when not given,
never compared for idempotency keys; and the settings' checks."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from supervisor.errors import ConfigError
from supervisor.mcp.attribution import UNNAMED_CLIENT, ServerInstance, requested_by
from supervisor.mcp.config import load_settings
from supervisor.turns.requests import spec_differences, turn_request
from supervisor.wire.control import TurnSubmitParams
from supervisor.wire.turn_spec import decode_spec, encode_spec, requested_by_text

_SERVER = ServerInstance(name="hunter-mcp", version="0.1.0", uid=1000, pid=4242)


def _params(**extra: object) -> TurnSubmitParams:
    raw = {"session_id": "S", "kind": "process", "declared_outputs": [], "argv": ["/bin/true"]}
    return msgspec.convert({**raw, **extra}, TurnSubmitParams)


def test_requested_by_is_kept_and_left_out_when_absent() -> None:
    """A spec without it encodes as before; with it, it round-trips and reads for people."""
    plain = turn_request(_params()).spec
    assert b"requested_by" not in encode_spec(plain)
    asked = requested_by(_SERVER, "host\x07", "1.0")
    spec = turn_request(_params(requested_by=msgspec.to_builtins(asked))).spec
    again = decode_spec(encode_spec(spec))
    assert again.requested_by == asked
    assert asked.client_name == "host"  # control characters are dropped
    assert spec_differences(plain, spec) == []  # not compared for idempotency keys
    text = requested_by_text(msgspec.to_builtins(asked))
    assert text == "host 1.0 via mcp (hunter-mcp 0.1.0, uid 1000, pid 4242)"


def test_requested_by_is_bounded_on_the_wire() -> None:
    """An oversized or unknown field is refused when the request is decoded."""
    good = msgspec.to_builtins(requested_by(_SERVER, None, None))
    assert good["client_name"] == UNNAMED_CLIENT
    with pytest.raises(msgspec.ValidationError, match="client_name"):
        _params(requested_by={**good, "client_name": "x" * 257})
    with pytest.raises(msgspec.ValidationError, match="operator"):
        _params(requested_by={**good, "operator": "someone"})


def test_settings_name_what_is_wrong(tmp_path: Path) -> None:
    """The [mcp] table is read; unknown keys and bad values are refused by name."""
    path = tmp_path / "mcp.toml"
    path.write_text('[mcp]\nallowed_packages = ["demo"]\nmax_turns_in_flight = 2\n', "utf-8")
    settings = load_settings(tmp_path / "control.sock", path=path, max_output_bytes=100)
    assert settings.allowed_packages == frozenset({"demo"})
    assert (settings.max_turns_in_flight, settings.max_output_bytes) == (2, 100)
    assert not settings.allows("other")
    path.write_text("[mcp]\nmax_turns = 2\n", "utf-8")
    with pytest.raises(ConfigError, match=r"mcp\.max_turns"):
        load_settings(tmp_path / "control.sock", path=path)
    with pytest.raises(ConfigError, match=r"mcp\.max_turns_in_flight"):
        load_settings(tmp_path / "control.sock", max_turns_in_flight=0)
