"""Fuzz: the other readers of untrusted input: manifests, ledgers, executor responses, config."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.errors import LedgerError
from ledger.verify import scan_bytes
from sandbox.errors import ManifestError
from sandbox.packages import load_manifest
from sandbox.policy.safety import build_executor_instruction, validate_executor_response
from supervisor.config import load_config
from supervisor.errors import ConfigError

FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=12,
)


def test_manifest_loader(tmp_path: Path, record: Callable[..., None]) -> None:
    """load_manifest on random bytes and random JSON: a Manifest or a ManifestError."""
    count = 0
    keys = ["id", "name", "version", "capabilities", "limits", "env_allow", "read", "write",
            "execute", "forbidden", "memory_mb", "pids", "timeout_s"]  # fmt: skip
    nested = st.dictionaries(st.sampled_from(keys), json_values, max_size=4)
    manifests = st.dictionaries(st.sampled_from(keys) | st.text(max_size=6), json_values | nested)
    path = tmp_path / "manifest.json"

    @settings(FUZZ, max_examples=400)
    @given(
        st.binary(max_size=200)
        | manifests.map(lambda m: json.dumps(m).encode())
        | st.integers(min_value=1, max_value=3000).map(lambda n: b"[" * n + b"]" * n)
    )
    def run(data: bytes) -> None:
        nonlocal count
        count += 1
        path.write_bytes(data)
        with contextlib.suppress(ManifestError):
            load_manifest(path)

    run()
    record("manifest loader", count, minimum=300)


def test_ledger_reader(record: Callable[..., None]) -> None:
    """scan_bytes (the verify path) on random bytes and random JSON lines: a Scan or a
    LedgerError (IntegrityError), never anything else."""
    count = 0
    lines = st.lists(
        st.binary(max_size=60)
        | st.dictionaries(
            st.sampled_from(["seq", "prev_hash", "entry_hash", "ts_us", "kind", "v", "ledger_id"])
            | st.text(max_size=5),
            json_values,
        ).map(lambda d: json.dumps(d, sort_keys=True, separators=(",", ":")).encode()),
        max_size=5,
    ).map(lambda ls: b"".join(line + b"\n" for line in ls))

    @settings(FUZZ, max_examples=500)
    @given(lines | st.binary(max_size=300), st.sampled_from([None, "SES-1/exec", "SES-1/turns"]))
    def run(data: bytes, ledger_id: str | None) -> None:
        nonlocal count
        count += 1
        with contextlib.suppress(LedgerError):
            scan_bytes(data, Path("fuzz.jsonl"), ledger_id=ledger_id, collect=True)

    run()
    record("ledger reader (scan_bytes)", count, minimum=350)


def test_envelope_validator(record: Callable[..., None]) -> None:
    """validate_executor_response never raises, whatever the response object."""
    count = 0
    instruction = build_executor_instruction(
        instruction_id="i-1",
        execution_id="e-1",
        command_type="READ",
        target_selector="#title",
        timestamp="2026-01-01T00:00:00Z",
        timeout_ms=1000,
        parameters={},
    )
    keys = [
        "instruction_id", "execution_id", "status", "timestamp", "duration_ms", "result",
        "error", "fault", "output", "data", "authority", "approved",
    ]  # fmt: skip
    responses = st.dictionaries(st.sampled_from(keys) | st.text(max_size=6), json_values).map(
        lambda d: {"instruction_id": "i-1", "execution_id": "e-1", **d}
    )

    @settings(FUZZ, max_examples=500)
    @given(responses | json_values)
    def run(response: object) -> None:
        nonlocal count
        count += 1
        result = validate_executor_response(instruction, response)
        assert result is not None

    run()
    record("envelope validator", count, minimum=350)


def test_config_loader(tmp_path: Path, record: Callable[..., None]) -> None:
    """load_config with random TOML and HUNTER_* values: a Config or a ConfigError."""
    count = 0
    defaults = load_config(None, env={}, overrides={"root": tmp_path}).to_dict()
    keys: list[str] = []
    for key, value in defaults.items():
        if isinstance(value, dict):
            keys.extend(f"{key}.{sub}" for sub in value)
        else:
            keys.append(key)
    toml_values = st.sampled_from(
        ['""', '"x"', "0", "-1", "1", "1.5", "-0.5", "1e400", "nan", "inf", "true", "[]", "{}",
         '"auto"', '"json"', '"debug"', '"strict"', '"0660"', "99999999999999999999", '"/tmp"',
         "[1, 2]", '"\\u0000"', "2026-01-01"]
    ) | st.text(max_size=15)  # fmt: skip
    path = tmp_path / "hunter.toml"

    @settings(FUZZ, max_examples=600)
    @given(
        st.lists(st.tuples(st.sampled_from(keys) | st.text(max_size=8), toml_values), max_size=4),
        st.dictionaries(
            st.sampled_from(keys).map(lambda k: "HUNTER_" + k.upper().replace(".", "__"))
            | st.text(max_size=10).map(lambda k: "HUNTER_" + k),
            st.text(max_size=12) | st.sampled_from(["0", "1.5", "-3", "true", "nan", "1e999"]),
            max_size=3,
        ),
        st.binary(max_size=80),
        st.booleans(),
    )
    def run(items: list[tuple[str, str]], env: dict[str, str], raw: bytes, use_raw: bool) -> None:
        nonlocal count
        count += 1
        if use_raw:
            path.write_bytes(raw)
        else:
            sections: dict[str, list[str]] = {}
            for key, value in items:
                section, _, name = key.rpartition(".")
                sections.setdefault(section, []).append(f"{json.dumps(name)} = {value}")
            text = "\n".join(sections.pop("", []))
            for section, body in sections.items():
                text += f"\n[{json.dumps(section)}]\n" + "\n".join(body)
            path.write_text(text + "\n", encoding="utf-8")
        env = {k: v.replace("\x00", "") for k, v in env.items() if "\x00" not in k}
        with contextlib.suppress(ConfigError):
            load_config(path, env={**env, "HUNTER_ROOT": str(tmp_path)})

    run()
    record("config loader", count, minimum=400)
