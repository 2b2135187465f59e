"""PostgreSQL connection strings in the configuration: parsed, checked, described. No I/O.

`store.dsn` is a libpq URI (``postgresql://user@host:5432/db?sslmode=require``) or a libpq
keyword string (``host=/run/postgresql port=5432 dbname=hunter user=hunter``). It never holds a
password: `dsn_problem` says why one is refused; the password comes from `store.password_file`
or libpq's own mechanisms (``PGPASSFILE`` / ``~/.pgpass``, ``PGPASSWORD``), which the driver
reads as usual. `to_uri` turns either form into the URI the driver takes; `with_password` adds
the password read at start; `describe` names the server, port, database and user for messages.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

__all__ = ["describe", "dsn_problem", "parse_keywords", "to_uri", "with_password"]

_SCHEMES: Final = ("postgresql://", "postgres://")
_KEYWORD: Final = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*")
#: keywords a URI carries in its authority and path rather than its query
_AUTHORITY: Final = frozenset({"user", "dbname"})


def _is_uri(dsn: str) -> bool:
    return dsn.strip().lower().startswith(_SCHEMES)


def parse_keywords(dsn: str) -> dict[str, str]:
    """A libpq keyword string as a dict (``key = value``, values optionally single-quoted with
    ``\\'`` and ``\\\\`` escapes). Raises ValueError on a malformed string."""
    out: dict[str, str] = {}
    pos = 0
    text = dsn.strip()
    while pos < len(text):
        match = _KEYWORD.match(text, pos)
        if not match:
            raise ValueError(f"expected 'keyword=value' at {text[pos : pos + 20]!r}")
        key = match.group(1).lower()
        pos = match.end()
        if pos < len(text) and text[pos] == "'":
            pos += 1
            value: list[str] = []
            while True:
                if pos >= len(text):
                    raise ValueError(f"unterminated quoted value of {key}")
                ch = text[pos]
                if ch == "\\" and pos + 1 < len(text):
                    value.append(text[pos + 1])
                    pos += 2
                elif ch == "'":
                    pos += 1
                    break
                else:
                    value.append(ch)
                    pos += 1
            out[key] = "".join(value)
        else:
            end = pos
            while end < len(text) and not text[end].isspace():
                end += 1
            out[key] = text[pos:end]
            pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def dsn_problem(dsn: str) -> str | None:
    """Why *dsn* is refused as `store.dsn` (a password in it, or not a DSN), or None."""
    if not dsn.strip():
        return "must not be empty"
    advice = (
        "must not contain a password: put it in the file named by store.password_file, or in "
        "~/.pgpass (PGPASSFILE)"
    )
    if _is_uri(dsn):
        parts = urlsplit(dsn.strip())
        if parts.password is not None:
            return advice
        if any(k.lower() == "password" for k, _ in parse_qsl(parts.query)):
            return advice
        return None
    try:
        keywords = parse_keywords(dsn)
    except ValueError as exc:
        return f"is neither a postgresql:// URI nor a libpq keyword string ({exc})"
    if not keywords:
        return "must not be empty"
    if "password" in keywords:
        return advice
    return None


def to_uri(dsn: str) -> str:
    """*dsn* as a ``postgresql://`` URI (a keyword string is converted; a URI is kept)."""
    if _is_uri(dsn):
        return dsn.strip()
    keywords = parse_keywords(dsn)
    user = quote(keywords.get("user", ""), safe="")
    dbname = quote(keywords.get("dbname", ""), safe="")
    query = {k: v for k, v in keywords.items() if k not in _AUTHORITY}
    uri = f"postgresql://{user + '@' if user else ''}/{dbname}"
    return uri + ("?" + urlencode(query) if query else "")


def with_password(uri: str, password: str) -> str:
    """*uri* (from `to_uri`) with *password* added as its ``password`` parameter."""
    sep = "&" if "?" in uri else "?"
    return uri + sep + urlencode({"password": password})


def describe(dsn: str) -> str:
    """Which server (host or socket directory, port), database and user *dsn* names, for
    messages; never a password. Unset parts are named as libpq defaults them."""
    try:
        parts = urlsplit(to_uri(dsn))
    except ValueError:
        return "postgresql server (unparsable dsn)"
    query = dict(parse_qsl(parts.query))
    host = unquote(parts.hostname or "") or query.get("host") or "(default host/socket)"
    try:
        port = str(parts.port or query.get("port") or 5432)
    except ValueError:
        port = "(bad port)"
    database = unquote(parts.path.lstrip("/")) or query.get("dbname") or "(default database)"
    user = unquote(parts.username or "") or query.get("user") or "(default user)"
    where = f"{host} port {port}" if host.startswith("/") else f"{host}:{port}"
    return f"postgresql server {where}, database {database}, user {user}"
