"""What etcd answers and how a call to it fails: the errors and codes the client
(:mod:`cluster.etcd`) and its watches (:mod:`cluster.etcd_watch`) share.

Its own module so that the watch needs nothing of the client module and the client can
import the watch: no import circle between the two.
"""

from __future__ import annotations

from typing import Any

from herald.protocol.errors import HeraldError

# gRPC status codes etcd answers with (google.golang.org/grpc/codes).
GRPC_CANCELED = 1
GRPC_NOT_FOUND = 5
GRPC_DEADLINE_EXCEEDED = 4
GRPC_UNAVAILABLE = 14
# The member, not the request: worth another endpoint. CANCELED is what a member's
# gateway answers while the member shuts down ("grpc: the client connection is
# closing", HTTP 408): the nemesis saw it reach a client as a 500.
SERVER_SIDE_CODES = frozenset({GRPC_CANCELED, GRPC_DEADLINE_EXCEEDED, GRPC_UNAVAILABLE})

# Sent as gRPC metadata through the gateway: a member without a leader refuses the
# request instead of serving it stale (clientv3.WithRequireLeader).
REQUIRE_LEADER = {"Grpc-Metadata-hasleader": "true"}


class EtcdUnavailable(HeraldError):
    """etcd cannot be reached (no endpoint answered within the call's timeout)."""

    code, status, title = "cluster_unavailable", 503, "Service Unavailable"

    def __init__(self, detail: str, **extra: Any) -> None:
        extra.setdefault("retry_after", 1)
        super().__init__(detail, **extra)


class EtcdOutcomeUnknown(EtcdUnavailable):
    """A write was sent but no answer came back: it may or may not have been applied.

    PROTOCOL §7 (settled 2026-11-26): a refused change did not happen, unless its write
    had already reached etcd unanswered — then the problem says ``"outcome": "unknown"``
    (the change may still take effect when etcd answers again; retrying is safe)."""

    def __init__(self, detail: str, **extra: Any) -> None:
        extra.setdefault("outcome", "unknown")
        super().__init__(detail, **extra)


class EtcdAuthFailed(EtcdUnavailable):
    """etcd refused this node's user and password or its client certificate: at a start,
    a one-line refusal (server/etcd_check.py); later (a password changed in etcd), etcd
    is as good as unreachable until the settings are fixed."""


class EtcdError(Exception):
    """etcd answered, and refused the request (a bug of ours, or a state to handle)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"etcd error {code}: {message}")
        self.grpc_code = code
        self.message = message


class LeaseNotFound(EtcdError):
    """The lease does not exist (any more): it expired or was revoked."""


class WatchCompacted(EtcdError):
    """The watch's start revision was compacted away: re-read, then watch from there."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(0, f"revision compacted; oldest available is {compact_revision}")
        self.compact_revision = compact_revision


class Retryable(Exception):
    """One attempt failed in a way that is safe to repeat on the next endpoint."""


def refusal(code: int, message: str) -> EtcdError:
    if code == GRPC_NOT_FOUND and "lease not found" in message:
        return LeaseNotFound(code, message)
    return EtcdError(code, message)
