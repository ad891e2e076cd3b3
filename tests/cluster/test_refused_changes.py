"""Issue 25, item 8: a refused change did not happen — unless the problem says its
outcome is unknown (PROTOCOL §7, settled 2026-11-26).

With etcd frozen (SIGSTOP) a write reaches etcd's socket and is never answered: the node
cannot know whether it was applied, so its 503 ``cluster_unavailable`` carries
``"outcome": "unknown"`` and the change may still take effect when etcd wakes (retrying
is safe). With etcd gone (connections refused) nothing was sent: the 503 carries no
outcome, and nothing changes when etcd is back.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx
import pytest

from tests.cluster.nodes import HeraldCluster


def problem(answer: Any) -> dict[str, Any]:
    assert answer.headers.get("content-type", "").startswith("application/problem+json"), (
        answer.text
    )
    body: dict[str, Any] = answer.json()
    return body


def delete_with_etcd_down(
    cluster: HeraldCluster, topic: str, outage: Literal["paused", "killed"]
) -> tuple[str, httpx.Response]:
    """Create ``topic``, then DELETE it through a serving node while etcd is down:
    ``paused`` (SIGSTOP: the request is sent and never answered) or ``killed`` (refused
    at once); etcd is back right after. The node asked, and its answer: a 503
    cluster_unavailable problem (:func:`problem`)."""
    etcd = cluster.etcd
    assert etcd is not None
    cluster.create_topic(topic, replication_factor=3, min_insync_replicas=2)
    node = cluster.any_serving().node_id
    stop, start = (etcd.pause, etcd.resume) if outage == "paused" else (etcd.kill, etcd.start)
    stop()
    try:
        answer = cluster.http.delete(f"{cluster.nodes[node].url}/v1/topics/{topic}", timeout=30.0)
    finally:
        start()
    assert answer.status_code == 503, answer.text
    assert problem(answer)["code"] == "cluster_unavailable"
    return node, answer


@pytest.mark.timeout(240)
def test_a_delete_etcd_never_answered_says_its_outcome_is_unknown_and_retrying_is_safe(
    herald_cluster: HeraldCluster,
) -> None:
    cluster = herald_cluster
    node, answer = delete_with_etcd_down(cluster, "doomed", "paused")
    body = problem(answer)
    assert body.get("outcome") == "unknown", body
    assert answer.headers.get("retry-after")

    cluster.wait_live(3, within=60.0)

    # Retrying is safe: the topic is deleted now, whether the first write took or not.
    def deleted() -> bool:
        again = cluster.http.delete(f"{cluster.nodes[node].url}/v1/topics/doomed", timeout=30.0)
        return again.status_code in (204, 404)

    cluster.wait_for(deleted, 60.0, "the retried delete answered")
    for other in cluster.nodes:
        cluster.wait_for(
            lambda other=other: cluster.get(other, "/v1/topics/doomed").status_code == 404,
            30.0,
            f"topic gone on {other}",
        )


@pytest.mark.timeout(240)
def test_a_delete_refused_with_etcd_unreachable_changes_nothing(
    herald_cluster: HeraldCluster,
) -> None:
    cluster = herald_cluster
    _, answer = delete_with_etcd_down(cluster, "kept", "killed")
    body = problem(answer)
    assert "outcome" not in body, body

    cluster.wait_live(3, within=60.0)
    for other in cluster.nodes:
        got = cluster.get(other, "/v1/topics/kept")
        assert got.status_code == 200, f"{other}: {got.status_code} {got.text}"
