"""The leader's side of replication: one fetch request of a follower node (cluster/wire.py),
for every partition it follows on this node, answered by each partition's
:class:`LeaderRole` (cluster/leading.py) — at once when something is ready for one of
them, or after the request's long poll.

A partition this node does not lead (any more, or not yet) answers with the error that
tells the follower what to do: ``UNKNOWN_LEADER_EPOCH`` when etcd has news this node has
not seen or this node is becoming its leader right now (the follower retries), else
``FENCED_LEADER_EPOCH`` (the follower looks for its leader again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from cluster.follower import EpochAnswer, FetchRequest, FetchResponse
from cluster.leading import LeaderRole
from cluster.replication import FetchError
from cluster.state import VersionedState
from cluster.wire import Request, encode_answer

Ref = tuple[str, int]  # (topic, partition)


class FetchServer:
    def __init__(
        self,
        node_id: str,
        *,
        leader_role: Callable[[str, int], LeaderRole | None],
        states: Callable[[], Mapping[Ref, VersionedState]],
    ) -> None:
        self.node_id = node_id
        self._leader_role = leader_role
        self._states = states  # the metadata view's, read when asked (a reload renews it)

    async def serve(self, request: Request) -> bytes:
        """One fetch request of a follower node: answered when something is ready for one
        of its partitions, or after its long poll."""
        epochs = []
        for query in request.epochs:
            role = self._leader_role(query.topic, query.partition)
            if role is None:
                answer = EpochAnswer(
                    self.no_role_error(query.topic, query.partition, query.leader_epoch), -1, -1, 0
                )
            else:
                answer = role.answer_epoch(query)
            epochs.append((query, answer))
        noted: list[tuple[FetchRequest, LeaderRole | None, FetchError | None]] = []
        for entry in request.fetch:
            fetch = entry.request
            role = self._leader_role(fetch.topic, fetch.partition)
            if role is None:
                noted.append(
                    (fetch, None, self.no_role_error(fetch.topic, fetch.partition, fetch.epoch))
                )
            else:
                noted.append(
                    (fetch, role, role.note_fetch(request.node, fetch, request.incarnation))
                )
        if not epochs and request.max_wait_ms > 0 and all(e is None for _, _, e in noted):
            await self._long_poll(request)
        fetches = []
        for fetch, role, error in noted:
            if role is None:
                fetches.append((fetch, FetchResponse(error, b"", 0, 0)))
            else:
                fetches.append((fetch, await role.answer_fetch(fetch, error)))
        return encode_answer(epochs, fetches)

    def no_role_error(self, topic: str, partition: int, epoch: int) -> FetchError:
        """The answer for a partition this node has no leader role of, asked at ``epoch``."""
        versioned = self._states().get((topic, partition))
        if versioned is not None and epoch > versioned.state.epoch:
            return FetchError.UNKNOWN_LEADER_EPOCH  # etcd has news this node has not seen
        if (
            versioned is not None
            and epoch == versioned.state.epoch
            and versioned.state.leader == self.node_id
        ):
            return FetchError.UNKNOWN_LEADER_EPOCH  # becoming leader right now
        return FetchError.FENCED_LEADER_EPOCH

    async def _long_poll(self, request: Request) -> None:
        waits = []
        for entry in request.fetch:
            role = self._leader_role(entry.request.topic, entry.request.partition)
            if role is None or role.ready(entry.request, entry.high_watermark):
                return
            waits.append(role.changed.wait())
        if not waits:
            return
        # The first partition with news answers the request (asyncio.wait's default waits
        # for all: every publish then took a whole long poll once a node followed two).
        await asyncio.wait(
            waits, timeout=request.max_wait_ms / 1000, return_when=asyncio.FIRST_COMPLETED
        )
