"""The systemd units: static verification, the hardening score, and a real systemd boot.

The boot test starts a throwaway systemd in a container (systemd-nspawn on a tmpfs root with the
host's /usr, the repository and the Python environment bound read-only at their own paths),
installs the five units, triggers socket activation with a control-API `ping` on control.sock and
checks the services the way an operator would: `systemctl show`, /proc, the journal, reload,
stop; the unprivileged daemon runs a sandboxed turn through the root helper it activates.
Every step has a deadline; the container is torn down (and killed by pid if it must) at the end.
Needs root and `systemd-container` (CI: `apt-get install -y systemd-container`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

_REPO = Path(__file__).resolve().parents[2]
_UNITS = _REPO / "systemd"
_UNIT_FILES = (
    "hunter.socket",
    "hunter-executors.socket",
    "hunter.service",
    "hunter-sandbox.socket",
    "hunter-sandbox.service",
    "hunter-console.service",
    "hunter-mcp.service",
)
_HELPER_SOCKET = "/run/hunter-sandbox/helper.sock"
_STEP_TIMEOUT_S = 30.0


def _analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze is not installed (package systemd)")
    return path


def test_units_verify_cleanly() -> None:
    """`systemd-analyze verify` of the seven units together prints nothing and exits 0."""
    proc = subprocess.run(
        [_analyze(), "verify", *(str(_UNITS / name) for name in _UNIT_FILES)],
        capture_output=True,
        text=True,
        timeout=_STEP_TIMEOUT_S,
        check=False,
    )
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, "", "")


def _exposure(unit: str) -> float:
    """`systemd-analyze security --offline=true`'s overall exposure level of *unit*."""
    proc = subprocess.run(
        [_analyze(), "security", "--offline=true", "--no-pager", str(_UNITS / unit)],
        capture_output=True,
        text=True,
        timeout=_STEP_TIMEOUT_S,
        check=False,
    )
    match = re.search(rf"Overall exposure level for {re.escape(unit)}: (\d+\.\d+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    return float(match.group(1))


def test_daemon_exposure_at_most_2_5() -> None:
    """The unprivileged daemon's unit rates at most 2.5 (it rates 1.1; it was 4.4 as root)."""
    assert _exposure("hunter.service") <= 2.5


def _a_client_of_the_daemon(unit: str, user: str, *more: str) -> set[str]:
    """*unit* rates at most 2.0 and runs as *user*, in group hunter for the control socket
    only, with no capability, loopback only and nothing writable (plus the lines *more*);
    its lines."""
    assert _exposure(unit) <= 2.0
    lines = set(_lines(unit))
    assert {
        f"User={user}",
        "SupplementaryGroups=hunter",
        "CapabilityBoundingSet=",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "IPAddressDeny=any",
        "IPAddressAllow=localhost",
        *more,
    } <= lines
    assert not any(x.startswith(("StateDirectory=", "ReadWritePaths=")) for x in lines)
    return lines


def test_console_exposure_at_most_2_0_and_no_privilege() -> None:
    """The console's unit rates at most 2.0 (it rates 1.1): its own user, in group hunter for
    the control socket only, no capability, loopback only, nothing writable."""
    _a_client_of_the_daemon("hunter-console.service", "hunter-console")


def test_mcp_server_exposure_at_most_2_0_and_no_privilege() -> None:
    """The MCP server's unit (the HTTP form) is hardened as the console's (it rates 1.1),
    reads the daemon's root only, writes nothing but its own runtime directory (the socket
    agent hosts reach), and never serves without its token."""
    lines = _a_client_of_the_daemon(
        "hunter-mcp.service",
        "hunter-mcp",
        "ReadOnlyPaths=/var/lib/hunter",
        "RuntimeDirectory=hunter-mcp",
    )
    [start] = [x for x in lines if x.startswith("ExecStart=")]
    assert "--token-file /etc/hunter/mcp-token" in start


def test_helper_exposure_stays_at_the_root_units() -> None:
    """The sandbox helper's unit rates at most 4.4, the old root daemon's figure.

    It is higher than the daemon's because it is the root half: it switches turns to sandbox
    uids, makes their cgroups, namespaces and session disks, answers seccomp notifications and
    reads audit records, so it keeps those capabilities, the host network (turns granted
    network) and the mount and privileged system calls. It accepts only the daemon's uid.
    """
    assert _exposure("hunter-sandbox.service") <= 4.4


def _lines(unit: str) -> list[str]:
    return (_UNITS / unit).read_text(encoding="utf-8").splitlines()


def test_every_capability_kept_says_why() -> None:
    """Each capability in the helper's bounding set has a comment line naming it, and the
    ones a turn's sandbox does not need (network admin, setpcap, fsetid) are gone; the daemon
    keeps none."""
    lines = _lines("hunter-sandbox.service")
    [line] = [x for x in lines if x.startswith("CapabilityBoundingSet=")]
    kept = line.split("=", 1)[1].split()
    assert "CAP_SYS_ADMIN" in kept
    comments = [x for x in lines if x.startswith("#")]
    for cap in kept:
        assert any(re.search(rf"#\s+(\S+\s+)*{cap}\b", c) for c in comments), cap
    assert not {"CAP_NET_ADMIN", "CAP_SETPCAP", "CAP_FSETID"} & set(kept)
    assert "RestrictNamespaces=net pid" in lines
    assert not any(x.startswith("User=") for x in lines)

    daemon = _lines("hunter.service")
    assert [x for x in daemon if x.startswith(("CapabilityBoundingSet=", "AmbientCap"))] == [
        "CapabilityBoundingSet="
    ]
    assert {"User=hunter", "Group=hunter", "RestrictNamespaces=yes"} <= set(daemon)
    assert f"Environment=HUNTER_SANDBOX__HELPER_SOCKET={_HELPER_SOCKET}" in daemon
    assert not any(x.startswith("Delegate=") for x in daemon)


def test_socket_units_name_their_fds() -> None:
    """Each daemon socket unit names its fd as server.py expects and points at hunter.service;
    the helper's socket is the daemon user's alone and points at hunter-sandbox.service."""
    for unit, name, path in (
        ("hunter.socket", "control", "/run/hunter/control.sock"),
        ("hunter-executors.socket", "executors", "/run/hunter/executors.sock"),
    ):
        text = (_UNITS / unit).read_text(encoding="utf-8")
        assert f"\nFileDescriptorName={name}\n" in text
        assert f"\nListenStream={path}\n" in text
        assert "\nSocketMode=0660\n" in text
        assert "\nService=hunter.service\n" in text
    helper = _lines("hunter-sandbox.socket")
    assert {f"ListenStream={_HELPER_SOCKET}", "Service=hunter-sandbox.service"} <= set(helper)
    assert {"SocketUser=hunter", "SocketMode=0600"} <= set(helper)


# --- the real boot ------------------------------------------------------------------------------


def _nspawn_missing_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to boot a systemd container"
    for tool in ("systemd-nspawn", "nsenter", "systemctl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install -y systemd-container)"
    return None


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii")
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _poll(what: str, check: object, *, timeout_s: float = _STEP_TIMEOUT_S) -> object:
    """Wait (bounded) for `check()` to return something truthy.

    The container's boot has no readiness signal the host can wait on before its PID 1 and
    its bus exist, so these two steps poll; everything later blocks on systemctl itself.
    """
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.02)


class _Container:
    """A booted systemd container; `run()` executes a command inside it with a deadline."""

    def __init__(self, nspawn: subprocess.Popen[bytes], pid1: int, log: Path) -> None:
        self.nspawn = nspawn
        self.pid1 = pid1
        self.log = log

    def run(
        self, *argv: str, timeout_s: float = _STEP_TIMEOUT_S, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                ["nsenter", "-t", str(self.pid1), "-a", *argv],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{argv[0]} timed out after {timeout_s:.0f}s\n{self.diagnostics()}")
        if check and proc.returncode != 0:
            pytest.fail(
                f"{' '.join(argv)} exited {proc.returncode}\nstdout: {proc.stdout}\n"
                f"stderr: {proc.stderr}\n{self.diagnostics()}"
            )
        return proc

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.run("systemctl", "show", unit, "-p", ",".join(props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def diagnostics(self) -> str:
        parts = []
        for argv in (
            ("systemctl", "status", "--no-pager", "-l", "hunter.service", "hunter.socket"),
            ("systemctl", "status", "--no-pager", "-l", "hunter-sandbox.service"),
            ("journalctl", "--no-pager", "-n", "200", "-u", "hunter.service"),
            ("journalctl", "--no-pager", "-n", "100", "-u", "hunter-sandbox.service"),
        ):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc = subprocess.run(
                    ["nsenter", "-t", str(self.pid1), "-a", *argv],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=False,
                )
                parts.append(proc.stdout + proc.stderr)
        return "\n".join(parts)


def _bind_paths() -> list[Path]:
    """The repository and the Python installation(s), bound at their own paths."""
    wanted = [_REPO, Path(sys.prefix), Path(os.path.realpath(sys.base_prefix))]
    wanted.append(Path(os.path.realpath(sys.executable)).parent.parent)
    out: list[Path] = []
    for path in wanted:
        if path.is_relative_to("/usr") or any(path.is_relative_to(p) for p in out):
            continue
        out = [p for p in out if not p.is_relative_to(path)]
        out.append(path)
    return out


@contextlib.contextmanager
def _boot(share: Path, log: Path) -> Iterator[_Container]:
    name = f"hunter-test-{uuid.uuid4().hex[:12]}"
    argv: list[str] = [
        "systemd-nspawn",
        "-D",
        "/",
        "--volatile=yes",
        "-M",
        name,
        "-b",
        "--register=no",
        "--keep-unit",
        "--console=read-only",
        f"--bind={share}:/mnt/share",
        *(f"--bind-ro={p}" for p in _bind_paths()),
        # nspawn's own seccomp allow list lacks Landlock; the daemon's sandbox uses it.
        "--system-call-filter=landlock_create_ruleset landlock_add_rule landlock_restrict_self",
        "systemd.firstboot=off",
    ]
    with log.open("wb") as out:
        nspawn = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    pid1: int | None = None
    try:

        def find_pid1() -> int | None:
            if nspawn.poll() is not None:
                pytest.fail(f"systemd-nspawn exited {nspawn.returncode}:\n{log.read_text()}")
            for child in _children(nspawn.pid):
                if _comm(child) == "systemd":
                    return child
            return None

        pid1 = int(str(_poll("the container's systemd", find_pid1)))
        _poll(
            "the container's systemd bus",
            lambda: Path(f"/proc/{pid1}/root/run/systemd/private").exists(),
        )
        container = _Container(nspawn, pid1, log)
        state = container.run("systemctl", "is-system-running", "--wait", check=False)
        assert state.stdout.strip() in {"running", "degraded"}, state.stdout + state.stderr
        yield container
        container.run("systemctl", "exit", "0", check=False, timeout_s=10)
        nspawn.wait(timeout=_STEP_TIMEOUT_S)
    finally:
        _tear_down(nspawn, pid1)


def _tear_down(nspawn: subprocess.Popen[bytes], pid1: int | None) -> None:
    """Stop a container that did not exit by itself: its PID 1 first (that ends every process
    in its PID namespace, which killing nspawn alone would orphan), then nspawn."""
    if nspawn.poll() is not None:
        return
    if pid1 is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid1, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            nspawn.wait(timeout=10)
    if nspawn.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(nspawn.pid, signal.SIGKILL)
        nspawn.wait(timeout=_STEP_TIMEOUT_S)


def _ping_script(socket_path: str) -> str:
    """Python run inside the container: one control-API ping on `socket_path`."""
    return (
        "import socket, struct, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.settimeout({_STEP_TIMEOUT_S})\n"
        f"s.connect({socket_path!r})\n"
        'body = b\'{"id": 1, "op": "ping", "params": {}}\'\n'
        's.sendall(struct.pack(">I", len(body)) + body)\n'
        "head = b''\n"
        "while len(head) < 4:\n"
        "    chunk = s.recv(4 - len(head))\n"
        "    if not chunk: sys.exit('connection closed before a reply')\n"
        "    head += chunk\n"
        '(size,) = struct.unpack(">I", head)\n'
        "data = b''\n"
        "while len(data) < size:\n"
        "    chunk = s.recv(size - len(data))\n"
        "    if not chunk: sys.exit('truncated reply')\n"
        "    data += chunk\n"
        "s.close()\n"
        "sys.stdout.write(data.decode())\n"
    )


def _write_share(share: Path) -> None:
    for name in (*_UNIT_FILES, "hunter.sysusers"):
        shutil.copy(_UNITS / name, share / name)
    shutil.copy(_REPO / "examples" / "packages" / "demo" / "manifest.json", share / "manifest.json")
    # The documented drop-in for an install in a virtual environment (both services), plus a
    # short watchdog so the test sees pings arrive and a frozen daemon killed quickly (without
    # a core dump).
    venv_bin = Path(sys.prefix) / "bin"
    dropin = f"[Service]\nEnvironment=PATH={venv_bin}:/usr/bin:/bin\nLimitCORE=0\n"
    # PrivateTmp= gives the services an empty /tmp: a checkout (and its venv) under /tmp or
    # /var/tmp would vanish from their view. docs/operations.md: never install there.
    if any(p.is_relative_to(t) for p in _bind_paths() for t in (Path("/tmp"), Path("/var/tmp"))):
        dropin += "PrivateTmp=no\n"
    (share / "helper-venv.conf").write_text(dropin, encoding="utf-8")
    dropin += "WatchdogSec=2s\n"
    if "PrivateTmp=no" in dropin:
        # ... and without a private /tmp, ProtectSystem=strict leaves the daemon no writable
        # temporary directory (Python's tempfile finds none): give it the container's /tmp.
        dropin += "ReadWritePaths=/tmp\n"
    # ProtectHome=yes hides /home, /root and /run/user from the daemon: a Python installed
    # there (pyenv under /root, a user's venv) is made visible again, read-only, on an empty
    # tmpfs (docs/operations.md: install under /opt or /usr/local instead).
    homes = (Path("/home"), Path("/root"), Path("/run/user"))
    hidden = [p for p in _bind_paths() if any(p.is_relative_to(h) for h in homes)]
    if hidden:
        dropin += "ProtectHome=tmpfs\n"
        dropin += "".join(f"BindReadOnlyPaths={p}\n" for p in hidden)
    (share / "venv.conf").write_text(dropin, encoding="utf-8")
    # the console has no watchdog: the same drop-in without it
    console = dropin.replace("WatchdogSec=2s\n", "")
    (share / "console-venv.conf").write_text(console, encoding="utf-8")


def _install(c: _Container) -> None:
    script = (
        "set -e\n"
        "install -m 0644 /mnt/share/hunter.socket /mnt/share/hunter-executors.socket "
        "/mnt/share/hunter.service /mnt/share/hunter-sandbox.socket "
        "/mnt/share/hunter-sandbox.service /etc/systemd/system/\n"
        "install -D -m 0644 /mnt/share/hunter.sysusers /etc/sysusers.d/hunter.conf\n"
        "install -D -m 0644 /mnt/share/venv.conf /etc/systemd/system/hunter.service.d/venv.conf\n"
        "install -D -m 0644 /mnt/share/helper-venv.conf "
        "/etc/systemd/system/hunter-sandbox.service.d/venv.conf\n"
        "install -D -m 0644 /mnt/share/manifest.json /var/lib/hunter/installed/demo/manifest.json\n"
        "systemd-sysusers\n"
        "systemctl daemon-reload\n"
        "systemctl start hunter.socket hunter-executors.socket hunter-sandbox.socket\n"
    )
    c.run("sh", "-c", script)


def _journal_events(c: _Container, unit: str = "hunter.service") -> list[dict[str, object]]:
    out = c.run("journalctl", "--no-pager", "-o", "cat", "-u", unit).stdout
    events = []
    for line in out.splitlines():
        if line.startswith("{"):
            events.append(orjson.loads(line))
    return events


def _event_names(c: _Container, unit: str = "hunter.service") -> set[str]:
    return {str(e.get("event")) for e in _journal_events(c, unit)}


def _status_fields(c: _Container, pid: str) -> dict[str, str]:
    """``/proc/<pid>/status`` of a process in the container, as name -> value."""
    text = c.run("cat", f"/proc/{pid}/status").stdout
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def _watchdog_pinged(c: _Container, before: str) -> bool:
    now = c.show("hunter.service", "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]
    return now not in {before, "0"}


def _console_under_systemd(c: _Container, share: Path) -> None:
    """hunter-console.service: runs as hunter-console with no capability, reaches the daemon
    through the control socket (group hunter), serves on loopback, stops cleanly."""
    from supervisor.console.operators import hash_password

    (share / "console-operators.toml").write_text(
        f'[operators.ops]\nrole = "reader"\npassword = "{hash_password("pw in a test")}"\n',
        encoding="utf-8",
    )
    c.run(
        "sh",
        "-c",
        "set -e\n"
        "install -m 0644 /mnt/share/hunter-console.service /etc/systemd/system/\n"
        "install -D -m 0644 /mnt/share/console-venv.conf "
        "/etc/systemd/system/hunter-console.service.d/venv.conf\n"
        "install -D -m 0640 -g hunter-console /mnt/share/console-operators.toml "
        "/etc/hunter/console-operators.toml\n"
        "systemctl daemon-reload\n"
        "systemctl start hunter-console.service\n",
    )
    props = c.show("hunter-console.service", "ActiveState", "SubState", "MainPID", "StatusText")
    assert (props["ActiveState"], props["SubState"]) == ("active", "running"), c.diagnostics()
    assert props["StatusText"] == "serving on http://127.0.0.1:8470"
    status = _status_fields(c, props["MainPID"])
    console_uid = c.run("id", "-u", "hunter-console").stdout.strip()
    assert status["Uid"].split() == [console_uid] * 4
    hunter_gid = c.run("id", "-g", "hunter").stdout.strip()
    assert hunter_gid in status["Groups"].split()
    zero = "0000000000000000"
    assert [status[k] for k in ("CapPrm", "CapEff", "CapBnd", "CapAmb")] == [zero] * 4
    fetch = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        "    r = urllib.request.urlopen('http://127.0.0.1:8470' + sys.argv[1], timeout=5)\n"
        "    print(r.status, r.read().decode()[:200])\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code, e.read().decode()[:200])\n"
    )
    _poll(
        "the console reaching the daemon",
        lambda: c.run(sys.executable, "-c", fetch, "/healthz").stdout.startswith("200"),
    )
    assert c.run(sys.executable, "-c", fetch, "/login").stdout.startswith("200")
    c.run("systemctl", "stop", "hunter-console.service", timeout_s=30)
    stopped = c.show("hunter-console.service", "ActiveState", "Result")
    assert stopped == {"ActiveState": "inactive", "Result": "success"}, c.diagnostics()


@pytest.mark.systemd
@pytest.mark.skipif(_nspawn_missing_reason() is not None, reason=str(_nspawn_missing_reason()))
def test_service_under_real_systemd(tmp_path: Path) -> None:
    """Socket activation starts `hunter serve` unprivileged; READY, STATUS, watchdog, reload, a
    clean stop; a sandboxed turn through the root helper, which its socket starts."""
    share = tmp_path / "share"
    share.mkdir()
    _write_share(share)
    with _boot(share, tmp_path / "nspawn.log") as c:
        _install(c)

        # The sockets listen (owned by systemd, mode 0660, group hunter; the helper's is the
        # daemon user's alone, 0600); the services wait.
        modes = c.run(
            "stat",
            "-c",
            "%a %U %G",
            "/run/hunter/control.sock",
            "/run/hunter/executors.sock",
            _HELPER_SOCKET,
        )
        assert modes.stdout.split("\n")[:3] == [
            "660 root hunter",
            "660 root hunter",
            "600 hunter root",
        ]
        assert c.show("hunter.service", "ActiveState")["ActiveState"] == "inactive"
        assert c.show("hunter-sandbox.service", "ActiveState")["ActiveState"] == "inactive"

        # A client's first request starts the daemon through the socket, and is answered.
        reply = c.run(sys.executable, "-c", _ping_script("/run/hunter/control.sock"))
        assert json.loads(reply.stdout)["ok"] is True, reply.stdout

        props = c.show(
            "hunter.service",
            "ActiveState",
            "SubState",
            "StatusText",
            "NRestarts",
            "MainPID",
            "WatchdogTimestampMonotonic",
        )
        assert (props["ActiveState"], props["SubState"]) == ("active", "running"), c.diagnostics()
        assert props["StatusText"], "the daemon sent no STATUS="
        assert props["NRestarts"] == "0", c.diagnostics()
        main_pid = props["MainPID"]

        # The daemon runs as user hunter without any capability.
        hunter_uid = c.run("id", "-u", "hunter").stdout.strip()
        status = _status_fields(c, main_pid)
        assert status["Uid"].split() == [hunter_uid] * 4, status["Uid"]
        assert status["Gid"].split() == [c.run("id", "-g", "hunter").stdout.strip()] * 4
        zero = "0000000000000000"
        caps = [status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
        assert caps == [zero] * 5, caps
        assert status["NoNewPrivs"] == "1"

        # StateDirectory/RuntimeDirectory reached the daemon through its config, and the
        # helper's socket through the unit's environment.
        environ = c.run("cat", f"/proc/{main_pid}/environ").stdout.split("\0")
        assert "STATE_DIRECTORY=/var/lib/hunter" in environ
        assert "RUNTIME_DIRECTORY=/run/hunter" in environ
        assert f"HUNTER_SANDBOX__HELPER_SOCKET={_HELPER_SOCKET}" in environ
        c.run("test", "-e", "/var/lib/hunter/state/turns.sqlite3")

        # The daemon's first request to the helper (its hello at start) started the root helper
        # through hunter-sandbox.socket (only the sockets were started), which answered.
        helper = c.show("hunter-sandbox.service", "ActiveState", "SubState", "MainPID")
        assert (helper["ActiveState"], helper["SubState"]) == ("active", "running"), helper
        assert _status_fields(c, helper["MainPID"])["Uid"].split() == ["0"] * 4
        _poll(
            "sandbox_helper_ready in the journal",
            lambda: "sandbox_helper_ready" in _event_names(c, "hunter-sandbox.service"),
        )
        assert "sandbox_helper_unreachable" not in _event_names(c)
        # The daemon's root is its user's; the helper's root is its own, root's.
        owner = c.run(
            "stat",
            "-c",
            "%a %U",
            "/var/lib/hunter",
            "/var/lib/hunter/state/turns.sqlite3",
            "/var/lib/hunter-sandbox",
        )
        assert owner.stdout.split("\n")[:3] == ["711 hunter", "640 hunter", "711 root"], (
            owner.stdout
        )

        # WATCHDOG=1 keeps arriving from the event loop (WatchdogSec=2s: a ping every 1 s).
        _poll(
            "a watchdog ping",
            lambda: _watchdog_pinged(c, props["WatchdogTimestampMonotonic"]),
            timeout_s=10,
        )

        # SIGHUP reloads without a restart (the daemon logs config_reloaded and keeps its pid).
        c.run("systemctl", "reload", "hunter.service")
        _poll("config_reloaded in the journal", lambda: "config_reloaded" in _event_names(c))
        after_reload = c.show("hunter.service", "ActiveState", "MainPID", "NRestarts")
        assert after_reload == {"ActiveState": "active", "MainPID": main_pid, "NRestarts": "0"}

        # A daemon that stops pinging (frozen with SIGSTOP) is killed by the watchdog and
        # restarted (Restart=on-failure); the new one serves through the same sockets.
        c.run("kill", "-STOP", main_pid)
        _poll(
            "the watchdog restart",
            lambda: (
                c.show("hunter.service", "NRestarts", "SubState")
                == {"NRestarts": "1", "SubState": "running"}
            ),
            timeout_s=20,
        )
        reply = c.run(sys.executable, "-c", _ping_script("/run/hunter/control.sock"))
        assert json.loads(reply.stdout)["ok"] is True, reply.stdout
        new_pid = c.show("hunter.service", "MainPID")["MainPID"]
        assert new_pid != main_pid
        watchdog_lines = c.run(
            "journalctl", "--no-pager", "-o", "cat", "-u", "hunter.service", "--grep", "[Ww]atchdog"
        ).stdout
        assert "Watchdog timeout" in watchdog_lines, watchdog_lines

        # SIGTERM (systemctl stop) drains and exits 0: Result=success.
        c.run("systemctl", "stop", "hunter.service", timeout_s=60)
        final = c.show(
            "hunter.service",
            "ActiveState",
            "Result",
            "ExecMainCode",
            "ExecMainStatus",
            "ExecMainPID",
        )
        assert final["ActiveState"] == "inactive", c.diagnostics()
        assert final["Result"] == "success", c.diagnostics()
        assert final["ExecMainPID"] == new_pid
        assert (final["ExecMainCode"], final["ExecMainStatus"]) == ("1", "0"), final

        # The journal holds JSON lines, one event each, with the daemon's lifecycle in it.
        _poll("daemon_stopped in the journal", lambda: "daemon_stopped" in _event_names(c))
        events = _journal_events(c)
        names = {str(e.get("event")) for e in events}
        assert {"daemon_ready", "shutdown_requested", "daemon_stopped"} <= names, sorted(names)
        assert all("timestamp" in e and "level" in e and "logger" in e for e in events)

        # The sockets stay with systemd, ready to start the daemon again.
        assert c.show("hunter.socket", "ActiveState") == {"ActiveState": "active"}

        # The unprivileged daemon runs a sandboxed process turn (uid drop, Landlock,
        # namespaces, rlimits) through the root helper; the client's first request starts the
        # daemon again through its socket.
        hunter = str(Path(sys.prefix) / "bin" / "hunter")
        control = ("--socket", "/run/hunter/control.sock")
        opened = c.run(hunter, "session", "open", "demo", *control, "--json")
        session_id = json.loads(opened.stdout)["session_id"]
        script = 'echo hello > "$HUNTER_OUTPUT_DIR/result.txt"'
        submit = (hunter, "submit", *control, "--session", session_id, "--wait", "--json")
        out = "--declare-output=result.txt:report"
        proc = c.run(*submit, out, "--", "sh", "-c", script, timeout_s=60, check=False)
        turn = json.loads(proc.stdout)
        stderr = [a.get("stderr") for a in turn.get("result", {}).get("attempts", [])]
        assert turn["state"] == "succeeded", (turn["state"], turn.get("reason_code"), stderr)

        # The output was promoted into the session's default workspace with the daemon's
        # file-system identity: the file belongs to user hunter, not to root or the turn's uid.
        promoted = f"/var/lib/hunter/workspace/{session_id}/result.txt"
        assert c.run("cat", promoted).stdout == "hello\n"
        assert c.run("stat", "-c", "%U %G", promoted).stdout.strip() == "hunter hunter"
        _console_under_systemd(c, share)
        c.run("systemctl", "stop", "hunter.service", timeout_s=60)

        # The helper stops cleanly (SIGTERM: its areas closed, exit 0); its socket stays.
        c.run("systemctl", "stop", "hunter-sandbox.service", timeout_s=60)
        stopped = c.show(
            "hunter-sandbox.service", "ActiveState", "Result", "ExecMainCode", "ExecMainStatus"
        )
        assert stopped == {
            "ActiveState": "inactive",
            "Result": "success",
            "ExecMainCode": "1",
            "ExecMainStatus": "0",
        }, c.diagnostics()
        _poll(
            "sandbox_helper_stopped in the journal",
            lambda: "sandbox_helper_stopped" in _event_names(c, "hunter-sandbox.service"),
        )
        assert c.show("hunter-sandbox.socket", "ActiveState") == {"ActiveState": "active"}
    assert c.nspawn.returncode == 0, (tmp_path / "nspawn.log").read_text()
