"""The Cluster page against a real cluster (PROTOCOL §7): etcd and three `herald serve
--cluster` processes on loopback. Killing a partition's leader shows on the page of a
surviving node: the node not live, the partition's new leader at the next epoch, the
dead replica out of sync, the header's count of live nodes down by one."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from server.auth import credentials_digest, new_token, toml_entry
from tests.cluster.nodes import HeraldCluster
from tests.console.conftest import screenshot
from tests.security.conftest import write_auth_file

# A kill shows within the node's lease, the failover (node_ttl_ms + 2 s, PROTOCOL §7) and
# a refresh of the page (1.5 s); generous on a loaded 2-core machine.
FAILOVER_S = 60
DIGITS = re.compile(r"^\d+$")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[HeraldCluster]:
    """tests/cluster's herald_cluster (its conftest is not this folder's): n1, n2, n3."""
    with HeraldCluster(tmp_path / "cluster", 3) as started:
        yield started


def test_a_killed_leader_shows_not_live_and_its_partition_moves(
    cluster: HeraldCluster, page: Any
) -> None:
    nodes = cluster.nodes
    first = nodes["n1"]
    cluster.create_topic("orders", via=first, partitions=3)
    for p in range(3):
        body = {"messages": [{"partition": p, "value": i} for i in range(5)]}
        # PROTOCOL §7: a 503 (a leader that just lost and renewed its lease on a loaded
        # host) appended nothing; the SDK retries it, and so does this test.
        deadline = time.monotonic() + 30.0
        published = cluster.post(first, "/v1/topics/orders/messages", body)
        while published.status_code == 503 and time.monotonic() < deadline:
            assert published.json().get("outcome") != "unknown", published.text
            time.sleep(0.2)
            published = cluster.post(first, "/v1/topics/orders/messages", body)
        assert published.status_code == 200, published.text
    partitions = cluster.topic("orders", first)["partitions"]

    page.goto(f"{first.url}/console/#/cluster")
    expect(page.locator("#cluster-name")).to_have_text("herald")
    expect(page.locator("#cluster-this-node")).to_have_text("n1")
    expect(page.locator("#cluster-live")).to_have_text("3 / 3")
    expect(page.locator("#cluster-info")).to_have_text("herald · 3/3 nodes live")
    for node_id, node in nodes.items():
        row = page.locator(f"#nodes-table tr[data-node={node_id}]")
        expect(row.locator("[data-live]")).to_have_text("live")
        expect(row.locator("a")).to_have_text(node.url)
    expect(page.locator("#nodes-table tr[data-node=n1]")).to_contain_text("this node")
    # This node's replication counters come from its own /metrics (a page reads only its
    # own origin); the other nodes' are on their consoles.
    for counter in ("isr_shrinks", "isr_expands", "leader_changes", "lease_refusals"):
        cell = f"[data-col=herald_{counter}_total]"
        expect(page.locator(f"#nodes-table tr[data-node=n1] {cell}")).to_have_text(DIGITS)
        expect(page.locator(f"#nodes-table tr[data-node=n2] {cell}")).to_have_text("—")
    for p in partitions:
        row = page.locator(f"#partitions-table tr[data-key='orders/{p['partition']}']")
        expect(row.locator("[data-col=leader]")).to_have_text(p["leader"])
        expect(row.locator("[data-col=epoch]")).to_have_text(str(p["epoch"]))
        expect(row.locator("[data-col=isr]")).to_have_text(", ".join(p["isr"]))
        expect(row.locator("[data-col=hwm]")).to_have_text("5")
        expect(row.locator("[data-col=log-end]")).to_have_text("5")
        for follower in (r for r in p["replicas"] if r != p["leader"]):
            expect(row.locator(f"[data-follower={follower}]")).to_have_text(f"{follower} 0")
    screenshot(page, "cluster-three-nodes")

    # Kill -9 the leader of a partition, on a node other than the page's.
    victim = next(p for p in partitions if p["leader"] != "n1")
    dead = victim["leader"]
    cluster.kill(dead)
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
    after = cluster.partition_state("orders", victim["partition"], first)
    assert (after["leader"], after["epoch"]) == (leader, victim["epoch"] + 1)
    screenshot(page, "cluster-leader-killed")

    # The page's filter of problems keeps the partitions the dead node was a replica of.
    page.check("#cluster-problems")
    expect(row).to_have_count(1)
    assert page.console_errors == []


def test_nodes_with_different_credentials_files_show_a_warning(tmp_path: Path, page: Any) -> None:
    """docs/security.md: revocation is per node; the page shows when the nodes' credentials
    files differ (GET /v1/cluster `credentials`), and stops once they agree."""
    files = {node: tmp_path / f"auth-{node}.toml" for node in ("n1", "n2")}
    tokens = write_auth_file(files["n1"], {"admin": (["admin"], [])})
    extra_id, extra = new_token()
    edited = files["n1"].read_text() + "\n" + toml_entry(extra_id, extra, ["admin"], [])
    files["n2"].write_text(edited)  # an edit that reached n2 only
    cluster = HeraldCluster(
        tmp_path / "cluster",
        2,
        node_args={node: ["--auth-file", str(path)] for node, path in files.items()},
        env={"HERALD_CLUSTER_TOKEN": tokens["admin"]},
    )
    cluster.http.headers["Authorization"] = f"Bearer {tokens['admin']}"
    with cluster:
        page.goto(f"{cluster.nodes['n1'].url}/console/#/cluster")
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", tokens["admin"])
        page.click("#token-dialog button")
        warning = page.locator("#cluster-credentials")
        expect(warning).to_contain_text("2 different credentials files", timeout=30_000)
        other = page.locator("#nodes-table tr[data-node=n2] [data-col=credentials]")
        expect(other).to_have_class(re.compile(r"\bbad\b"))
        expect(other).to_have_text(credentials_digest(edited))
        screenshot(page, "cluster-credentials-mismatch")
        files["n1"].write_text(edited)  # rolled out to every node
        expect(warning).to_be_hidden(timeout=30_000)
        expect(other).not_to_have_class(re.compile(r"\bbad\b"))
        # Only the calls made before the token was given (401) failed.
        assert [e for e in page.console_errors if "401" not in e] == []
