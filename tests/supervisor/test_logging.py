"""Structured logging: JSON lines, the console renderer, ids from contextvars, stdlib routing."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import orjson
import pytest
import structlog

from supervisor.logging import bind_ids, configure_logging, get_logger, reset_logging

_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    """Every test starts and ends with logging unconfigured."""
    reset_logging()
    yield
    reset_logging()


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


def test_json_line_fields_and_order() -> None:
    """A JSON event starts with timestamp, level, logger, event, then its own fields."""
    stream = io.StringIO()
    configure_logging(fmt="json", level="info", stream=stream)
    get_logger("supervisor.test").info("turn_accepted", turn_number=3, path=Path("/x"))
    (event,) = _lines(stream)
    assert list(event)[:4] == ["timestamp", "level", "logger", "event"]
    assert _TIMESTAMP.match(str(event["timestamp"]))
    assert event["level"] == "info"
    assert event["logger"] == "supervisor.test"
    assert event["event"] == "turn_accepted"
    assert event["turn_number"] == 3
    assert event["path"] == "/x"


def test_level_filtering_and_reconfiguration() -> None:
    """Events below the level are dropped; reconfiguring changes it for existing loggers."""
    stream = io.StringIO()
    configure_logging(fmt="json", level="warning", stream=stream)
    log = get_logger("x")
    log.info("dropped")
    log.warning("kept")
    configure_logging(fmt="json", level="debug", stream=stream)
    log.debug("now_kept")
    assert [e["event"] for e in _lines(stream)] == ["kept", "now_kept"]


def test_bind_ids_adds_and_removes_ids() -> None:
    """Ids bound in a context appear on every event inside it, and only there; None is skipped."""
    stream = io.StringIO()
    configure_logging(fmt="json", stream=stream)
    log = get_logger("x")
    with bind_ids(session_id="SES-1", turn_number=2, executor_id=None):
        log.info("inside")
        with bind_ids(attempt=1):
            log.info("nested")
    log.info("outside")
    inside, nested, outside = _lines(stream)
    assert inside["session_id"] == "SES-1"
    assert inside["turn_number"] == 2
    assert "executor_id" not in inside
    assert nested["attempt"] == 1
    assert nested["session_id"] == "SES-1"
    assert "session_id" not in outside
    assert "attempt" not in outside


async def test_bound_ids_follow_tasks() -> None:
    """Ids bound before starting a task are seen by that task; its own binds stay in it."""
    stream = io.StringIO()
    configure_logging(fmt="json", stream=stream)
    log = get_logger("x")

    async def worker(n: int) -> None:
        with bind_ids(attempt=n):
            log.info("in_task")

    with bind_ids(session_id="SES-2"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker, 1)
            tg.start_soon(worker, 2)
    log.info("after")
    events = _lines(stream)
    assert sorted(int(str(e.get("attempt", 0))) for e in events[:2]) == [1, 2]
    assert all(e["session_id"] == "SES-2" for e in events[:2])
    assert "session_id" not in events[2]


def test_stdlib_logging_is_routed() -> None:
    """Records from the standard library go through the same processors and level."""
    stream = io.StringIO()
    configure_logging(fmt="json", level="info", stream=stream)
    with bind_ids(session_id="SES-3"):
        logging.getLogger("thirdparty").warning("disk %s", "full")
    logging.getLogger("thirdparty").debug("dropped")
    (event,) = _lines(stream)
    assert event["logger"] == "thirdparty"
    assert event["level"] == "warning"
    assert event["event"] == "disk full"
    assert event["session_id"] == "SES-3"


def test_structlog_get_logger_uses_the_configuration() -> None:
    """Packages calling structlog.get_logger(name) directly (the ledger) get the same output."""
    stream = io.StringIO()
    configure_logging(fmt="json", stream=stream)
    structlog.get_logger("ledger").info("ledger_opened", seq=0)
    (event,) = _lines(stream)
    assert event["logger"] == "ledger"
    assert event["event"] == "ledger_opened"


def test_exception_is_rendered_in_json() -> None:
    """log.exception() adds the traceback as one string field."""
    stream = io.StringIO()
    configure_logging(fmt="json", stream=stream)
    try:
        _ = 1 // 0
    except ZeroDivisionError:
        get_logger("x").exception("step_failed")
    (event,) = _lines(stream)
    assert event["level"] == "error"
    assert "ZeroDivisionError" in str(event["exception"])


def test_auto_format_picks_console_on_a_tty() -> None:
    """fmt='auto' renders for humans on a tty and JSON otherwise."""
    tty = _Tty()
    configure_logging(fmt="auto", stream=tty)
    get_logger("x").info("daemon_ready", sockets=2)
    text = tty.getvalue()
    assert "daemon_ready" in text
    assert not text.startswith("{")
    pipe = io.StringIO()
    configure_logging(fmt="auto", stream=pipe)
    get_logger("x").info("daemon_ready")
    assert _lines(pipe)[0]["event"] == "daemon_ready"


def test_console_format_on_a_pipe_has_no_colours() -> None:
    """fmt='console' without a tty is readable and free of escape codes."""
    stream = io.StringIO()
    configure_logging(fmt="console", stream=stream)
    get_logger("x").warning("heartbeat_missed", executor_id="ex-1")
    text = stream.getvalue()
    assert "heartbeat_missed" in text
    assert "executor_id=ex-1" in text
    assert "\x1b[" not in text


def test_default_stream_is_current_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a stream, events go to sys.stdout as it is at write time."""
    configure_logging(fmt="json")
    get_logger("x").info("to_stdout")
    assert orjson.loads(capsys.readouterr().out)["event"] == "to_stdout"


def test_invalid_arguments() -> None:
    """Unknown levels and formats are refused."""
    with pytest.raises(ValueError, match=r"^unknown log level 'loud'"):
        configure_logging(fmt="json", level="loud")
    with pytest.raises(ValueError, match=r"^unknown log format 'xml'"):
        configure_logging(fmt="xml", level="info")  # type: ignore[arg-type]  # runtime check
