"""Encryption at rest of batch record sections (AES-256-GCM), with rotating keys.

Threat model: it protects record keys, values, headers and producer ids in
segment files against someone who reads the disk, a backup or a snapshot but
not the server's memory or its key. It does not hide topic names, partition
counts, offsets, timestamps, record counts or sizes (the framing stays in
clear so recovery, indexes and retention work without the key), and it does not
protect against an attacker who can run code as the server or read its key.
Integrity: GCM authenticates the record section together with the batch header
(offsets, timestamps, key id), so a swapped or edited batch fails to decrypt
instead of yielding wrong records; the CRC still detects torn writes.

An encrypted batch (``ATTR_ENCRYPTED`` in storage/batch.py) is the 40-byte
header with ``key_id`` set, then a 12-byte random nonce, then the GCM
ciphertext of the plaintext record section and its 16-byte tag. Keys come from
a key file (lines ``<id>:<base64 of 32 bytes>``, id 1..65535) or the
``HERALD_ENCRYPTION_KEY`` variable (one such line); the highest id encrypts new
batches, every listed id decrypts, so a key rotates by adding a line with a
higher id and keeping the old one until its segments have expired.
The keyring is process-wide (``configure``), set before Storage opens.
"""

from __future__ import annotations

import base64
import binascii
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from herald.protocol.errors import HeraldError

ATTR_ENCRYPTED = 0x01  # the same bit as storage/batch.py's
_CRC_START = 8
_ATTR_AT, _KEY_ID_AT = 9, 10
_NONCE = 12
_KEY_ID = struct.Struct("<H")
ENV_VAR = "HERALD_ENCRYPTION_KEY"


class EncryptionError(HeraldError):
    """A batch cannot be decrypted: its key is missing or wrong. Not corruption: the
    log must never be cut because of it (recovery only cuts on CorruptLog)."""

    code, status, title = "storage_unavailable", 503, "Service Unavailable"


class KeyFileError(ValueError):
    """A key file or variable that cannot be used."""


@dataclass(frozen=True, slots=True)
class Keyring:
    keys: dict[int, AESGCM]
    # The keys' bytes, from which a cluster derives its own keys (cluster/trust.py).
    secrets: dict[int, bytes] = field(default_factory=dict, repr=False)

    @property
    def active_id(self) -> int:
        return max(self.keys)

    @classmethod
    def parse(cls, text: str) -> Keyring:
        keys: dict[int, AESGCM] = {}
        secrets: dict[int, bytes] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            ident, sep, encoded = line.partition(":")
            try:
                key_id = int(ident)
                key = base64.b64decode(encoded.strip(), validate=True)
            except (ValueError, binascii.Error):
                raise KeyFileError(f"line {number}: expected <id>:<base64 key>") from None
            if not sep or not 1 <= key_id <= 65535 or len(key) != 32:
                raise KeyFileError(f"line {number}: id 1..65535 and a 32-byte key")
            keys[key_id] = AESGCM(key)
            secrets[key_id] = key
        if not keys:
            raise KeyFileError("no keys")
        return cls(keys, secrets)

    @classmethod
    def load(cls, path: Path | None, env: dict[str, str] | None = None) -> Keyring | None:
        """From ``path`` if given, else from HERALD_ENCRYPTION_KEY; None when neither."""
        if path is not None:
            return cls.parse(Path(path).read_text(encoding="utf-8"))
        value = (os.environ if env is None else env).get(ENV_VAR)
        return cls.parse(value) if value else None


_keyring: Keyring | None = None


def configure(keyring: Keyring | None) -> None:
    global _keyring
    _keyring = keyring


def active() -> bool:
    return _keyring is not None


def current() -> Keyring | None:
    """The configured keyring (None: encryption off)."""
    return _keyring


def new_key_line(key_id: int) -> str:
    return f"{key_id}:{base64.b64encode(AESGCM.generate_key(bit_length=256)).decode()}"


def seal(batch: bytes, header_size: int) -> bytes:
    """The encrypted form of a framed plaintext batch whose header takes ``header_size``
    bytes (header fields kept in clear)."""
    assert _keyring is not None
    key_id = _keyring.active_id
    header = bytearray(batch[:header_size])
    header[_ATTR_AT] |= ATTR_ENCRYPTED
    _KEY_ID.pack_into(header, _KEY_ID_AT, key_id)
    nonce = os.urandom(_NONCE)
    sealed = _keyring.keys[key_id].encrypt(nonce, batch[header_size:], bytes(header[_CRC_START:]))
    buf = header + nonce + sealed
    struct.pack_into("<I", buf, 0, len(buf))
    struct.pack_into("<I", buf, 4, crc32c.crc32c(memoryview(buf)[_CRC_START:]))
    return bytes(buf)


def unseal(buf: bytes | memoryview, pos: int, length: int, header_size: int) -> bytes:
    """The framed plaintext batch of the (CRC-checked) encrypted batch at ``pos``, whose
    header takes ``header_size`` bytes."""
    view = memoryview(buf)[pos : pos + length]
    header = bytes(view[:header_size])
    (key_id,) = _KEY_ID.unpack_from(header, _KEY_ID_AT)
    base_offset = struct.unpack_from("<q", header, 12)[0]
    if _keyring is None:
        raise EncryptionError(
            f"batch at offset {base_offset} is encrypted (key id {key_id}) and no "
            "encryption key is configured"
        )
    aead = _keyring.keys.get(key_id)
    if aead is None:
        raise EncryptionError(
            f"batch at offset {base_offset} needs encryption key id {key_id}, which the "
            "configured keys do not include"
        )
    try:
        plain = aead.decrypt(
            bytes(view[header_size : header_size + _NONCE]),
            bytes(view[header_size + _NONCE :]),
            header[_CRC_START:],
        )
    except InvalidTag:
        raise EncryptionError(
            f"batch at offset {base_offset} does not decrypt with encryption key id "
            f"{key_id}: wrong key"
        ) from None
    out = bytearray(header) + plain
    out[_ATTR_AT] &= ~ATTR_ENCRYPTED & 0xFF
    out[_KEY_ID_AT : _KEY_ID_AT + 2] = b"\0\0"
    struct.pack_into("<I", out, 0, len(out))
    return bytes(out)


# --- values sealed at rest (meta.db's subscription configs: their push secrets) -------

SEALED_PREFIX = "herald-sealed:v1:"  # then the key id, ":", base64 of nonce + ciphertext


def seal_value(plain: bytes, context: bytes) -> str:
    """``plain`` sealed with the active key, bound to ``context`` (its row: a sealed value
    moved to another row does not open)."""
    assert _keyring is not None
    key_id = _keyring.active_id
    nonce = os.urandom(_NONCE)
    sealed = _keyring.keys[key_id].encrypt(nonce, plain, context)
    return f"{SEALED_PREFIX}{key_id}:{base64.b64encode(nonce + sealed).decode()}"


def is_sealed(text: str) -> bool:
    return text.startswith(SEALED_PREFIX)


def sealed_key_id(text: str) -> int:
    """The key id a sealed value names (0 when it names none readable)."""
    ident = text[len(SEALED_PREFIX) :].partition(":")[0]
    return int(ident) if ident.isdigit() else 0


def unseal_value(text: str, context: bytes, what: str) -> bytes:
    """The plaintext of a :func:`seal_value` result; EncryptionError when the key is
    missing or wrong (``what`` names the value in the message)."""
    ident, _, encoded = text[len(SEALED_PREFIX) :].partition(":")
    key_id = int(ident) if ident.isdigit() else 0
    if _keyring is None:
        raise EncryptionError(f"{what} is encrypted (key id {key_id}) and no key is configured")
    aead = _keyring.keys.get(key_id)
    if aead is None:
        raise EncryptionError(
            f"{what} needs encryption key id {key_id}, which the configured keys do not include"
        )
    try:
        raw = base64.b64decode(encoded, validate=True)
        return aead.decrypt(raw[:_NONCE], raw[_NONCE:], context)
    except (InvalidTag, binascii.Error, ValueError):
        raise EncryptionError(f"{what} does not decrypt with encryption key id {key_id}") from None
