"""A REAL Herald cluster on loopback for the end-to-end cluster tests and bench/cluster.py:
one etcd (:class:`EtcdProcess`) and N ``herald serve --cluster`` processes, each on its
own free port and data directory (PROTOCOL §7).

``HeraldCluster(root, size=3).start()`` returns once every node answers ``/healthz`` and
every node's ``GET /v1/cluster`` shows all N live. Then:

- ``cluster.nodes["n2"]`` a :class:`ClusterNode` (a HeraldProcess: ``.url``, ``.log()``);
  ``kill`` (SIGKILL), ``pause`` / ``resume`` (SIGSTOP / SIGCONT), ``terminate`` (SIGTERM)
  and ``restart`` (same port, id and data dir) by node id;
- ``partition_state(topic, p)``: the partition's ``leader``, ``epoch``, ``replicas`` and
  ``isr`` as a live node's ``GET /v1/topics/{t}`` shows them; ``leader(topic)``;
- ``wait_for(condition, within, what)``: a bounded poll (tests/helpers.py) that counts a
  node that does not answer as "not yet";
- ``stop()`` ends every process (always: also after a failure), and ``check(topic, p,
  high_watermark=…, acknowledged=…)`` stops the nodes and hands each replica's partition
  directory to ``tests/cluster/checker.py``'s ``check_replicas``;
- ``logs()`` every node's log (and etcd's tail), for a failure report.

:class:`Publisher` and :class:`Reader` are the fault tests' clients: threads speaking
real HTTP that record every answer (what was acknowledged, at which offsets, by whom and
when) and every record a reader was shown.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
import orjson

from storage.encryption import new_key_line
from tests.cluster.checker import CheckReport, check_replicas
from tests.cluster.conftest import EtcdProcess
from tests.conftest import PROJECT_ROOT, HeraldProcess, freeze
from tests.helpers import wait_until_sync

NODE_TTL_MS = 2000  # short, so that a failover fits in a test (PROTOCOL §7 default 5000)
REPLICA_LAG_MS = 3000  # a killed follower leaves the ISR after this (default 10000)
START_WITHIN_S = 60.0  # every node live once each answers /healthz
HTTP_TIMEOUT_S = 30.0  # generous: a loaded host (load 20+) took over 10 s to answer
LOG_TAIL_LINES = 300


def serve_to_exit(
    data_dir: Path,
    etcd_urls: Sequence[str],
    *args: str,
    port: int = 0,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`herald serve --cluster … --node-id n1` that is expected to refuse its start: run
    to its exit (at most 120 s), output captured, for the tests of a start's one line."""
    command = [
        sys.executable, "-m", "server.cli", "serve", "--port", str(port),
        "--data-dir", str(data_dir), "--cluster", ",".join(etcd_urls), "--node-id", "n1",
        *args,
    ]  # fmt: skip
    return subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


def refusal_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused start says: it exited non-zero, without a traceback, with
    exactly one line on stderr."""
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


class ClusterNode(HeraldProcess):
    """``herald serve --cluster …`` for one node id; its advertise URL follows its port."""

    # Three Pythons importing the server at once on a loaded 2-core host took up to 30 s
    # before the first log line (measured while other workers ran browsers).
    start_timeout = 120.0

    def __init__(
        self,
        node_id: str,
        data_dir: Path,
        etcd_urls: Sequence[str],
        *,
        cluster_name: str,
        node_ttl_ms: int,
        replica_lag_ms: int,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(data_dir, extra_args=extra_args, env=env)
        self.node_id = node_id
        self.etcd_urls = list(etcd_urls)
        self.cluster_name = cluster_name
        self.node_ttl_ms = node_ttl_ms
        self.replica_lag_ms = replica_lag_ms
        self.paused = False

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--cluster", ",".join(self.etcd_urls),
            "--node-id", self.node_id,
            "--advertise-url", self.url,
            "--cluster-name", self.cluster_name,
            "--node-ttl-ms", str(self.node_ttl_ms),
            "--replica-lag-ms", str(self.replica_lag_ms),
        ]  # fmt: skip

    def pause(self) -> None:
        """SIGSTOP: the process is frozen (no lease renewal, no answers) but alive."""
        assert self.proc is not None and self.proc.poll() is None
        freeze(self.proc)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def _reap(self, sig: int, timeout: float = 30.0) -> int:
        if self.proc is not None and self.proc.poll() is None and self.paused:
            self.resume()  # a stopped process handles SIGTERM only once continued
        return super()._reap(sig, timeout)

    @property
    def serving(self) -> bool:
        return self.is_running() and not self.paused


class HeraldCluster:
    def __init__(
        self,
        root: Path,
        size: int = 3,
        *,
        node_ttl_ms: int = NODE_TTL_MS,
        replica_lag_ms: int = REPLICA_LAG_MS,
        cluster_name: str = "herald",
        extra_args: Sequence[str] = (),
        etcd: EtcdProcess | None = None,
        cluster_secret: bool | None = None,
        env: dict[str, str] | None = None,
        node_args: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.root = root
        self.env = env or {}  # e.g. HERALD_CLUSTER_TOKEN, for every node
        self.node_args = dict(node_args or {})  # node id -> its own extra arguments
        # An etcd started by the caller (a TLS or password-protected one:
        # test_cluster_trust.py), left running by stop(); and whether the nodes share a
        # --cluster-secret-file (by default with an auth file, which needs one).
        self._own_etcd = etcd is None
        if cluster_secret is None:
            cluster_secret = any(
                "--auth-file" in args for args in (extra_args, *self.node_args.values())
            )
        self.secret_file = root / "cluster.key" if cluster_secret else None
        self.size = size
        self.node_ttl_ms = node_ttl_ms
        self.replica_lag_ms = replica_lag_ms
        self.cluster_name = cluster_name
        self.extra_args = list(extra_args)
        if self.secret_file is not None:
            self.extra_args += ["--cluster-secret-file", str(self.secret_file)]
        self.etcd: EtcdProcess | None = etcd
        self.nodes: dict[str, ClusterNode] = {}
        self.http = httpx.Client(timeout=HTTP_TIMEOUT_S)

    # -- life ----------------------------------------------------------------------------

    def __enter__(self) -> HeraldCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> HeraldCluster:
        """etcd, then every node at once; returns when all N are live on every node."""
        try:
            if self.secret_file is not None and not self.secret_file.exists():
                self.root.mkdir(parents=True, exist_ok=True)
                self.secret_file.write_text(new_key_line(1) + "\n")
            if self._own_etcd:
                self.etcd = self._start_etcd()
            assert self.etcd is not None
            self.nodes = {
                f"n{i}": ClusterNode(
                    f"n{i}",
                    self.root / f"n{i}",
                    self.etcd.urls,
                    cluster_name=self.cluster_name,
                    node_ttl_ms=self.node_ttl_ms,
                    replica_lag_ms=self.replica_lag_ms,
                    extra_args=[*self.extra_args, *self.node_args.get(f"n{i}", ())],
                    env=self.env,
                )
                for i in range(1, self.size + 1)
            }
            with ThreadPoolExecutor(self.size) as pool:
                for started in [pool.submit(node.start) for node in self.nodes.values()]:
                    started.result()
            self.wait_live(self.size, within=START_WITHIN_S)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_etcd(self) -> EtcdProcess:
        self.root.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            etcd = EtcdProcess(self.root / f"etcd-{attempt}")
            try:
                return etcd.start()
            except RuntimeError:
                # A port taken between free_port() and etcd's bind: try other ports.
                if attempt == 2 or "address already in use" not in etcd.log():
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Every node (SIGTERM, SIGKILL after 30 s), then etcd. Safe to call twice."""
        self.stop_nodes()
        if self.etcd is not None and self._own_etcd:
            self.etcd.terminate()
        self.http.close()

    def stop_nodes(self) -> None:
        with ThreadPoolExecutor(max(1, len(self.nodes))) as pool:
            list(pool.map(lambda node: node.terminate(), self.nodes.values()))

    # -- faults (by node id) -------------------------------------------------------------

    def kill(self, node_id: str) -> None:
        self.nodes[node_id].kill()

    def pause(self, node_id: str) -> None:
        self.nodes[node_id].pause()

    def resume(self, node_id: str) -> None:
        self.nodes[node_id].resume()

    def terminate(self, node_id: str) -> int:
        return self.nodes[node_id].terminate()

    def restart(self, node_id: str) -> ClusterNode:
        """Start again on the same port, id and data dir (a killed node's registration
        is taken over once its lease ran out: up to one node TTL)."""
        node = self.nodes[node_id]
        node.restart()
        return node

    # -- looking -------------------------------------------------------------------------

    def serving(self) -> list[ClusterNode]:
        return [node for node in self.nodes.values() if node.serving]

    def any_serving(self, exclude: Iterable[str] = ()) -> ClusterNode:
        skip = set(exclude)
        for node in self.serving():
            if node.node_id not in skip:
                return node
        raise AssertionError(f"no serving node outside {sorted(skip)}")

    def get(self, node: ClusterNode | str, path: str, **params: Any) -> httpx.Response:
        return self.http.get(self._node(node).url + path, params=params or None)

    def put(self, node: ClusterNode | str, path: str, body: Any = None) -> httpx.Response:
        return self.http.put(self._node(node).url + path, json=body)

    def post(self, node: ClusterNode | str, path: str, body: Any, **params: Any) -> httpx.Response:
        return self.http.post(self._node(node).url + path, json=body, params=params or None)

    def _node(self, node: ClusterNode | str) -> ClusterNode:
        return self.nodes[node] if isinstance(node, str) else node

    def cluster_view(self, node: ClusterNode | str) -> dict[str, Any]:
        answer = self.get(node, "/v1/cluster")
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    def live_ids(self, node: ClusterNode | str) -> set[str]:
        return {n["id"] for n in self.cluster_view(node)["nodes"] if n["live"]}

    def wait_live(self, count: int, within: float = 30.0) -> None:
        """Every serving node sees exactly ``count`` live nodes, the same ones."""

        def agreed() -> bool:
            views = [self.live_ids(node) for node in self.serving()]
            return all(len(v) == count for v in views) and len({frozenset(v) for v in views}) == 1

        self.wait_for(agreed, within, f"{count} live nodes seen by every serving node")

    def topic(self, name: str, node: ClusterNode | str | None = None) -> dict[str, Any]:
        answer = self.get(node or self.any_serving(), f"/v1/topics/{name}")
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    def partition_state(
        self, topic: str, partition: int = 0, node: ClusterNode | str | None = None
    ) -> dict[str, Any]:
        """``{"partition", "start_offset", "end_offset", "leader", "epoch", "replicas",
        "isr", …}`` as GET /v1/topics/{topic} shows it."""
        state: dict[str, Any] = self.topic(topic, node)["partitions"][partition]
        return state

    def leader(self, topic: str, partition: int = 0) -> ClusterNode:
        leader = self.partition_state(topic, partition)["leader"]
        assert leader is not None, f"{topic}/{partition} has no leader"
        return self.nodes[leader]

    def followers(self, topic: str, partition: int = 0) -> list[ClusterNode]:
        state = self.partition_state(topic, partition)
        return [self.nodes[r] for r in state["replicas"] if r != state["leader"]]

    def high_watermark(
        self, topic: str, partition: int = 0, node: ClusterNode | str | None = None
    ) -> int:
        end: int = self.partition_state(topic, partition, node)["end_offset"]
        return end

    def create_topic(
        self, name: str, *, via: ClusterNode | str | None = None, **config: Any
    ) -> dict[str, Any]:
        """PUT the topic on one node; returns once every serving node shows it with a
        leader and a full ISR for every partition."""
        answer = self.put(via or self.any_serving(), f"/v1/topics/{name}", config or None)
        assert answer.status_code in (200, 201), answer.text

        def everywhere() -> bool:
            for node in self.serving():
                got = self.get(node, f"/v1/topics/{name}")
                if got.status_code != 200:
                    return False
                for p in got.json()["partitions"]:
                    # Ready: a leader, and every replica in the ISR (its followers fetch).
                    if p.get("leader") is None or set(p["isr"]) != set(p["replicas"]):
                        return False
            return True

        self.wait_for(everywhere, 30.0, f"topic {name} with leaders on every node")
        body: dict[str, Any] = answer.json()
        return body

    def wait_known_everywhere(self, path: str, within: float = 30.0) -> None:
        """Until every node answers ``GET path`` 200 (a subscription or topic created on
        one node has reached every node's view of etcd)."""
        self.wait_for(
            lambda: all(self.get(node, path).status_code == 200 for node in self.nodes),
            within,
            f"{path} on every node",
        )

    def wait_for(self, condition: Callable[[], bool], within: float, what: str) -> float:
        """Poll ``condition`` until true (a node that does not answer: not yet); returns
        how long it took."""
        started = time.monotonic()

        def check() -> bool:
            try:
                return bool(condition())
            except (httpx.TransportError, AssertionError, KeyError, ValueError):
                return False

        wait_until_sync(check, within=within, what=what)
        return time.monotonic() - started

    def wait_leader(
        self, topic: str, partition: int = 0, *, not_on: Iterable[str] = (), within: float = 30.0
    ) -> dict[str, Any]:
        """Wait until every serving node names the same live leader, outside ``not_on``;
        returns that partition state."""
        excluded = set(not_on)
        seen: dict[str, Any] = {}

        def elected() -> bool:
            states = [self.partition_state(topic, partition, node) for node in self.serving()]
            leaders = {(s["leader"], s["epoch"]) for s in states}
            if len(leaders) != 1:
                return False
            leader = states[0]["leader"]
            if leader is None or leader in excluded or not self.nodes[leader].serving:
                return False
            seen.update(states[0])
            return True

        self.wait_for(elected, within, f"a leader of {topic}/{partition} outside {excluded}")
        return seen

    def wait_isr(
        self, topic: str, partition: int, isr: Iterable[str], within: float = 30.0
    ) -> None:
        wanted = set(isr)
        self.wait_for(
            lambda: set(self.partition_state(topic, partition)["isr"]) == wanted,
            within,
            f"ISR of {topic}/{partition} == {sorted(wanted)}",
        )

    # -- after ---------------------------------------------------------------------------

    def replica_dirs(
        self, topic: str, partition: int = 0, replicas: Iterable[str] | None = None
    ) -> dict[str, Path]:
        names = self.nodes if replicas is None else replicas
        return {
            name: self.nodes[name].data_dir / "topics" / topic / str(partition) for name in names
        }

    def check(
        self,
        topic: str,
        partition: int = 0,
        *,
        replicas: Iterable[str],
        high_watermark: int,
        acknowledged: Iterable[tuple[int, bytes]] = (),
        must_hold: Iterable[str] | None = None,
    ) -> CheckReport:
        """Stop every node, then prove the invariants over every replica's log."""
        self.stop_nodes()
        dirs = self.replica_dirs(topic, partition, replicas)
        for name, path in dirs.items():
            assert path.is_dir(), f"{name} holds no directory for {topic}/{partition}: {path}"
        return check_replicas(
            dirs,
            high_watermark=high_watermark,
            acknowledged=acknowledged,
            must_hold=must_hold,
            partition=partition,
        )

    def failure_section(self) -> tuple[str, str]:
        """Every node's log, for a failed test's report (tests/conftest.py)."""
        return "herald cluster logs", self.logs()

    def logs(self, tail: int = LOG_TAIL_LINES) -> str:
        parts = []
        for node in self.nodes.values():
            lines = node.log().splitlines()[-tail:]
            parts.append(f"===== {node.node_id} ({node.url}) =====\n" + "\n".join(lines))
        if self.etcd is not None:
            lines = self.etcd.log().splitlines()[-20:]
            parts.append("===== etcd =====\n" + "\n".join(lines))
        return "\n".join(parts)


# -- the fault tests' clients ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ack:
    """One record answered 200: its producer id, value, where it landed, and when."""

    id: str
    value: bytes
    partition: int
    offset: int
    duplicate: bool
    node: str  # the node that answered
    sent: float  # monotonic, when the request that got this answer was sent
    answered: float  # monotonic, when the answer arrived


@dataclass(frozen=True, slots=True)
class Refusal:
    node: str
    status: int
    code: str | None
    retry_after: str | None
    sent: float
    answered: float


class _Worker(ABC):
    """A test's thread (a Publisher, a Reader): `start` runs its `_run`; `stop` asks it
    to stop, waits for it (60 s at most) and fails the test with what it raised."""

    stop_event: threading.Event
    error: BaseException | None
    _thread: threading.Thread | None

    @property
    @abstractmethod
    def what(self) -> str:
        """What the thread is, for its name and the test's failure."""

    @abstractmethod
    def _run(self) -> None:
        """The thread's work, until `stop_event` is set; what it raises goes in `error`."""

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self.what.replace(" ", "-"))
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), f"{self.what} did not stop"
        if self.error is not None:
            raise AssertionError(f"{self.what} failed: {self.error!r}")


@dataclass
class Publisher(_Worker):
    """A thread publishing batches of ``batch`` records with ids ``{name}-{seq}`` at
    ``acks`` to ``targets`` (node ids), one request at a time. A batch that failed
    (503, or no answer) goes again with the same ids to the next target, so a retry of
    a batch that was in fact appended is deduplicated (PROTOCOL §2)."""

    cluster: HeraldCluster
    name: str
    topic: str
    targets: Sequence[str]
    acks: str = "all"
    batch: int = 5
    partition: int | None = 0
    timeout: float = 5.0
    pause_s: float = 0.0  # between two acknowledged batches
    acks_log: list[Ack] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    transport_errors: int = 0
    stop_event: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    error: BaseException | None = None
    _seq: int = 0

    @property
    def what(self) -> str:
        return f"publisher {self.name}"

    def stop(self) -> None:
        """Stop after the batch under way is settled (acknowledged or given up)."""
        super().stop()

    def acked(self) -> list[Ack]:
        with self._lock:
            return list(self.acks_log)

    def _run(self) -> None:
        try:
            with httpx.Client(timeout=self.timeout) as http:
                turn = 0
                while not self.stop_event.is_set():
                    messages = self._next_batch()
                    while not self.stop_event.is_set():
                        target = self.targets[turn % len(self.targets)]
                        if self._publish(http, target, messages):
                            break
                        turn += 1  # no luck there: the next target, same ids
                    if self.pause_s:
                        self.stop_event.wait(self.pause_s)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def _next_batch(self) -> list[dict[str, Any]]:
        messages = []
        for _ in range(self.batch):
            self._seq += 1
            record_id = f"{self.name}-{self._seq}"
            message: dict[str, Any] = {
                "id": record_id,
                "value_b64": base64.b64encode(record_id.encode()).decode(),
            }
            if self.partition is not None:
                message["partition"] = self.partition
            messages.append(message)
        return messages

    def _publish(self, http: httpx.Client, target: str, messages: list[dict[str, Any]]) -> bool:
        node = self.cluster.nodes[target]
        sent = time.monotonic()
        try:
            answer = http.post(
                f"{node.url}/v1/topics/{self.topic}/messages",
                params={"acks": self.acks},
                json={"messages": messages},
            )
        except httpx.TransportError:
            self.transport_errors += 1
            self.stop_event.wait(0.05)
            return False
        answered = time.monotonic()
        if answer.status_code == 200:
            results = answer.json()["results"]
            assert len(results) == len(messages), answer.text
            with self._lock:
                for message, result in zip(messages, results, strict=True):
                    self.acks_log.append(
                        Ack(
                            message["id"],
                            message["id"].encode(),
                            result["partition"],
                            result["offset"],
                            bool(result.get("duplicate")),
                            target,
                            sent,
                            answered,
                        )
                    )
            return True
        code = None
        if answer.headers.get("content-type", "").startswith("application/problem+json"):
            code = answer.json().get("code")
        with self._lock:
            self.refusals.append(
                Refusal(
                    target,
                    answer.status_code,
                    code,
                    answer.headers.get("retry-after"),
                    sent,
                    answered,
                )
            )
        if answer.status_code not in (503, 429):
            raise AssertionError(f"{target} answered {answer.status_code}: {answer.text}")
        self.stop_event.wait(0.1)  # sooner than Retry-After: a test wants to see the end
        return False


@dataclass
class Reader(_Worker):
    """A thread reading one partition from every target node in turn from where it got
    to, recording every (offset, value) any node showed it."""

    cluster: HeraldCluster
    topic: str
    targets: Sequence[str]
    partition: int = 0
    # offset -> every (node, value) shown there: one value per offset, or a reader saw
    # two different records at one offset
    shown: dict[int, set[tuple[str, bytes]]] = field(default_factory=dict)
    reads: int = 0
    stop_event: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    _thread: threading.Thread | None = None

    @property
    def what(self) -> str:
        return f"reader {self.topic}"

    def _run(self) -> None:
        try:
            next_offset = {target: 0 for target in self.targets}
            with httpx.Client(timeout=1.0) as http:
                while not self.stop_event.is_set():
                    for target in self.targets:
                        next_offset[target] = self._read(http, target, next_offset[target])
                    self.stop_event.wait(0.02)
        except BaseException as exc:
            self.error = exc

    def _read(self, http: httpx.Client, target: str, offset: int) -> int:
        url = self.cluster.nodes[target].url
        path = f"/v1/topics/{self.topic}/partitions/{self.partition}/messages"
        try:
            answer = http.get(url + path, params={"offset": offset, "limit": 1000})
        except httpx.TransportError:
            return offset  # paused, killed or restarting: later
        if answer.status_code != 200:
            return offset  # 503 while a node catches up, or offset_out_of_range
        self.reads += 1
        for message in answer.json()["messages"]:
            self.shown.setdefault(message["offset"], set()).add((target, message_bytes(message)))
        next_offset: int = answer.json()["next_offset"]
        return next_offset


def message_bytes(message: Mapping[str, Any]) -> bytes:
    """A read record's value as the log stores it (decoded ``value_b64``)."""
    if "value_b64" in message:
        return base64.b64decode(message["value_b64"])
    return orjson.dumps(message["value"])


def read_all(cluster: HeraldCluster, node: str, topic: str, partition: int = 0) -> list[Any]:
    """Every record of the partition as one node serves it (pages of 1000)."""
    out: list[Any] = []
    offset = 0
    for _ in range(10_000):
        answer = cluster.get(
            node,
            f"/v1/topics/{topic}/partitions/{partition}/messages",
            offset=offset,
            limit=1000,
        )
        assert answer.status_code == 200, f"{node}: {answer.status_code} {answer.text}"
        body = answer.json()
        out += body["messages"]
        if not body["messages"]:
            return out
        offset = body["next_offset"]
    raise AssertionError("more than 10,000 pages")
