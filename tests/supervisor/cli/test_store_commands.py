"""`hunter store migrate`: SQLite (the store file is opened, which migrates it) and PostgreSQL
(the private test cluster): what it prints, and exit 2 with a clear message when the server is
not there or the configuration is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli.main import main
from supervisor.store.postgres.schema import SCHEMA_VERSION as PG_SCHEMA
from tests.supervisor.store.pg_cluster import (
    PgCluster,
    database_for,
)


@pytest.fixture(autouse=True)
def _no_hunter_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HUNTER_CONFIG", "HUNTER_ROOT", "HUNTER_STORE__ENGINE", "HUNTER_STORE__DSN"):
        monkeypatch.delenv(name, raising=False)


def _config(tmp_path: Path, dsn: str, extra: str = "") -> Path:
    path = tmp_path / "hunter.toml"
    path.write_text(f'[store]\nengine = "postgres"\ndsn = "{dsn}"\n{extra}', encoding="utf-8")
    return path


def test_migrate_sqlite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default engine: a new store file is created at the current version, then current."""
    root = tmp_path / "root"
    assert main(["store", "migrate", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"sqlite turn store {root / 'state' / 'turns.sqlite3'}: migrated from no schema" in out
    assert main(["store", "migrate", "--root", str(root)]) == 0
    assert "already current" in capsys.readouterr().out


def test_migrate_postgres(
    pg_cluster: PgCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fresh database is migrated to the current version (tables exist after), then is
    already current."""
    dsn = database_for(tmp_path)
    config = _config(tmp_path, dsn)
    assert main(["store", "migrate", "--config", str(config), "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"postgresql server {pg_cluster.socket_dir} port {pg_cluster.port}" in out
    assert f"migrated from no schema to version {PG_SCHEMA}" in out
    database = dsn.partition("?")[0].rpartition("/")[2]
    value = pg_cluster.psql(
        "SELECT value FROM hunter_meta WHERE key = 'turn_store_schema'", database=database
    )
    assert value.strip() == str(PG_SCHEMA)
    assert main(["store", "migrate", "--config", str(config), "--root", str(tmp_path)]) == 0
    assert f"schema version {PG_SCHEMA}, already current" in capsys.readouterr().out


def test_migrate_postgres_with_password_file(
    pg_cluster: PgCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A password_file is read (trust auth ignores it); an unreadable one is exit 2."""
    dsn = database_for(tmp_path)
    secret = tmp_path / "pgpass"
    secret.write_text("not-shown-anywhere\n", encoding="utf-8")
    config = _config(tmp_path, dsn, f'password_file = "{secret}"\n')
    assert main(["store", "migrate", "--config", str(config), "--root", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "not-shown-anywhere" not in captured.out + captured.err
    missing = _config(tmp_path, dsn, f'password_file = "{tmp_path / "absent"}"\n')
    assert main(["store", "migrate", "--config", str(missing), "--root", str(tmp_path)]) == 2
    assert "cannot read store.password_file" in capsys.readouterr().err


def test_migrate_unreachable_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No server on the socket: exit 2 naming the server, port, user and what failed."""
    empty = tmp_path / "sock"
    empty.mkdir()
    config = _config(tmp_path, f"host={empty} port=5498 dbname=turns user=ops")
    assert main(["store", "migrate", "--config", str(config), "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hunter store migrate: cannot connect to postgresql server")
    assert f"{empty} port 5498, database turns, user ops" in err


def test_migrate_refuses_a_password_in_the_dsn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A password in the DSN is a configuration error (exit 2), and it is not echoed."""
    config = _config(tmp_path, "postgresql://ops:hunter2@db/turns")
    assert main(["store", "migrate", "--config", str(config), "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "store.dsn" in err
    assert "hunter2" not in err


def test_migrate_refused_by_the_server(
    pg_cluster: PgCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server answers but refuses (a database or a role that does not exist): exit 2 with
    the server's reason after the server's name."""
    base = pg_cluster.dsn("no_such_database")
    assert main(["store", "migrate", "--config", str(_config(tmp_path, base))]) == 2
    err = capsys.readouterr().err
    assert "database no_such_database, user postgres: " in err
    assert 'database "no_such_database" does not exist' in err
    role = pg_cluster.dsn("postgres").replace("postgres@", "no_such_role@", 1)
    assert main(["store", "migrate", "--config", str(_config(tmp_path, role))]) == 2
    err = capsys.readouterr().err
    assert "user no_such_role: " in err
    assert 'role "no_such_role" does not exist' in err
