"""The running server: its app-wide workers, their start and stop order, and the typed
services the routes use.

The lifespan (server/app.py) starts a :class:`Runtime`: it opens Storage (recovery),
starts the DeliveryEngine and the webhook dispatchers, runs the retention and flush
loops, and on SIGTERM drains in the order PROTOCOL §3 asks: pending appends finish,
cursors are persisted and consumers closed with 1001, then Storage closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import HTTPConnection

from cluster.node import ClusterNode, ClusterSettings
from cluster.trust import PeerVerifier
from delivery.config import SubscriptionConfig
from delivery.engine import DeliveryEngine
from delivery.redrive import Redrives
from herald.lifecycle import periodic, start_service
from herald.protocol.close_codes import CloseCode
from server.cluster_trust import cluster_keys, etcd_access, peer_verify
from server.config import ServerConfig
from server.errors import ServiceStopping
from server.file_limit import open_files_limit, segment_file_budget
from server.metrics import Histogram
from server.peers import Peers
from server.stats_history import SAMPLE_INTERVAL_S, StatsHistory
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


def _cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()


class ClusterService:
    """The cluster node and its peers' HTTP client as one service: stopped together,
    the node first (it may still forward to peers while it hands roles over)."""

    def __init__(self, node: ClusterNode, peers: Peers) -> None:
        self.node, self.peers = node, peers

    async def start(self) -> None:
        await self.node.start()

    async def stop(self) -> None:
        try:
            await self.node.close()
        finally:
            await self.peers.aclose()


class EngineHost:
    """A cluster node's subscriptions (cluster/subscription_coordinator.py SubscriptionHost): the delivery
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
        self._stack: contextlib.AsyncExitStack | None = None  # what start() started
        self._drained = False
        self._closed = False

    async def start(self) -> None:
        """Start storage → cluster → delivery → webhooks, then the periodic work, on one
        exit stack: a failed start stops what had started, :meth:`close` the rest, in
        reverse (STYLE principle 14)."""
        async with contextlib.AsyncExitStack() as stack:
            storage = self._storage = await self._open_storage()
            stack.push_async_callback(storage.close)
            cluster: ClusterNode | None = None
            if self.config.clustered:
                # Before the engine: every partition has its role (and its visible end,
                # the high watermark) before anything reads it.
                service = self._cluster_service(storage)
                # Stopped also when its start fails: the node may have begun (etcd
                # sessions, the peers' client) before it raised.
                stack.push_async_callback(service.stop)
                await service.start()
                cluster = service.node
            engine = await start_service(stack, self._delivery_engine(storage, cluster))
            webhooks = await start_service(stack, await self._webhook_dispatchers(engine))
            if cluster is not None:
                self.tails.on_first, self.tails.on_last = cluster.tail_opened, cluster.tail_closed
                cluster.bind_subscriptions(EngineHost(engine, webhooks, cluster.cursor_saved))
            self._services = self._build_services(storage, engine, webhooks)
            await self._start_periodic(stack, self._services)
            self._stack = stack.pop_all()

    async def _open_storage(self) -> Storage:
        lock = self._data_lock if self._data_lock is not None and self._data_lock.held else None
        return await Storage.open(
            self.config.data_dir,
            segment_bytes=self.config.segment_bytes,
            lock=lock,
            # PROTOCOL §6: the rest of the open-files limit is for sockets.
            max_open_files=segment_file_budget(open_files_limit(), self.config.max_open_files),
        )

    def _cluster_service(self, storage: Storage) -> ClusterService:
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
            peer_headers=peers.own_headers,
            peer_trusted=peers.trusted,
            peer_verify=peers_ca,
        )
        return ClusterService(self._cluster, peers)

    def _delivery_engine(self, storage: Storage, cluster: ClusterNode | None) -> DeliveryEngine:
        return DeliveryEngine(
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

    async def _webhook_dispatchers(self, engine: DeliveryEngine) -> WebhookDispatchers:
        verify = await asyncio.to_thread(webhook_verify, self.config.webhook_ca_file)
        # PROTOCOL §6: with credentials, webhooks reach public addresses only.
        destinations = DestinationGuard(
            enforced=self.config.auth_file is not None,
            allowed=self.config.webhook_allowed_networks,
        )
        return WebhookDispatchers(engine, verify=verify, destinations=destinations)

    def _build_services(
        self, storage: Storage, engine: DeliveryEngine, webhooks: WebhookDispatchers
    ) -> Services:
        cluster = self._cluster
        return Services(
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
            cluster=cluster,
            peers=self._peers,
        )

    async def _start_periodic(self, stack: contextlib.AsyncExitStack, services: Services) -> None:
        """The app-wide loops, in one task group on the stack: unwound first, before the
        webhooks, the engine, the cluster and storage they use."""
        group = await stack.enter_async_context(asyncio.TaskGroup())
        tasks: list[asyncio.Task[None]] = []
        stack.callback(_cancel_all, tasks)  # then the group waits for them to end
        storage, history = services.storage, services.history

        async def sample() -> None:
            history.record(services.storage, services.engine)

        loops = [  # (task name, what failed in the log, every, work)
            (
                "retention",
                "retention pass",
                self.config.retention_interval_s,
                storage.run_retention,
            ),
            ("stats-history", "stats sample", SAMPLE_INTERVAL_S, sample),
        ]
        if self.config.flush_interval_s > 0:
            # Bounds what power loss can take from acks=1 appends to about one interval.
            loops.append(("flush", "periodic flush", self.config.flush_interval_s, storage.flush))
        for name, what, seconds, work in loops:
            loop = periodic(seconds, work, what=what, logger=log)
            tasks.append(group.create_task(loop, name=f"herald-{name}"))

    async def _topic_deleted(self, name: str) -> None:
        """etcd no longer has the topic (PROTOCOL §7: deleted from any node): its
        subscriptions and tails end first, as on a single node, then its files go."""
        if self._services is not None:
            await self._services.engine.topic_deleted(name)
            self._services.sockets.tails.topic_deleted(name)
        if self._storage is not None and self._storage.topic(name) is not None:
            await self._storage.delete_topic(name)

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
        """Drain, then unwind what :meth:`start` started, in reverse: the periodic work,
        the webhooks, the engine, the cluster, storage (pending appends finish, fsync)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.drain()
        finally:
            if self._stack is not None:
                await self._stack.aclose()
