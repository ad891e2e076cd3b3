"""Credentials of PROTOCOL §6: tokens, their salted hashes, roles, and the auth file.

A token reads ``hrd_<id>_<secret>``. The id (8 hex digits) is not secret: it
names the token in the auth file, in logs and in the audit log, and lets a
lookup go straight to one entry. Only a salted HMAC-SHA256 of the whole token is
stored (a token holds 256 random bits: a slow hash would add nothing but a cost
per guess, which an attacker chooses); it is compared in constant time. Files
of older versions hold scrypt hashes, which still verify (tens of milliseconds,
in a thread); once such a token has verified, the entry remembers a salted
HMAC of it, so later guesses at that id cost an HMAC too. A verified token is
remembered (keyed by a keyed BLAKE2b of the token, never the token) until the
file changes.

The auth file (TOML)::

    [tokens.1a2b3c4d]
    name = "orders-service"            # optional, for people
    hash = "hmac-sha256$<salt>$<digest>"  # or scrypt$16384$8$1$<salt>$<digest> (older)
    roles = ["publish", "subscribe"]   # admin | metrics | publish | subscribe
    topics = ["orders.*"]              # fnmatch patterns for publish/subscribe
    subscriptions = ["billing-*"]      # optional: the subscriptions it may use (fnmatch)
    messages_per_second = 1000         # optional publish rate limits (token bucket)
    bytes_per_second = 1048576

    [browser_tokens]                   # optional: lets tokens mint browser tokens
    keys = { k1 = "<base64 of 32 random bytes>" }   # `herald token signing-key`
    active = "k1"                      # mints with this one; verifies with any listed

Browser tokens (PROTOCOL §8) are not in the file: ``hrb_<payload>.<signature>``,
the payload a compact JSON of the rights, the expiry, the signing key id and the
minting token's id, signed with HMAC-SHA256 under one of the ``[browser_tokens]``
keys, so any node holding the file verifies one without a lookup (see
:meth:`Credentials.verify_browser`). To rotate: add a new key, make it active,
and drop the old one once its tokens have expired (24 h at most).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
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
BROWSER_PREFIX = "hrb_"
_KEY_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")

HMAC_SCHEME = "hmac-sha256"
# scrypt at n=2**14, r=8: ~16 MiB and tens of ms per guess (auth files of older versions).
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
    # A browser token: its own patterns per role (``topics`` is their union) and expiry.
    publish_topics: tuple[str, ...] | None = None
    subscribe_topics: tuple[str, ...] | None = None
    expires_at_ms: int | None = None
    # A browser token's minting token as the auth file has it now (PROTOCOL §6): the
    # browser token may only what both may.
    parent: Principal | None = None
    # PROTOCOL §6: subscription name patterns (fnmatch) narrowing the subscribe right;
    # None: every subscription of its topics.
    subscriptions: tuple[str, ...] | None = None

    def may_subscription(self, name: str) -> bool:
        """Whether its subscription patterns (and its parent's) let it use ``name``."""
        if self.parent is not None and not self.parent.may_subscription(name):
            return False
        if self.is_admin or self.subscriptions is None:
            return True
        return any(fnmatchcase(name, p) for p in self.subscriptions)

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    def patterns(self, role: str) -> tuple[str, ...]:
        """The topic patterns this token holds for ``publish`` or ``subscribe``."""
        if role not in self.roles:
            return ()
        own = self.publish_topics if role == "publish" else self.subscribe_topics
        return self.topics if own is None else own

    def may(self, role: str, topic: str | None = None) -> bool:
        """Admin may everything; ``publish``/``subscribe`` need a matching topic pattern."""
        if self.parent is not None and not self.parent.may(role, topic):
            return False
        if self.is_admin:
            return True
        if role not in self.roles:
            return False
        if role in ("publish", "subscribe"):
            return topic is not None and any(fnmatchcase(topic, p) for p in self.patterns(role))
        return True


@dataclass(frozen=True, slots=True)
class SigningKeys:
    """The browser-token signing keys: mint with ``active``, verify with any."""

    active: str
    keys: Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class _Entry:
    principal: Principal
    hash: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_token(token: str, *, salt: bytes | None = None) -> str:
    """The stored form of a new token: ``hmac-sha256$<salt>$<HMAC-SHA256(salt, token)>``.
    A token carries 256 random bits, so a fast keyed hash is as safe as a slow one (as
    GitHub and Stripe store theirs) and a guess costs the server microseconds."""
    salt = salt if salt is not None else os.urandom(16)
    return f"{HMAC_SCHEME}${_b64(salt)}${_b64(_hmac_digest(salt, token))}"


def _hmac_digest(salt: bytes, token: str) -> bytes:
    return hmac.new(salt, token.encode(), hashlib.sha256).digest()


def scrypt_hash(token: str, *, salt: bytes | None = None) -> str:
    """The stored form older versions wrote (still verified: ``is_slow``)."""
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.scrypt(
        token.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P, dklen=32
    )
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def is_slow(stored: str) -> bool:
    """Whether verifying against ``stored`` costs a scrypt (call it off the event loop)."""
    return stored.startswith("scrypt$")


def verify_hash(token: str, stored: str) -> bool:
    if stored.startswith(HMAC_SCHEME + "$"):
        try:
            _, salt, digest = stored.split("$")
            expected, key = _unb64(digest), _unb64(salt)
        except ValueError:
            return False
        return hmac.compare_digest(_hmac_digest(key, token), expected)
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


def parse_signing_keys(text: str) -> SigningKeys | None:
    """The ``[browser_tokens]`` section of an auth file, or None when it has none."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AuthFileError(f"not valid TOML: {exc}") from None
    section = doc.get("browser_tokens")
    if section is None:
        return None
    if not isinstance(section, dict):
        raise AuthFileError("[browser_tokens] must be a table")
    raw_keys = section.get("keys")
    if not isinstance(raw_keys, dict) or not raw_keys:
        raise AuthFileError("browser_tokens.keys must be a table of key id = base64 key")
    keys: dict[str, bytes] = {}
    for key_id, encoded in raw_keys.items():
        if not _KEY_ID_RE.match(key_id):
            raise AuthFileError(f"browser_tokens.keys: bad key id {key_id!r} (1-32 of A-Za-z0-9_-)")
        try:
            key = base64.b64decode(str(encoded).replace("-", "+").replace("_", "/"), validate=True)
        except ValueError:
            key = b""
        if len(key) < 32:
            raise AuthFileError(f"browser_tokens.keys.{key_id}: must be base64 of >= 32 bytes")
        keys[key_id] = key
    active = section.get("active")
    if not isinstance(active, str) or active not in keys:
        raise AuthFileError("browser_tokens.active must name one of browser_tokens.keys")
    return SigningKeys(active, keys)


def _entry(token_id: str, raw: Any) -> _Entry:
    where = f"tokens.{token_id}"
    if not _ID_RE.match(token_id):
        raise AuthFileError(f"{where}: a token id is 8 lowercase hex digits")
    if not isinstance(raw, dict):
        raise AuthFileError(f"{where} must be a table")
    stored = raw.get("hash")
    if not isinstance(stored, str) or not (
        (stored.startswith(HMAC_SCHEME + "$") and stored.count("$") == 2)
        or (stored.startswith("scrypt$") and stored.count("$") == 5)
    ):
        raise AuthFileError(f"{where}: hash must be a {HMAC_SCHEME}$... or scrypt$... string")
    roles = raw.get("roles", [])
    if not isinstance(roles, list) or not roles or any(r not in ROLES for r in roles):
        raise AuthFileError(f"{where}: roles must be a non-empty list of {', '.join(ROLES)}")
    topics = raw.get("topics", [])
    if not isinstance(topics, list) or not all(isinstance(t, str) and t for t in topics):
        raise AuthFileError(f"{where}: topics must be a list of patterns")
    if {"publish", "subscribe"} & set(roles) and not topics:
        raise AuthFileError(f"{where}: publish/subscribe need topics")
    subscriptions = raw.get("subscriptions")
    if subscriptions is not None and (
        not isinstance(subscriptions, list)
        or not all(isinstance(n, str) and n for n in subscriptions)
    ):
        raise AuthFileError(f"{where}: subscriptions must be a list of name patterns")
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
        subscriptions=None if subscriptions is None else tuple(subscriptions),
    )
    return _Entry(principal, stored)


def credentials_digest(text: str) -> str:
    """What GET /v1/cluster shows of each node's credentials (docs/security.md): the first
    16 hex digits of the SHA-256 of the parsed file in a canonical form, so that comments,
    spacing and order do not matter and the same tokens, rights, limits and keys give
    the same digest on every node. It gives nothing away: the file holds only salted
    hashes of 256-bit tokens and random keys, which no one can guess from it."""
    canonical = json.dumps(tomllib.loads(text), sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class Credentials:
    """The tokens of one auth file; ``reload()`` swaps them only if the new file is good."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._entries: Mapping[str, _Entry] = {}
        self._verified: dict[bytes, Principal] = {}
        self._upgraded: dict[str, str] = {}  # token id -> HMAC hash of a verified scrypt one
        self._cache_key = os.urandom(32)
        self._seen: tuple[int, int] | None = None  # (mtime, size) of the file as loaded
        self.signing: SigningKeys | None = None
        self.digest = ""  # of the file as loaded: credentials_digest
        self.load()

    def load(self) -> None:
        """Read the file; raises AuthFileError (used at startup, where a bad file is fatal)."""
        try:
            data = self.path.read_bytes()
            stat = self.path.stat()  # after the read: what was read is at most this new
        except OSError as exc:
            raise AuthFileError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AuthFileError(f"{self.path} is not UTF-8: {exc}") from None
        entries = parse_auth_file(text)
        signing = parse_signing_keys(text)
        self._entries = entries
        self.signing = signing
        self.digest = credentials_digest(text)
        self._verified = {}
        self._upgraded = {}
        # A file rewritten in place (truncated, then written) can be read half-written
        # within one tick of the clock that stamps its mtime: then its size differs from
        # what was read, and the next check reads it again.
        self._seen = (stat.st_mtime_ns, stat.st_size) if stat.st_size == len(data) else None
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
            stat = self.path.stat()
            return (stat.st_mtime_ns, stat.st_size) != self._seen
        except OSError:
            return False  # a file being replaced; the next check sees the new one

    def cached(self, token: str) -> Principal | None:
        """A token verified before (cheap); None if it must be verified."""
        return self._verified.get(self._cache_digest(token))

    def slow(self, token: str) -> bool:
        """Whether ``verify(token)`` costs a scrypt (an older file's entry not yet used
        since the file was loaded): the caller runs it in a thread."""
        token_id = token_id_of(token)
        entry = None if token_id is None else self._entries.get(token_id)
        return entry is not None and is_slow(entry.hash) and token_id not in self._upgraded

    def verify(self, token: str) -> Principal | None:
        """The principal of a token, or None. An HMAC, or a scrypt when ``slow(token)``."""
        token_id = token_id_of(token)
        if token_id is None:
            return None
        entries, upgraded = self._entries, self._upgraded
        entry = entries.get(token_id)
        if entry is None:
            return None
        stored = upgraded.get(token_id, entry.hash)
        if not verify_hash(token, stored):
            return None
        if entries is self._entries:  # not reloaded meanwhile
            if is_slow(stored):  # later guesses at this id cost an HMAC, not a scrypt
                upgraded[token_id] = hash_token(token)
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

    # -- browser tokens (PROTOCOL §8) -------------------------------------------------

    def mint_browser(
        self,
        parent: Principal,
        *,
        publish: tuple[str, ...],
        subscribe: tuple[str, ...],
        expires_at_ms: int,
    ) -> str:
        """A signed browser token for ``parent`` (the caller checked that the rights lie
        within the parent's). Needs ``self.signing``."""
        signing = self.signing
        if signing is None:
            raise AuthFileError("the auth file has no [browser_tokens] signing key")
        payload: dict[str, Any] = {"k": signing.active, "e": expires_at_ms, "i": parent.token_id}
        if publish:
            payload["p"] = list(publish)
        if subscribe:
            payload["s"] = list(subscribe)
        if parent.messages_per_second is not None:
            payload["m"] = parent.messages_per_second
        if parent.bytes_per_second is not None:
            payload["b"] = parent.bytes_per_second
        body = _b64(json.dumps(payload, separators=(",", ":")).encode())
        return f"{BROWSER_PREFIX}{body}.{_b64(_sign(signing.keys[signing.active], body))}"

    def verify_browser(self, token: str, now_ms: int) -> Principal | None:
        """The principal of a browser token, or None when it is malformed, tampered with,
        signed by a key the file no longer lists, expired, or its minting token is gone
        from the file. Cheap (one HMAC): no thread needed."""
        signing = self.signing
        if signing is None or not token.startswith(BROWSER_PREFIX) or len(token) > 8192:
            return None
        body, _, signature = token[len(BROWSER_PREFIX) :].partition(".")
        try:
            payload = json.loads(_unb64(body))
            given = _unb64(signature)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(payload, dict):
            return None
        key_id = payload.get("k")
        key = signing.keys.get(key_id) if isinstance(key_id, str) else None
        if key is None or not hmac.compare_digest(_sign(key, body), given):
            return None
        try:
            expires = payload["e"]
            parent = payload["i"]
            publish = tuple(payload.get("p", ()))
            subscribe = tuple(payload.get("s", ()))
        except (KeyError, TypeError):
            return None
        entry = self._entries.get(parent) if isinstance(parent, str) else None
        if not isinstance(expires, int) or expires <= now_ms or entry is None:
            return None  # expired, or its minting token was revoked
        # PROTOCOL §6: the rights it was minted with, within its parent's rights now, and
        # the parent's rate-limit bucket under the parent's current limits.
        current = entry.principal
        roles = {"publish"} if publish else set()
        roles |= {"subscribe"} if subscribe else set()
        if not current.is_admin:
            roles &= current.roles
        return Principal(
            token_id=parent,
            name=f"browser token of {parent}",
            roles=frozenset(roles),
            topics=tuple(dict.fromkeys(publish + subscribe)),
            messages_per_second=current.messages_per_second,
            bytes_per_second=current.bytes_per_second,
            publish_topics=publish,
            subscribe_topics=subscribe,
            expires_at_ms=expires,
            parent=current,
        )


def _sign(key: bytes, body: str) -> bytes:
    return hmac.new(key, b"hrb1." + body.encode(), hashlib.sha256).digest()


def new_signing_key_line(key_id: str = "k1") -> str:
    """A ``[browser_tokens]`` section with one fresh key (``herald token signing-key``)."""
    key = base64.b64encode(os.urandom(32)).decode()
    return f'[browser_tokens]\nkeys = {{ {key_id} = "{key}" }}\nactive = "{key_id}"\n'


_METACHARS = frozenset("*?[")


def _literal_prefix(pattern: str) -> str:
    for i, ch in enumerate(pattern):
        if ch in _METACHARS:
            return pattern[:i]
    return pattern


def pattern_within(requested: str, held: str) -> bool:
    """Whether every topic ``requested`` matches is sure to match ``held`` (fnmatch).

    Provably narrower, and nothing else: the same pattern; a literal name ``held``
    matches; or ``held`` is a literal prefix followed by one ``*`` (``orders.*``, ``*``)
    and ``requested`` (up to its first wildcard) starts with that prefix, since a ``*``
    matches any run of characters, dots included (``orders.eu.*`` within ``orders.*``).
    """
    if requested == held:
        return True
    if not _METACHARS & set(requested):
        return fnmatchcase(requested, held)
    if held.endswith("*") and not _METACHARS & set(held[:-1]):
        return _literal_prefix(requested).startswith(held[:-1])
    return False
