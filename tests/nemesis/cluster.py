"""The cluster under test: 3 etcd members and N ``herald serve --cluster`` nodes, each
process on its own loopback address (127.0.0.0/8 all routes to lo on Linux, so binding
needs no setup), data directories under the run's --out directory.

Each run claims a slot (``claim_slot``: runs at once on one host use different
addresses and group ids). Each Herald node runs with a group id of its own (the user
unchanged, so it reads the interpreter wherever it lives): on loopback a connection's
source address is 127.0.0.1 whoever opens it, so the firewall (tests/nemesis/network.py)
tells the nodes' packets apart by their owner's group, not their source. etcd members
run as the caller.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from tests.conftest import PROJECT_ROOT

NODE_GID_BASE = 47100  # node i of slot s runs with gid 47100 + 10 s + i (no group entry)
ADDRESS = "127.0.{}.{}"  # slot s: node i at 127.0.s.1i (127.0.0.11, …), member k at 127.0.s.2k
SLOTS = 20  # runs at once on one host, each in a slot of its own (addresses, group ids)
SLOT_LOCK = "/tmp/herald-nemesis-slot-{}.lock"
NODE_TTL_MS = 2000  # short, so that a failover fits in a run (PROTOCOL §7 default 5000)
REPLICA_LAG_MS = 3000
START_WITHIN_S = 120.0  # three Pythons importing the server at once on 2 loaded cores
STOP_WITHIN_S = 30.0


def claim_slot() -> tuple[int, IO[bytes]]:
    """The first slot no other run on this host holds (an flock held while the returned
    file stays open): two runs at once would otherwise share addresses and group ids,
    and one's partitions would cut the other's nodes."""
    for slot in range(SLOTS):
        handle = open(SLOT_LOCK.format(slot), "ab")  # noqa: SIM115 - held for the run
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return slot, handle
    raise RuntimeError(f"{SLOTS} nemesis runs already hold every slot on this host")


def free_port_on(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    """One process the nemesis owns: spawn, wait until healthy, signal, reap."""

    name: str
    address: str
    data_dir: Path
    log_path: Path
    gid: int | None = None  # None: run as the caller
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False

    def command(self) -> list[str]:
        raise NotImplementedError

    def health_url(self) -> str:
        raise NotImplementedError

    def healthy(self) -> bool:
        try:
            answer = httpx.get(self.health_url(), timeout=1.0)
        except httpx.TransportError:
            return False
        return answer.status_code == 200

    def spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=PROJECT_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                group=self.gid,
                extra_groups=[] if self.gid is not None else None,
                start_new_session=True,  # a Ctrl-C of the nemesis reaches it through us only
            )
        self.paused = False

    def wait_healthy(self, within: float = START_WITHIN_S) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                break
            if self.healthy():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not become healthy; see {self.log_path}")

    def start(self) -> None:
        self.spawn()
        self.wait_healthy()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def serving(self) -> bool:
        return self.running and not self.paused

    def pause(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        self._reap(signal.SIGKILL)

    def terminate(self) -> None:
        self._reap(signal.SIGTERM)

    def _reap(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.paused = False
            return
        if self.paused:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process handles TERM only then
        self.proc.send_signal(sig)
        try:
            self.proc.wait(STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_WITHIN_S)
        self.paused = False

    def wipe(self) -> None:
        """The data directory gone, as with a new disk (only while stopped)."""
        assert not self.running, f"{self.name} is running"
        shutil.rmtree(self.data_dir, ignore_errors=True)


@dataclass
class EtcdMember(Process):
    client_port: int = 0
    peer_port: int = 0
    initial_cluster: str = ""
    started_once: bool = False

    @property
    def client_url(self) -> str:
        return f"http://{self.address}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.address}:{self.peer_port}"

    def health_url(self) -> str:
        return f"{self.client_url}/health"

    def command(self) -> list[str]:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise RuntimeError("etcd is not installed (apt-get install etcd-server)")
        return [
            etcd,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]  # fmt: skip


@dataclass
class HeraldNode(Process):
    port: int = 0
    etcd_urls: Sequence[str] = ()
    node_ttl_ms: int = NODE_TTL_MS
    replica_lag_ms: int = REPLICA_LAG_MS
    starts: list[float] = field(default_factory=list)  # monotonic, each spawn

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def health_url(self) -> str:
        return f"{self.url}/healthz"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "server.cli", "serve",
            "--host", self.address, "--port", str(self.port),
            "--data-dir", str(self.data_dir),
            "--cluster", ",".join(self.etcd_urls),
            "--node-id", self.name,
            "--advertise-url", self.url,
            "--node-ttl-ms", str(self.node_ttl_ms),
            "--replica-lag-ms", str(self.replica_lag_ms),
            # Every topic is created by a PUT the history records: a publish to a topic
            # deleted meanwhile must not create an incarnation the checker cannot see.
            "--no-auto-create",
        ]  # fmt: skip

    def spawn(self) -> None:
        super().spawn()
        self.starts.append(time.monotonic())


class Cluster:
    """3 etcd members and ``size`` Herald nodes under ``root``; ``start()`` returns once
    every node answers /healthz and sees all nodes live."""

    def __init__(self, root: Path, size: int = 3, slot: int = 0) -> None:
        self.root = root
        self.slot = slot
        self.etcd = [
            EtcdMember(
                f"e{k}",
                ADDRESS.format(slot, 20 + k),
                root / f"e{k}",
                root / f"e{k}.log",
            )
            for k in range(1, 4)
        ]
        self.nodes = {
            f"n{i}": HeraldNode(
                f"n{i}",
                ADDRESS.format(slot, 10 + i),
                root / f"n{i}",
                root / f"n{i}.log",
                gid=NODE_GID_BASE + 10 * slot + i,
            )
            for i in range(1, size + 1)
        }

    @property
    def etcd_urls(self) -> list[str]:
        return [member.client_url for member in self.etcd]

    def node_gid(self, name: str) -> int:
        gid = self.nodes[name].gid
        assert gid is not None
        return gid

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for member in self.etcd:
            member.client_port = free_port_on(member.address)
            member.peer_port = free_port_on(member.address)
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.etcd)
        for member in self.etcd:
            member.initial_cluster = initial
            member.spawn()
        for member in self.etcd:
            member.wait_healthy()
            member.started_once = True
        for node in self.nodes.values():
            node.port = free_port_on(node.address)
            node.etcd_urls = self.etcd_urls
            node.spawn()
        for node in self.nodes.values():
            node.wait_healthy()
        self.wait_all_live(START_WITHIN_S)

    def restart_etcd(self, member: EtcdMember) -> None:
        """Start a stopped member again on its data (an existing member: no --initial)."""
        member.spawn()
        member.wait_healthy()

    def etcd_revision(self) -> int | None:
        """etcd's current revision, from any member that answers."""
        for member in self.etcd:
            if not member.serving:
                continue
            try:
                answer = httpx.post(f"{member.client_url}/v3/kv/range", json={"key": "AA=="},
                                    timeout=1.0)  # fmt: skip
                return int(answer.json()["header"]["revision"])
            except (httpx.HTTPError, ValueError, KeyError):
                continue
        return None

    def live_seen_by(self, node: HeraldNode) -> set[str]:
        answer = httpx.get(f"{node.url}/v1/cluster", timeout=2.0)
        if answer.status_code != 200:
            return set()
        return {n["id"] for n in answer.json()["nodes"] if n["live"]}

    def wait_all_live(self, within: float) -> bool:
        deadline = time.monotonic() + within
        everyone = set(self.nodes)
        while time.monotonic() < deadline:
            try:
                if all(self.live_seen_by(n) == everyone for n in self.nodes.values()):
                    return True
            except (httpx.TransportError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        """Every process, whatever state it is in (also after a failure)."""
        for process in [*self.nodes.values(), *self.etcd]:
            try:
                process.terminate()
            except (OSError, subprocess.SubprocessError):
                process.kill()
