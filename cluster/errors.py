"""The errors a cluster adds to PROTOCOL §7's answers: each a 503 with ``Retry-After``.

``cluster_unavailable`` (etcd cannot be reached, or this node cannot renew its lease)
is :class:`cluster.etcd.EtcdUnavailable`.
"""

from __future__ import annotations

from typing import Any

from herald.protocol.errors import HeraldError


class _Unavailable(HeraldError):
    status, title = 503, "Service Unavailable"

    def __init__(self, detail: str, **extra: Any) -> None:
        extra.setdefault("retry_after", 1)
        super().__init__(detail, **extra)


class LeaderUnavailable(_Unavailable):
    """The partition has no live leader (or its leader moved while the request ran):
    nothing of the batch was appended by this answer."""

    code = "leader_unavailable"


class NotEnoughReplicas(_Unavailable):
    """acks=all while the ISR is below min_insync_replicas."""

    code = "not_enough_replicas"
