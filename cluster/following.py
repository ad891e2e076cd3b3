"""Partitions this node follows: cluster/follower.py's FollowerReplica, driven over one
long-lived connection per leader node (cluster/wire.py has the messages).

A :class:`FetchSession` per leader node sends, in turn, one request for every partition
it follows there — epoch queries for those checking for divergence, fetches for the
others — and applies the answer: truncations, resets and appends on the partition's
writer thread, then the leader's high watermark as the partition's visible end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import Awaitable, Callable

import websockets
from websockets.asyncio.client import ClientConnection, connect

from cluster.errors import LeaderUnavailable
from cluster.follower import (
    Action,
    EpochAnswer,
    FetchResponse,
    FollowerReplica,
    Phase,
    Step,
)
from cluster.trust import peer_ssl
from cluster.wire import MAX_WAIT_MS, BadMessage, FetchEntry, Request, decode_answer, encode_request
from herald.protocol.errors import StorageUnavailable
from storage.partition import Partition
from storage.record import Acks
from storage.topic import Topic

log = logging.getLogger("herald.cluster")

FETCH_MAX_BYTES = 4 << 20  # per partition per request
_ANSWER_GRACE_S = 10.0  # beyond the long poll: a leader slower than this is dropped
_DISK_RETRY_S = 1.0  # after this node's disk refused a fetched response


class FollowerRole:
    """Follows ``partition`` of ``topic``, led by ``leader`` at ``epoch``."""

    def __init__(
        self,
        *,
        node_id: str,
        topic: Topic,
        partition: Partition,
        leader: str,
        epoch: int,
        topic_id: int = 0,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.leader = leader
        self.epoch = epoch
        self.replica = FollowerReplica(
            node_id,
            topic=topic.name,
            partition=partition.partition,
            leader=leader,
            epoch=epoch,
            latest_epoch=partition.latest_epoch,
            log_start=partition.start_offset,
            log_end=partition.log_end_offset,
            high_watermark=partition.end_offset,
            max_bytes=FETCH_MAX_BYTES,
            topic_id=topic_id,
        )
        self.stopped = False
        self.retry_at = 0.0  # loop time before which it is left out of requests
        # The leader's high watermark at the first answer of this role: once the log
        # reaches it, this copy holds all that was committed when it started following.
        self.first_leader_hw = -1

    # the hooks Partition.append calls: a follower's log is written by replication only
    def check_append(self, acks: Acks) -> None:
        raise LeaderUnavailable(
            f"partition {self.topic.name}/{self.partition.partition} is led by {self.leader}"
        )

    async def wait_commit(self, end_offset: int, acks: Acks) -> None:  # pragma: no cover
        raise LeaderUnavailable("a follower does not take appends")

    @property
    def ref(self) -> tuple[str, int]:
        return self.topic.name, self.partition.partition

    async def on_epoch_answer(self, answer: EpochAnswer) -> None:
        step = self.replica.on_epoch_answer(answer, self.partition.end_offset_for_epoch)
        await self._do(step)

    async def on_fetch_response(self, response: FetchResponse) -> None:
        step = self.replica.on_fetch_response(response)
        if response.error is None and self.first_leader_hw < 0:
            self.first_leader_hw = response.high_watermark
        await self._do(step)

    @property
    def caught_up(self) -> bool:
        """Whether this copy holds everything committed when it started following."""
        return 0 <= self.first_leader_hw <= self.partition.end_offset

    async def _do(self, step: Step) -> None:
        partition = self.partition
        if step.action is Action.TRUNCATE:
            offset = step.offset
            if (lost := partition.lost_offset) is not None and lost < offset:
                # This log lost records from there after a failed write-back (a leader
                # that handed its lead over, say): they are fetched again, as ones the
                # leader has and this log does not.
                offset = lost
            if offset < partition.log_end_offset:
                log.info(
                    "%s/%d: truncating to %d (%s %d..%d)",
                    self.topic.name,
                    partition.partition,
                    offset,
                    f"the leader {self.leader} does not have"
                    if offset == step.offset
                    else "this node's disk lost",
                    offset,
                    partition.log_end_offset - 1,
                )
                await partition.truncate_to(offset)
                self.topic.forget_dedup_from(partition.partition, offset)
            self.replica.truncated(partition.log_end_offset, partition.latest_epoch)
        elif step.action is Action.RESET:
            log.info("%s/%d: log reset to %d", self.topic.name, partition.partition, step.offset)
            await partition.reset_to(step.offset)
            self.topic.forget_dedup_from(partition.partition, 0)
            self.replica.reset(partition.log_end_offset, partition.latest_epoch)
        elif step.action is Action.APPEND:
            if step.batches:
                try:
                    await partition.append_batches(step.batches)
                except Exception as exc:  # a bad CRC, not contiguous, a stale epoch
                    log.warning(
                        "%s/%d: batches from %s refused (%s): checking divergence again",
                        self.topic.name,
                        partition.partition,
                        self.leader,
                        exc,
                    )
                    self.replica.append_failed()
                    # Never a hot loop: a failing disk heals in its time; anything else
                    # should be settled by the epoch query, and is not retried at once
                    # in case it is not.
                    wait = _DISK_RETRY_S if isinstance(exc, StorageUnavailable) else 0.1
                    self.retry_at = asyncio.get_running_loop().time() + wait
                    return
            self.replica.appended(partition.log_end_offset, partition.latest_epoch)
            partition.set_high_watermark(self.replica.high_watermark)
        elif step.action is Action.RETRY:
            self.retry_at = asyncio.get_running_loop().time() + 0.1
        elif step.action is Action.STOP:
            self.stopped = True  # fenced: etcd's next state decides
        # Action.QUERY: the next request carries an epoch query (phase is TRUNCATING)


class FetchSession:
    """The connection to one leader node, shared by every partition followed there."""

    def __init__(
        self,
        *,
        node_id: str,
        leader: str,
        url_of: Callable[[str], str | None],
        headers: dict[str, str],
        incarnation: Callable[[], int] = lambda: 0,
        trusted: Callable[[str], Awaitable[bool]] | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        # Whether the leader's URL proved it is a node (cluster/trust.py): the fetch
        # carries the cluster token. ``verify``: the peers' CA, for wss://.
        self._trusted = trusted
        self._verify = verify
        self.node_id = node_id
        self._incarnation = incarnation
        self.leader = leader
        self._url_of = url_of
        self._headers = headers
        self.roles: dict[tuple[str, int], FollowerRole] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = False

    def add(self, role: FollowerRole) -> None:
        self.roles[role.ref] = role
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"herald-fetch-{self.leader}")

    def remove(self, ref: tuple[str, int]) -> FollowerRole | None:
        role = self.roles.pop(ref, None)
        self._wake.set()
        return role

    async def close(self) -> None:
        self.roles.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        backoff = 0.1
        while self.roles:
            url = self._url_of(self.leader)
            if url is None:  # the leader is not a live member: etcd will move its partitions
                await self._sleep(0.2)
                continue
            ws_url = url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
            if self._trusted is not None and not await self._trusted(url):
                await self._sleep(1.0)  # logged by the verifier; etcd may change the URL
                continue
            try:
                async with connect(
                    ws_url + "/v1/cluster/fetch",
                    additional_headers=self._headers,
                    max_size=None,
                    compression=None,
                    open_timeout=5,
                    ping_interval=5,
                    ping_timeout=10,
                    ssl=peer_ssl(ws_url, self._verify),
                ) as ws:
                    self.connected = True
                    backoff = 0.1
                    await self._exchange(ws)
            except (OSError, TimeoutError, websockets.WebSocketException, BadMessage) as exc:
                log.debug("fetch connection to %s: %s", self.leader, exc)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("fetch session with %s failed", self.leader)
            finally:
                self.connected = False
            await self._sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, 1.0)

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _exchange(self, ws: ClientConnection) -> None:
        loop = asyncio.get_running_loop()
        while self.roles:
            request = self._request(loop.time())
            if request is None:
                await self._sleep(0.1)
                continue
            await ws.send(encode_request(request))
            data = await asyncio.wait_for(ws.recv(), request.max_wait_ms / 1000 + _ANSWER_GRACE_S)
            if isinstance(data, str):
                raise BadMessage("a text answer")
            epochs, fetches = decode_answer(data)
            for topic, number, answer in epochs:
                role = self.roles.get((topic, number))
                if role is not None and role.replica.phase is Phase.TRUNCATING:
                    await role.on_epoch_answer(answer)
            for topic, number, response in fetches:
                role = self.roles.get((topic, number))
                if role is not None and role.replica.phase is Phase.FETCHING:
                    await role.on_fetch_response(response)

    def _request(self, now: float) -> Request | None:
        epochs, fetches = [], []
        for role in self.roles.values():
            if role.stopped or role.retry_at > now:
                continue
            replica = role.replica
            if replica.phase is Phase.TRUNCATING:
                epochs.append(replica.epoch_query())
            elif replica.phase is Phase.FETCHING:
                request = replica.fetch_request(role.partition.fsynced_offset)
                fetches.append(FetchEntry(request, replica.high_watermark))
        if not epochs and not fetches:
            return None
        # Epoch queries are answered at once; a request of fetches only long-polls.
        wait = 0 if epochs else MAX_WAIT_MS
        return Request(
            self.node_id, wait, tuple(epochs), tuple(fetches), incarnation=self._incarnation()
        )
