"""A leader whose log lost records hands its lead over (needs root: a failing disk).

After a failed write-back Linux marks the pages clean; if the kernel drops them before
the log is rewritten, the records are gone from this node (storage/segment.py: the log
then takes no appends, PartitionLog.lost_offset). A follower in that state cuts its log
there and fetches them again. A leader cannot: it kept leading, every publish to the
partition refused, until it restarted. Now it hands the lead to the first live in-sync
replica, as an election after its death would (epoch + 1), and follows: it cuts its log
below the hole, fetches the records again and rejoins the ISR.

The leader's data directory is ext4 on a loop device over a small tmpfs
(tests/failing_disk.py); the test drops the leader's pages from the page cache itself,
as memory pressure may (the page cache is the kernel's, not the process's).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import httpx

from tests.cluster.nodes import HeraldCluster
from tests.failing_disk import FailingDisk, needs_failing_disk

pytestmark = needs_failing_disk

TOPIC = "lost"
FAULTY = "n3"  # the node whose data directory is n3_disk (tests/cluster/conftest.py)
# A record spans new blocks of the image: its write-back fails while the disk does.
VALUE_BYTES = 200_000


def value(message_id: str) -> bytes:
    return message_id.encode() * (VALUE_BYTES // len(message_id))


def publish(
    http: httpx.Client, cluster: HeraldCluster, node: str, partition: int, ids: list[str], acks: str
) -> httpx.Response:
    messages = [
        {"id": i, "value_b64": base64.b64encode(value(i)).decode(), "partition": partition}
        for i in ids
    ]
    url = f"{cluster.nodes[node].url}/v1/topics/{TOPIC}/messages"
    return http.post(url, json={"messages": messages}, params={"acks": acks})


def evict(directory: Path) -> None:
    """Drop the partition's log pages from the page cache (clean after the failed
    write-back, so the kernel may)."""
    for path in directory.glob("*.log"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def follower_lag(cluster: HeraldCluster, partition: int) -> dict[str, int | None]:
    """The followers' lag as the leader reports it (GET /v1/cluster)."""
    view = cluster.cluster_view(FAULTY)
    for p in view["partitions"]:
        if p["topic"] == TOPIC and p["partition"] == partition:
            lag: dict[str, int | None] = p["lag"]
            return lag
    raise AssertionError(f"{FAULTY} does not lead {TOPIC}/{partition}")


def test_a_leader_whose_log_lost_records_hands_the_lead_over_and_catches_up(
    cluster_n3_on_disk: HeraldCluster, n3_disk: FailingDisk
) -> None:
    cluster, failing_disk = cluster_n3_on_disk, n3_disk  # n3's data directory on the disk
    cluster.create_topic(TOPIC, partitions=3, replication_factor=3, min_insync_replicas=2)
    states = cluster.topic(TOPIC)["partitions"]
    led = [s for s in states if s["leader"] == FAULTY]
    assert led, f"{FAULTY} leads no partition of {TOPIC}: {states}"
    partition, epoch = led[0]["partition"], led[0]["epoch"]

    with httpx.Client(timeout=60.0) as http:
        before = publish(http, cluster, FAULTY, partition, ["before-0", "before-1"], "all")
        assert before.status_code == 200, before.text

        failing_disk.fail_fsyncs()
        # Written, and its fsync failed: answered 503, the records in the log all the
        # same (a retry would be deduplicated).
        during = publish(http, cluster, FAULTY, partition, [f"b{k}" for k in range(8)], "all")
        assert during.status_code == 503, during.text
        # The followers copied them from the leader's page cache (their disks work).
        cluster.wait_for(
            lambda: all(v == 0 for v in follower_lag(cluster, partition).values()),
            30.0,
            "the followers caught up with the leader",
        )
        evict(failing_disk.mountpoint / "topics" / TOPIC / str(partition))
        failing_disk.heal()

        # The leader finds the hole at its next flush and hands the lead over.
        state = cluster.wait_leader(TOPIC, partition, not_on=[FAULTY], within=60.0)
        assert state["epoch"] > epoch  # + 1, or more had an election come between
        # The new ISR may be below min_insync_replicas until a lagging follower is back
        # (503 not_enough_replicas, which PROTOCOL §7 allows): the same id again until it
        # is answered, deduplicated if an earlier try landed.
        answers: list[httpx.Response] = []

        def answered() -> bool:
            answers.append(publish(http, cluster, state["leader"], partition, ["after-0"], "all"))
            return answers[-1].status_code == 200

        cluster.wait_for(answered, 60.0, "an acks=all publish answered by the new leader")
        after = answers[-1]

        # The old leader cuts its log below the hole, fetches again and rejoins.
        cluster.wait_isr(TOPIC, partition, cluster.nodes, within=60.0)

    acknowledged = [
        (r["offset"], value(i))
        for answer, ids in ((before, ["before-0", "before-1"]), (after, ["after-0"]))
        for r, i in zip(answer.json()["results"], ids, strict=True)
    ]
    cluster.check(
        TOPIC,
        partition,
        replicas=cluster.nodes,
        high_watermark=cluster.high_watermark(TOPIC, partition),
        acknowledged=acknowledged,
    )
