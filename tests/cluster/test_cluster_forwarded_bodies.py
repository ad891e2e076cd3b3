"""A request forwarded to a subscription's coordinator (PROTOCOL §7) has its body bounded
on the node it arrived at, as the coordinator's route bounds it (STYLE rule 3): a body
over the limit is the same 413 problem from any node, and is never held whole."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from server.http import ADMIN_BODY_LIMIT
from tests.cluster.nodes import HeraldCluster
from tests.cluster.test_cluster_subscriptions import wait_coordinated

pytestmark = pytest.mark.timeout(240)


def _oversized() -> Iterator[bytes]:
    """A body one byte over the limit, sent chunked (no Content-Length to refuse it by)."""
    chunk = b" " * 65536
    for _ in range(ADMIN_BODY_LIMIT // len(chunk)):
        yield chunk
    yield b"x"


def test_a_forwarded_body_over_the_limit_gets_the_same_413_as_an_unforwarded_one(
    shared_cluster: HeraldCluster, unique: Callable[[str], str]
) -> None:
    cluster = shared_cluster
    topic, billing = unique("orders"), unique("billing")
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    created = cluster.put("n1", f"/v1/subscriptions/{billing}", {"topic": topic})
    assert created.status_code == 201, created.text
    owner = wait_coordinated(cluster, billing)
    other = next(n for n in ("n1", "n2", "n3") if n != owner)
    cluster.wait_known_everywhere(f"/v1/subscriptions/{billing}")
    answers: dict[tuple[str, str], httpx.Response] = {}
    for node in (owner, other):
        url = f"{cluster.nodes[node].url}/v1/subscriptions/{billing}/ack"
        declared = b'{"ids":["' + b"a" * ADMIN_BODY_LIMIT + b'"]}'
        answers[node, "declared"] = httpx.post(
            url, content=declared, headers={"content-type": "application/json"}, timeout=60
        )
        answers[node, "streamed"] = httpx.post(
            url, content=_oversized(), headers={"content-type": "application/json"}, timeout=60
        )
    for how in ("declared", "streamed"):
        direct, forwarded = answers[owner, how], answers[other, how]
        assert direct.status_code == forwarded.status_code == 413, (how, forwarded.text)
        assert direct.headers["content-type"] == forwarded.headers["content-type"]
        assert direct.json() == forwarded.json()
        assert forwarded.json()["code"] == "payload_too_large"
    # Nothing was changed, and a body within the limit is still forwarded.
    acked = httpx.post(
        f"{cluster.nodes[other].url}/v1/subscriptions/{billing}/ack", json={"ids": ["nope"]}
    )
    assert acked.status_code == 200, acked.text
    assert acked.json() == {"ok": [], "unknown": ["nope"]}
