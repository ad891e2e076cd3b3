"""The data directory: metadata, topics with their partitions, cursors, retention.

Layout (docs/architecture.md "Data directory")::

    <data_dir>/meta.db                      topics and subscriptions (the truth of what exists)
    <data_dir>/topics/<topic>/<partition>/  partition logs
    <data_dir>/cursors/                     subscription cursors
    <data_dir>/trash/                       deleted topics, removed off the event loop
    <data_dir>/.lock                        held (flock) by the one process using the directory

meta.db decides which topics exist: a topic is written there before its directory is
made, and removed from there before its directory goes, so a crash at any point
leaves at worst an orphan directory, which the next open sweeps into the trash. A
topic re-created under the same name can never pick up the old topic's records.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from herald.protocol.errors import LimitExceeded, TopicConflict, TopicNotFound
from storage.config import TopicConfig
from storage.cursors import CursorStore
from storage.durable import fsync_dir, make_dirs
from storage.lock import DataDirLock
from storage.metadata import MetadataStore
from storage.open_files import OpenFiles
from storage.partition import Partition
from storage.partition_log import LogConfig
from storage.tail_cache import DEFAULT_CACHE_BYTES
from storage.topic import Topic
from storage.writer import WriterPool, wall_clock_ms


class Storage:
    """Build it with :meth:`open`; every method runs on the event loop."""

    def __init__(
        self,
        data_dir: Path,
        metadata: MetadataStore,
        cursors: CursorStore,
        writers: WriterPool,
        *,
        wall_ms: Callable[[], int],
        log_config: LogConfig,
        cache_bytes: int,
        lock: DataDirLock,
        open_files: OpenFiles | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.lock = lock
        self.metadata = metadata
        self.cursors = cursors
        self.writers = writers
        self._wall_ms = wall_ms
        self._log_config = log_config
        self._cache_bytes = cache_bytes
        # PROTOCOL §6: the partitions' descriptors stay below the process's limit.
        self.open_files = open_files or OpenFiles()
        self._topics: dict[str, Topic] = {}
        # Serialises create/delete so two requests for one name cannot interleave their
        # metadata and directory steps.
        self._admin = asyncio.Lock()

    @property
    def topics_dir(self) -> Path:
        return self.data_dir / "topics"

    @property
    def trash_dir(self) -> Path:
        return self.data_dir / "trash"

    @classmethod
    async def open(
        cls,
        data_dir: Path,
        *,
        segment_bytes: int | None = None,
        log_config: LogConfig | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        writer_threads: int = 4,
        wall_ms: Callable[[], int] = wall_clock_ms,
        lock: DataDirLock | None = None,
        max_open_files: int | None = None,
    ) -> Storage:
        """Lock the directory, create the layout if needed, then open every topic listed
        in meta.db.

        ``lock`` is the directory's lock if the caller took it already (``herald serve``
        takes it before anything else); otherwise it is taken here, and either way the
        Storage holds it until :meth:`close`. Raises ``DataDirLocked`` if another process
        holds it, having touched nothing.

        ``segment_bytes`` overrides ``log_config.segment_bytes``; ``cache_bytes`` is each
        partition's tail cache; every partition shares a pool of ``writer_threads``.
        ``wall_ms`` is the clock of record timestamps, dedup windows and retention, so
        that tests can move time instead of sleeping. ``max_open_files`` bounds the
        descriptors partitions keep open (idle ones close theirs; None: unbounded).
        """
        data_dir = Path(data_dir)
        segments = log_config or LogConfig()
        if segment_bytes is not None:
            segments = dataclasses.replace(segments, segment_bytes=segment_bytes)
        if lock is None:
            lock = await asyncio.to_thread(DataDirLock.acquire, data_dir)
        try:
            metadata = await asyncio.to_thread(_prepare_layout, data_dir)
        except BaseException:
            lock.release()
            raise
        storage = cls(
            data_dir,
            metadata,
            CursorStore(data_dir / "cursors"),
            WriterPool(writer_threads, clock_ms=wall_ms),
            wall_ms=wall_ms,
            log_config=segments,
            cache_bytes=cache_bytes,
            lock=lock,
            open_files=OpenFiles(max_open_files),
        )
        try:
            configs = await asyncio.to_thread(metadata.topics)
            auto_created = await asyncio.to_thread(metadata.auto_created_topics)
            await asyncio.to_thread(storage._sweep_orphans, set(configs))
            for name, config in configs.items():
                topic = await storage._open_topic(name, config)
                topic.auto_created = name in auto_created
                storage._topics[name] = topic
        except BaseException:
            await storage.close()
            raise
        return storage

    # --- lookup ----------------------------------------------------------------------

    def topic(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def topics(self) -> list[Topic]:
        return [self._topics[name] for name in sorted(self._topics)]

    # --- admin -----------------------------------------------------------------------

    async def create_topic(
        self, name: str, config: TopicConfig, *, max_topics: int | None = None
    ) -> Topic:
        """Create a new topic, persisted in meta.db. Raises TopicConflict if ``name``
        exists (whatever its config): comparing configs is the server's decision; and
        LimitExceeded, having changed nothing, if ``max_topics`` exist already."""
        async with self._admin:
            if name in self._topics:
                raise TopicConflict(f"topic {name!r} already exists")
            self._check_room(max_topics)
            return await self._create(name, config)

    async def ensure_topic(
        self,
        name: str,
        config: TopicConfig,
        *,
        auto_created: bool = False,
        max_topics: int | None = None,
    ) -> tuple[Topic, bool]:
        """(topic, created): the existing topic as it is, or a new one with ``config``
        (``auto_created``: made by a publish or a subscription, recorded in meta.db).
        Race-free for concurrent auto-creates and idempotent PUTs of one name. A new
        one past ``max_topics`` is LimitExceeded (PROTOCOL §6), nothing changed."""
        async with self._admin:
            existing = self._topics.get(name)
            if existing is not None:
                return existing, False
            self._check_room(max_topics)
            return await self._create(name, config, auto_created=auto_created), True

    def _check_room(self, max_topics: int | None) -> None:
        if max_topics is not None and len(self._topics) >= max_topics:
            raise LimitExceeded(
                f"this server holds its maximum of {max_topics} topics (--max-topics)",
                max_topics=max_topics,
            )

    async def _create(self, name: str, config: TopicConfig, *, auto_created: bool = False) -> Topic:
        # A directory of this name is what a delete that failed half way left (a failing
        # disk): a new topic must never open it and serve the deleted records as its own.
        await asyncio.to_thread(self._trash, name)
        await asyncio.to_thread(
            functools.partial(
                self.metadata.put_topic, name, config, self._wall_ms(), auto_created=auto_created
            )
        )
        try:
            topic = await self._open_topic(name, config)
        except BaseException:
            # Nothing was acknowledged: undo so the name is free again.
            await asyncio.to_thread(self.metadata.delete_topic, name)
            await asyncio.to_thread(self._trash, name)
            raise
        topic.auto_created = auto_created
        self._topics[name] = topic
        return topic

    async def delete_topic(self, name: str) -> list[str]:
        """Close the topic's partitions (in-flight appends finish first), delete it and
        its subscriptions from meta.db, then remove its files off the loop. Returns the
        names of the subscriptions deleted with it (cursors are the delivery engine's)."""
        async with self._admin:
            topic = self._topics.pop(name, None)
            if topic is None:
                raise TopicNotFound(f"topic {name!r} does not exist")
            # Each step runs whatever the one before it raised (a failing disk fails the
            # close's fsync and meta.db's commit): the files go all the same.
            try:
                await topic.close()
            finally:
                try:
                    subscriptions = await asyncio.to_thread(self.metadata.delete_topic, name)
                finally:
                    await asyncio.to_thread(self._trash, name)
        return subscriptions

    async def run_retention(self) -> None:
        """One retention pass over every partition (the server schedules the passes)."""
        now = self._wall_ms()
        for topic in list(self._topics.values()):
            config = topic.config
            for partition in topic.partitions:
                await partition.apply_retention(now, config.retention_ms, config.retention_bytes)
            topic.expire_dedup()

    async def flush(self) -> None:
        """fsync every partition once (for a periodic flush of Acks.LEADER appends)."""
        for topic in list(self._topics.values()):
            await asyncio.gather(*(p.flush() for p in topic.partitions))

    async def close(self) -> None:
        """Close every topic (pending appends finish, partitions fsync), stop the writer
        threads, close meta.db, then release the directory's lock."""
        topics, self._topics = list(self._topics.values()), {}
        results = await asyncio.gather(*(t.close() for t in topics), return_exceptions=True)
        try:
            await asyncio.to_thread(self.writers.close)
            await asyncio.to_thread(self.metadata.close)
        finally:
            self.lock.release()
        for result in results:
            if isinstance(result, BaseException):
                raise result

    # --- internals ----------------------------------------------------------------------

    async def _open_topic(self, name: str, config: TopicConfig) -> Topic:
        directory = self.topics_dir / name
        # Recovery of each partition runs on a thread; open them side by side.
        opened = await asyncio.gather(
            *(
                Partition.open(
                    directory / str(index),
                    name,
                    index,
                    writers=self.writers,
                    config=self._log_config,
                    cache_bytes=self._cache_bytes,
                    open_files=self.open_files,
                )
                for index in range(config.partitions)
            ),
            return_exceptions=True,
        )
        partitions = [p for p in opened if isinstance(p, Partition)]
        try:
            for outcome in opened:
                if isinstance(outcome, BaseException):
                    raise outcome
            return await Topic.open(name, config, partitions, wall_ms=self._wall_ms)
        except BaseException:
            await asyncio.gather(*(p.close() for p in partitions), return_exceptions=True)
            raise

    def _trash(self, name: str) -> None:
        """Move a topic directory to the trash (one atomic rename), then remove it."""
        source = self.topics_dir / name
        target = self.trash_dir / f"{name}.{uuid.uuid4().hex}"
        try:
            os.rename(source, target)
        except FileNotFoundError:
            return
        try:
            fsync_dir(self.topics_dir)
        finally:
            shutil.rmtree(target, ignore_errors=True)

    def _sweep_orphans(self, known: set[str]) -> None:
        # Leftovers of a crash during a delete: directories of topics meta.db no longer has,
        # and trash not yet removed.
        for entry in self.topics_dir.iterdir():
            if entry.name not in known:
                self._trash(entry.name)
        for entry in self.trash_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _prepare_layout(data_dir: Path) -> MetadataStore:
    for sub in ("topics", "cursors", "trash"):
        make_dirs(data_dir / sub)
    created = not (data_dir / "meta.db").exists()
    metadata = MetadataStore(data_dir / "meta.db")
    if created:  # SQLite fsyncs its files, not the directory entries naming them
        fsync_dir(data_dir)
    return metadata
