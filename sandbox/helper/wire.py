"""The sandbox helper's messages: typed, frozen, checked in one step at decode.

A frame is a 4-byte big-endian length and a MessagePack body. The daemon sends one request
per frame and waits for its reply; a connection carries one request at a time, and closing it
cancels the request in flight (a confined run is killed). A message that decodes is valid:
`decode_request` raises `HelperWireError` (with what was wrong) for anything else.
"""

from __future__ import annotations

import struct
from typing import Annotated, Final

import msgspec
from msgspec import Meta, Struct

from sandbox.enumerate import RealizedWrite, SurfaceProblem
from sandbox.policy.attempts import AttemptOutcome
from sandbox.policy.declarations import DeclaredOutput
from sandbox.promote import PromotedOutput
from sandbox.runs import ProcessAttempt
from sandbox.session_ids import SESSION_ID_RE

__all__ = [
    "MAX_FRAME",
    "PROTOCOL_VERSION",
    "Close",
    "Confine",
    "Done",
    "Empty",
    "Failed",
    "Hello",
    "HelperWireError",
    "Levels",
    "Open",
    "Opened",
    "Promote",
    "Promoted",
    "Ran",
    "Reply",
    "Request",
    "Reset",
    "Run",
    "SessionSpec",
    "Violation",
    "Welcome",
    "decode_reply",
    "decode_request",
    "encode",
    "frame_length",
]

PROTOCOL_VERSION: Final = 1
#: Largest frame either side sends or accepts (a run's reply carries its capped output).
MAX_FRAME: Final = 16 << 20
_HEADER: Final = struct.Struct(">I")
HEADER_SIZE: Final = _HEADER.size

_SessionId = Annotated[str, Meta(min_length=1, max_length=128, pattern=SESSION_ID_RE.pattern)]
_Path = Annotated[str, Meta(min_length=1, max_length=4096, pattern=r"^/")]
_Arg = Annotated[str, Meta(max_length=1 << 17)]


class HelperWireError(ValueError):
    """A frame that is not a valid helper message (what was wrong, and where)."""


class SessionSpec(Struct, frozen=True, kw_only=True):
    """What the helper needs to build a session's confined area."""

    session_id: _SessionId
    package_id: Annotated[str, Meta(min_length=1, max_length=256)]
    package_dir: _Path
    #: the package's manifest (`Manifest.to_dict`); the helper parses it again
    manifest: dict[str, object]
    workspace: _Path
    #: the daemon's own trees and sockets: no turn may touch them either
    forbidden: tuple[Annotated[str, Meta(max_length=4096)], ...] = ()
    #: the values of the manifest's ``env_allow`` names in the daemon's environment
    env: dict[str, str] = {}
    #: the daemon that opened it (its root directory): a `Reset` of that daemon closes it
    owner: _Path = "/"


class Request(Struct, frozen=True, kw_only=True, tag_field="op"):
    """One request of the daemon."""


class Hello(Request, frozen=True, kw_only=True, tag="hello"):
    """What the helper enforces on this machine (asked at the daemon's start)."""


class Reset(Request, frozen=True, kw_only=True, tag="reset"):
    """A daemon starts: close every area a previous run of it (the same *owner*, its root)
    left open, their processes killed. Other daemons' areas stay. The sessions it resumes
    open theirs again."""

    owner: _Path


class Open(Request, frozen=True, kw_only=True, tag="open"):
    """Open (or, when the helper has it, open again) a session's confined area."""

    session: SessionSpec


class Confine(Request, frozen=True, kw_only=True, tag="confine"):
    session_id: _SessionId


class Run(Request, frozen=True, kw_only=True, tag="run"):
    session_id: _SessionId
    exe: _Path
    argv: Annotated[tuple[_Arg, ...], Meta(min_length=1, max_length=4096)]
    declared: tuple[DeclaredOutput, ...]
    turn: Annotated[int, Meta(ge=1, le=2**62)]
    attempt_no: Annotated[int, Meta(ge=1, le=1_000_000)]
    timeout_s: Annotated[float, Meta(gt=0, le=7 * 86_400)]


class Promote(Request, frozen=True, kw_only=True, tag="promote"):
    """Promote files of the session's last run: by path only. The helper promotes what its
    own enumeration found, never a file the daemon names otherwise."""

    session_id: _SessionId
    paths: tuple[Annotated[str, Meta(min_length=1, max_length=4096)], ...]
    workspace: _Path


class Empty(Request, frozen=True, kw_only=True, tag="empty"):
    session_id: _SessionId


class Close(Request, frozen=True, kw_only=True, tag="close"):
    session_id: _SessionId


class Reply(Struct, frozen=True, kw_only=True, tag_field="reply"):
    """One reply of the helper."""


class Welcome(Reply, frozen=True, kw_only=True, tag="welcome"):
    version: int
    levels: dict[str, str]
    missing: dict[str, str]
    root: str


class Opened(Reply, frozen=True, kw_only=True, tag="opened"):
    tmp_dir: str
    output_dir: str
    uid: int
    gid: int


class Levels(Reply, frozen=True, kw_only=True, tag="levels"):
    levels: dict[str, str]


class Violation(Struct, frozen=True, kw_only=True):
    """A `CapabilityViolation` found in a run (its fields)."""

    operation: str
    target: str
    capability: str
    session_id: str
    turn_number: int
    detail: str = ""


class Ran(Reply, frozen=True, kw_only=True, tag="ran"):
    #: the session's enforcement levels (as `Levels`), so that later turns need not ask
    levels: dict[str, str]
    record: ProcessAttempt
    outcome: AttemptOutcome
    writes: tuple[RealizedWrite, ...]
    problems: tuple[SurfaceProblem, ...]
    violations: tuple[Violation, ...]


class Promoted(Reply, frozen=True, kw_only=True, tag="promoted"):
    outputs: tuple[PromotedOutput, ...]


class Done(Reply, frozen=True, kw_only=True, tag="done"):
    pass


class Failed(Reply, frozen=True, kw_only=True, tag="failed"):
    """A request the helper could not do. ``kind``: ``bad_request``, ``forbidden``,
    ``unknown_session`` (open it first), ``promotion`` (an output refused), ``os`` (an I/O
    error, ``errno`` set), ``unavailable`` (a mechanism is missing), ``internal``."""

    kind: str
    message: str
    errno: int = 0


_request_decoder: Final = msgspec.msgpack.Decoder(
    Hello | Reset | Open | Confine | Run | Promote | Empty | Close
)
_reply_decoder: Final = msgspec.msgpack.Decoder(
    Welcome | Opened | Levels | Ran | Promoted | Done | Failed
)
_encoder: Final = msgspec.msgpack.Encoder()


def encode(message: Request | Reply) -> bytes:
    """The frame of *message* (header and body)."""
    body = _encoder.encode(message)
    if len(body) > MAX_FRAME:
        raise HelperWireError(
            f"a {type(message).__name__} of {len(body)} bytes exceeds the frame limit"
        )
    return _HEADER.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """The body length a header announces; `HelperWireError` above `MAX_FRAME`."""
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME:
        raise HelperWireError(f"frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    return int(length)


def decode_request(body: bytes) -> Request:
    try:
        return _request_decoder.decode(body)  # type: ignore[no-any-return]
    except RecursionError:  # msgspec's answer to data nested too deep
        raise HelperWireError("not a helper request: nested too deep") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise HelperWireError(f"not a helper request: {exc}") from None
    except UnicodeError as exc:  # msgspec's answer to a str that is not UTF-8
        raise HelperWireError(f"not a helper request: a string is not UTF-8 ({exc})") from None
    except Exception as exc:  # anything unforeseen in a body is a bad frame, never a crash
        raise HelperWireError(f"not a helper request: {type(exc).__name__}: {exc}") from None


def decode_reply(body: bytes) -> Reply:
    try:
        return _reply_decoder.decode(body)  # type: ignore[no-any-return]
    except RecursionError:
        raise HelperWireError("not a helper reply: nested too deep") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise HelperWireError(f"not a helper reply: {exc}") from None
    except UnicodeError as exc:  # msgspec's answer to a str that is not UTF-8
        raise HelperWireError(f"not a helper reply: a string is not UTF-8 ({exc})") from None
    except Exception as exc:  # anything unforeseen in a body is a bad frame, never a crash
        raise HelperWireError(f"not a helper reply: {type(exc).__name__}: {exc}") from None
