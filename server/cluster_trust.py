"""The server's side of a cluster's trust (cluster/trust.py, docs/security.md "A
cluster"): the settings turned into etcd access, the shared keys and the peers' TLS,
and the one route a node answers without credentials, ``POST /v1/cluster/proof``."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable
from pathlib import Path

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from cluster.etcd import EtcdAccess
from cluster.trust import PROOF_PATH, ClusterKeys
from server.config import ServerConfig
from storage import encryption

_MAX_NONCE = 128


def etcd_access(config: ServerConfig) -> EtcdAccess:
    return EtcdAccess(
        user=config.etcd_user,
        password=config.etcd_password,
        ca_file=config.etcd_ca_file,
        cert_file=config.etcd_cert_file,
        key_file=config.etcd_key_file,
    )


def cluster_keys(config: ServerConfig) -> ClusterKeys | None:
    """The key set the nodes share: the cluster secret file's, else the encryption keys
    (set before, by configure_encryption); None when neither is configured."""
    if config.cluster_secret_file is not None:
        keyring = encryption.Keyring.load(config.cluster_secret_file)
    else:
        keyring = encryption.current()
    return ClusterKeys(keyring.secrets) if keyring is not None else None


def trust_problem(config: ServerConfig) -> str | None:
    """Why a clustered node cannot start with these settings (one line), or None."""
    try:
        keys = cluster_keys(config)
    except (OSError, encryption.KeyFileError) as exc:
        return f"cluster secret file: {exc}"
    if keys is None and config.auth_file is not None:
        return (
            "a cluster with --auth-file needs a secret all nodes share, so that no "
            "credential is forwarded to a URL just because etcd names it: give every node "
            "the same --cluster-secret-file (`herald encryption-key --id 1 > cluster.key`) "
            "or the same --encryption-key-file"
        )
    for name in ("etcd_ca_file", "etcd_cert_file", "etcd_key_file", "peer_ca_file"):
        path: Path | None = getattr(config, name)
        if path is not None and not path.is_file():
            return f"--{name.replace('_', '-')} {path}: no such file"
    try:
        etcd_access(config).verify()
        peer_verify(config)
    except (OSError, ssl.SSLError) as exc:
        return f"TLS files: {exc}"
    return None


def peer_verify(config: ServerConfig) -> ssl.SSLContext | bool:
    """What a node verifies another node's https:// certificate with."""
    if config.peer_ca_file is None:
        return True
    return ssl.create_default_context(cafile=str(config.peer_ca_file))


class PeerProofEndpoint:
    """ASGI layer answering ``POST /v1/cluster/proof`` before any credential check: a
    node asked by another proves it holds the cluster's keys and is at the URL it
    advertises (cluster/trust.py). 404 on a node without keys."""

    def __init__(self, app: ASGIApp, keys: ClusterKeys | None, url: str) -> None:
        self.app = app
        self._keys = keys
        self._url = url

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] != "http" or scope["path"] != PROOF_PATH or self._keys is None:
            # The next layer's own coroutine: no frame of this one is held for as long
            # as a WebSocket stays open (issue 27 §3: memory per idle consumer).
            return self.app(scope, receive, send)
        return self._prove(self._keys, scope, receive, send)

    async def _prove(self, keys: ClusterKeys, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False) or len(body) > 4 * _MAX_NONCE:
                break
        try:
            nonce = orjson.loads(body)["nonce"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            nonce = None
        if (
            scope["method"] != "POST"
            or not isinstance(nonce, str)
            or not 16 <= len(nonce) <= _MAX_NONCE
        ):
            await _answer(send, 400, {
                "type": "about:blank", "title": "Bad Request", "status": 400,
                "code": "bad_request", "detail": 'POST {"nonce": "<16 to 128 characters>"}',
            })  # fmt: skip
            return
        await _answer(send, 200, {"url": self._url, "proofs": keys.proofs(nonce, self._url)})


async def _answer(send: Send, status: int, body: dict[str, object]) -> None:
    content = orjson.dumps(body)
    kind = b"application/json" if status == 200 else b"application/problem+json"
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", kind), (b"content-length", str(len(content)).encode())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": content})
