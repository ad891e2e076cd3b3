"""A REAL etcd (Debian's etcd-server 3.4) on loopback for the cluster tests.

``etcd_server`` (function scope) a fresh single-member etcd on a temp data dir, listening
                for clients on TWO free loopback ports (``.urls``, for endpoint failover)
                and on a free peer port. ``.pause()`` (SIGSTOP), ``.resume()`` (SIGCONT),
                ``.kill()`` (SIGKILL), ``.restart()`` (same ports and data), ``.log()``.
``etcd``        (function scope) an :class:`EtcdClient` on both URLs, generous timeouts.
``etcd_cluster`` (function scope) three members forming one etcd cluster.
``membership``  (function scope) node ``n1`` registered on ``etcd`` under the asking
                module's ``CLUSTER`` name, its lease held; :func:`fence_alone` its fence
                with no peers to ask.
``herald_cluster`` (function scope) etcd + three ``herald serve --cluster`` nodes, all
                live (tests/cluster/nodes.py); a failed test's report carries their logs.
``n3_disk``     (function scope) a failing disk (tests/failing_disk.py, needs root)
                mounted as n3's data directory; with ``cluster_n3_on_disk``, the three
                nodes on it (the disk mounted first, so unmounted after they stop).
``shared_cluster`` the same, lent to one test after another: for tests that fault
                nothing (no kill, pause, wipe or cut, of a node or of etcd) and name
                their own topics and subscriptions (``unique``). See
                :class:`SharedCluster`.

No test is skipped when etcd is missing: it fails, saying ``make test`` installs it.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from cluster.etcd import EtcdClient
from cluster.fence import Fence
from cluster.membership import Membership
from tests.conftest import free_port, freeze

if TYPE_CHECKING:
    from tests.cluster.nodes import HeraldCluster
    from tests.failing_disk import FailingDisk

START_TIMEOUT_S = 30.0
# The fault tests' clients: a call's whole budget, and one HTTP request's.
CLIENT_TIMEOUT_S = 2.0
ATTEMPT_TIMEOUT_S = 1.0
# Everyone else's: generous, an fsync on a loaded 2-core machine can take a second.
GENEROUS_TIMEOUT_S, GENEROUS_ATTEMPT_S = 10.0, 5.0


def etcd_binary() -> str:
    path = shutil.which("etcd")
    if path is None:
        pytest.fail(
            "etcd is not installed: `make test` installs it (apt-get install etcd-server)",
            pytrace=False,
        )
    return path


class EtcdProcess:
    def __init__(self, data_dir: Path, name: str = "herald-test") -> None:
        self.data_dir = data_dir
        self.name = name
        self.log_path = data_dir.parent / f"{data_dir.name}.etcd.log"
        self.client_ports = (free_port(), free_port())
        self.peer_port = free_port()
        self.initial_cluster = f"{name}={self.peer_url}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.client_ports]

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def command(self) -> list[str]:
        peer = self.peer_url
        return [
            etcd_binary(),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", ",".join(self.urls),
            "--advertise-client-urls", self.urls[0],
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            # A lone member elects itself after one election timeout: keep it short.
            "--heartbeat-interval", "20",
            "--election-timeout", "200",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]  # fmt: skip

    def start(self) -> EtcdProcess:
        self.spawn()
        return self.wait_healthy()

    def spawn(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)

    def wait_healthy(self) -> EtcdProcess:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if all(self._healthy(url) for url in self.urls):
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"etcd did not become healthy; its log:\n{self.log()}")

    @staticmethod
    def _healthy(url: str) -> bool:
        try:
            response = httpx.get(f"{url}/health", timeout=1.0)
        except httpx.TransportError:
            return False
        return response.status_code == 200 and response.json().get("health") == "true"

    def pause(self) -> None:
        assert self.proc is not None
        freeze(self.proc)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process dies only once resumed
            self.proc.kill()
            self.proc.wait(30)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def restart(self) -> EtcdProcess:
        self.kill()
        return self.start()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[EtcdProcess]:
    yield from _started_etcd(tmp_path)


def _started_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    for attempt in range(3):
        process = EtcdProcess(tmp_path / f"etcd-{attempt}")
        try:
            process.start()
        except RuntimeError:
            # A port taken between free_port() and etcd's bind: try other ports.
            if attempt == 2 or "address already in use" not in process.log():
                raise
            continue
        try:
            yield process
        finally:
            process.terminate()
        return


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[list[EtcdProcess]]:
    """Three etcd members on loopback forming one cluster (a leader and two followers)."""
    members = [EtcdProcess(tmp_path / f"member-{i}", name=f"m{i}") for i in range(3)]
    initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
    for member in members:
        member.initial_cluster = initial
        member.spawn()
    try:
        for member in members:  # healthy means a leader was elected: a quorum is up
            member.wait_healthy()
        yield members
    finally:
        for member in members:
            member.terminate()


@pytest.fixture
async def etcd(etcd_server: EtcdProcess) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(
        etcd_server.urls, timeout=GENEROUS_TIMEOUT_S, attempt_timeout=GENEROUS_ATTEMPT_S
    ) as client:
        yield client


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float, what: str) -> float:
    """Poll ``check`` until it is true (every 50 ms, at most ``within_s``); returns the wait."""
    started = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - started
        if time.monotonic() - started > within_s:
            raise AssertionError(f"not within {within_s} s: {what}")
        await asyncio.sleep(0.05)


class TcpGate:
    """A loopback TCP forwarder to one etcd URL that a test can cut and restore: a
    network partition between one client and etcd, while other clients go on."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._forward, "127.0.0.1", self.port)

    async def cut(self) -> None:
        """Refuse new connections and break every open one."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._pipes):
            writer.transport.abort()
        self._pipes.clear()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._pipes |= {writer, up_writer}
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._pipe(reader, up_writer))
                tg.create_task(self._pipe(up_reader, writer))
        except* (ConnectionError, OSError):
            pass  # the gate was cut, or a side hung up
        finally:
            for side in (writer, up_writer):
                self._pipes.discard(side)
                side.transport.abort()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
        sink.transport.abort()  # one side ended: end the other (etcd streams are one-shot)


@pytest.fixture
async def etcd_gate(etcd_server: EtcdProcess) -> AsyncIterator[TcpGate]:
    gate = TcpGate(etcd_server.client_ports[0])
    await gate.open()
    try:
        yield gate
    finally:
        await gate.cut()


# -- one node registered on a real etcd, with no peers ------------------------------------


@pytest.fixture
async def membership(etcd: EtcdClient, request: pytest.FixtureRequest) -> AsyncIterator[Membership]:
    """Node n1 registered under the test module's ``CLUSTER`` (each module its own
    cluster name, so that modules never see each other's keys)."""
    async with Membership(
        etcd,
        cluster=request.module.CLUSTER,
        node_id="n1",
        advertise_url="http://127.0.0.1:9",
        ttl_s=5,
    ) as registered:
        yield registered


async def _no_answers(urls: Mapping[str, str], timeout_s: float) -> dict[str, float]:
    return {}


def fence_alone(membership: Membership) -> Fence:
    """The fence of a node with no peers: it stands on its own lease alone."""
    return Fence(
        holds_lease=membership.holds_lease,
        failing_since=membership.failing_since,
        peers=lambda: ({}, set()),
        ask=_no_answers,
    )


# -- a Herald cluster: etcd + `herald serve --cluster` processes (tests/cluster/nodes.py) --


@pytest.fixture
def herald_cluster(tmp_path: Path) -> Iterator[HeraldCluster]:
    """Three ``herald serve --cluster`` nodes (n1, n2, n3) on one fresh etcd, all live;
    every process is stopped at teardown, whatever happened."""
    from tests.cluster.nodes import HeraldCluster

    cluster = HeraldCluster(tmp_path / "cluster", 3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def n3_disk(tmp_path: Path) -> Iterator[FailingDisk]:
    from tests.failing_disk import failing_disk

    mountpoint = tmp_path / "cluster" / "n3"  # the node's data directory
    mountpoint.mkdir(parents=True)
    with failing_disk(tmp_path / "backing", mountpoint) as disk:
        yield disk


@pytest.fixture
def cluster_n3_on_disk(n3_disk: FailingDisk, herald_cluster: HeraldCluster) -> HeraldCluster:
    return herald_cluster


class SharedCluster:
    """One three-node cluster lent to every test that asks for ``shared_cluster``.

    Starting etcd and three nodes costs seconds a test; tests that only create, publish,
    read and subscribe can share one, each under names of its own. It is started for the
    first such test and stopped as soon as the next test does not ask for it (the
    borrowers run one after another: :func:`pytest_collection_modifyitems`), so that it
    never runs beside a cluster of another test (two clusters on a 2-core host starve
    the nodes' lease renewals). A test that left a node or etcd down, though it should
    not, gets a fresh cluster rather than a broken one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cluster: HeraldCluster | None = None
        self.started = 0

    def lend(self) -> HeraldCluster:
        from tests.cluster.nodes import HeraldCluster

        if self.cluster is not None and not self._whole(self.cluster):
            self.close()
        if self.cluster is None:
            self.started += 1
            self.cluster = HeraldCluster(self.root / f"cluster-{self.started}", 3).start()
        return self.cluster

    @staticmethod
    def _whole(cluster: HeraldCluster) -> bool:
        etcd = cluster.etcd
        etcd_up = etcd is not None and etcd.proc is not None and etcd.proc.poll() is None
        return etcd_up and len(cluster.serving()) == cluster.size

    def close(self) -> None:
        """Stop the cluster lent, if any, and remove its data (etcd preallocates 62 MB)."""
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)


SHARED_CLUSTER = pytest.StashKey[SharedCluster]()


@pytest.fixture(scope="session")
def shared_clusters(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedCluster]:
    clusters = SharedCluster(tmp_path_factory.mktemp("shared-cluster"))
    request.config.stash[SHARED_CLUSTER] = clusters
    try:
        yield clusters
    finally:
        clusters.close()


@pytest.fixture
def shared_cluster(shared_clusters: SharedCluster) -> HeraldCluster:
    """A live three-node cluster shared with other tests: fault nothing, use your own
    topic and subscription names, assert nothing about what other tests made."""
    return shared_clusters.lend()


def borrows_shared_cluster(item: pytest.Item | None) -> bool:
    return item is not None and "shared_cluster" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that borrow the shared cluster run one after another, from where the
    first of them stands (tests/conftest.py puts their modules on one worker)."""
    borrowers = [item for item in items if borrows_shared_cluster(item)]
    if not borrowers:
        return
    first = items.index(borrowers[0])
    others = [item for item in items if not borrows_shared_cluster(item)]
    items[:] = [*others[:first], *borrowers, *others[first:]]


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The shared cluster stops once the next test does not borrow it."""
    clusters = item.config.stash.get(SHARED_CLUSTER, None)
    if (
        clusters is not None
        and borrows_shared_cluster(item)
        and not borrows_shared_cluster(nextitem)
    ):
        clusters.close()
