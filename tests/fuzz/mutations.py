"""Structure-aware mutations of valid wire messages (a helper of the fuzz tests; no tests here).

Generated values never reach the decoders' worst inputs: a JSON encoder only writes valid
UTF-8, msgspec only writes well-formed MessagePack. Here a valid message (a plain value:
dicts, lists, strings, numbers, as ``msgspec.to_builtins`` gives) is encoded once per place in
it, with that one place (every key, every value: strings, numbers, booleans, containers, the
root) replaced by a hostile token spliced in as raw bytes:

* `json_mutations`: strings holding bytes that are not UTF-8 (``\\xc0``, ``\\xff``, CESU
  surrogates, truncated and overlong sequences), JSON escapes of lone surrogates, NUL (raw and
  escaped), control characters, huge and malformed numbers (``2**64``, ``10**400``, ``1e400``,
  ``-0``, ``1.5``, ``NaN``, 100 000 digits), wrong types, nesting 10 000 deep, strings of
  100 000 characters. The message is encoded with a unique placeholder string at the place,
  and the placeholder's bytes are replaced by the token's.
* `msgpack_mutations`: the same for MessagePack, built by hand: str headers of every width
  around bytes that are not UTF-8, bin and ext (timestamps too) in place of a str, uint64/int64
  extremes, NaN and infinities, the never-used byte 0xc1, headers announcing more (or fewer)
  items or bytes than follow, nesting 10 000 deep, 100 000-byte strings.
* `byte_mutations`: a valid encoded body with bit flips, interesting bytes written or inserted,
  slices deleted or duplicated, and (small bodies) truncation at every offset, drawn from a
  seeded ``random.Random`` so that a run is reproducible.

Each `Mutation` carries a label that says what was done where (``$.params.session_id <-
str \\xc0``), so that a failure names its input.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import msgspec

__all__ = [
    "DEEP",
    "LONG",
    "Mutation",
    "byte_mutations",
    "encode_json",
    "encode_msgpack",
    "json_mutations",
    "msgpack_mutations",
]

#: Nesting depth of the deep tokens.
DEEP: Final = 10_000
#: Length of the long tokens (characters, or bytes).
LONG: Final = 100_000

Path = tuple[str | int, ...]

_HOLE: Final = "hole-5f0c2e9b7d"  # never in a message: asserted at each splice
_JSON_HOLE: Final = msgspec.json.encode(_HOLE)
_MSGPACK_HOLE: Final = msgspec.msgpack.encode(_HOLE)

# --- the hostile tokens ----------------------------------------------------------------------

#: Byte sequences that are not UTF-8 (each name says which rule it breaks).
INVALID_UTF8: Final[tuple[tuple[str, bytes], ...]] = (
    ("\\xc0 (never valid)", b"\xc0"),
    ("\\xff (never valid)", b"\xff"),
    ("\\xfe (never valid)", b"\xfe"),
    ("\\x80 (lone continuation)", b"\x80"),
    ("CESU high surrogate \\xed\\xa0\\x80", b"\xed\xa0\x80"),
    ("CESU low surrogate \\xed\\xbf\\xbf", b"\xed\xbf\xbf"),
    ("CESU surrogate pair", b"\xed\xa0\xbd\xed\xb8\x80"),
    ("truncated 3-byte \\xe2\\x82", b"\xe2\x82"),
    ("truncated 4-byte \\xf0\\x9f\\x98", b"\xf0\x9f\x98"),
    ("above U+10FFFF \\xf4\\x90\\x80\\x80", b"\xf4\x90\x80\x80"),
    ("5-byte form \\xf8\\x88\\x80\\x80\\x80", b"\xf8\x88\x80\x80\x80"),
    ("overlong / \\xc0\\xaf", b"\xc0\xaf"),
    ("overlong / \\xe0\\x80\\xaf", b"\xe0\x80\xaf"),
    ("overlong / \\xf0\\x80\\x80\\xaf", b"\xf0\x80\x80\xaf"),
    ("overlong NUL \\xc0\\x80", b"\xc0\x80"),
    ("overlong \\xc1\\xbf", b"\xc1\xbf"),
    ("valid then \\xc0", b"ok\xc0"),
)
#: What goes between the quotes of a JSON string: escapes of lone surrogates and bad escapes.
JSON_ESCAPES: Final[tuple[tuple[str, bytes], ...]] = (
    ("escaped lone high surrogate", rb"\ud800"),
    ("escaped lone low surrogate", rb"\udfff"),
    ("escaped high surrogate then A", rb"\ud800\u0041"),
    ("escaped reversed pair", rb"\udc00\ud800"),
    ("escaped two high surrogates", rb"\ud800\ud800"),
    ("escaped high surrogate, cut escape", rb"\ud800\u"),
    ("short \\u escape", rb"\u00"),
    ("\\x escape", rb"\x41"),
    ("lone backslash", b"\\"),
    ("escaped NUL", rb"\u0000"),
)
#: Raw bytes that are UTF-8 but are hostile inside a string.
CONTROL_BYTES: Final[tuple[tuple[str, bytes], ...]] = (
    ("raw NUL", b"\x00"),
    ("raw \\x01", b"\x01"),
    ("raw newline", b"\n"),
    ("raw DEL", b"\x7f"),
    ("U+FFFF", "\uffff".encode()),
    ("BOM", "\ufeff".encode()),
)
#: JSON numbers (valid and not) for any value.
JSON_NUMBERS: Final[tuple[bytes, ...]] = (
    b"18446744073709551616",  # 2**64
    b"18446744073709551615",  # 2**64 - 1
    b"9223372036854775808",  # 2**63
    b"9223372036854775807",
    b"-9223372036854775809",  # -2**63 - 1
    b"-9223372036854775808",
    b"1" + b"0" * 400,  # 10**400
    b"-1" + b"0" * 400,
    b"9" * LONG,  # beyond Python's int-from-string digit limit
    b"1e400",
    b"-1e400",
    b"1e-400",
    b"1e99999999999999999999",
    b"0." + b"0" * 1000 + b"1",
    b"-0",
    b"-0.0",
    b"0.0",
    b"1.5",
    b"1.0",
    b"1E2",
    b"0",
    b"-1",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"01",
    b"1.",
    b".5",
    b"+1",
    b"0x10",
    b"1e",
    b"--1",
)
JSON_OTHER: Final[tuple[tuple[str, bytes], ...]] = (
    ("null", b"null"),
    ("true", b"true"),
    ("false", b"false"),
    ("[]", b"[]"),
    ("{}", b"{}"),
    ('""', b'""'),
    ('"0"', b'"0"'),
    ("[null]", b"[null]"),
    ('{"":null}', b'{"":null}'),
    ("raw \\xc0 outside a string", b"\xc0"),
    ("unterminated string", b'"abc'),
    (f"arrays {DEEP} deep", b"[" * DEEP + b"]" * DEEP),
    (f"objects {DEEP} deep", b'{"a":' * DEEP + b"null" + b"}" * DEEP),
    (f"unclosed arrays {DEEP} deep", b"[" * DEEP),
    (f"string of {LONG} characters", b'"' + b"x" * LONG + b'"'),
    (f"string of {LONG} characters then \\xc0", b'"' + b"x" * LONG + b'\xc0"'),
    (f"string of {LONG} \\xff", b'"' + b"\xff" * LONG + b'"'),
    (f"string of {LONG // 6} escaped surrogates", b'"' + rb"\ud800" * (LONG // 6) + b'"'),
)

_MAX_U32: Final = b"\xff\xff\xff\xff"
#: MessagePack values for any place.
MSGPACK_OTHER: Final[tuple[tuple[str, bytes], ...]] = (
    ("nil", b"\xc0"),
    ("true", b"\xc3"),
    ("false", b"\xc2"),
    ("0", b"\x00"),
    ("-1", b"\xff"),
    ("[]", b"\x90"),
    ("{}", b"\x80"),
    ('""', b"\xa0"),
    ("reserved byte 0xc1", b"\xc1"),
    ("uint64 max", b"\xcf" + b"\xff" * 8),
    ("uint64 2**63", b"\xcf\x80" + b"\x00" * 7),
    ("int64 min", b"\xd3\x80" + b"\x00" * 7),
    ("int64 -1", b"\xd3" + b"\xff" * 8),
    ("uint8 255", b"\xcc\xff"),
    ("int8 -128", b"\xd0\x80"),
    ("float64 1.5", b"\xcb" + struct.pack(">d", 1.5)),
    ("float64 -0.0", b"\xcb" + struct.pack(">d", -0.0)),
    ("float64 inf", b"\xcb" + struct.pack(">d", float("inf"))),
    ("float64 -inf", b"\xcb" + struct.pack(">d", float("-inf"))),
    ("float64 nan", b"\xcb" + struct.pack(">d", float("nan"))),
    ("float64 1e308", b"\xcb" + struct.pack(">d", 1e308)),
    ("float32 1.5", b"\xca" + struct.pack(">f", 1.5)),
    ("float32 nan", b"\xca" + struct.pack(">f", float("nan"))),
    ("bin8 ok", b"\xc4\x02ok"),
    ("bin8 \\xc0", b"\xc4\x01\xc0"),
    ("bin16 empty", b"\xc5\x00\x00"),
    ("bin32 ok", b"\xc6\x00\x00\x00\x02ok"),
    ("fixext1 type 1", b"\xd4\x01\x00"),
    ("fixext4 timestamp32", b"\xd6\xff" + b"\x00\x00\x00\x01"),
    ("fixext8 timestamp64, nanoseconds > 1e9", b"\xd7\xff" + b"\xff" * 8),
    ("ext8 timestamp96", b"\xc7\x0c\xff" + b"\x00" * 4 + b"\x7f" + b"\xff" * 7),
    ("ext8 timestamp, bad length", b"\xc7\x05\xff" + b"\x00" * 5),
    ("ext8 type -128", b"\xc7\x01\x80\x00"),
    ("fixext16 type 5", b"\xd8\x05" + b"\x00" * 16),
    ("array32 announcing 2**32-1 items", b"\xdd" + _MAX_U32),
    ("map32 announcing 2**32-1 pairs", b"\xdf" + _MAX_U32),
    ("fixarray announcing 15 items", b"\x9f"),
    ("fixmap announcing 15 pairs", b"\x8f"),
    ("fixmap announcing 1 pair, none follows", b"\x81"),
    ("str32 announcing 4 GiB", b"\xdb" + _MAX_U32),
    ("str8 announcing 255 bytes", b"\xd9\xff"),
    ("bin32 announcing 4 GiB", b"\xc6" + _MAX_U32),
    ("ext32 announcing 4 GiB", b"\xc9" + _MAX_U32 + b"\x01"),
    ("truncated uint64", b"\xcf\xff"),
    ("truncated float64", b"\xcb\x00"),
    (f"arrays {DEEP} deep", b"\x91" * DEEP + b"\xc0"),
    (f"maps {DEEP} deep", b"\x81\xa1a" * DEEP + b"\xc0"),
    (f"fixarrays {DEEP} deep, unclosed", b"\x91" * DEEP),
    (f"str32 of {LONG} bytes", b"\xdb" + struct.pack(">I", LONG) + b"x" * LONG),
    (f"str32 of {LONG} \\xff", b"\xdb" + struct.pack(">I", LONG) + b"\xff" * LONG),
    (f"bin32 of {LONG} bytes", b"\xc6" + struct.pack(">I", LONG) + b"x" * LONG),
)


@dataclass(frozen=True, slots=True)
class Mutation:
    """One mutated body and what was done to make it (the label names the place)."""

    label: str
    body: bytes

    def show(self, limit: int = 300) -> str:
        """The label and the body's repr (its first ``limit`` bytes when it is longer)."""
        body = self.body
        if len(body) <= limit:
            return f"{self.label}: {body!r}"
        return f"{self.label}: {body[:limit]!r}... ({len(body)} bytes in all)"


def encode_json(value: object) -> bytes:
    """``value`` as compact JSON (the form the daemon's peers send)."""
    return msgspec.json.encode(value)


def encode_msgpack(value: object) -> bytes:
    """``value`` as MessagePack (the form of the sandbox helper's frames)."""
    return msgspec.msgpack.encode(value)


# --- walking a message -----------------------------------------------------------------------


def _places(value: object, path: Path = ()) -> Iterator[tuple[Path, bool, object]]:
    """Every place in ``value``: ``(path, is_key, what is there)``, the root first."""
    yield path, False, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key), True, key
            yield from _places(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _places(item, (*path, index))


def _with_hole(value: object, path: Path, *, key: bool) -> object:
    """A copy of ``value`` with the node at ``path`` (with ``key``: the key that leads to it)
    replaced by the placeholder string; key order is kept."""
    if not path:
        return _HOLE
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        out: dict[object, object] = {}
        for k, item in value.items():
            if k != head:
                out[k] = item
            elif key and not rest:
                out[_HOLE] = item
            else:
                out[k] = _with_hole(item, rest, key=key)
        return out
    if isinstance(value, list):
        return [
            _with_hole(item, rest, key=key) if i == head else item for i, item in enumerate(value)
        ]
    raise AssertionError(f"no place {path!r} in {value!r}")


def _where(path: Path, *, key: bool) -> str:
    text = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    return f"key of {text}" if key else text


def _splice(encoded: bytes, hole: bytes, token: bytes) -> bytes:
    if encoded.count(hole) != 1:
        raise AssertionError(f"the placeholder is not once in {encoded!r}")
    return encoded.replace(hole, token, 1)


# --- JSON ------------------------------------------------------------------------------------


def _json_string_tokens(original: str | None) -> Iterator[tuple[str, bytes]]:
    """Hostile JSON strings: each hostile content alone, and after ``original``'s text."""
    prefix = b"" if original is None else msgspec.json.encode(original)[1:-1]
    for name, inner in (*INVALID_UTF8, *JSON_ESCAPES, *CONTROL_BYTES):
        yield f"str {name}", b'"' + inner + b'"'
        if prefix:
            yield f"str {original!r} + {name}", b'"' + prefix + inner + b'"'


def json_mutations(message: object) -> Iterator[Mutation]:
    """``message`` as JSON with one place at a time made hostile (see the module docstring)."""
    for path, is_key, there in _places(message):
        encoded = encode_json(_with_hole(message, path, key=is_key))
        where = _where(path, key=is_key)
        original = there if isinstance(there, str) else None
        tokens: list[tuple[str, bytes]] = list(_json_string_tokens(original))
        if is_key:
            tokens.append((f"key of {LONG} characters", b'"' + b"k" * LONG + b'"'))
            tokens.extend(("number key", n) for n in (b"1", b"1e400"))
        else:
            tokens.extend((f"number {n[:24].decode()}", n) for n in JSON_NUMBERS)
            tokens.extend(JSON_OTHER)
        for name, token in tokens:
            yield Mutation(f"json {where} <- {name}", _splice(encoded, _JSON_HOLE, token))


# --- MessagePack -----------------------------------------------------------------------------


def _msgpack_str(raw: bytes, width: int | None = None) -> bytes:
    """A MessagePack str of ``raw`` (no UTF-8 check): fixstr/str8/str16/str32 by ``width``
    (0 for fixstr; the smallest that fits when None)."""
    size = len(raw)
    if width is None:
        width = 0 if size < 32 else 8 if size < 256 else 16 if size < 65_536 else 32
    if width == 0:
        return bytes([0xA0 | size]) + raw
    if width == 8:
        return b"\xd9" + struct.pack(">B", size) + raw
    if width == 16:
        return b"\xda" + struct.pack(">H", size) + raw
    return b"\xdb" + struct.pack(">I", size) + raw


def _msgpack_bin(raw: bytes) -> bytes:
    """A MessagePack bin of ``raw`` (the smallest header that fits)."""
    size = len(raw)
    if size < 256:
        return b"\xc4" + struct.pack(">B", size) + raw
    if size < 65_536:
        return b"\xc5" + struct.pack(">H", size) + raw
    return b"\xc6" + struct.pack(">I", size) + raw


def _msgpack_string_tokens(original: str | None) -> Iterator[tuple[str, bytes]]:
    """Hostile MessagePack strs: each hostile content alone (every header width) and after
    ``original``'s bytes; the same content as bin."""
    prefix = b"" if original is None else original.encode()
    for name, raw in (*INVALID_UTF8, *CONTROL_BYTES):
        for width in (0, 8, 16, 32):
            yield f"str{width or 'fix'} {name}", _msgpack_str(raw, width)
        yield f"bin {name}", _msgpack_bin(raw)
        if prefix:
            yield f"str {original!r} + {name}", _msgpack_str(prefix + raw)
    if prefix:
        yield f"bin of {original!r}", _msgpack_bin(prefix)
    if 0 < len(prefix) < 255:
        for delta in (-1, 1):
            announced = bytes([len(prefix) + delta])
            yield f"str8 of {original!r}, length {delta:+d}", b"\xd9" + announced + prefix


def _recount(encoded: bytes, delta: int) -> bytes | None:
    """``encoded`` (one map or array) with its header announcing ``delta`` more items, as a
    32-bit header; None when it is not a container."""
    first = encoded[0]
    if 0x80 <= first <= 0x8F:
        kind, count, rest = b"\xdf", first & 0x0F, encoded[1:]
    elif 0x90 <= first <= 0x9F:
        kind, count, rest = b"\xdd", first & 0x0F, encoded[1:]
    elif first in (0xDC, 0xDE):
        kind = b"\xdd" if first == 0xDC else b"\xdf"
        count, rest = struct.unpack(">H", encoded[1:3])[0], encoded[3:]
    elif first in (0xDD, 0xDF):
        kind, count, rest = encoded[:1], struct.unpack(">I", encoded[1:5])[0], encoded[5:]
    else:
        return None
    if count + delta < 0:
        return None
    return kind + struct.pack(">I", count + delta) + rest


def msgpack_mutations(message: object) -> Iterator[Mutation]:
    """``message`` as MessagePack with one place at a time made hostile (see the module
    docstring)."""
    for path, is_key, there in _places(message):
        encoded = encode_msgpack(_with_hole(message, path, key=is_key))
        where = _where(path, key=is_key)
        original = there if isinstance(there, str) else None
        tokens: list[tuple[str, bytes]] = list(_msgpack_string_tokens(original))
        tokens.extend(MSGPACK_OTHER)
        if not is_key and isinstance(there, dict | list) and there:
            sub = encode_msgpack(there)
            for delta in (1, -1, 2**20):
                recounted = _recount(sub, delta)
                if recounted is not None:
                    tokens.append((f"header announcing {delta:+d} items", recounted))
        for name, token in tokens:
            yield Mutation(f"msgpack {where} <- {name}", _splice(encoded, _MSGPACK_HOLE, token))


# --- bytes -----------------------------------------------------------------------------------

#: Bytes that mean something to a JSON or MessagePack decoder.
_INTERESTING: Final = b'\x00\xff\xc0\xc1\x80\x7f"\\{}[]:,0-eE.\x90\x80\xdd\xdf\xdb\xcf\xd9'


def byte_mutations(
    body: bytes, rng: random.Random, *, count: int, truncate_below: int = 2048
) -> Iterator[Mutation]:
    """``count`` random byte-level mutations of ``body`` (bit flips, interesting bytes written
    or inserted, slices deleted or duplicated, junk appended), then, when ``body`` is shorter
    than ``truncate_below``, every proper prefix of it. ``rng`` makes it reproducible."""
    size = len(body)
    for _ in range(count):
        choice = rng.randrange(7)
        pos = rng.randrange(size) if size else 0
        if choice == 0 and size:
            bit = rng.randrange(8)
            out = body[:pos] + bytes([body[pos] ^ (1 << bit)]) + body[pos + 1 :]
            label = f"bytes: flip bit {bit} of byte {pos}"
        elif choice == 1 and size:
            byte = _INTERESTING[rng.randrange(len(_INTERESTING))]
            out = body[:pos] + bytes([byte]) + body[pos + 1 :]
            label = f"bytes: byte {pos} := {byte:#04x}"
        elif choice == 2:
            byte = _INTERESTING[rng.randrange(len(_INTERESTING))]
            out = body[:pos] + bytes([byte]) + body[pos:]
            label = f"bytes: insert {byte:#04x} at {pos}"
        elif choice == 3:
            length = min(rng.randint(1, 16), size - pos) or 1
            out = body[:pos] + body[pos + length :]
            label = f"bytes: delete {length} at {pos}"
        elif choice == 4:
            length = min(rng.randint(1, 32), size - pos)
            at = rng.randrange(size + 1)
            out = body[:at] + body[pos : pos + length] + body[at:]
            label = f"bytes: copy {length} from {pos} to {at}"
        elif choice == 5:
            junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            out = body + junk
            label = f"bytes: append {junk!r}"
        else:
            flips = rng.randint(2, 8)
            data = bytearray(body)
            for _ in range(flips):
                if data:
                    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            out = bytes(data)
            label = f"bytes: {flips} random bit flips"
        yield Mutation(label, out)
    if size < truncate_below:
        for cut in range(size):
            yield Mutation(f"bytes: first {cut} of {size}", body[:cut])
