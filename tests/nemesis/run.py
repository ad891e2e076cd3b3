"""One nemesis run: start the cluster, run the workload with the seeded faults for the
given minutes, heal, wait for the ISRs to settle, read everything back from every node
(over HTTP, then from each node's partition files once it is stopped), read etcd's
history of the partition and cursor keys from revision 1, check, report. A run with
violations copies each node's data directory to ``out/kept/`` before its disk goes.

Whatever happens (an exception, Ctrl-C, SIGTERM), every process is stopped and the
firewall chain removed before returning.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from tests import failing_disk
from tests.failing_disk import FailingDisk
from tests.nemesis import checker, report, workload
from tests.nemesis.cluster import Cluster, claim_slot
from tests.nemesis.etcd_log import EtcdLog
from tests.nemesis.faults import Nemesis
from tests.nemesis.history import Fault, History
from tests.nemesis.network import Firewall, FirewallUnavailable

SETTLE_WITHIN_S = 90.0
ETCD_LOG_WITHIN_S = 60.0  # for the recorded history of etcd to reach its head at the end
DRAIN_WITHIN_S = 60.0
CLUSTER_NAME = "herald"  # herald serve's default --cluster-name
DISK_BACKING_MB = 96  # each node's disk: a run writes ~5 MB a node
DISK_IMAGE_MB = 512


def isr_full(cluster: Cluster) -> bool:
    """Every serving node shows every partition of every topic led, with a full ISR."""
    for node in cluster.nodes.values():
        if not node.serving:
            return False
        for topic in workload.PARTITIONS:
            try:
                answer = httpx.get(f"{node.url}/v1/topics/{topic}", timeout=2.0)
            except httpx.TransportError:
                return False
            if answer.status_code != 200:
                return False
            for p in answer.json()["partitions"]:
                if p.get("leader") is None or set(p["isr"]) != set(p["replicas"]):
                    return False
    return True


def high_watermarks(
    cluster: Cluster,
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], list[str]]]:
    """Each partition's end_offset, the lowest any node shows, and its replicas."""
    marks: dict[tuple[str, int], int] = {}
    replicas: dict[tuple[str, int], list[str]] = {}
    for node in cluster.nodes.values():
        for topic in workload.PARTITIONS:
            try:
                answer = httpx.get(f"{node.url}/v1/topics/{topic}", timeout=5.0)
            except httpx.TransportError:
                continue
            if answer.status_code != 200:
                continue
            for p in answer.json()["partitions"]:
                key = (topic, p["partition"])
                marks[key] = min(marks.get(key, p["end_offset"]), p["end_offset"])
                replicas[key] = list(p["replicas"])
    return marks, replicas


async def run(
    seed: int, minutes: float, size: int, out: Path, *, churn: bool = True
) -> dict[str, Any]:
    history = History()
    notes: list[str] = []
    slot, lock = claim_slot()
    cluster = Cluster(out / "cluster", size, slot)
    with contextlib.ExitStack() as stack:
        stack.callback(lock.close)
        firewall: Firewall | None
        try:
            firewall = stack.enter_context(Firewall())
        except FirewallUnavailable as exc:
            firewall = None
            notes.append(f"no partitions: iptables unusable ({exc})")
        disks: dict[str, FailingDisk] = {}
        if failing_disk.available():
            (out / "disks").mkdir(parents=True, exist_ok=True)
            for name, node in cluster.nodes.items():
                node.data_dir.mkdir(parents=True, exist_ok=True)
                disks[name] = stack.enter_context(
                    failing_disk.failing_disk(
                        out / "disks" / name, node.data_dir, DISK_BACKING_MB, DISK_IMAGE_MB
                    )
                )
        else:
            notes.append("no disk faults: needs root, mkfs.ext4, e2fsck and losetup")
        stack.callback(cluster.stop)  # before the disks are unmounted
        await asyncio.to_thread(cluster.start)
        violations = await _exercise(cluster, history, firewall, disks, seed, minutes, notes, churn)
        if violations and disks:  # the disks go with the run: a post-mortem needs their files
            for name, node in cluster.nodes.items():
                try:
                    await asyncio.to_thread(shutil.copytree, node.data_dir, out / "kept" / name)
                except shutil.Error as unreadable:  # copied what it could read
                    notes.append(
                        f"{name}'s data directory kept without {len(unreadable.args[0])} "
                        "unreadable files (its disk's faults)"
                    )
    result = report.build(
        history, violations, seed=seed, minutes=minutes, nodes=size, notes=notes, churn=churn
    )
    report.write(out, result, history)
    return result


async def _exercise(
    cluster: Cluster,
    history: History,
    firewall: Firewall | None,
    disks: dict[str, FailingDisk],
    seed: int,
    minutes: float,
    notes: list[str],
    churn: bool,
) -> list[checker.Violation]:
    stop, deliver_stop = asyncio.Event(), asyncio.Event()
    etcd_log = EtcdLog(cluster.etcd_urls, f"/herald/{CLUSTER_NAME}/")
    recorder = asyncio.create_task(etcd_log.follow(), name="etcd-log")
    clients = workload.Clients(cluster, history, random.Random(seed + 1), stop, {}, asyncio.Lock())
    await workload.setup(clients)
    nemesis = Nemesis(
        cluster,
        history,
        random.Random(seed),
        firewall,
        lambda: isr_full(cluster),
        workload.PARTITIONS,
        disks,
    )
    coroutines = workload.all_clients(clients, deliver_stop, churn)
    tasks = [asyncio.create_task(c) for c in coroutines]
    try:
        await nemesis.run(history.now() + minutes * 60, stop)
        await nemesis.heal_all()
        healed_at = history.now()
        settled = await _wait(
            lambda: cluster.wait_all_live(1.0) and isr_full(cluster), SETTLE_WITHIN_S
        )
        if not settled:
            notes.append(f"not every ISR full within {SETTLE_WITHIN_S:.0f} s of the heal")
            history.faults.append(
                Fault(
                    "no-recovery",
                    "cluster",
                    healed_at,
                    history.now(),
                    f"not all live with full ISRs within {SETTLE_WITHIN_S:.0f} s of the last heal",
                )
            )
        stop.set()  # producers, readers, tails and the churn end
        await _wait(lambda: all(t.done() for t in tasks[:-2]), 60.0)  # all but consumers
        acked = {
            w.token
            for w in history.writes
            if w.outcome == "ok" and w.acks == "all" and w.topic == workload.MAIN
        }
        await _wait(lambda: _delivered(history, acked), DRAIN_WITHIN_S)
        deliver_stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60.0)
        await workload.read_everywhere(clients, how="final-read", once=True)
        marks, replicas = await asyncio.to_thread(high_watermarks, cluster)
        if not await etcd_log.caught_up(ETCD_LOG_WITHIN_S):
            notes.append(
                f"etcd's history not recorded to its end within {ETCD_LOG_WITHIN_S:.0f} s"
                f" (from revision {etcd_log.next_revision}: not checked)"
            )
            etcd_log.end_unrecorded()
        if etcd_log.failures:
            notes.append(
                f"etcd's history watch failed {len(etcd_log.failures)} times and went on;"
                f" the last: {etcd_log.failures[-1]}"
            )
        if etcd_log.gaps:
            notes.append(
                f"etcd's history has {etcd_log.gaps} gaps (compacted while no member answered)"
            )
        events = history.etcd_events = etcd_log.events
    finally:
        recorder.cancel()
        await asyncio.gather(recorder, return_exceptions=True)
        stop.set()
        deliver_stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            notes.append(f"a client failed: {task.exception()!r}")
    await asyncio.to_thread(cluster.stop)
    data_dirs = {name: node.data_dir for name, node in cluster.nodes.items()}
    return [
        *checker.check_history(history, workload.PARTITIONS),
        *checker.check_stale_reads(history),
        *checker.check_delivery(history, workload.MAIN),
        *checker.check_files(history, data_dirs, workload.PARTITIONS, marks, replicas),
        *checker.check_etcd(events),
        *checker.check_restarts(history, events),
        *checker.check_recovery(history),
    ]


def _delivered(history: History, acked: set[str]) -> bool:
    for how in ("consume", "pull"):
        if not acked <= {s.token for s in history.seen if s.how == how}:
            return False
    return True


async def _wait(condition: Any, within: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if await asyncio.to_thread(condition):
            return True
        await asyncio.sleep(0.5)
    return False


def terminate_as_interrupt() -> None:
    """SIGTERM unwinds like Ctrl-C, so that the cleanup runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
