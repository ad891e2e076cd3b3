"""Issue 14's fault tests, end to end: a real etcd and three real `herald serve --cluster`
processes on loopback (tests/cluster/nodes.py), faults by signal (kill -9, SIGSTOP /
SIGCONT), clients over real HTTP that record every answer, and after every test the
replica checker (tests/cluster/checker.py) over every replica's partition directory.

PROTOCOL §7: no record answered 200 at acks=all is ever lost; offsets stay contiguous;
no reader ever sees two different records at one offset; a node that loses its lease
stops acknowledging before its lease can expire; a returning replica drops what the
leader does not have, catches up and rejoins the ISR; with the ISR below
min_insync_replicas, acks=all is refused (503 not_enough_replicas) before any append;
with etcd unreachable, committed records stay readable and what needs etcd answers 503
cluster_unavailable within 5 s, until etcd is back.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterable
from typing import Any

import httpx
import pytest

from tests.cluster.nodes import (
    Ack,
    HeraldCluster,
    Publisher,
    Reader,
    message_bytes,
    read_all,
)

TOPIC_CONFIG: dict[str, Any] = {"replication_factor": 3, "min_insync_replicas": 2}
CONTRACT_ANSWER_S = 5.0  # PROTOCOL §7: cluster_unavailable "within 5 s (never a hang)"
GRACE_S = 2.5  # a loaded 2-core machine schedules late; still far from a hang


def all_acks(publishers: Iterable[Publisher]) -> list[Ack]:
    return [ack for publisher in publishers for ack in publisher.acked()]


def assert_acks_consistent(acks: list[Ack]) -> None:
    """One offset per producer id (a retried batch comes back as its original), and
    never two ids at one offset."""
    offset_of: dict[str, int] = {}
    id_at: dict[int, str] = {}
    for ack in acks:
        assert offset_of.setdefault(ack.id, ack.offset) == ack.offset, (
            f"{ack.id} acknowledged at {offset_of[ack.id]} and at {ack.offset}"
        )
        assert id_at.setdefault(ack.offset, ack.id) == ack.id, (
            f"offset {ack.offset} acknowledged for {id_at[ack.offset]} and for {ack.id}"
        )


def assert_readable_everywhere(
    cluster: HeraldCluster, topic: str, acks: list[Ack], nodes: Iterable[str]
) -> list[dict[str, Any]]:
    """Every node serves the same contiguous records, holding every acknowledged one."""
    reference: list[tuple[int, bytes]] | None = None
    records: list[dict[str, Any]] = []
    for node in nodes:
        records = read_all(cluster, node, topic)
        served = [(m["offset"], message_bytes(m)) for m in records]
        offsets = [offset for offset, _ in served]
        assert offsets == list(range(len(offsets))), f"{node}: offsets not contiguous from 0"
        by_offset = dict(served)
        missing = [a for a in acks if by_offset.get(a.offset) != a.value]
        assert not missing, f"{node}: {len(missing)} acknowledged records missing: {missing[:5]}"
        if reference is None:
            reference = served
        else:
            assert served == reference, f"{node} serves other records than the first node"
    return records


def wait_acks(
    cluster: HeraldCluster, publishers: list[Publisher], count: int, after: float
) -> None:
    cluster.wait_for(
        lambda: sum(1 for a in all_acks(publishers) if a.sent >= after) >= count,
        45.0,
        f"{count} records acknowledged",
    )


def publish(
    cluster: HeraldCluster, node: str, topic: str, ids: list[str], acks: str = "all"
) -> httpx.Response:
    messages = [
        {"id": i, "value_b64": base64.b64encode(i.encode()).decode(), "partition": 0} for i in ids
    ]
    return cluster.post(node, f"/v1/topics/{topic}/messages", {"messages": messages}, acks=acks)


def publish_retrying(
    cluster: HeraldCluster, node: str, topic: str, ids: list[str], within_s: float = 30.0
) -> httpx.Response:
    """``publish`` retried on 503, as the SDK retries (PROTOCOL §7: while a partition has
    no live leader, publishes answer 503 and nothing is appended; the ids make a retry
    safe). Nodes that registered again after an outage elect anew, so a write accepted
    once can meet a 503 again for a moment."""
    deadline = time.monotonic() + within_s
    while True:
        answer = publish(cluster, node, topic, ids)
        if answer.status_code != 503 or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def acks_of(answer: httpx.Response, ids: list[str], node: str, sent: float) -> list[Ack]:
    assert answer.status_code == 200, f"{node}: {answer.status_code} {answer.text}"
    now = time.monotonic()
    return [
        Ack(i, i.encode(), r["partition"], r["offset"], r["duplicate"], node, sent, now)
        for i, r in zip(ids, answer.json()["results"], strict=True)
    ]


def problem_code(answer: httpx.Response) -> str | None:
    try:
        code = answer.json().get("code")
    except ValueError:
        return None
    return code if isinstance(code, str) else None


# -- kill -9 of a leader ---------------------------------------------------------------


@pytest.mark.timeout(240)
def test_kill_9_of_a_leader_under_four_producers_loses_no_acknowledged_record(
    herald_cluster: HeraldCluster,
) -> None:
    cluster = herald_cluster
    cluster.create_topic("orders", **TOPIC_CONFIG)
    before = cluster.partition_state("orders")
    old = before["leader"]
    ids = list(cluster.nodes)
    # Two producers start on the leader itself, two on followers (forwarded); each
    # moves to the next node when its node does not answer.
    starts = [old, old, *[n for n in ids if n != old]]
    producers = [
        Publisher(cluster, f"p{k}", "orders", ids[ids.index(s) :] + ids[: ids.index(s)])
        for k, s in enumerate(starts)
    ]
    for producer in producers:
        producer.start()
    try:
        wait_acks(cluster, producers, 200, after=0.0)
        killed_at = time.monotonic()
        cluster.kill(old)
        after = cluster.wait_leader("orders", not_on={old})
        elected_s = time.monotonic() - killed_at
        wait_acks(cluster, producers, 1, after=killed_at)
        first_ack_s = min(a.answered for a in all_acks(producers) if a.sent >= killed_at)
        first_ack_s -= killed_at
        wait_acks(cluster, producers, 200, after=killed_at)
        print(
            f"\nfailover: leader {old} killed; {after['leader']} leads at epoch "
            f"{after['epoch']} after {elected_s:.2f} s (seen by every node); first acks=all "
            f"publish answered {first_ack_s:.2f} s after the kill "
            f"(node TTL {cluster.node_ttl_ms} ms)"
        )
        # One election at least: a survivor's lease lapsing on a loaded host adds one.
        assert after["epoch"] >= before["epoch"] + 1

        cluster.restart(old)  # producers still running: it catches up under load
        cluster.wait_isr("orders", 0, ids, within=60.0)
    finally:
        for producer in producers:
            producer.stop()

    acks = all_acks(producers)
    assert_acks_consistent(acks)
    print(
        f"{len(acks)} records acknowledged, "
        f"{sum(p.transport_errors for p in producers)} requests unanswered, "
        f"{sum(len(p.refusals) for p in producers)} refused: "
        f"{sorted({(r.status, r.code) for p in producers for r in p.refusals})}"
    )
    assert_readable_everywhere(cluster, "orders", acks, ids)
    high_watermark = cluster.high_watermark("orders")
    state = cluster.partition_state("orders")
    if state["leader"] == after["leader"]:
        assert state["epoch"] == after["epoch"], "the epoch moved without a leader change"
    report = cluster.check(
        "orders",
        replicas=ids,
        high_watermark=high_watermark,
        acknowledged=[(a.offset, a.value) for a in acks],
    )
    assert report.acknowledged == len(acks)
    assert all(s.end == high_watermark for s in report.replicas.values()), report.replicas


# -- SIGSTOP of a leader longer than its lease -------------------------------------------


@pytest.mark.timeout(240)
def test_a_leader_frozen_past_its_lease_acknowledges_nothing_late_and_drops_its_tail(
    herald_cluster: HeraldCluster,
) -> None:
    cluster = herald_cluster
    ttl_s = cluster.node_ttl_ms / 1000
    cluster.create_topic("events", **TOPIC_CONFIG)
    before = cluster.partition_state("events")
    old = before["leader"]
    followers = [n for n in cluster.nodes if n != old]
    ids = list(cluster.nodes)
    reader = Reader(cluster, "events", ids).start()
    # One producer forwards through the followers; one talks to the leader itself and
    # waits long for an answer, so that a request it froze is still open when it wakes.
    via_followers = Publisher(cluster, "f", "events", followers)
    direct = Publisher(cluster, "d", "events", [old, *followers], timeout=30.0)
    producers = [via_followers, direct]
    tail: list[Ack] = []
    try:
        for producer in producers:
            producer.start()
        wait_acks(cluster, producers, 100, after=0.0)

        # The followers freeze (shorter than the TTL and the replica lag: they stay live
        # and in the ISR) while the leader writes records at acks=1: an unreplicated tail.
        for follower in followers:
            cluster.pause(follower)
        try:
            # A few batches, each sent once the last was answered (a follower's fetch
            # that was waiting may carry the first away); well within the TTL.
            frozen_at = time.monotonic()
            for k in range(8):
                # At least one batch; then no longer than 0.6 s in all, so that the
                # followers' leases (renewed up to a third of the TTL before) hold.
                if k >= 1 and time.monotonic() - frozen_at > 0.6:
                    break
                batch = [f"tail-{k}-{j}" for j in range(3)]
                sent = time.monotonic()
                tail += acks_of(publish(cluster, old, "events", batch, acks="1"), batch, old, sent)
                time.sleep(0.03)
        finally:
            stopped_at = time.monotonic()
            cluster.pause(old)
            for follower in followers:
                cluster.resume(follower)

        after = cluster.wait_leader("events", not_on={old})
        elected_s = time.monotonic() - stopped_at
        wait_acks(cluster, [via_followers], 50, after=stopped_at + ttl_s)
        frozen_s = time.monotonic() - stopped_at
        assert frozen_s > ttl_s
        resumed_at = time.monotonic()
        cluster.resume(old)
        cluster.wait_isr("events", 0, ids, within=60.0)
        rejoined_s = time.monotonic() - resumed_at
        wait_acks(cluster, producers, 20, after=time.monotonic())
    finally:
        for producer in producers:
            producer.stop()
        reader.stop()

    print(
        f"\n{old} frozen {frozen_s:.2f} s (TTL {ttl_s} s); {after['leader']} led at epoch "
        f"{after['epoch']} {elected_s:.2f} s after the freeze; {old} back in the ISR "
        f"{rejoined_s:.2f} s after SIGCONT; the reader made {reader.reads} reads"
    )
    # One election at least: a survivor's lease lapsing on a loaded host adds one.
    assert after["epoch"] >= before["epoch"] + 1

    acks = all_acks(producers)
    assert_acks_consistent(acks)
    # Nothing acknowledged by the frozen leader once its lease could have expired
    # (measured here from the SIGSTOP, before which its last renewal was sent).
    late = [a for a in acks if a.node == old and a.answered > stopped_at + ttl_s]
    assert not late, f"{old} acknowledged {len(late)} records after its lease: {late[:5]}"
    refused_late = {
        (r.status, r.code) for r in direct.refusals if r.node == old and r.answered > resumed_at
    }
    print(f"the frozen leader's answers after SIGCONT: {sorted(refused_late) or 'none'}")

    records = assert_readable_everywhere(cluster, "events", acks, ids)
    final = {m["offset"]: message_bytes(m) for m in records}
    dropped = [t for t in tail if final.get(t.offset) != t.value]
    print(f"acks=1 tail: {len(tail)} records written by {old} alone, {len(dropped)} dropped")
    assert dropped, "no unreplicated tail was made: the scenario did not test a truncation"
    # No reader ever saw a record that is not the final one at its offset (the dropped
    # tail included).
    for offset, shown in reader.shown.items():
        wrong = {(node, value) for node, value in shown if final.get(offset) != value}
        assert not wrong, f"offset {offset}: readers were shown {sorted(wrong)}, not the log's"
    assert reader.shown, "the reader saw nothing"

    high_watermark = cluster.high_watermark("events")
    report = cluster.check(
        "events",
        replicas=ids,
        high_watermark=high_watermark,
        acknowledged=[(a.offset, a.value) for a in acks],
    )
    assert all(s.end == high_watermark for s in report.replicas.values()), report.replicas


# -- a follower killed and restarted; the ISR below min_insync_replicas ----------------


@pytest.mark.timeout(240)
def test_a_killed_follower_catches_up_and_a_short_isr_refuses_acks_all_before_appending(
    herald_cluster: HeraldCluster,
) -> None:
    cluster = herald_cluster
    ids = list(cluster.nodes)
    cluster.create_topic("t", **TOPIC_CONFIG)
    cluster.create_topic("strict", replication_factor=3, min_insync_replicas=3)
    leaders = {cluster.leader("t").node_id, cluster.leader("strict").node_id}
    victim = next(n for n in ids if n not in leaders)  # a follower of both
    survivors = [n for n in ids if n != victim]

    acks: dict[str, list[Ack]] = {"t": [], "strict": []}
    sent = time.monotonic()
    acks["t"] += acks_of(
        publish(cluster, ids[0], "t", [f"a{i}" for i in range(100)]),
        [f"a{i}" for i in range(100)],
        ids[0],
        sent,
    )
    strict_ids = [f"s{i}" for i in range(10)]
    acks["strict"] += acks_of(
        publish(cluster, ids[1], "strict", strict_ids), strict_ids, ids[1], sent
    )

    killed_at = time.monotonic()
    cluster.kill(victim)
    # A follower leaves the ISR once it has not caught up with the log end for
    # replica_lag_ms: one record at acks=1 (which waits for no ISR) makes it behind.
    for topic in ("t", "strict"):
        trigger = [f"{topic}-trigger"]
        sent = time.monotonic()
        acks[topic] += acks_of(
            publish(cluster, ids[0], topic, trigger, acks="1"), trigger, ids[0], sent
        )
    cluster.wait_isr("t", 0, survivors, within=30.0)
    cluster.wait_isr("strict", 0, survivors, within=30.0)
    print(f"\n{victim} killed; out of both ISRs {time.monotonic() - killed_at:.2f} s later")

    # ISR 2 < min_insync_replicas 3: refused before the append, on every node.
    end_before = cluster.high_watermark("strict")
    for k, node in enumerate(survivors):
        refused_ids = [f"refused-{k}-{j}" for j in range(5)]
        answer = publish(cluster, node, "strict", refused_ids)
        assert answer.status_code == 503, f"{node}: {answer.status_code} {answer.text}"
        assert problem_code(answer) == "not_enough_replicas", answer.text
        assert answer.headers.get("retry-after"), "a 503 without Retry-After"
    for node in survivors:
        assert cluster.high_watermark("strict", node=node) == end_before
        for partition in cluster.cluster_view(node).get("partitions", []):
            if partition["topic"] == "strict":
                assert partition["log_end"] == end_before, f"{node} appended a refused batch"
    # ISR 2 >= min_insync_replicas 2: accepted while the follower is away, 2,000 records.
    for k in range(10):
        batch = [f"b{k}-{j}" for j in range(200)]
        node = survivors[k % 2]
        sent = time.monotonic()
        acks["t"] += acks_of(publish(cluster, node, "t", batch), batch, node, sent)

    restarted_at = time.monotonic()
    cluster.restart(victim)
    cluster.wait_isr("t", 0, ids, within=60.0)
    cluster.wait_isr("strict", 0, ids, within=60.0)
    print(f"{victim} restarted and back in both ISRs {time.monotonic() - restarted_at:.2f} s later")

    late_ids = ["s-late"]
    sent = time.monotonic()
    late = acks_of(publish(cluster, victim, "strict", late_ids), late_ids, victim, sent)
    assert late[0].offset == end_before, "the refused batches took offsets"
    acks["strict"] += late

    for topic in ("t", "strict"):
        assert_acks_consistent(acks[topic])
        assert_readable_everywhere(cluster, topic, acks[topic], [victim, *survivors])
    high_watermarks = {topic: cluster.high_watermark(topic) for topic in acks}
    assert high_watermarks["strict"] == len(acks["strict"])
    for topic, acked in acks.items():
        report = cluster.check(
            topic,
            replicas=ids,
            high_watermark=high_watermarks[topic],
            acknowledged=[(a.offset, a.value) for a in acked],
        )
        ends = {name: s.end for name, s in report.replicas.items()}
        assert set(ends.values()) == {high_watermarks[topic]}, f"{topic}: {ends}"


# -- etcd unreachable --------------------------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("outage", ["sigstop", "kill"])
def test_with_etcd_down_committed_records_stay_readable_and_etcd_work_answers_503(
    herald_cluster: HeraldCluster, outage: str
) -> None:
    cluster = herald_cluster
    ttl_s = cluster.node_ttl_ms / 1000
    etcd = cluster.etcd
    assert etcd is not None
    ids = list(cluster.nodes)
    cluster.create_topic("ledger", **TOPIC_CONFIG)
    leader = cluster.leader("ledger").node_id
    acks: list[Ack] = []
    for k, node in enumerate(ids):
        batch = [f"before-{k}-{j}" for j in range(20)]
        sent = time.monotonic()
        acks += acks_of(publish(cluster, node, "ledger", batch), batch, node, sent)

    if outage == "sigstop":
        etcd.pause()  # etcd hangs: every call to it must time out, not wait forever
    else:
        etcd.kill()  # etcd refuses connections
    # Once stopped or dead (both calls wait for it): a renewal etcd answered while the
    # signal was on its way legitimately ran the lease on from then.
    down_at = time.monotonic()
    try:
        with httpx.Client(timeout=CONTRACT_ANSWER_S + 10.0) as http:
            # Once the leader cannot renew its lease, its writes answer 503
            # cluster_unavailable: none sent after its lease could have expired (its last
            # renewal went out before the outage) is acknowledged.
            probes = 0
            while True:
                batch = [f"probe-{probes}"]
                probes += 1
                sent = time.monotonic()
                answer = publish(cluster, leader, "ledger", batch)
                if answer.status_code == 200:
                    assert sent - down_at <= ttl_s, (
                        f"{leader} acknowledged a write sent {sent - down_at:.2f} s into the "
                        f"etcd outage, past its {ttl_s} s lease"
                    )
                    acks += acks_of(answer, batch, leader, sent)
                else:
                    assert answer.status_code == 503, answer.text
                    if problem_code(answer) == "cluster_unavailable":
                        break
                assert time.monotonic() - down_at < 30.0, f"still {answer.status_code} after 30 s"
                time.sleep(0.05)
            print(
                f"\nthe leader refuses writes sent {sent - down_at:.2f} s after etcd went down "
                f"(TTL {ttl_s} s; {probes} probes, {answer.headers.get('retry-after')=})"
            )
            for node in ids:
                assert_readable_everywhere(cluster, "ledger", acks, [node])

            # Creating a topic needs etcd: 503 cluster_unavailable within 5 s.
            for node in ids:
                started = time.monotonic()
                answer = http.put(f"{cluster.nodes[node].url}/v1/topics/during-{node}")
                took = time.monotonic() - started
                print(f"PUT topic on {node} with etcd down: {answer.status_code} in {took:.2f} s")
                assert answer.status_code == 503, answer.text
                assert problem_code(answer) == "cluster_unavailable", answer.text
                assert answer.headers.get("retry-after"), "a 503 without Retry-After"
                assert took < CONTRACT_ANSWER_S + GRACE_S

            for node in ids:
                batch = [f"during-{node}"]
                started = time.monotonic()
                answer = publish(cluster, node, "ledger", batch)
                took = time.monotonic() - started
                print(
                    f"publish via {node}: {answer.status_code} {problem_code(answer)} in {took:.2f} s"
                )
                assert answer.status_code == 503, answer.text
                expected = (
                    {"cluster_unavailable"}
                    if node == leader
                    else {"cluster_unavailable", "leader_unavailable"}
                )
                assert problem_code(answer) in expected, answer.text
                assert answer.headers.get("retry-after"), "a 503 without Retry-After"
                assert took < CONTRACT_ANSWER_S + GRACE_S

            # Still readable from every node, though no node holds a lease any more.
            for node in ids:
                assert_readable_everywhere(cluster, "ledger", acks, [node])
    finally:
        if outage == "sigstop":
            etcd.resume()
        else:
            etcd.start()
    back_at = time.monotonic()

    cluster.wait_live(3, within=60.0)
    resumed: list[Ack] = []

    def accepted_again() -> bool:
        batch = [f"after-{len(resumed)}"]
        sent = time.monotonic()
        answer = publish(cluster, ids[0], "ledger", batch)
        if answer.status_code != 200:
            return False
        resumed.extend(acks_of(answer, batch, ids[0], sent))
        return True

    cluster.wait_for(accepted_again, 60.0, "acks=all accepted again")
    print(f"writes accepted again {time.monotonic() - back_at:.2f} s after etcd came back")
    created = cluster.put(ids[1], "/v1/topics/after-outage", None)
    assert created.status_code == 201, created.text
    acks += resumed
    for k, node in enumerate(ids):
        batch = [f"after-{k}-{j}" for j in range(10)]
        sent = time.monotonic()
        acks += acks_of(publish_retrying(cluster, node, "ledger", batch), batch, node, sent)

    assert_acks_consistent(acks)
    assert_readable_everywhere(cluster, "ledger", acks, ids)
    high_watermark = cluster.high_watermark("ledger")
    cluster.check(
        "ledger",
        replicas=ids,
        high_watermark=high_watermark,
        acknowledged=[(a.offset, a.value) for a in acks],
    )


def test_a_dead_follower_of_an_idle_partition_leaves_the_isr_with_its_lease(
    herald_cluster: HeraldCluster,
) -> None:
    # Nothing is written, so the lag rule has nothing to measure: the follower leaves the
    # ISR because its node's key is gone (Kafka's controller on a broker's death), and an
    # acks=all that needs it is refused before anything is appended, not after a wait.
    cluster = herald_cluster
    cluster.create_topic("idle", partitions=1, replication_factor=3, min_insync_replicas=3)
    state = cluster.partition_state("idle")
    leader = state["leader"]
    follower = next(r for r in state["replicas"] if r != leader)
    cluster.kill(follower)
    killed = time.monotonic()
    cluster.wait_isr("idle", 0, set(state["replicas"]) - {follower}, within=20.0)
    left = time.monotonic() - killed
    refused = cluster.post(leader, "/v1/topics/idle/messages", {"messages": [{"value": 1}]})
    assert refused.status_code == 503, refused.text
    assert refused.json()["code"] == "not_enough_replicas"
    assert cluster.high_watermark("idle", 0, leader) == 0
    assert cluster.get(leader, "/v1/topics/idle").json()["partitions"][0]["end_offset"] == 0
    print(
        f"the dead follower left the ISR {left:.1f} s after the kill (TTL {cluster.node_ttl_ms} ms)"
    )
