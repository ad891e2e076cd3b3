"""Random fault schedules over three real replicas (tests/cluster/replicas.py): publishes
at acks=all and acks=1, followers fetching one request at a time, stopping and resuming,
crashing and restarting, leaders failing over to an ISR member, the clock moving past
replica_lag_ms. After every step the ISR members agree below the high watermark and the
leader holds every acknowledged record; at the end, with everyone back, every replica
holds the same log and the replica checker passes. Seeded: a failure names its seed."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cluster.replication import LeaderReplica
from tests.cluster.checker import check_replicas
from tests.cluster.replicas import Cluster

LAG_MS = 1_000
STEPS = 250


def _check_now(c: Cluster) -> None:
    assert c.state is not None
    leader = c.leader
    role = leader.role
    assert isinstance(role, LeaderReplica)
    hw = role.high_watermark
    isr_live = {n: c.nodes[n].log for n in c.state.isr if c.nodes[n].live}
    check_replicas(
        isr_live,
        high_watermark=hw,
        acknowledged=[a for a in c.acked if a[0] < hw],
        must_hold=(leader.name,),
    )
    held = {r.offset: r.value for r in leader.log.read(0, 1 << 20, 1 << 30)}
    for offset, value in c.acked:
        assert held.get(offset) == value, f"acknowledged {offset} missing on the leader"
    if role.high_watermark_settled:
        assert all(offset < hw for offset, _ in c.acked)


def _run(c: Cluster, rng: random.Random) -> dict[str, int]:
    counts: dict[str, int] = {}
    serial = 0
    for _ in range(STEPS):
        assert c.state is not None
        followers = [n for n in c.names if n != c.state.leader]
        op = rng.choices(
            ["publish", "step", "round", "time", "stop", "resume", "crash", "restart", "fail"],
            weights=[30, 30, 10, 8, 3, 4, 2, 4, 2],
        )[0]
        if op == "publish":
            n = rng.randint(1, 4)
            vals = [f"v{serial + i}".encode() for i in range(n)]
            serial += n
            c.publish(vals, acks=rng.choice(["all", "all", "1"]))
        elif op == "step":
            c.step(rng.choice(followers))
        elif op == "round":
            c.round()
        elif op == "time":
            c.clock.advance(rng.uniform(0, LAG_MS * 0.75))
            c.tick()
        elif op == "stop":
            c.nodes[rng.choice(followers)].fetching = False
        elif op == "resume":
            c.nodes[rng.choice(followers)].fetching = True
        elif op == "crash":
            name = rng.choice(followers)
            if c.nodes[name].live:
                c.crash(name)
        elif op == "restart":
            dead = [n for n in c.names if not c.nodes[n].live]
            if dead:
                c.restart(rng.choice(dead))
        elif op == "fail":
            # The leader dies; an ISR member that is alive takes over (etcd's failover
            # transaction); none alive: the leader stays.
            successors = [n for n in c.state.isr if n != c.state.leader and c.nodes[n].live]
            if not successors:
                continue
            c.crash(c.state.leader)
            c.elect(rng.choice(successors))
        counts[op] = counts.get(op, 0) + 1
        _check_now(c)
    return counts


@pytest.mark.parametrize("seed", range(12))
def test_random_faults_keep_the_invariants(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    c = Cluster(tmp_path, ("a", "b", "c"), min_insync=2, replica_lag_ms=LAG_MS, max_bytes=600)
    try:
        c.elect("a")
        counts = _run(c, rng)
        # Everyone back, fetching: the logs converge and every check holds on all three.
        for name in c.names:
            if not c.nodes[name].live:
                c.restart(name)
            c.nodes[name].fetching = True
        c.replicate()
        assert c.state is not None and set(c.state.isr) == set(c.names)
        leader_log = c.leader.log
        end = leader_log.end_offset
        report = check_replicas(
            {n: node.log for n, node in c.nodes.items()},
            high_watermark=end,
            acknowledged=c.acked,
        )
        assert report.compared_offsets == end - leader_log.start_offset
        stored = {n: node.log.read_batches(0, 1 << 30) for n, node in c.nodes.items()}
        assert len(set(stored.values())) == 1, f"seed {seed}: logs differ after converging"
        assert counts.get("publish", 0) > 0 and c.acked, f"seed {seed}: {counts}"
    finally:
        c.close()
