"""The Cluster page against a real cluster (PROTOCOL §7): etcd and three `herald serve
--cluster` processes on loopback. Killing a partition's leader shows on the page of a
surviving node: the node not live, the partition's new leader at the next epoch, the
dead replica out of sync, the header's count of live nodes down by one."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.cluster.conftest import EtcdProcess, etcd_server  # noqa: F401 (a fixture)
from tests.conftest import HeraldProcess
from tests.console.conftest import screenshot

NODE_TTL_MS = 2000
# A kill shows within the node's lease, the failover (node_ttl_ms + 2 s, PROTOCOL §7) and
# a refresh of the page (1.5 s); generous on a loaded 2-core machine.
FAILOVER_S = 60


def start_cluster(
    etcd: EtcdProcess, herald_factory: Callable[..., HeraldProcess], n: int = 3
) -> dict[str, HeraldProcess]:
    nodes = {}
    for i in range(1, n + 1):
        node = f"n{i}"
        nodes[node] = herald_factory(
            "--cluster", ",".join(etcd.urls), "--node-id", node,
            "--node-ttl-ms", str(NODE_TTL_MS), "--replica-lag-ms", "2000",
        )  # fmt: skip
    return nodes


def publish_until_taken(url: str, topic: str, messages: list[dict[str, Any]]) -> None:
    """Publish at acks=all, retrying the 503s of a cluster still electing its leaders."""
    deadline = time.monotonic() + 60
    while True:
        response = httpx.post(f"{url}/v1/topics/{topic}/messages", json={"messages": messages})
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        assert response.status_code == 503, response.text
        time.sleep(0.2)
    assert response.status_code == 200, response.text


def test_a_killed_leader_shows_not_live_and_its_partition_moves(
    etcd_server: EtcdProcess,  # noqa: F811 (the fixture imported above)
    herald_factory: Callable[..., HeraldProcess],
    page: Any,
) -> None:
    nodes = start_cluster(etcd_server, herald_factory)
    first = nodes["n1"]
    created = httpx.put(f"{first.url}/v1/topics/orders", json={"partitions": 3}, timeout=30)
    assert created.status_code == 201, created.text
    for p in range(3):
        publish_until_taken(first.url, "orders", [{"partition": p, "value": i} for i in range(5)])
    partitions = httpx.get(f"{first.url}/v1/topics/orders").json()["partitions"]

    page.goto(f"{first.url}/console/#/cluster")
    expect(page.locator("#cluster-name")).to_have_text("herald")
    expect(page.locator("#cluster-this-node")).to_have_text("n1")
    expect(page.locator("#cluster-live")).to_have_text("3 / 3")
    expect(page.locator("#cluster-info")).to_have_text("herald · 3/3 nodes live")
    for node in nodes.values():
        row = page.locator(f"#nodes-table tr[data-node={node_id(nodes, node)}]")
        expect(row.locator("[data-live]")).to_have_text("live")
        expect(row.locator("a")).to_have_text(node.url)
    expect(page.locator("#nodes-table tr[data-node=n1]")).to_contain_text("this node")
    for p in partitions:
        row = page.locator(f"#partitions-table tr[data-key='orders/{p['partition']}']")
        expect(row.locator("[data-col=leader]")).to_have_text(p["leader"])
        expect(row.locator("[data-col=epoch]")).to_have_text(str(p["epoch"]))
        expect(row.locator("[data-col=isr] ")).to_have_text(", ".join(p["isr"]))
        expect(row.locator("[data-col=hwm]")).to_have_text("5")
        expect(row.locator("[data-col=log-end]")).to_have_text("5")
        for follower in (r for r in p["replicas"] if r != p["leader"]):
            expect(row.locator(f"[data-follower={follower}]")).to_have_text(f"{follower} 0")
    screenshot(page, "cluster-three-nodes")

    # Kill -9 the leader of a partition, on a node other than the page's.
    victim = next(p for p in partitions if p["leader"] != "n1")
    dead = victim["leader"]
    nodes[dead].kill()
    row = page.locator(f"#partitions-table tr[data-key='orders/{victim['partition']}']")
    timeout = FAILOVER_S * 1000
    expect(page.locator(f"#nodes-table tr[data-node={dead}] [data-live]")).to_have_text(
        "not live", timeout=timeout
    )
    expect(page.locator("#cluster-live")).to_have_text("2 / 3", timeout=timeout)
    expect(page.locator("#cluster-info")).to_have_text("herald · 2/3 nodes live", timeout=timeout)
    expect(row.locator("[data-col=epoch]")).to_have_text(str(victim["epoch"] + 1), timeout=timeout)
    leader = row.locator("[data-col=leader]").inner_text()
    assert leader != dead and leader in nodes, leader
    # Out of the ISR: struck out among the replicas, its lag highlighted.
    expect(row.locator("[data-col=replicas] .replica.oos")).to_have_text(dead, timeout=timeout)
    expect(row.locator(f"[data-col=lag] .lag.oos[data-follower={dead}]")).to_have_count(1)
    expect(page.locator("#cluster-under-replicated")).not_to_have_text("0")
    expect(page.locator("#cluster-leaderless")).to_have_text("0", timeout=timeout)
    after = httpx.get(f"{first.url}/v1/topics/orders").json()["partitions"][victim["partition"]]
    assert (after["leader"], after["epoch"]) == (leader, victim["epoch"] + 1)
    screenshot(page, "cluster-leader-killed")

    # The page's filter of problems keeps the partitions the dead node was a replica of.
    page.check("#cluster-problems")
    expect(row).to_have_count(1)
    assert page.console_errors == []


def node_id(nodes: dict[str, HeraldProcess], process: HeraldProcess) -> str:
    return next(name for name, p in nodes.items() if p is process)
