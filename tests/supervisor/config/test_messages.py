"""What a bad configuration is told: msgspec's findings in dotted keys, bounds and hints."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config.loader import load_config
from supervisor.config.schema import KEYS
from supervisor.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hunter.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "[executors]\nqueue_capasity = 5\n",
            "config key 'executors.queue_capasity': unknown key; "
            "did you mean 'executors.queue_capacity'?",
        ),
        (
            "[executor]\nqueue_capacity = 5\n",
            "config key 'executor': unknown key; did you mean 'executors'?",
        ),
        (
            "max_attempts = 3\n",
            "config key 'max_attempts': unknown key; did you mean 'retry.max_attempts'?",
        ),
        (
            "[log]\nlevels = 'debug'\n",
            "config key 'log.levels': unknown key; did you mean 'log.level'?",
        ),
        ("[executors]\nslots = 4\n", "config key 'executors.slots': unknown key"),  # nothing close
    ],
)
def test_unknown_key_in_a_file_gets_a_hint(tmp_path: Path, toml: str, message: str) -> None:
    """An unknown key in the file is named with its dotted key and the closest known key."""
    path = _write(tmp_path, toml)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert str(caught.value) == f"{message} (from {path})"


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("HUNTER_EXECUTORS__QUEUE_CAPASITY", "HUNTER_EXECUTORS__QUEUE_CAPACITY"),
        ("HUNTER_EXECUTOR__QUEUE_CAPACITY", "HUNTER_EXECUTORS__QUEUE_CAPACITY"),
        ("HUNTER_MAX_ATTEMPTS", "HUNTER_RETRY__MAX_ATTEMPTS"),
        ("HUNTER_DRAIN_GRACE", "HUNTER_DRAIN_GRACE_S"),
    ],
)
def test_unknown_env_override_gets_a_hint(name: str, hint: str) -> None:
    """An unknown HUNTER_* variable names the variable of the closest known key."""
    with pytest.raises(ConfigError, match=rf"unknown environment variable {name} .*") as caught:
        load_config(None, env={name: "5"})
    assert str(caught.value).endswith(f"; did you mean {hint}? (from {name})")


def test_unknown_override_gets_a_hint() -> None:
    """Overrides (command-line flags, `to_dict()` fed back) get the same hint."""
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={}, overrides={"log": {"formt": "json"}})
    assert str(caught.value) == (
        "config key 'log.formt': unknown key; did you mean 'log.format'? (from override)"
    )


@pytest.mark.parametrize(
    ("toml", "key", "problem"),
    [
        ("[store]\npool_size = 'five'\n", "store.pool_size", "expected an integer, got 'five'"),
        ("[store]\npool_size = 2.0\n", "store.pool_size", "expected an integer, got 2.0"),
        (
            "[metrics]\ntextfile = 3\n",
            "metrics.textfile",
            "expected a non-empty path string, got 3",
        ),
        ("[retry]\njitter = [0.5]\n", "retry.jitter", "expected a number, got [0.5]"),
        ("[log]\nlevel = 10\n", "log.level", "expected a string, got 10"),
        ("[tracing]\nservice_name = true\n", "tracing.service_name", "expected a string, got True"),
        ("[store]\ndsn = 5\n", "store.dsn", "expected a connection string, got 5"),
        (
            "allowed_uids = [0, 'x']\n",
            "allowed_uids",
            "expected uids between 0 and 4294967294, got 'x'",
        ),
    ],
)
def test_wrong_type_at_a_nested_key(tmp_path: Path, toml: str, key: str, problem: str) -> None:
    """A value of the wrong type is reported at its dotted key, with the value and the file."""
    path = _write(tmp_path, toml)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert caught.value.key == key
    assert caught.value.source == str(path)
    assert str(caught.value) == f"config key {key!r}: {problem} (from {path})"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"HUNTER_STORE__POOL_SIZE": "65"},
            "config key 'store.pool_size': must be <= 64, got 65 (from HUNTER_STORE__POOL_SIZE)",
        ),
        (
            {"HUNTER_EXECUTORS__HELLO_TIMEOUT_S": "0"},
            "config key 'executors.hello_timeout_s': must be > 0, got 0.0 "
            "(from HUNTER_EXECUTORS__HELLO_TIMEOUT_S)",
        ),
        (
            {"HUNTER_SANDBOX__MEMORY_MAX_BYTES": "1024"},
            "config key 'sandbox.memory_max_bytes': must be >= 1048576, got 1024 "
            "(from HUNTER_SANDBOX__MEMORY_MAX_BYTES)",
        ),
        (
            {"HUNTER_EXECUTORS__BREAKER_WINDOW_S": "0.0001"},
            "config key 'executors.breaker_window_s': must be >= 0.001, got 0.0001 "
            "(from HUNTER_EXECUTORS__BREAKER_WINDOW_S)",
        ),
        (
            {"HUNTER_SOCKET_MODE": "1000"},
            "config key 'socket_mode': must be <= 0777, got 1000 (from HUNTER_SOCKET_MODE)",
        ),
        (
            {"HUNTER_RETRY__JITTER": "inf"},
            "config key 'retry.jitter': expected a finite number, got inf "
            "(from HUNTER_RETRY__JITTER)",
        ),
    ],
)
def test_bound_violation_names_the_bound(env: dict[str, str], message: str) -> None:
    """A value out of range is reported with the bound it breaks and the value given."""
    with pytest.raises(ConfigError) as caught:
        load_config(None, env=env)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "key", [k for k, spec in KEYS.items() if spec.meta.le is not None and spec.kind != "mode"]
)
def test_every_upper_bound_is_checked_and_named(key: str) -> None:
    """Each declared maximum is enforced, and the message names it as declared."""
    spec = KEYS[key]
    assert spec.meta.le is not None
    limit = spec.meta.le
    value = limit + 1 if spec.kind == "int" else float(limit) * 2 + 1
    shown = int(limit) if float(limit).is_integer() else limit
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={}, overrides={key: value})
    assert caught.value.key == key
    assert caught.value.problem == f"must be <= {shown}, got {value!r}"


def test_an_environment_value_keeps_its_case_unless_it_is_a_choice() -> None:
    """A choice (`log.level`) is case-insensitive; a name or a URL from the environment keeps
    the case it was given (a service name, an endpoint's path)."""
    env = {
        "HUNTER_LOG__LEVEL": "WARNING",
        "HUNTER_TRACING__SERVICE_NAME": "Hunter-EU",
        "HUNTER_TRACING__OTLP_ENDPOINT": "http://127.0.0.1:4318/V1/Traces",
    }
    config = load_config(None, env=env)
    assert config.log.level == "warning"
    assert config.tracing.service_name == "Hunter-EU"
    assert config.tracing.otlp_endpoint == "http://127.0.0.1:4318/V1/Traces"
