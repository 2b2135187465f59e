"""Who may sign in to the console, and what each may do: the operators file.

The file is TOML and holds only password hashes (scrypt, from the standard library)::

    [operators.alice]
    role = "resolver"                      # or "reader"
    password = "scrypt$16384$8$1$<salt hex>$<hash hex>"   # hunter console hash-password

    [operators.bob]
    role = "reader"                        # no password: only for --user-header (a proxy)

A **reader** sees every page; a **resolver** may also resolve escalations and cancel turns.
Behind a reverse proxy that authenticates people (``hunter console --user-header``), the proxy's
user name must be listed here for its role; a password is then not needed. No I/O but reading
the file in `load_operators`.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from supervisor.console.errors import OperatorsFileError

__all__ = [
    "Operator",
    "Operators",
    "Role",
    "hash_password",
    "load_operators",
    "verify_password",
]

#: scrypt's cost: n = 2**14, r = 8, p = 1 (about 16 MiB and 50 ms a check; OWASP's minimum is
#: n = 2**17 for interactive use at 128 MiB: sign-ins are also rate limited).
_N: Final = 1 << 14
_R: Final = 8
_P: Final = 1
_SALT_BYTES: Final = 16
_HASH_BYTES: Final = 32
#: scrypt refuses more memory than this by default; our costs need 16 MiB.
_MAXMEM: Final = 64 << 20
#: names an operator may have: what a log line and an evidence entry can hold plainly
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@")


class Role(enum.Enum):
    """What an operator may do."""

    READER = "reader"
    RESOLVER = "resolver"

    @property
    def may_decide(self) -> bool:
        """May resolve escalations and cancel turns."""
        return self is Role.RESOLVER


@dataclass(frozen=True, slots=True)
class Operator:
    name: str
    role: Role
    #: the scrypt hash of the password; None: signs in only through a proxy (--user-header)
    password_hash: str | None


@dataclass(frozen=True, slots=True)
class Operators:
    """The operators file, read."""

    by_name: dict[str, Operator]
    path: Path

    def get(self, name: str) -> Operator | None:
        return self.by_name.get(name)


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """The ``scrypt$n$r$p$salt$hash`` string the operators file holds for *password*."""
    if not password:
        raise ValueError("an empty password cannot be hashed: choose one")
    salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=_N, r=_R, p=_P, maxmem=_MAXMEM, dklen=_HASH_BYTES
    )
    return f"scrypt${_N}${_R}${_P}${salt.hex()}${digest.hex()}"


def verify_password(password: str, encoded: str) -> bool:
    """Whether *password* matches *encoded* (`hash_password`'s form), in constant time."""
    parsed = _parse_hash(encoded)
    if parsed is None:
        return False
    n, r, p, salt, expected = parsed
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=len(expected)
    )
    return hmac.compare_digest(digest, expected)


def _parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes] | None:
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        return None
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, expected = bytes.fromhex(parts[4]), bytes.fromhex(parts[5])
    except ValueError:
        return None
    # a cost outside these bounds is not one we wrote (and would let a file exhaust memory)
    if not (2 <= n <= 1 << 20 and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
        return None
    if len(salt) < 8 or len(expected) < 16:
        return None
    return n, r, p, salt, expected


def load_operators(path: Path) -> Operators:
    """Read and check the operators file; `OperatorsFileError` names what is wrong and where."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OperatorsFileError(
            f"{path}: no such file; create it with `hunter console add-operator NAME --role"
            " reader|resolver --operators FILE`",
            path=path,
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise OperatorsFileError(f"{path}: cannot be read: {exc}", path=path) from None
    except tomllib.TOMLDecodeError as exc:
        raise OperatorsFileError(f"{path}: not valid TOML: {exc}", path=path) from None
    unknown = sorted(set(data) - {"operators"})
    if unknown:
        raise OperatorsFileError(
            f"{path}: unknown top-level key(s) {', '.join(unknown)}; the file holds"
            " [operators.<name>] tables",
            path=path,
        )
    table = data.get("operators", {})
    if not isinstance(table, dict) or not table:
        raise OperatorsFileError(
            f"{path}: no [operators.<name>] table: nobody could sign in", path=path
        )
    by_name = {name: _operator(path, name, entry) for name, entry in table.items()}
    return Operators(by_name=by_name, path=path)


def _operator(path: Path, name: str, entry: object) -> Operator:
    where = f"{path}: operators.{name}"
    if not name or not set(name) <= _NAME_CHARS or len(name) > 64:
        raise OperatorsFileError(
            f"{where}: a name is 1 to 64 of letters, digits and . _ - @", path=path
        )
    if not isinstance(entry, dict):
        raise OperatorsFileError(f"{where}: must be a table (role, password)", path=path)
    unknown = sorted(set(entry) - {"role", "password"})
    if unknown:
        raise OperatorsFileError(
            f"{where}: unknown key(s) {', '.join(unknown)}; an operator has role and password",
            path=path,
        )
    role_text = entry.get("role")
    try:
        role = Role(role_text)
    except ValueError:
        raise OperatorsFileError(
            f'{where}.role: {role_text!r} is not a role; use "reader" or "resolver"',
            path=path,
        ) from None
    password = entry.get("password")
    if password is not None and (not isinstance(password, str) or _parse_hash(password) is None):
        raise OperatorsFileError(
            f"{where}.password: not a scrypt hash (the file holds no plain passwords); make one"
            " with `hunter console hash-password`",
            path=path,
        )
    return Operator(name=name, role=role, password_hash=password)
