"""The running server: its app-wide workers, their start and stop order, and the typed
services the routes use.

The lifespan (server/app.py) starts a :class:`Runtime`: it opens Storage (recovery),
starts the DeliveryEngine and the webhook dispatchers, runs the retention and flush
loops, and on SIGTERM drains in the order PROTOCOL §3 asks: pending appends finish,
cursors are persisted and consumers closed with 1001, then Storage closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import HTTPConnection

from cluster.node import ClusterNode, ClusterSettings
from cluster.trust import PeerVerifier
from delivery.config import SubscriptionConfig
from delivery.engine import DeliveryEngine
from delivery.redrive import Redrives
from herald.protocol.close_codes import CloseCode
from server.cluster_trust import cluster_keys, etcd_access, peer_verify
from server.config import ServerConfig
from server.errors import ServiceStopping
from server.file_limit import open_files_limit, segment_file_budget
from server.metrics import Histogram
from server.peers import Peers
from server.stats_history import SAMPLE_INTERVAL_S, StatsHistory
from server.tasks import cancel_and_wait
from storage.cursors import decode_snapshot, encode_snapshot
from storage.engine import Storage
from storage.lock import DataDirLock
from subscribers.destination import DestinationGuard
from subscribers.tail import TailRegistry
from subscribers.webhook import WebhookDispatchers, webhook_verify
from subscribers.websocket import SocketServices

log = logging.getLogger("herald.server")


class BackgroundAppends:
    """Supervises the appends of acks=0 publishes, which are answered before they run.

    Bounded (STYLE principle 3): when ``limit`` appends are pending, the next
    acks=0 request waits for a slot before it is answered, which pushes back on
    the producer instead of queueing without end. SIGTERM waits for all of them.
    """

    def __init__(self, limit: int) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def submit(self, append: Coroutine[Any, Any, Any]) -> None:
        try:
            if self._closed:
                raise ServiceStopping("the server is shutting down")
            await self._slots.acquire()
        except BaseException:
            append.close()  # never started: close it so it is not reported as never awaited
            raise
        task = asyncio.create_task(append)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._slots.release()
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Nobody waits for an acks=0 answer; the log is the only place this can go.
            log.error("acks=0 append failed: %s", exc, exc_info=exc)

    async def drain(self) -> None:
        self._closed = True
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


@dataclass(frozen=True, slots=True, eq=False)
class Services:
    """What the routes, middleware and sockets use, typed: built by the Runtime once
    recovery is done, reached through :func:`services` (never through ``app.state``'s
    untyped attributes)."""

    config: ServerConfig
    storage: Storage
    engine: DeliveryEngine
    webhooks: WebhookDispatchers  # PROTOCOL §4 push subscriptions
    redrives: Redrives  # dead-letter redrive (delivery/redrive.py)
    sockets: SocketServices  # what subscribers/websocket.py needs
    background: BackgroundAppends  # acks=0 appends
    stopping: asyncio.Event  # set on SIGTERM: wakes long-polls
    admin_lock: asyncio.Lock  # serialises topic and subscription create/delete
    publish_duration: Histogram  # herald_publish_duration_seconds
    started_ms: int  # GET /v1/stats uptime
    history: StatsHistory  # GET /v1/stats?history=1: the charts' last 15 minutes
    cluster: ClusterNode | None = None  # PROTOCOL §7; None: a single node
    peers: Peers | None = None  # forwarding to the other nodes of the cluster


def services(connection: HTTPConnection) -> Services:
    """The running server's services, for a request or a WebSocket."""
    return app_services(connection.app)


def app_services(app: Any) -> Services:
    """The same from the app (ASGI middleware has the scope's ``app``)."""
    runtime: Runtime = app.state.runtime
    return runtime.services


async def _every(seconds: float, work: Callable[[], Awaitable[None]], what: str) -> None:
    """Run ``work`` every ``seconds`` until cancelled; one failed run (a retention pass, an
    fsync) is logged and tried again at the next tick, never the end of the loop."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await work()
        except Exception:
            log.exception("%s failed", what)


class EngineHost:
    """A cluster node's subscriptions (cluster/node.py SubscriptionHost): the delivery
    engine runs those this node coordinates, with their webhook dispatchers."""

    def __init__(
        self,
        engine: DeliveryEngine,
        webhooks: WebhookDispatchers,
        replicate: Callable[[str, bytes], None],
    ) -> None:
        self.engine = engine
        self.webhooks = webhooks
        self._replicate = replicate  # a cursor to etcd

    def running(self) -> set[str]:
        return set(self.engine.names())

    async def adopt(self, name: str, config: bytes, cursor: bytes | None) -> None:
        settings = SubscriptionConfig.from_storage(orjson.loads(config))
        start = await self.engine.adopt(name, settings, decode_snapshot(cursor) if cursor else None)
        if cursor is None:
            # Where a new subscription starts is fixed now, for every later coordinator
            # ("latest" must not move if this node dies before the first ack).
            self._replicate(name, encode_snapshot(start))
        self.webhooks.ensure(name)

    async def release(self, name: str) -> None:
        await self.webhooks.stop_one(name)  # its records out to the endpoint go back first
        await self.engine.release(name)

    async def deleted(self, name: str) -> None:
        await self.webhooks.stop_one(name)
        await self.engine.delete_subscription(name)


class Runtime:
    """The app-wide workers and their start/stop order; owns the Services."""

    def __init__(self, config: ServerConfig, data_lock: DataDirLock | None = None) -> None:
        self.config = config
        self._data_lock = data_lock  # taken by `herald serve` before it bound its port
        self.stopping = asyncio.Event()  # wakes long-polls on SIGTERM
        self.background = BackgroundAppends(config.max_pending_unacked_publishes)
        self.tails = TailRegistry()
        self._storage: Storage | None = None
        self._cluster: ClusterNode | None = None
        self._peers: Peers | None = None
        self._services: Services | None = None
        self._retention: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._drained = False
        self._closed = False

    async def start(self) -> None:
        lock = self._data_lock if self._data_lock is not None and self._data_lock.held else None
        storage = self._storage = await Storage.open(
            self.config.data_dir,
            segment_bytes=self.config.segment_bytes,
            lock=lock,
            # PROTOCOL §6: the rest of the open-files limit is for sockets.
            max_open_files=segment_file_budget(open_files_limit(), self.config.max_open_files),
        )
        try:
            if self.config.clustered:
                # Before the engine: every partition has its role (and its visible end,
                # the high watermark) before anything reads it.
                keys = cluster_keys(self.config)
                peers_ca = peer_verify(self.config)
                self._peers = peers = Peers(
                    self.config.cluster_token,
                    # Credentials go only to URLs that prove they are nodes (cluster/trust.py).
                    verifier=PeerVerifier(keys, peers_ca) if keys is not None else None,
                    verify=peers_ca,
                )
                self._cluster = ClusterNode(
                    storage,
                    ClusterSettings(
                        endpoints=self.config.etcd_endpoints,
                        name=self.config.cluster_name,
                        node_id=self.config.node_id,
                        advertise_url=self.config.node_url,
                        node_ttl_ms=self.config.node_ttl_ms,
                        replica_lag_ms=self.config.replica_lag_ms,
                        etcd_history_s=self.config.etcd_history_s,
                        etcd_access=etcd_access(self.config),
                        keys=keys,
                    ),
                    on_topic_deleted=self._topic_deleted,
                    ask_renewals=peers.renewals,
                    # PROTOCOL §7 (stale reads): a tail reconnects to a node that serves.
                    on_fenced=lambda: self.tails.close_all(
                        CloseCode.SERVICE_RESTART, "this node cannot reach etcd; reconnect"
                    ),
                    peer_headers=self._peers.own_headers,
                    peer_trusted=self._peers.trusted,
                    peer_verify=peers_ca,
                )
                await self._cluster.start()
            cluster = self._cluster
            engine = DeliveryEngine(
                storage,
                # PROTOCOL §7: a node runs the subscriptions it coordinates, not meta.db's,
                # and every cursor it persists goes to etcd too.
                load_local=cluster is None,
                cursor_saved=(
                    None
                    if cluster is None
                    else lambda name, cursor: cluster.cursor_saved(name, encode_snapshot(cursor))
                ),
            )
            await engine.start()
            verify = await asyncio.to_thread(webhook_verify, self.config.webhook_ca_file)
            # PROTOCOL §6: with credentials, webhooks reach public addresses only.
            destinations = DestinationGuard(
                enforced=self.config.auth_file is not None,
                allowed=self.config.webhook_allowed_networks,
            )
            webhooks = WebhookDispatchers(engine, verify=verify, destinations=destinations)
            await webhooks.start()
            if cluster is not None:
                self.tails.on_first, self.tails.on_last = cluster.tail_opened, cluster.tail_closed
                cluster.bind_subscriptions(EngineHost(engine, webhooks, cluster.cursor_saved))
        except BaseException:
            await self._close_cluster()
            await storage.close()
            raise
        self._services = Services(
            config=self.config,
            storage=storage,
            engine=engine,
            webhooks=webhooks,
            redrives=Redrives(engine),
            sockets=SocketServices(
                engine,
                storage,
                self.tails,
                may_tail=cluster.may_serve if cluster is not None else None,
            ),
            background=self.background,
            stopping=self.stopping,
            admin_lock=asyncio.Lock(),
            publish_duration=Histogram(),
            started_ms=time.time_ns() // 1_000_000,
            history=StatsHistory(),
            cluster=self._cluster,
            peers=self._peers,
        )
        self._retention = asyncio.create_task(
            _every(self.config.retention_interval_s, storage.run_retention, "retention pass"),
            name="herald-retention",
        )
        history, services = self._services.history, self._services

        async def sample() -> None:
            history.record(services.storage, services.engine)

        self._sampler = asyncio.create_task(
            _every(SAMPLE_INTERVAL_S, sample, "stats sample"), name="herald-stats-history"
        )
        if self.config.flush_interval_s > 0:
            # Bounds what power loss can take from acks=1 appends to about one interval.
            self._flusher = asyncio.create_task(
                _every(self.config.flush_interval_s, storage.flush, "periodic flush"),
                name="herald-flush",
            )

    async def _topic_deleted(self, name: str) -> None:
        """etcd no longer has the topic (PROTOCOL §7: deleted from any node): its
        subscriptions and tails end first, as on a single node, then its files go."""
        if self._services is not None:
            await self._services.engine.topic_deleted(name)
            self._services.sockets.tails.topic_deleted(name)
        if self._storage is not None and self._storage.topic(name) is not None:
            await self._storage.delete_topic(name)

    async def _close_cluster(self) -> None:
        try:
            if self._cluster is not None:
                await self._cluster.close()
        finally:
            if self._peers is not None:
                await self._peers.aclose()

    @property
    def services(self) -> Services:
        if self._services is None:
            raise RuntimeError("the server has not started")
        return self._services

    async def drain(self) -> None:
        """Stop serving consumers: wake long-polls, finish acks=0 appends, persist cursors,
        close consumers with 1001. Idempotent; runs before uvicorn closes connections."""
        if self._drained:
            return
        self._drained = True
        self.stopping.set()
        await self.background.drain()
        if self._services is not None:
            # The webhooks first: unfinished POSTs give their records back.
            await self._services.webhooks.stop()
            await self._services.engine.stop()
        self.tails.close_all()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.drain()
        finally:
            try:
                await cancel_and_wait(self._retention, self._flusher, self._sampler)
                await self._close_cluster()
            finally:
                if self._storage is not None:
                    await self._storage.close()
