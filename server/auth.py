"""Credentials of PROTOCOL §6: tokens, their salted hashes, roles, and the auth file.

A token reads ``hrd_<id>_<secret>``. The id (8 hex digits) is not secret: it
names the token in the auth file, in logs and in the audit log, and lets a
lookup go straight to one entry instead of trying every slow hash. Only a
salted scrypt hash of the whole token is stored; it is compared in constant
time. Verifying costs tens of milliseconds on purpose, so a verified token is
remembered (keyed by a keyed BLAKE2b of the token, never the token) until the
file changes.

The auth file (TOML)::

    [tokens.1a2b3c4d]
    name = "orders-service"            # optional, for people
    hash = "scrypt$16384$8$1$<salt>$<digest>"
    roles = ["publish", "subscribe"]   # admin | metrics | publish | subscribe
    topics = ["orders.*"]              # fnmatch patterns for publish/subscribe
    messages_per_second = 1000         # optional publish rate limits (token bucket)
    bytes_per_second = 1048576
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

log = logging.getLogger("herald.auth")

ROLES = ("admin", "metrics", "publish", "subscribe")
TOKEN_PREFIX = "hrd_"
_TOKEN_RE = re.compile(r"^hrd_([0-9a-f]{8})_([A-Za-z0-9_-]{20,100})$")
_ID_RE = re.compile(r"^[0-9a-f]{8}$")

# scrypt at n=2**14, r=8: ~16 MiB and tens of ms per guess.
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1
_CACHE_LIMIT = 4096


class AuthFileError(ValueError):
    """An auth file that cannot be used (the old one stays in force)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a verified token is, and what it may do."""

    token_id: str
    name: str
    roles: frozenset[str]
    topics: tuple[str, ...]
    messages_per_second: float | None = None
    bytes_per_second: float | None = None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    def may(self, role: str, topic: str | None = None) -> bool:
        """Admin may everything; ``publish``/``subscribe`` need a matching topic pattern."""
        if self.is_admin:
            return True
        if role not in self.roles:
            return False
        if role in ("publish", "subscribe"):
            return topic is not None and any(fnmatchcase(topic, p) for p in self.topics)
        return True


@dataclass(frozen=True, slots=True)
class _Entry:
    principal: Principal
    hash: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_token(token: str, *, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.scrypt(
        token.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P, dklen=32
    )
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def verify_hash(token: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = _unb64(digest)
        actual = hashlib.scrypt(
            token.encode(),
            salt=_unb64(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
            maxmem=256 * 1024 * 1024,
        )
    except ValueError:
        return False
    return hmac.compare_digest(actual, expected)


def new_token() -> tuple[str, str]:
    """A fresh ``(token_id, token)``."""
    token_id = secrets.token_hex(4)
    return token_id, f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"


def token_id_of(token: str) -> str | None:
    """The non-secret id part of a well-formed token, else None."""
    match = _TOKEN_RE.match(token)
    return match.group(1) if match else None


def toml_entry(token_id: str, token: str, roles: list[str], topics: list[str]) -> str:
    """The auth-file lines for a new token (only its hash, never the token)."""
    lines = [
        f"[tokens.{token_id}]",
        f'hash = "{hash_token(token)}"',
        "roles = [" + ", ".join(f'"{r}"' for r in roles) + "]",
    ]
    if topics:
        lines.append("topics = [" + ", ".join(_toml_str(t) for t in topics) + "]")
    return "\n".join(lines) + "\n"


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ------------------------------------------------------------------ the file


def parse_auth_file(text: str) -> dict[str, _Entry]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AuthFileError(f"not valid TOML: {exc}") from None
    tokens = doc.get("tokens", {})
    if not isinstance(tokens, dict):
        raise AuthFileError("[tokens] must be a table")
    entries: dict[str, _Entry] = {}
    for token_id, raw in tokens.items():
        entries[token_id] = _entry(token_id, raw)
    return entries


def _entry(token_id: str, raw: Any) -> _Entry:
    where = f"tokens.{token_id}"
    if not _ID_RE.match(token_id):
        raise AuthFileError(f"{where}: a token id is 8 lowercase hex digits")
    if not isinstance(raw, dict):
        raise AuthFileError(f"{where} must be a table")
    stored = raw.get("hash")
    if not isinstance(stored, str) or not stored.startswith("scrypt$") or stored.count("$") != 5:
        raise AuthFileError(f"{where}: hash must be a scrypt$... string")
    roles = raw.get("roles", [])
    if not isinstance(roles, list) or not roles or any(r not in ROLES for r in roles):
        raise AuthFileError(f"{where}: roles must be a non-empty list of {', '.join(ROLES)}")
    topics = raw.get("topics", [])
    if not isinstance(topics, list) or not all(isinstance(t, str) and t for t in topics):
        raise AuthFileError(f"{where}: topics must be a list of patterns")
    if {"publish", "subscribe"} & set(roles) and not topics:
        raise AuthFileError(f"{where}: publish/subscribe need topics")
    limits: dict[str, float | None] = {}
    for key in ("messages_per_second", "bytes_per_second"):
        value = raw.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
        ):
            raise AuthFileError(f"{where}: {key} must be a positive number")
        limits[key] = None if value is None else float(value)
    name = raw.get("name", token_id)
    principal = Principal(
        token_id=token_id,
        name=str(name),
        roles=frozenset(roles),
        topics=tuple(topics),
        messages_per_second=limits["messages_per_second"],
        bytes_per_second=limits["bytes_per_second"],
    )
    return _Entry(principal, stored)


class Credentials:
    """The tokens of one auth file; ``reload()`` swaps them only if the new file is good."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._entries: Mapping[str, _Entry] = {}
        self._verified: dict[bytes, Principal] = {}
        self._cache_key = os.urandom(32)
        self._mtime: int | None = None
        self.load()

    def load(self) -> None:
        """Read the file; raises AuthFileError (used at startup, where a bad file is fatal)."""
        try:
            stat = self.path.stat()
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise AuthFileError(f"cannot read {self.path}: {exc.strerror}") from None
        entries = parse_auth_file(text)
        self._entries = entries
        self._verified = {}
        self._mtime = stat.st_mtime_ns
        log.info("auth file %s: %d tokens", self.path, len(entries))

    def reload(self) -> bool:
        """Reload on SIGHUP or change; a bad file keeps the old tokens and logs an error."""
        try:
            self.load()
        except AuthFileError as exc:
            log.error("auth file %s not reloaded, keeping the previous tokens: %s", self.path, exc)
            return False
        return True

    def changed(self) -> bool:
        try:
            return self.path.stat().st_mtime_ns != self._mtime
        except OSError:
            return False  # a file being replaced; the next check sees the new one

    def cached(self, token: str) -> Principal | None:
        """A token verified before (cheap); None if it must be verified."""
        return self._verified.get(self._cache_digest(token))

    def verify(self, token: str) -> Principal | None:
        """The principal of a token, or None. Slow (scrypt): call it off the event loop."""
        token_id = token_id_of(token)
        if token_id is None:
            return None
        entries = self._entries
        entry = entries.get(token_id)
        if entry is None or not verify_hash(token, entry.hash):
            return None
        if entries is self._entries:  # not reloaded meanwhile
            if len(self._verified) >= _CACHE_LIMIT:
                self._verified.clear()
            self._verified[self._cache_digest(token)] = entry.principal
        return entry.principal

    def hash_of(self, token_id: str) -> str | None:
        """The stored hash a token id has now (what a later ``standing`` compares)."""
        entry = self._entries.get(token_id)
        return None if entry is None else entry.hash

    def standing(self, token_id: str, stored_hash: str) -> Principal | None:
        """The current principal of a token that was verified against ``stored_hash``:
        None once its entry is gone or holds another hash (revoked or re-issued)."""
        entry = self._entries.get(token_id)
        if entry is None or not hmac.compare_digest(entry.hash, stored_hash):
            return None
        return entry.principal

    def _cache_digest(self, token: str) -> bytes:
        return hashlib.blake2b(token.encode(), key=self._cache_key, digest_size=32).digest()
