"""A real `hunter sandbox-helper` process for tests (started as root, like its unit)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["HelperProcess"]


class HelperProcess:
    """``hunter sandbox-helper --root ROOT --socket SOCK --allow-user UID...`` in the background."""

    def __init__(self, root: Path, socket_path: Path, allow: tuple[int, ...], log: Path) -> None:
        self.root = root
        self.socket_path = socket_path
        self.allow = allow
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.offset = 0

    def start(self, *, timeout_s: float = 20.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HUNTER_", "LISTEN_"))}
        env.pop("NOTIFY_SOCKET", None)
        argv = [sys.executable, "-m", "supervisor", "sandbox-helper", "--log-format", "json"]
        argv += ["--root", str(self.root), "--socket", str(self.socket_path)]
        for uid in self.allow:
            argv += ["--allow-user", str(uid)]
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        #: where this run's lines begin in the log (a restart appends)
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out, env=env)
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the helper did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)

    def ready(self) -> bool:
        return (
            b"sandbox_helper_ready" in self.log.read_bytes()[-65536:] and self.socket_path.exists()
        )

    def stop(self, sig: signal.Signals = signal.SIGTERM, *, timeout_s: float = 20.0) -> int:
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def restart(self) -> None:
        """A new helper process on the same root and socket (its lines appended to the log)."""
        self.start()
