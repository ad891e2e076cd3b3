"""Keeping etcd's history small (PROTOCOL §7: "etcd's history is kept small").

etcd keeps every revision of every key until it is compacted. Herald writes often —
a subscription's cursor every ``CURSOR_EVERY_S`` while it delivers, ISR changes, leases
— so without compaction the history fills etcd's space quota (2 GiB by default) in hours
to days, after which etcd refuses every write: no failover, no registration, no topic.

One live node compacts (the member with the smallest id, so there is one without an
election; two compacting at once would only repeat each other's work): every
``every_s`` it notes etcd's current revision, and compacts up to the newest revision it
noted at least ``keep_s`` ago. A watcher that falls further behind than ``keep_s`` gets
:class:`~cluster.etcd.WatchCompacted` and reads the state afresh (cluster/metadata.py,
cluster/membership.py do). Compaction frees space inside etcd's database for reuse; it
does not shrink the file — ``etcdctl defrag`` does, one member at a time (docs/operations
in the README).

Like etcd's own ``--auto-compaction-mode=periodic``, but driven from here so that a
Herald cluster needs no particular etcd flags.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from cluster.clock import Clock, lease_clock
from cluster.etcd import EtcdClient, EtcdError, EtcdUnavailable

log = logging.getLogger("herald.cluster")

COMPACT_EVERY_S = 60.0
KEEP_S = 300.0  # five minutes of history for watchers that fall behind


class Compactor:
    """``await Compactor(etcd, is_compactor=…).run()`` until cancelled."""

    def __init__(
        self,
        etcd: EtcdClient,
        *,
        is_compactor: Callable[[], bool],
        probe_key: str,
        every_s: float = COMPACT_EVERY_S,
        keep_s: float = KEEP_S,
        clock: Clock = lease_clock,
    ) -> None:
        self._etcd = etcd
        self._is_compactor = is_compactor
        self._probe_key = probe_key  # any key: a range of it tells the current revision
        self.every_s = every_s
        self.keep_s = keep_s
        self._clock = clock
        self._marks: deque[tuple[float, int]] = deque()  # (when, revision), oldest first
        self.compacted = 0  # the revision last compacted to (0: none yet)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except EtcdUnavailable as exc:
                log.info("compacting etcd's history: %s", exc)
            except Exception:
                log.exception("compacting etcd's history failed")

    async def step(self) -> int | None:
        """Note the current revision; compact if this node is the one and a mark is old
        enough. Returns the revision compacted to, if any."""
        revision = (await self._etcd.range(self._probe_key, count_only=True)).revision
        now = self._clock()
        self._marks.append((now, revision))
        target = 0
        while self._marks and now - self._marks[0][0] >= self.keep_s:
            target = self._marks.popleft()[1]
        if not target or target <= self.compacted or not self._is_compactor():
            return None
        try:
            await self._etcd.compact(target)
        except EtcdError as exc:
            if "compacted" not in exc.message:  # someone compacted further already: fine
                raise
        self.compacted = target
        log.info("compacted etcd's history up to revision %d", target)
        return target
