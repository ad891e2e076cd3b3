"""One record at a time on a cluster answers in milliseconds, not in a fetch long poll
(issue 27 §1): a real etcd, three real `herald serve --cluster` nodes and, beside them,
a single `herald serve`, each publish measured over real HTTP.

Until the leader's long poll answered a follower as soon as ANY of its partitions had
news (it waited for all of them, or for the 500 ms long poll), every acks=all publish
on a cluster with more than one partition took half a second. That is what is asserted
against: the lower quartile of the publishes answers well inside one long poll (the bug
held every one of them; a quartile, not the median, so that a burst of load on the
host, which slows some, cannot fail it). The figures themselves
(a few milliseconds, at most three times the single node's) are bench/cluster.py's to show: on a
shared machine with three nodes and etcd on its two cores, a timing bound tighter than
the bug it guards against fails for the load, not for the code (a forwarded publish's
median once reached 153 ms at load 20).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import httpx
import pytest

from cluster.wire import MAX_WAIT_MS
from tests.cluster.nodes import HeraldCluster
from tests.conftest import HeraldProcess

ROUNDS = 20
WARM_UP = 5
BOUND_MS = 0.6 * MAX_WAIT_MS  # the bug answered each publish after a whole long poll


def publish_ms(http: httpx.Client, url: str, topic: str, acks: str) -> float:
    """One one-record publish to partition 0, from send to answer, in ms."""
    started = time.perf_counter()
    answer = http.post(
        f"{url}/v1/topics/{topic}/messages",
        params={"acks": acks},
        json={"messages": [{"value": "x" * 100, "partition": 0}]},
    )
    took = (time.perf_counter() - started) * 1000
    assert answer.status_code == 200, answer.text
    return took


@pytest.mark.timeout(300)
def test_a_one_record_acks_all_publish_answers_within_a_small_multiple_of_a_single_node(
    shared_cluster: HeraldCluster,
    herald_factory: Callable[..., HeraldProcess],
    unique: Callable[[str], str],
) -> None:
    single = herald_factory()
    with httpx.Client(timeout=10.0) as http:
        created = http.put(f"{single.url}/v1/topics/alone", json={"partitions": 4})
        assert created.status_code == 201, created.text
        # Several topics of several partitions: every follower's fetch names many.
        orders, *others = [unique(name) for name in ("orders", "payments", "audit")]
        for name in (orders, *others):
            shared_cluster.create_topic(name, partitions=4, replication_factor=3)
        leader = shared_cluster.leader(orders)
        other = shared_cluster.any_serving(exclude={leader.node_id})
        paths = {
            "single node": (single.url, "alone"),
            f"cluster, to the leader {leader.node_id}": (leader.url, orders),
            f"cluster, through {other.node_id} (forwarded)": (other.url, orders),
        }
        for url, topic in paths.values():
            for _ in range(WARM_UP):
                publish_ms(http, url, topic, "all")
        # Alternating, so that the machine's other work weighs on each path alike.
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(ROUNDS):
            for name, (url, topic) in paths.items():
                times[name].append(publish_ms(http, url, topic, "all"))
    quartiles = {name: statistics.quantiles(values, n=4)[0] for name, values in times.items()}
    single_ms = quartiles.pop("single node")
    shown = ", ".join(f"{name} {ms:.1f} ms" for name, ms in quartiles.items())
    assert all(ms < BOUND_MS for ms in quartiles.values()), (
        f"lower quartile of {ROUNDS} acks=all publishes: {shown}; single node {single_ms:.1f} ms "
        f"(bound {BOUND_MS:.0f} ms: a fetch long poll is {MAX_WAIT_MS} ms)"
    )
