"""Structured logging for the daemon and the CLI: structlog, one event per state transition.

`configure_logging(fmt=..., level=...)` sets the output once per process (and again on SIGHUP
reload): JSON lines (orjson) for journald and pipes, structlog's ConsoleRenderer on a tty.
Every event carries `timestamp` (ISO 8601, UTC, microseconds), `level`, `logger`, `event`, the
ids bound with `bind_ids(...)` (contextvars) and its own fields. Records from the standard
library's `logging` (third-party libraries) go through the same processors, so the output is one
consistent stream. The event catalogue is docs/logging.md.

Design: the processors are plain functions and read the module's current settings, so loggers
obtained (and cached) before a reconfiguration follow the new level, format and stream. Level
filtering is the first processor: a dropped event costs one function call.
"""

from __future__ import annotations

import contextlib
import logging as _stdlib_logging
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, TextIO, cast

import orjson
import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

__all__ = [
    "ID_KEYS",
    "LEVELS",
    "add_level",
    "add_logger_name",
    "add_timestamp",
    "bind_ids",
    "configure_logging",
    "describe_error",
    "drop_below_level",
    "get_logger",
    "info_enabled",
    "render",
    "reset_logging",
]

LogFormat = Literal["auto", "json", "console"]

# The ids every event should carry when known (STYLE item 7).
ID_KEYS: Final = ("session_id", "turn_number", "instruction_id", "executor_id", "attempt")

LEVELS: Final[dict[str, int]] = {
    "debug": _stdlib_logging.DEBUG,
    "info": _stdlib_logging.INFO,
    "warning": _stdlib_logging.WARNING,
    "error": _stdlib_logging.ERROR,
    "critical": _stdlib_logging.CRITICAL,
}
# structlog method names that are not level names.
_METHOD_LEVEL: Final[dict[str, str]] = {
    "warn": "warning",
    "exception": "error",
    "fatal": "critical",
    "msg": "info",
    "err": "error",
}


@dataclass(slots=True)
class _Settings:
    level: int = _stdlib_logging.INFO
    json: bool = True
    stream: TextIO | None = None  # None: sys.stdout at write time (follows pytest's capture)
    console: structlog.dev.ConsoleRenderer | None = None


_settings = _Settings()
_write_lock = threading.Lock()
_bridge: _StdlibBridge | None = None


def info_enabled() -> bool:
    """Whether ``info`` events are written at the level in force. Loggers are cached with
    every level enabled (a reload changes the level in place, `drop_below_level` applies it),
    so an ``info`` event below the level still costs its processors: the turn's hot path
    (an event or three per turn) asks this first."""
    return _settings.level <= _stdlib_logging.INFO


# --- processors (plain functions) -----------------------------------------------------------------


def drop_below_level(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Drop the event (structlog.DropEvent) when its level is below the configured one."""
    level = _METHOD_LEVEL.get(method_name, method_name)
    if LEVELS.get(level, _stdlib_logging.INFO) < _settings.level:
        raise structlog.DropEvent
    return event_dict


def add_timestamp(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Add `timestamp`: ISO 8601 in UTC with microseconds, e.g. 2026-01-02T03:04:05.678901Z."""
    if "timestamp" not in event_dict:
        now = datetime.now(UTC)
        event_dict["timestamp"] = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return event_dict


def add_level(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Add `level` (debug, info, warning, error, critical) from the method called."""
    if "level" not in event_dict:
        event_dict["level"] = _METHOD_LEVEL.get(method_name, method_name)
    return event_dict


def add_logger_name(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Add `logger`: the name given to `get_logger(name)` / `structlog.get_logger(name)`."""
    if "logger" not in event_dict:
        event_dict["logger"] = getattr(logger, "name", "") or "hunter"
    return event_dict


_FIRST: Final = ("timestamp", "level", "logger", "event")


def render(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> str:
    """The last processor: a JSON line (orjson) or the console rendering, as configured."""
    if not _settings.json and _settings.console is not None:
        return _settings.console(logger, method_name, event_dict)
    exc_info = event_dict.pop("exc_info", None)
    if exc_info:
        event_dict["exception"] = _format_exception(exc_info)
    stack = event_dict.pop("stack_info", None)
    if stack:
        event_dict["stack"] = "".join(traceback.format_stack())
    ordered = {k: event_dict[k] for k in _FIRST if k in event_dict}
    ordered.update(event_dict)
    return orjson.dumps(ordered, default=_default, option=orjson.OPT_NON_STR_KEYS).decode()


def _format_exception(exc_info: object) -> str:
    if isinstance(exc_info, BaseException):
        return "".join(traceback.format_exception(exc_info)).rstrip()
    if isinstance(exc_info, tuple):
        return "".join(traceback.format_exception(*exc_info)).rstrip()
    current = sys.exc_info()
    if current[1] is not None:
        return "".join(traceback.format_exception(*current)).rstrip()
    return ""


def _default(obj: object) -> object:
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    return str(obj)


# --- the sink ---------------------------------------------------------------------------------


class _Sink:
    """The wrapped logger: writes one rendered line per event and flushes (journald, pipes)."""

    __slots__ = ("name",)

    def __init__(self, name: str = "") -> None:
        self.name = name

    def msg(self, message: str) -> None:
        stream = _settings.stream if _settings.stream is not None else sys.stdout
        with _write_lock:
            stream.write(message + "\n")
            stream.flush()

    log = debug = info = warning = warn = error = err = critical = fatal = exception = msg


def _sink_factory(*args: Any) -> _Sink:
    return _Sink(str(args[0]) if args else "")


_PROCESSORS: Final[list[Processor]] = [
    drop_below_level,
    structlog.contextvars.merge_contextvars,
    add_level,
    add_logger_name,
    add_timestamp,
    render,
]


# --- the stdlib bridge ------------------------------------------------------------------------


class _StdlibBridge(_stdlib_logging.Handler):
    """Feeds standard-library log records into the structlog processors."""

    def emit(self, record: _stdlib_logging.LogRecord) -> None:
        try:
            fields: dict[str, object] = {}
            if record.exc_info and record.exc_info[1] is not None:
                fields["exc_info"] = record.exc_info[1]
            logger = cast("FilteringBoundLogger", structlog.get_logger(record.name))
            logger.log(record.levelno, record.getMessage(), **fields)
        except Exception:  # logging must never take the daemon down
            self.handleError(record)


# --- public API -------------------------------------------------------------------------------


def configure_logging(
    *, fmt: LogFormat = "auto", level: str = "info", stream: TextIO | None = None
) -> None:
    """Set where and how events are written; safe to call again (SIGHUP reload, tests).

    `fmt`: "json" (JSON lines), "console" (readable, colours on a tty) or "auto" (console when
    the stream is a tty, else JSON). `level`: debug, info, warning, error, critical.
    `stream`: a text stream; None writes to the current `sys.stdout`.
    """
    global _bridge
    if level not in LEVELS:
        msg = f"unknown log level {level!r}; expected one of {', '.join(LEVELS)}"
        raise ValueError(msg)
    if fmt not in ("auto", "json", "console"):
        msg = f"unknown log format {fmt!r}; expected auto, json or console"
        raise ValueError(msg)
    target = stream if stream is not None else sys.stdout
    is_tty = _isatty(target)
    use_json = fmt == "json" or (fmt == "auto" and not is_tty)
    _settings.level = LEVELS[level]
    _settings.json = use_json
    _settings.stream = stream
    _settings.console = None if use_json else structlog.dev.ConsoleRenderer(colors=is_tty)
    structlog.configure(
        processors=_PROCESSORS,
        wrapper_class=structlog.make_filtering_bound_logger(_stdlib_logging.DEBUG),
        context_class=dict,
        logger_factory=_sink_factory,
        cache_logger_on_first_use=True,
    )
    root = _stdlib_logging.getLogger()
    if _bridge is None:
        _bridge = _StdlibBridge()
        root.addHandler(_bridge)
    root.setLevel(_settings.level)


def reset_logging() -> None:
    """Undo `configure_logging` (for tests): structlog defaults, no stdlib bridge, no ids bound."""
    global _bridge
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    if _bridge is not None:
        _stdlib_logging.getLogger().removeHandler(_bridge)
        _bridge = None
    _stdlib_logging.getLogger().setLevel(_stdlib_logging.WARNING)
    _settings.level = _stdlib_logging.INFO
    _settings.json = True
    _settings.stream = None
    _settings.console = None


def get_logger(name: str = "hunter", **initial: object) -> FilteringBoundLogger:
    """A structlog logger whose events carry `logger=name` (and `initial` fields)."""
    return cast("FilteringBoundLogger", structlog.get_logger(name, **initial))


@contextlib.contextmanager
def bind_ids(**ids: object) -> Iterator[None]:
    """Bind ids (session_id, turn_number, instruction_id, executor_id, attempt, ...) to every
    event logged in this context (and in tasks started from it); None values are skipped."""
    present = {k: v for k, v in ids.items() if v is not None}
    with structlog.contextvars.bound_contextvars(**present):
        yield


def _isatty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    if isatty is None:
        return False
    try:
        return bool(isatty())
    except (OSError, ValueError):  # closed or detached stream
        return False


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of *exc* for a log line; for an exception group (what an anyio task
    group raises, whatever the number of its errors), of each error inside it."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe_error(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"
