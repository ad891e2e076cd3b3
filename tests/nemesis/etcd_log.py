"""etcd's history of the partition and cursor keys, recorded while the run goes on.

The checker's etcd rules (an epoch +1 at each change of leader, every leader in its ISR,
cursors never going back, a restarted node never keeping its leadership) read every
change to those keys. Read once at the end, that history is gone after an hour: the
cluster compacts etcd a few minutes behind (PROTOCOL §7, "etcd's history is kept
small"), so the first long run checked none of it. Here a watch opened before the
workload starts follows the keys for the whole run, from revision 1.

The watch reopens itself on another member when one dies (cluster/etcd_watch.py). When
no member answers, it resumes where it stopped once one does; if what it missed was
compacted meanwhile, the log records a gap — a ``GAP`` event at the first revision it
could read again — and the checker reads no rule across it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.etcd import EtcdClient, EtcdUnavailable, WatchCompacted

GAP = "GAP"
RETRY_S = 0.5  # no etcd member answers: try again after this long


class EtcdLog:
    """``task = asyncio.create_task(log.follow())`` … ``await log.caught_up(within)``."""

    def __init__(self, urls: list[str], prefix: str) -> None:
        self._urls = urls
        self._prefix = prefix
        self.events: list[dict[str, Any]] = []
        self.gaps = 0
        self.failures: list[str] = []  # what broke the watch, other than etcd being away
        self.next_revision = 1

    async def follow(self) -> None:
        """Record every change until cancelled."""
        async with EtcdClient(self._urls, timeout=20.0, attempt_timeout=5.0) as etcd:
            while True:
                watch = etcd.watch(self._prefix, prefix=True, start_revision=self.next_revision)
                try:
                    async with watch:
                        async for event in watch:
                            kv = event.kv
                            self._record(kv.key, event.type.value, event.revision, kv.value)
                            self.next_revision = watch.next_revision
                except WatchCompacted as exc:
                    self.gaps += 1
                    self.events.append(
                        {"key": "", "type": GAP, "revision": exc.compact_revision, "value": ""}
                    )
                    self.next_revision = exc.compact_revision
                except EtcdUnavailable:
                    self.next_revision = max(self.next_revision, watch.next_revision)
                    await asyncio.sleep(RETRY_S)
                except Exception as exc:
                    # Anything else (a watch etcd cancelled, a stream the gateway ended
                    # with a gRPC error while members restarted): go on from where it
                    # stopped, as the nodes' own watch does (cluster/metadata.py). Such an
                    # error used to end this task unseen; a run (seed 927, two etcd members
                    # restarted at once) recorded nothing past its 460th second.
                    self.failures.append(repr(exc))
                    self.next_revision = max(self.next_revision, watch.next_revision)
                    await asyncio.sleep(RETRY_S)

    def _record(self, key: bytes, kind: str, revision: int, value: bytes) -> None:
        name = key.decode(errors="replace")
        if "/partitions/" in name or "/cursors/" in name:
            self.events.append(
                {
                    "key": name,
                    "type": kind,
                    "revision": revision,
                    "value": value.decode(errors="replace"),
                }
            )

    def end_unrecorded(self) -> None:
        """Mark what was not recorded (the log did not catch up) as a gap: the checker
        reads no rule across it, rather than take the last recorded state for the rest."""
        self.events.append({"key": "", "type": GAP, "revision": self.next_revision, "value": ""})

    async def caught_up(self, within: float) -> bool:
        """Whether every change made up to now was recorded within ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        async with EtcdClient(self._urls, timeout=20.0, attempt_timeout=5.0) as etcd:
            # A write of our own under the prefix: the watch passes its revision, and so
            # everything before it, whatever else etcd holds.
            head = await etcd.put(f"{self._prefix}nemesis-caught-up", b"1")
        while self.next_revision <= head:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.1)
        return True
