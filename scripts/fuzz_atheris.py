"""Coverage-guided fuzzing of the wire decoders with atheris (optional: ``pip install -e .[fuzz]``).

Not a test (CI fails on skipped tests, and atheris may not install everywhere); the hypothesis
fuzz tests in ``tests/fuzz/`` are the ones CI runs. Usage::

    .venv/bin/python scripts/fuzz_atheris.py control  -runs=200000
    .venv/bin/python scripts/fuzz_atheris.py executor -max_total_time=60

Targets: ``control`` (``decode_request``), ``executor`` (``decode_hello`` and
``decode_executor_message``), ``frames`` (``decode_body``). Any exception other than the
documented ones is a crash that atheris reports with the input that caused it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import atheris

with atheris.instrument_imports():
    from supervisor.errors import ProtocolError
    from supervisor.wire.control import RequestDecodeError, decode_request
    from supervisor.wire.executor import decode_executor_message, decode_hello
    from supervisor.wire.frames import FrameDecodeError, decode_body


def _control(data: bytes) -> None:
    with contextlib.suppress(RequestDecodeError, FrameDecodeError):
        decode_request(data)


def _executor(data: bytes) -> None:
    for decode in (decode_hello, decode_executor_message):
        with contextlib.suppress(ProtocolError, FrameDecodeError):
            decode(data)


def _frames(data: bytes) -> None:
    with contextlib.suppress(FrameDecodeError):
        decode_body(data)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "control": _control,
    "executor": _executor,
    "frames": _frames,
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: fuzz_atheris.py {{{'|'.join(TARGETS)}}} [libFuzzer options]")
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
