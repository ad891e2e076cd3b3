"""What the nodes of a cluster share so that etcd need not be trusted with secrets, nor
to say who is a node (docs/security.md "A cluster").

One key set all nodes hold (``--cluster-secret-file``, else the encryption-at-rest
keys; lines ``<id>:<base64 32 bytes>``), from which two keys per id are derived with
HKDF-SHA256, one per use:

- **Sealing** (AES-256-GCM): a subscription's config (push secrets, previous secrets,
  and its url, which may carry the receiver's credentials) is sealed before it is
  written to etcd and unsealed when read, with the etcd key as associated data (a
  sealed value moved to another key does not open). The highest id seals; every id
  opens, so the key set rotates like the encryption keys (add a line, restart every
  node, keep the old line).
- **Peer proof** (HMAC-SHA256): before a node sends a client's ``Authorization`` or
  its cluster token to a URL etcd names as a node's, it asks that URL to prove it
  holds the key set: ``POST /v1/cluster/proof {"nonce"}`` answers an HMAC of the
  nonce *and the URL the prover advertises itself at*. A listener someone wrote into
  etcd cannot compute it, and cannot borrow it from a real node either: the real
  node's proof names its own URL, not the listener's. A URL that proved itself is
  trusted for ``PROVEN_FOR_S``; one that failed is asked again at the next use.

Why a proof and not mutual TLS alone: it holds on plain-HTTP clusters and with TLS
certificates any node's name shares (a wildcard, a load balancer's), and it needs no
second PKI; ``--peer-ca-file`` adds TLS verification of https:// peers on top, which
also hides the traffic from the network.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
import ssl
import struct
import time
from collections.abc import Mapping
from hashlib import sha256

import httpx
import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

log = logging.getLogger("herald.cluster")

SEALED = b"herald-sealed:v1:"  # a sealed etcd value starts with this, then key id, nonce
_KEY_ID = struct.Struct(">H")
_NONCE = 12
PROOF_PATH = "/v1/cluster/proof"
PROVEN_FOR_S = 60.0
_PROOF_TIMEOUT_S = 3.0


class SealError(Exception):
    """A sealed etcd value that the configured keys do not open."""


def _derive(secret: bytes, use: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=use).derive(secret)


class ClusterKeys:
    def __init__(self, secrets_by_id: Mapping[int, bytes]) -> None:
        if not secrets_by_id:
            raise ValueError("no cluster keys")
        self.active_id = max(secrets_by_id)
        self._seal = {
            i: AESGCM(_derive(k, b"herald etcd seal v1")) for i, k in secrets_by_id.items()
        }
        self._proof = {i: _derive(k, b"herald peer proof v1") for i, k in secrets_by_id.items()}

    # ----------------------------------------------------------------- sealing

    def seal(self, key: str, value: bytes) -> bytes:
        nonce = os.urandom(_NONCE)
        sealed = self._seal[self.active_id].encrypt(nonce, value, key.encode())
        return SEALED + _KEY_ID.pack(self.active_id) + nonce + sealed

    def unseal(self, key: str, value: bytes) -> bytes:
        """The plaintext of a sealed value; a value in clear (written before the cluster
        had keys) is returned as it is."""
        if not value.startswith(SEALED):
            return value
        body = value[len(SEALED) :]
        (key_id,) = _KEY_ID.unpack_from(body)
        aead = self._seal.get(key_id)
        if aead is None:
            raise SealError(
                f"{key} is sealed with cluster key id {key_id}, which is not configured"
            )
        start = _KEY_ID.size
        try:
            return aead.decrypt(body[start : start + _NONCE], body[start + _NONCE :], key.encode())
        except InvalidTag:
            raise SealError(f"{key} does not open with cluster key id {key_id}") from None

    # ------------------------------------------------------------------- proofs

    def proofs(self, nonce: str, url: str) -> dict[str, str]:
        """What a node at ``url`` answers to ``nonce``: an HMAC per key id it holds."""
        message = f"herald peer proof\0{nonce}\0{url.rstrip('/')}".encode()
        return {str(i): hmac.new(k, message, sha256).hexdigest() for i, k in self._proof.items()}

    def proven(self, nonce: str, url: str, answer: object) -> bool:
        if not isinstance(answer, dict):
            return False
        expected = self.proofs(nonce, url)
        return any(
            isinstance(given, str)
            and key_id in expected
            and hmac.compare_digest(given, expected[key_id])
            for key_id, given in answer.items()
        )


def peer_ssl(ws_url: str, verify: ssl.SSLContext | bool) -> ssl.SSLContext | None:
    """The ``ssl`` option of a WebSocket opened to another node: the peers' CA for a
    wss:// URL when one is configured (None: the system's CAs, or plain ws://)."""
    if ws_url.startswith("wss://") and isinstance(verify, ssl.SSLContext):
        return verify
    return None


class PeerVerifier:
    """Whether a URL etcd names as a node's answers as one (see the module's text)."""

    def __init__(self, keys: ClusterKeys, verify: ssl.SSLContext | bool = True) -> None:
        self._keys = keys
        self._http = httpx.AsyncClient(timeout=_PROOF_TIMEOUT_S, verify=verify)
        self._proven: dict[str, float] = {}  # url -> until when
        self._locks: dict[str, asyncio.Lock] = {}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def trusted(self, url: str) -> bool:
        url = url.rstrip("/")
        if self._proven.get(url, 0.0) > time.monotonic():
            return True
        lock = self._locks.setdefault(url, asyncio.Lock())
        async with lock:
            if self._proven.get(url, 0.0) > time.monotonic():
                return True
            if await self._ask(url):
                self._proven[url] = time.monotonic() + PROVEN_FOR_S
                return True
            self._proven.pop(url, None)
            return False

    async def _ask(self, url: str) -> bool:
        nonce = secrets.token_hex(16)
        try:
            response = await self._http.post(
                url + PROOF_PATH,
                content=orjson.dumps({"nonce": nonce}),
                headers={"content-type": "application/json"},
            )
            answer = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            log.info("the node at %s did not answer the peer proof: %s", url, exc)
            return False
        proofs = answer.get("proofs") if isinstance(answer, dict) else None
        if self._keys.proven(nonce, url, proofs):
            return True
        log.warning(
            "the node etcd names at %s did not prove it holds the cluster secret: no "
            "credentials are sent there (a node with another --cluster-secret-file or "
            "--advertise-url, or a listener written into etcd)",
            url,
        )
        return False
