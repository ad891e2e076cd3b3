"""A Herald cluster's happy path, end to end (PROTOCOL §7): a real etcd and three real
`herald serve --cluster` processes on loopback (tests/cluster/nodes.py), talked to over
HTTP. Topics are cluster-wide with replication settings, any node publishes and reads,
leaders are spread, the epoch counts leader changes, GET /v1/cluster describes it all;
and a single node is what it was."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.cluster.nodes import HeraldCluster, read_all
from tests.conftest import HeraldProcess


@pytest.fixture
def cluster(shared_cluster: HeraldCluster) -> HeraldCluster:
    """The shared three-node cluster (tests/cluster/conftest.py): these tests fault
    nothing and each makes topics of its own names."""
    return shared_cluster


def config_of(cluster: HeraldCluster, node: str, topic: str) -> dict[str, Any]:
    config: dict[str, Any] = cluster.topic(topic, node)["config"]
    return config


@pytest.mark.timeout(120)
def test_a_topic_created_on_one_node_is_visible_on_every_node(cluster: HeraldCluster) -> None:
    created = cluster.put("n2", "/v1/topics/visible", {"partitions": 2})
    assert created.status_code == 201, created.text
    cluster.wait_for(
        lambda: all(cluster.get(n, "/v1/topics/visible").status_code == 200 for n in cluster.nodes),
        30.0,
        "the topic on every node",
    )
    configs = [config_of(cluster, node, "visible") for node in cluster.nodes]
    assert all(c == configs[0] for c in configs), configs
    assert configs[0]["partitions"] == 2
    for node in cluster.nodes:
        names = [t["name"] for t in cluster.get(node, "/v1/topics").json()["topics"]]
        assert "visible" in names, f"{node} does not list it"
    # The same PUT again on another node is the idempotent 200; another config, 409.
    again = cluster.put("n3", "/v1/topics/visible", {"partitions": 2})
    assert again.status_code == 200, again.text
    conflict = cluster.put("n1", "/v1/topics/visible", {"partitions": 3})
    assert conflict.status_code == 409, conflict.text


@pytest.mark.timeout(120)
def test_replication_defaults_follow_the_live_nodes(cluster: HeraldCluster) -> None:
    # PROTOCOL §7: replication_factor min(3, live nodes); min_insync min(2, RF).
    cases: dict[str, tuple[dict[str, Any], tuple[int, int]]] = {
        "defaults": ({}, (3, 2)),
        "rf2": ({"replication_factor": 2}, (2, 2)),
        "rf1": ({"replication_factor": 1}, (1, 1)),
        "rf3-min3": ({"replication_factor": 3, "min_insync_replicas": 3}, (3, 3)),
        "rf3-min1": ({"replication_factor": 3, "min_insync_replicas": 1}, (3, 1)),
    }
    for name, (body, (rf, min_isr)) in cases.items():
        cluster.create_topic(f"defaults-{name}", **body)
        for node in cluster.nodes:
            config = config_of(cluster, node, f"defaults-{name}")
            assert (config["replication_factor"], config["min_insync_replicas"]) == (rf, min_isr), (
                f"{name} on {node}: {config}"
            )
        partition = cluster.partition_state(f"defaults-{name}")
        assert len(partition["replicas"]) == rf == len(set(partition["replicas"]))
        assert partition["leader"] in partition["replicas"]
        cluster.wait_isr(f"defaults-{name}", 0, partition["replicas"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"replication_factor": 4}, "validation_error"),  # more than the live nodes
        ({"replication_factor": 0}, "validation_error"),
        ({"min_insync_replicas": 0}, "validation_error"),
        ({"replication_factor": 3, "min_insync_replicas": 4}, "validation_error"),
        ({"replication_factor": 2, "min_insync_replicas": 3}, "validation_error"),
        ({"min_insync_replicas": 4}, "validation_error"),  # above the default RF 3
        ({"replication_factor": "3"}, "bad_request"),
        ({"replication_factor": 1.5}, "bad_request"),
    ],
)
def test_bad_replication_settings_are_refused_and_create_nothing(
    cluster: HeraldCluster, body: dict[str, Any], code: str
) -> None:
    for node in cluster.nodes:
        answer = cluster.put(node, "/v1/topics/refused", body)
        assert answer.status_code == 400, f"{node}: {answer.status_code} {answer.text}"
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert answer.json()["code"] == code, answer.text
        assert cluster.get(node, "/v1/topics/refused").status_code == 404


@pytest.mark.timeout(120)
def test_a_publish_on_any_node_is_read_the_same_from_every_node(cluster: HeraldCluster) -> None:
    cluster.create_topic("anywhere", partitions=3)
    published: dict[int, list[tuple[int, Any]]] = {0: [], 1: [], 2: []}
    for round_ in range(3):
        for node in cluster.nodes:
            messages = [
                {"value": {"from": node, "round": round_, "p": p}, "partition": p} for p in range(3)
            ]
            answer = cluster.post(node, "/v1/topics/anywhere/messages", {"messages": messages})
            assert answer.status_code == 200, f"{node}: {answer.text}"
            results = answer.json()["results"]
            assert [r["partition"] for r in results] == [0, 1, 2]  # request order
            for message, result in zip(messages, results, strict=True):
                published[result["partition"]].append((result["offset"], message["value"]))
            # PROTOCOL §7: a read on any node after the 200 sees the publish.
            for reader in cluster.nodes:
                for p in range(3):
                    got = read_all(cluster, reader, "anywhere", p)
                    assert [(m["offset"], m["value"]) for m in got] == published[p], (
                        f"{reader} partition {p} after a publish on {node}"
                    )
    for p, records in published.items():
        assert [offset for offset, _ in records] == list(range(9)), f"partition {p}"
    for node in cluster.nodes:
        partitions = cluster.topic("anywhere", node)["partitions"]
        assert [q["end_offset"] for q in partitions] == [9, 9, 9], node


@pytest.mark.timeout(120)
def test_leaders_and_replicas_are_spread_evenly(cluster: HeraldCluster) -> None:
    def leaders_overall() -> Counter[str]:
        led: Counter[str] = Counter({n: 0 for n in cluster.nodes})
        for topic in cluster.get("n1", "/v1/topics").json()["topics"]:
            for p in cluster.topic(topic["name"])["partitions"]:
                led[p["leader"]] += 1
        return led

    def even(counts: Counter[str]) -> bool:
        return max(counts.values()) - min(counts.values()) <= 1

    # Even within the topic (Kafka's round robin) or over the whole cluster (a balancer
    # that gives new partitions to the nodes that lead least): either is "spread evenly".
    cluster.create_topic("spread", partitions=6)
    partitions = cluster.topic("spread")["partitions"]
    mine = Counter(p["leader"] for p in partitions)
    assert mine == {"n1": 2, "n2": 2, "n3": 2} or even(leaders_overall()), (
        f"leaders of 'spread': {dict(mine)}; over the cluster: {dict(leaders_overall())}"
    )
    for p in partitions:
        assert sorted(p["replicas"]) == ["n1", "n2", "n3"]
        assert p["leader"] in p["isr"]

    cluster.create_topic("spread-rf1", partitions=3, replication_factor=1)
    partitions = cluster.topic("spread-rf1")["partitions"]
    mine = Counter(p["leader"] for p in partitions)
    assert mine == {"n1": 1, "n2": 1, "n3": 1} or even(leaders_overall()), (
        f"leaders of 'spread-rf1': {dict(mine)}; over the cluster: {dict(leaders_overall())}"
    )
    assert all(p["replicas"] == [p["leader"]] == p["isr"] for p in partitions)

    # GET /v1/cluster "leads": what each node leads, over every topic.
    led = leaders_overall()
    for node in cluster.nodes:
        leads = {n["id"]: n["leads"] for n in cluster.cluster_view(node)["nodes"]}
        assert leads == {n: led[n] for n in cluster.nodes}, f"{node}: {leads} != {dict(led)}"


@pytest.mark.timeout(120)
def test_get_cluster_describes_nodes_and_partitions(cluster: HeraldCluster) -> None:
    cluster.create_topic("described", partitions=2)
    for k in range(2):
        answer = cluster.post(
            "n1", "/v1/topics/described/messages", {"messages": [{"value": k, "partition": k}]}
        )
        assert answer.status_code == 200, answer.text

    for node_id, node in cluster.nodes.items():
        body = cluster.cluster_view(node_id)
        assert body["name"] == "herald"
        assert body["node"] == node_id
        nodes = sorted(body["nodes"], key=lambda n: n["id"])
        assert [n["id"] for n in nodes] == ["n1", "n2", "n3"]
        for entry in nodes:
            assert set(entry) >= {"id", "url", "live", "leads"}
            assert entry["url"] == cluster.nodes[entry["id"]].url  # the advertise URL
            assert entry["live"] is True
            assert isinstance(entry["leads"], int)
        assert node.url in {n["url"] for n in nodes}

    def settled() -> bool:
        body = cluster.cluster_view("n2")
        mine = [p for p in body["partitions"] if p["topic"] == "described"]
        assert sorted(p["partition"] for p in mine) == [0, 1]
        for p in mine:
            assert set(p) >= {
                "topic", "partition", "leader", "epoch", "replicas", "isr",
                "high_watermark", "log_end", "lag",
            }  # fmt: skip
            assert set(p["lag"]) == set(p["replicas"]) - {p["leader"]}
            assert p["high_watermark"] <= p["log_end"]
        return all(
            p["high_watermark"] == p["log_end"] == 1 and set(p["lag"].values()) == {0} for p in mine
        )

    cluster.wait_for(settled, 30.0, "every follower of 'described' caught up, lag 0")
    state = cluster.partition_state("described", 1)
    entry = next(
        p
        for p in cluster.cluster_view("n3")["partitions"]
        if p["topic"] == "described" and p["partition"] == 1
    )
    for field in ("leader", "epoch", "replicas", "isr"):
        assert entry[field] == state[field], field


@pytest.mark.timeout(180)
def test_the_epoch_goes_up_by_one_at_each_change_of_leader_and_only_then(
    herald_cluster: HeraldCluster,
) -> None:
    cluster = herald_cluster
    cluster.create_topic("epochs")
    first = cluster.partition_state("epochs")
    follower = next(n for n in first["replicas"] if n != first["leader"])

    cluster.kill(follower)  # a follower leaving and returning changes no leader
    cluster.restart(follower)
    cluster.wait_isr("epochs", 0, first["replicas"])
    assert cluster.partition_state("epochs")["epoch"] == first["epoch"]
    assert cluster.partition_state("epochs")["leader"] == first["leader"]

    epoch, leader = first["epoch"], first["leader"]
    for _ in range(2):
        cluster.kill(leader)
        state = cluster.wait_leader("epochs", not_on={leader})
        assert state["epoch"] == epoch + 1, f"{leader} -> {state['leader']}: {state}"

        def published(at: str = state["leader"]) -> bool:
            answer = cluster.post(at, "/v1/topics/epochs/messages", {"messages": [{"value": 1}]})
            # PROTOCOL §7: 503 not_enough_replicas while the ISR is below min_insync_replicas;
            # under load a follower can drop out of it and rejoin around the failover.
            if answer.status_code == 503 and answer.json()["code"] == "not_enough_replicas":
                return False
            if answer.status_code != 200:
                pytest.fail(answer.text)
            return True

        cluster.wait_for(published, 60.0, "a publish to the new leader")
        cluster.restart(leader)
        cluster.wait_isr("epochs", 0, first["replicas"], within=60.0)
        now = cluster.partition_state("epochs")
        if now["leader"] == state["leader"]:
            assert now["epoch"] == state["epoch"], "the epoch moved without a leader change"
        epoch, leader = now["epoch"], now["leader"]


@pytest.mark.timeout(60)
def test_a_single_node_shows_replication_as_1_and_accepts_nothing_more(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    server = herald_factory()
    with httpx.Client(base_url=server.url, timeout=10) as http:
        created = http.put("/v1/topics/single")
        assert created.status_code == 201, created.text
        config = created.json()["config"]
        assert (config["replication_factor"], config["min_insync_replicas"]) == (1, 1)
        explicit = http.put(
            "/v1/topics/single-1", json={"replication_factor": 1, "min_insync_replicas": 1}
        )
        assert explicit.status_code == 201, explicit.text
        for body in ({"replication_factor": 2}, {"min_insync_replicas": 2}):
            refused = http.put("/v1/topics/single-2", json=body)
            assert refused.status_code == 400, refused.text
            assert refused.json()["code"] == "validation_error"
            assert http.get("/v1/topics/single-2").status_code == 404
        publish = http.post("/v1/topics/single/messages", json={"messages": [{"value": 1}]})
        assert publish.status_code == 200
        assert http.get("/v1/cluster").json()["name"] is None


@pytest.mark.timeout(120)
def test_an_auto_created_topic_is_marked_on_every_node(cluster: HeraldCluster) -> None:
    # docs/protocol.md "Auto-created topics": the mark travels with the topic's config in
    # etcd, so every node's console shows it, not only the node that made the topic.
    def published() -> bool:
        answer = cluster.post("n1", "/v1/topics/ordres/messages", {"messages": [{"value": 1}]})
        return answer.status_code == 200  # a 503 while the new topic gets its leader

    cluster.wait_for(published, 30.0, "a publish that auto-creates ordres")
    cluster.create_topic("orders", via="n1")

    def marks(node: str) -> dict[str, bool]:
        listed = cluster.get(node, "/v1/topics").json()["topics"]
        return {t["name"]: t["auto_created"] for t in listed if t["name"] in ("orders", "ordres")}

    others = ("n2", "n3")
    cluster.wait_for(lambda: all(len(marks(n)) == 2 for n in others), 30.0, "both topics")
    for node in others:
        assert marks(node) == {"orders": False, "ordres": True}, node
        assert cluster.topic("ordres", node)["auto_created"] is True
        assert cluster.topic("orders", node)["auto_created"] is False
