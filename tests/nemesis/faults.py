"""The faults: a seeded random schedule, each healed and followed by a recovery pause
(every node live and every partition's ISR full again, bounded) before the next. Most come
one at a time; a share (``COMBINED``) come two at once, the second starting a moment into
the first and hitting another node or etcd member (Jepsen's composed nemeses): a node
killed while another is cut off, two etcd members down (etcd without a quorum), a pause
inside a partition. At most one data directory is lost at a time (min_insync_replicas - 1).

Kinds: ``kill`` (kill -9 and restart at once), ``kill-later`` (kill -9, restart after
twice the node TTL), ``pause`` (SIGSTOP past the node TTL, then SIGCONT), ``restart``
(SIGTERM and start), ``wipe`` (kill -9, empty data directory, restart: one node at a
time, min_insync_replicas - 1 = 1), ``etcd-kill``, ``etcd-pause``, ``etcd-restart`` (an
etcd member; the etcd leader when it can be told), ``cut-etcd`` (a node cut from every
etcd member), ``cut-nodes`` (a node cut from every other node, both ways),
``cut-one-way`` (one node cannot reach another; the other still reaches it). With root
and loop devices each node's data directory is a disk of its own (tests/failing_disk.py),
and two more: ``disk-fail`` (every write-back, hence every fsync, of a node's disk fails
past the node TTL, then works again: the process runs on) and ``power-loss`` (kill -9,
then the disk as a power cut leaves it: whatever was not yet written back is gone,
healthy or not, and the file system is checked; then restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

from tests.failing_disk import FailingDisk
from tests.nemesis.cluster import NODE_TTL_MS, START_WITHIN_S, Cluster, EtcdMember, HeraldNode
from tests.nemesis.history import Fault, History
from tests.nemesis.network import Firewall

KINDS = (
    "kill",
    "kill-later",
    "pause",
    "restart",
    "wipe",
    "etcd-kill",
    "etcd-pause",
    "etcd-restart",
    "cut-etcd",
    "cut-nodes",
    "cut-one-way",
)
DISK_KINDS = ("disk-fail", "power-loss")  # with a disk of its own per node
TTL_S = NODE_TTL_MS / 1000
RECOVER_WITHIN_S = 60.0
PAUSE_BETWEEN_S = (1.0, 4.0)
COMBINED = 0.3  # the share of faults that come two at once


@dataclass
class Nemesis:
    cluster: Cluster
    history: History
    rng: random.Random
    firewall: Firewall | None  # None: iptables unusable, partitions left out
    isr_full: Callable[[], bool]  # every partition of every topic: ISR == replicas
    topics: Mapping[str, int]  # topic -> partitions, to pick a leader to hit
    disks: Mapping[str, FailingDisk]  # node -> its data directory's disk (or none)
    # Two faults at once pick their nodes one after the other: the leader lookup awaits,
    # and both once took one node (a failing disk filled while its power cut copied it).
    _choosing: asyncio.Lock = field(default_factory=asyncio.Lock)

    def kinds(self) -> tuple[str, ...]:
        kinds = KINDS + DISK_KINDS if self.disks else KINDS
        if self.firewall is None:
            return tuple(k for k in kinds if not k.startswith("cut-"))
        return kinds

    async def run(self, until: float, stop: asyncio.Event) -> None:
        """Faults until the run's clock passes ``until`` (history seconds)."""
        await self._settle()
        settled = True
        while not stop.is_set() and self.history.now() < until:
            kind = self.rng.choice(self.kinds())
            if kind == "wipe" and not settled:
                kind = "kill"  # a second lost disk before the first caught up: not allowed
            busy: set[str] = set()  # the nodes and etcd members a fault in effect holds
            if self.rng.random() < COMBINED:
                second = self.rng.choice([k for k in self.kinds() if k != "wipe"])
                later = self.rng.uniform(0, TTL_S)
                await asyncio.gather(self.inject(kind, busy), self.inject(second, busy, later))
            else:
                await self.inject(kind, busy)
            settled = await self._settle()
            await asyncio.sleep(self.rng.uniform(*PAUSE_BETWEEN_S))

    async def inject(self, kind: str, busy: set[str], after_s: float = 0.0) -> None:
        """One fault, on a node or etcd member not in ``busy`` (which it joins)."""
        await asyncio.sleep(after_s)
        started = self.history.now()
        revision_before = await asyncio.to_thread(self.cluster.etcd_revision)
        async with self._choosing:
            free = sorted(set(self.cluster.nodes) - busy) or sorted(self.cluster.nodes)
            node = self.rng.choice(free)
            if self.rng.random() < 0.5:  # half the time a partition's leader: where it hurts
                leader = await asyncio.to_thread(self._a_leader, node)
                node = leader if leader not in busy else node
            if not kind.startswith("etcd-"):
                busy.add(node)
        target, note = node, ""
        process = self.cluster.nodes[node]
        if kind == "kill":
            await asyncio.to_thread(process.kill)
            await asyncio.to_thread(self._start, process)
        elif kind == "kill-later":
            await asyncio.to_thread(process.kill)
            await asyncio.sleep(2 * TTL_S + self.rng.uniform(0, 2))
            await asyncio.to_thread(self._start, process)
        elif kind == "pause":
            held = TTL_S + self.rng.uniform(1, 3)
            process.pause()
            await asyncio.sleep(held)
            process.resume()
            note = f"stopped {held:.1f} s"
        elif kind == "restart":
            await asyncio.to_thread(process.terminate)
            await asyncio.to_thread(self._start, process)
        elif kind == "wipe":
            await asyncio.to_thread(process.kill)
            process.wipe()
            await asyncio.to_thread(self._start, process)
        elif kind == "power-loss":
            await asyncio.to_thread(process.kill)
            await asyncio.to_thread(self.disks[node].power_cut)
            await asyncio.to_thread(self._start, process)
        elif kind == "disk-fail":
            held = TTL_S + self.rng.uniform(1, 4)
            disk = self.disks[node]
            await asyncio.to_thread(disk.fail_fsyncs)
            await asyncio.sleep(held)
            disk.heal()
            note = f"failed {held:.1f} s"
        elif kind.startswith("etcd-"):
            members = [m for m in self.cluster.etcd if m.name not in busy] or self.cluster.etcd
            member = self.rng.choice(members)
            leader = await asyncio.to_thread(self._etcd_leader)
            if leader is not None and leader.name not in busy and self.rng.random() < 0.5:
                member = leader
            busy.add(member.name)
            target = member.name + (" (leader)" if member is leader else "")
            await self._etcd_fault(kind, member)
        else:
            target, note = await self._partition(kind, process)
        ended = self.history.now()
        revision_after = await asyncio.to_thread(self.cluster.etcd_revision)
        revisions = None
        if revision_before is not None and revision_after is not None:
            revisions = (revision_before, revision_after)
        self.history.faults.append(Fault(kind, target, started, ended, note, revisions))

    def _start(self, process: HeraldNode) -> None:
        process.spawn()
        with contextlib.suppress(RuntimeError):  # counted by the recovery wait
            process.wait_healthy()

    async def _etcd_fault(self, kind: str, member: EtcdMember) -> None:
        if kind == "etcd-kill":
            await asyncio.to_thread(member.kill)
            await asyncio.sleep(self.rng.uniform(1, 2 * TTL_S))
            await self._restart_etcd(member)
        elif kind == "etcd-pause":
            member.pause()
            await asyncio.sleep(self.rng.uniform(1, 2 * TTL_S))
            member.resume()
        else:
            await asyncio.to_thread(member.terminate)
            await self._restart_etcd(member)

    async def _restart_etcd(self, member: EtcdMember) -> None:
        # With another member down meanwhile (a combined fault) it is healthy only once
        # that one is back: the recovery wait counts it.
        with contextlib.suppress(RuntimeError):
            await asyncio.to_thread(self.cluster.restart_etcd, member)

    def _a_leader(self, otherwise: str) -> str:
        """The leader of a partition chosen at random, as a serving node shows it."""
        topic = self.rng.choice(sorted(self.topics))
        partition = self.rng.randrange(self.topics[topic])
        for node in self.cluster.nodes.values():
            if not node.serving:
                continue
            try:
                answer = httpx.get(f"{node.url}/v1/topics/{topic}", timeout=1.0)
                leader = answer.json()["partitions"][partition]["leader"]
            except (httpx.HTTPError, ValueError, KeyError, IndexError):
                continue
            if leader in self.cluster.nodes:
                return str(leader)
        return otherwise

    def _etcd_leader(self) -> EtcdMember | None:
        for member in self.cluster.etcd:
            if not member.serving:
                continue
            try:
                answer = httpx.post(
                    f"{member.client_url}/v3/maintenance/status", json={}, timeout=1
                )
                body = answer.json()
            except (httpx.HTTPError, ValueError):
                continue
            if body.get("leader") == body.get("header", {}).get("member_id"):
                return member
        return None

    async def _partition(self, kind: str, process: HeraldNode) -> tuple[str, str]:
        assert self.firewall is not None
        gid = self.cluster.node_gid(process.name)
        held = TTL_S + self.rng.uniform(1, 4)
        others = [n for n in self.cluster.nodes.values() if n is not process]
        cuts: list[tuple[int, str]] = []
        if kind == "cut-etcd":
            cuts = [(gid, member.address) for member in self.cluster.etcd]
            target = f"{process.name} | etcd"
        elif kind == "cut-nodes":
            for other in others:
                cuts += [(gid, other.address), (self.cluster.node_gid(other.name), process.address)]
            target = f"{process.name} | nodes"
        else:
            other = self.rng.choice(others)
            cuts = [(gid, other.address)]
            target = f"{process.name} -/-> {other.name}"
        for cut in cuts:
            self.firewall.cut(*cut)
        await asyncio.sleep(held)
        for cut in cuts:  # only this partition's: another may still be in effect
            self.firewall.restore(*cut)
        return target, f"held {held:.1f} s"

    async def heal_all(self) -> None:
        """Every link and disk back, every process running and resumed."""
        if self.firewall is not None:
            self.firewall.heal()
        for disk in self.disks.values():
            disk.heal()
        await self._heal_etcd()
        for node in self.cluster.nodes.values():
            node.resume()
            if not node.running:
                await asyncio.to_thread(self._start, node)

    async def _heal_etcd(self) -> None:
        """Every etcd member running again. Those that stopped start together: one alone
        is not healthy while another is down (no quorum), so waiting for each in turn
        could not end (seed 2809 stopped there, two members down). A member resumed with
        a stop signal pending (sent while it was paused) ends just after: it starts again
        in the next round. Not healthy within the bound: the recovery wait counts it."""
        for member in self.cluster.etcd:
            member.resume()
        deadline = time.monotonic() + START_WITHIN_S
        while time.monotonic() < deadline:
            for member in self.cluster.etcd:
                if not member.running:
                    member.spawn()
            if await asyncio.to_thread(lambda: all(m.healthy() for m in self.cluster.etcd)):
                return
            await asyncio.sleep(0.5)

    async def _settle(self) -> bool:
        """Wait (bounded) until every node sees every node live and every ISR is full."""
        await self.heal_all()
        deadline = self.history.now() + RECOVER_WITHIN_S
        while self.history.now() < deadline:
            live = await asyncio.to_thread(self.cluster.wait_all_live, 1.0)
            if live and await asyncio.to_thread(self.isr_full):
                return True
            await asyncio.sleep(0.5)
        self.history.faults.append(
            Fault(
                "no-recovery",
                "cluster",
                deadline - RECOVER_WITHIN_S,
                self.history.now(),
                f"not all live with full ISRs within {RECOVER_WITHIN_S:.0f} s",
            )
        )
        return False
