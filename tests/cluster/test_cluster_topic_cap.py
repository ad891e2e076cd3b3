"""PROTOCOL §6 in a cluster: --max-topics counts the whole cluster's topics (etcd's
topic keys), whichever node a creation, explicit or automatic, arrives at."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.nodes import HeraldCluster


def publish_until_acked(cluster: HeraldCluster, node: str, topic: str) -> None:
    """PROTOCOL §7: a 503 with Retry-After (a new topic's leader not yet known
    everywhere) may be retried."""

    def acked() -> bool:
        answer = cluster.post(node, f"/v1/topics/{topic}/messages", {"messages": [{"value": 1}]})
        assert answer.status_code in (200, 503), answer.text
        return answer.status_code == 200

    cluster.wait_for(acked, 60.0, f"a publish to {topic} on {node} acked")


@pytest.mark.timeout(300)
def test_topic_cap_counts_the_whole_cluster(tmp_path: Path) -> None:
    with HeraldCluster(tmp_path / "cluster", 2, extra_args=["--max-topics", "3"]) as cluster:
        assert cluster.put("n1", "/v1/topics/a", {}).status_code == 201
        assert cluster.put("n2", "/v1/topics/b", {}).status_code == 201
        publish_until_acked(cluster, "n1", "c")  # auto-created by the first try
        for node in ("n1", "n2"):
            refused = cluster.put(node, "/v1/topics/d", {})
            assert refused.status_code == 409, refused.text
            assert refused.headers["content-type"].startswith("application/problem+json")
            assert refused.json()["code"] == "limit_exceeded"
            auto = cluster.post(node, "/v1/topics/e/messages", {"messages": [{"value": 1}]})
            assert auto.status_code == 409, auto.text
            assert auto.json()["code"] == "limit_exceeded"
            # An existing topic is not a new one: its PUT and publishes go on.
            assert cluster.put(node, "/v1/topics/a", {}).status_code == 200
            publish_until_acked(cluster, node, "c")
        for node in ("n1", "n2"):
            names = sorted(t["name"] for t in cluster.get(node, "/v1/topics").json()["topics"])
            assert names == ["a", "b", "c"]
        # Room again once one is deleted.
        assert cluster.http.delete(f"{cluster.nodes['n2'].url}/v1/topics/b").status_code == 204
        assert cluster.put("n1", "/v1/topics/d", {}).status_code == 201
