"""Which node leads each partition of a topic, as the producer last learnt it (a cluster:
PROTOCOL §7; docs/protocol.md "Publishing to the leader").

Any node of a cluster takes any publish and forwards each record to its partition's
leader, and says so in its answer (`Herald-Forwarded`). A producer that sends each
record to that leader itself saves the hop, as Kafka's clients do from their metadata.
The first such answer for a topic has the producer read the topic's layout — its
partition count and the URL of each partition's leader, from `GET /v1/topics/{topic}`,
which anyone who may publish to the topic may read — in the background; so does every
later one (a leader moved), at most once per `MIN_REFETCH_S`. A single node never
forwards: its producers never read a layout. Nothing depends on the layout being
right: a node that no longer leads forwards the record, so a stale layout costs a hop,
never a record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import crc32c

log = logging.getLogger("herald.producer")

MIN_REFETCH_S = 5.0  # between two reads of one topic's layout
# A leader URL that did not answer goes unused this long, twice as long each time it
# fails again, up to the last (an address this client can never reach costs a failed
# connection every 10 minutes, not every publish).
UNANSWERED_S = 30.0
UNANSWERED_MAX_S = 600.0


def partition_of_key(key: str, count: int) -> int:
    """The partition the server puts a record of ``key`` in (PROTOCOL §1: a stable hash
    of the key modulo the partition count; storage/topic.py ``choose_partition``)."""
    return crc32c.crc32c(key.encode()) % count


@dataclass(slots=True)
class Layout:
    """A topic's partitions and where each one's records go: a leader's URL, or None for
    the node the producer talks to (it leads the partition, or the leader is unknown)."""

    leaders: list[str | None]
    next_keyless: int = 0  # the partition the next batch of keyless records goes to

    @property
    def remote(self) -> bool:
        """Whether any partition is led elsewhere than the node the producer talks to."""
        return any(url is not None for url in self.leaders)

    def leader_of(self, partition: int) -> str | None:
        return self.leaders[partition] if 0 <= partition < len(self.leaders) else None

    def leader_of_key(self, key: str) -> str | None:
        return self.leaders[partition_of_key(key, len(self.leaders))]

    def spread(self) -> tuple[int, str | None]:
        """The partition of the next batch of keyless records, and its leader: batches
        rotate over the partitions, as the server spreads them (PROTOCOL §1)."""
        partition = self.next_keyless % len(self.leaders)
        self.next_keyless = partition + 1
        return partition, self.leaders[partition]


# A topic's partitions as GET /v1/topics/{topic} shows them: (leader URL or None) each;
# None when the topic cannot be read (missing, not allowed, the node unreachable).
Fetch = Callable[[str], Awaitable[list[str | None] | None]]


class Routes:
    """The layouts of the topics a producer publishes to, read when answers show them
    missing or stale."""

    def __init__(
        self, home_url: str, fetch: Fetch, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._home = home_url.rstrip("/")
        self._scheme = urlsplit(self._home).scheme
        self._fetch = fetch
        self._layouts: dict[str, Layout] = {}
        self._read_at: dict[str, float] = {}  # topic -> when its layout was last read
        self._fetching: dict[str, asyncio.Task[Layout | None]] = {}
        # leader URL -> (until when it goes unused, how long it went unused last time)
        self._unanswered: dict[str, tuple[float, float]] = {}

    def layout(self, topic: str) -> Layout | None:
        return self._layouts.get(topic)

    def forwarded(self, topic: str) -> None:
        """A node forwarded records of ``topic`` to their leader: the layout is missing
        or stale. It is read again, unless it was read in the last MIN_REFETCH_S (a
        leader this producer cannot reach is forwarded to on every publish)."""
        if topic in self._fetching:
            return
        read_at = self._read_at.get(topic)
        if read_at is None or self._clock() - read_at >= MIN_REFETCH_S:
            self._start_fetch(topic)

    moved = forwarded  # a leader answered that it leads the partition no longer

    async def wait_layout(self, topic: str) -> Layout | None:
        """The topic's layout, read now (or the read under way)."""
        if topic not in self._fetching:
            self._start_fetch(topic)
        return await asyncio.shield(self._fetching[topic])

    def answers(self, url: str) -> bool:
        """Whether ``url`` may be sent to: it did not fail to answer lately."""
        failed = self._unanswered.get(url)
        return failed is None or self._clock() >= failed[0]

    def answered(self, url: str) -> None:
        self._unanswered.pop(url, None)

    def unanswered(self, url: str) -> None:
        """A leader URL did not answer: its partitions go to the home node (which
        forwards, and so has the layout read again) and the URL goes unused a while."""
        previous = self._unanswered.get(url)
        pause = min(UNANSWERED_MAX_S, 2 * previous[1]) if previous else UNANSWERED_S
        self._unanswered[url] = (self._clock() + pause, pause)
        for layout in self._layouts.values():
            if url in layout.leaders:
                layout.leaders = [None if u == url else u for u in layout.leaders]

    def forget(self, topic: str) -> None:
        """The layout is of an older topic of that name: drop it (the next answer that
        says it was forwarded has it read again, without waiting)."""
        self._layouts.pop(topic, None)
        self._read_at.pop(topic, None)

    async def close(self) -> None:
        for task in self._fetching.values():
            task.cancel()
        await asyncio.gather(*self._fetching.values(), return_exceptions=True)
        self._fetching.clear()

    def _start_fetch(self, topic: str) -> None:
        self._read_at[topic] = self._clock()
        task = asyncio.get_running_loop().create_task(self._refresh(topic))
        self._fetching[topic] = task
        task.add_done_callback(lambda _: self._fetching.pop(topic, None))

    async def _refresh(self, topic: str) -> Layout | None:
        try:
            urls = await self._fetch(topic)
        except Exception as exc:  # the layout is an optimisation: never a send's failure
            log.debug("herald: reading the layout of %r failed: %s", topic, exc)
            urls = None
        if not urls:
            self._layouts.pop(topic, None)
            return None
        previous = self._layouts.get(topic)
        layout = Layout(
            [self._usable(url) for url in urls],
            previous.next_keyless if previous is not None else 0,
        )
        self._layouts[topic] = layout
        return layout

    def _usable(self, url: str | None) -> str | None:
        """A leader URL to send to, or None for the home node: the home node itself, an
        unknown leader, a URL that failed to answer lately, and one of another scheme (a
        token given for https never goes over plain http) all go home."""
        if url is None:
            return None
        url = url.rstrip("/")
        if url == self._home or urlsplit(url).scheme != self._scheme:
            return None
        return url if self.answers(url) else None
