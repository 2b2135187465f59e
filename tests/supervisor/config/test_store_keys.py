"""The `[store]` keys: the engine choice, the PostgreSQL DSN (never with a password), env
overrides, and what `hunter config show` prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import ConfigError, load_config, to_toml
from supervisor.config.dsn import describe, dsn_problem, parse_keywords, to_uri, with_password

_TOML = """\
[store]
engine = "postgres"
dsn = "postgresql://hunter@db.example.net:5433/turns?sslmode=require"
password_file = "secrets/pg"
pool_size = 5
"""


def test_default_is_sqlite(tmp_path: Path) -> None:
    """Without a [store] section the embedded engine is used, and show prints no dsn."""
    config = load_config(None, env={"HUNTER_ROOT": str(tmp_path)})
    assert config.store.engine == "sqlite"
    assert config.store.dsn == ""
    assert config.store.password_file is None
    assert "password_file" not in to_toml(config)


def test_postgres_keys_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keys load from TOML; a relative password_file is made absolute."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "hunter.toml"
    path.write_text(_TOML, encoding="utf-8")
    config = load_config(path, env={})
    assert config.store.engine == "postgres"
    assert config.store.dsn.startswith("postgresql://hunter@db.example.net:5433/turns")
    assert config.store.password_file == tmp_path / "secrets" / "pg"
    assert config.store.pool_size == 5
    assert load_config(None, env={}, overrides=config.to_dict()) == config
    shown = to_toml(config)
    assert '[store]\nengine = "postgres"' in shown
    assert "password =" not in shown


def test_env_overrides(tmp_path: Path) -> None:
    """HUNTER_STORE__* override the file; the DSN keeps its case."""
    path = tmp_path / "hunter.toml"
    path.write_text(_TOML, encoding="utf-8")
    config = load_config(
        path,
        env={
            "HUNTER_STORE__DSN": "host=/run/PG port=5432 dbname=Hunter user=svc",
            "HUNTER_STORE__POOL_SIZE": "7",
            "HUNTER_STORE__ENGINE": "SQLite",
        },
    )
    assert config.store.dsn == "host=/run/PG port=5432 dbname=Hunter user=svc"
    assert config.store.pool_size == 7
    assert config.store.engine == "sqlite"


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://hunter:s3cret@db/turns",
        "postgres://hunter@db/turns?password=s3cret",
        "host=db user=hunter password=s3cret",
        "host=db user=hunter password='s3 cret'",
    ],
)
def test_password_in_dsn_is_refused(dsn: str) -> None:
    """A password in the DSN is refused at load, naming the key and the alternatives, and the
    value is not repeated in the message."""
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={"HUNTER_STORE__DSN": dsn})
    text = str(caught.value)
    assert "store.dsn" in text
    assert "password_file" in text
    assert ".pgpass" in text
    assert "s3" not in text


def test_postgres_needs_a_dsn() -> None:
    """engine = postgres without a dsn is a configuration error."""
    with pytest.raises(ConfigError, match=r"store\.dsn"):
        load_config(None, env={"HUNTER_STORE__ENGINE": "postgres"})


@pytest.mark.parametrize(
    ("key", "value"),
    [("store.pool_size", 0), ("store.pool_size", 65), ("store.engine", "mysql")],
)
def test_bounds(key: str, value: object) -> None:
    """pool_size is bounded, engine is one of two."""
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, env={}, overrides={key: value})


def test_dsn_helpers() -> None:
    """Keyword strings become URIs; describe names server, port, database and user."""
    assert parse_keywords("host='/a b' port = 5 user=x\\y") == {
        "host": "/a b",
        "port": "5",
        "user": "x\\y",
    }
    uri = to_uri("host=/run/pg port=5433 dbname=turns user=svc")
    assert uri == "postgresql://svc@/turns?host=%2Frun%2Fpg&port=5433"
    assert describe(uri) == "postgresql server /run/pg port 5433, database turns, user svc"
    assert describe("postgresql://a@db.example:6000/x") == (
        "postgresql server db.example:6000, database x, user a"
    )
    assert "secret" not in describe(with_password(uri, "secret"))
    assert dsn_problem("host=db dbname='unterminated") is not None
    assert dsn_problem(uri) is None
