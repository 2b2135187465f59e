"""`hunter console` as an operator runs it (docs/console.md): `add-operator` writes the
operators file, `hunter console` serves beside a real `hunter serve` in its own process, signs
people in, stops on SIGTERM with exit 0; bad flags and bad files exit 2 naming what is wrong.
The operators file's rules (`supervisor.console.operators`) are checked here too."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from supervisor.console.errors import OperatorsFileError
from supervisor.console.operators import Role, hash_password, load_operators, verify_password

HUNTER = [sys.executable, "-m", "supervisor"]


def hunter(
    *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HUNTER, *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_hash_and_verify() -> None:
    encoded = hash_password("s3cret")
    assert encoded.startswith("scrypt$16384$8$1$")
    assert verify_password("s3cret", encoded)
    assert not verify_password("s3cret ", encoded)
    assert not verify_password("s3cret", "scrypt$16384$8$1$zz$zz")  # not hex: no match
    # a hash whose cost would exhaust memory is not one we wrote: refused, not computed
    huge = encoded.replace("scrypt$16384$", f"scrypt${1 << 24}$")
    assert not verify_password("s3cret", huge)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "[operators.a]\nrole = 'admin'\npassword = 'x'\n",
            "operators.a.role: 'admin' is not a role",
        ),
        ("[operators.a]\nrole = 'reader'\npassword = 'hunter2'\n", "not a scrypt hash"),
        ("[operators.a]\nrole = 'reader'\npasword = 'x'\n", "unknown key(s) pasword"),
        ("[operators.'a b']\nrole = 'reader'\n", "a name is 1 to 64 of"),
        ("[users.a]\nrole = 'reader'\n", "unknown top-level key(s) users"),
        ("", "no [operators.<name>] table"),
        ("[operators\n", "not valid TOML"),
    ],
)
def test_a_bad_operators_file_is_named(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "ops.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(OperatorsFileError) as info:
        load_operators(path)
    assert named in str(info.value)
    assert str(path) in str(info.value)


def test_add_operator_writes_hashes_only(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "ops.toml"
    added = hunter(
        "console",
        "add-operator",
        "alice",
        "--role",
        "reader",
        "--operators",
        str(path),
        "--password-stdin",
        stdin="first password\n",
    )
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == f"alice: reader in {path}"
    changed = hunter(
        "console",
        "add-operator",
        "alice",
        "--role",
        "resolver",
        "--operators",
        str(path),
        "--password-stdin",
        stdin="second password\n",
    )
    assert changed.returncode == 0, changed.stderr
    proxied = hunter(
        "console",
        "add-operator",
        "sso.user@example",
        "--role",
        "reader",
        "--operators",
        str(path),
        "--no-password",
    )
    assert proxied.returncode == 0, proxied.stderr
    text = path.read_text(encoding="utf-8")
    values = [line for line in text.splitlines() if line.startswith("password")]
    assert len(values) == 1
    assert all(v.startswith('password = "scrypt$') for v in values)
    assert "first password" not in text
    assert "second password" not in text
    assert oct(path.stat().st_mode & 0o777) == "0o640"
    operators = load_operators(path)
    alice = operators.get("alice")
    assert alice is not None
    assert alice.role is Role.RESOLVER
    assert alice.password_hash is not None
    assert verify_password("second password", alice.password_hash)
    sso = operators.get("sso.user@example")
    assert sso is not None
    assert sso.password_hash is None


def test_bad_flags_exit_2_naming_the_problem(tmp_path: Path, root: Path) -> None:
    missing = hunter("console", "--root", str(root), "--operators", str(tmp_path / "none.toml"))
    assert missing.returncode == 2
    assert "no such file" in missing.stderr
    assert "add-operator" in missing.stderr
    ops = tmp_path / "ops.toml"
    ops.write_text(f'[operators.a]\nrole = "reader"\npassword = "{hash_password("pw")}"\n')
    header = hunter(
        "console", "--root", str(root), "--operators", str(ops), "--user-header", "X-User"
    )
    assert header.returncode == 2
    assert "only with --listen unix:PATH" in header.stderr
    listen = hunter("console", "--root", str(root), "--operators", str(ops), "--listen", "nowhere")
    assert listen.returncode == 2
    assert "give HOST:PORT" in listen.stderr
    host = hunter(
        "console", "--root", str(root), "--operators", str(ops), "--allow-host", "http://x/"
    )
    assert host.returncode == 2
    assert "--allow-host 'http://x/': give a host name" in host.stderr
    env = {k: v for k, v in os.environ.items() if k != "HUNTER_CONSOLE_OPERATORS"}
    none = subprocess.run(
        [*HUNTER, "console", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert none.returncode == 2
    assert "give --operators FILE" in none.stderr


def test_console_beside_a_served_root(tmp_path: Path, root: Path) -> None:
    """The docs' walkthrough: `hunter serve`, `add-operator`, `hunter console`; sign in, read
    the overview; SIGTERM stops it with exit 0."""
    ops = tmp_path / "ops.toml"
    assert (
        hunter(
            "console",
            "add-operator",
            "alice",
            "--role",
            "resolver",
            "--operators",
            str(ops),
            "--password-stdin",
            stdin="pw of alice\n",
        ).returncode
        == 0
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    daemon = subprocess.Popen(
        [*HUNTER, "serve", "--root", str(root), "--log-format", "json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    port = free_port()
    console = subprocess.Popen(
        [
            *HUNTER,
            "console",
            "--root",
            str(root),
            "--operators",
            str(ops),
            "--listen",
            f"127.0.0.1:{port}",
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=10) as http:
            for _ in range(600):
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            else:
                pytest.fail("the console never reached the daemon")
            form = http.get("/login")
            token = re.search(r'name="form_token" value="([^"]+)"', form.text)
            assert token
            signed = http.post(
                "/login",
                data={
                    "form_token": token.group(1),
                    "name": "alice",
                    "password": "pw of alice",
                    "next": "/",
                },
            )
            assert signed.status_code == 303
            overview = http.get("/")
            assert overview.status_code == 200
            assert "Overview" in overview.text
            assert "this daemon" in overview.text
    finally:
        console.send_signal(signal.SIGTERM)
        out, errors = console.communicate(timeout=30)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    assert console.returncode == 0, errors
    assert '"event":"console_started"' in out.replace(" ", "")
    assert '"event":"console_stopping"' in out.replace(" ", "")
