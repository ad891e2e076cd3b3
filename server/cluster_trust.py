"""The server's side of a cluster's trust (cluster/trust.py, docs/security.md "A
cluster"): the settings turned into etcd access, the shared keys and the peers' TLS,
and the one route a node answers without credentials, ``POST /v1/cluster/proof``."""

from __future__ import annotations

import ssl
from pathlib import Path

import orjson
from starlette.requests import Request
from starlette.responses import Response

from cluster.etcd import EtcdAccess
from cluster.trust import ClusterKeys
from herald.protocol.errors import BadRequest, NotFound
from server.config import ServerConfig
from server.http import json_response, read_body
from server.routing import Handler
from storage import encryption

_MIN_NONCE, _MAX_NONCE = 16, 128
PROOF_BODY_LIMIT = 4 * _MAX_NONCE  # {"nonce": …} and room for spaces


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


def peer_proof_route(keys: ClusterKeys | None, url: str) -> Handler:
    """``POST /v1/cluster/proof``, open (server/route_table.py): a node asked by another
    proves it holds the cluster's keys and is at the URL it advertises (cluster/trust.py),
    before any credential is sent to it. 404 on a node without keys."""

    async def peer_proof(request: Request) -> Response:
        if keys is None:
            raise NotFound("this node has no cluster keys to prove")
        raw = await read_body(
            request.stream(), request.headers.get("content-length"), PROOF_BODY_LIMIT
        )
        try:
            nonce = orjson.loads(raw)["nonce"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            nonce = None
        if not isinstance(nonce, str) or not _MIN_NONCE <= len(nonce) <= _MAX_NONCE:
            raise BadRequest('POST {"nonce": "<16 to 128 characters>"}')
        return json_response({"url": url, "proofs": keys.proofs(nonce, url)})

    return peer_proof
