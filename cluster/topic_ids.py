"""Which incarnation of each topic this node's disk holds (PROTOCOL §7, "a name deleted
and created again is a new thing"; Kafka's topic IDs, KIP-516).

A topic's id is the create revision of its key in etcd: a topic deleted and created
again under the same name gets a new one. A node that was down or cut off while that
happened still holds the old topic's log under the name; comparing the id it recorded
when it created its copy with etcd's tells the two apart, and the old copy is deleted
before anything reads it — no node serves, tails, delivers or deduplicates against a
record of the old topic.

The ids live in ``<data-dir>/cluster-topics.json`` (``{"topic": id}``), replaced as a
whole (temp file, fsync, rename, fsync dir). An id is recorded *before* the local copy
is created, so a copy without a recorded id was made before ids existed, and adopts
etcd's.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson

from storage.durable import replace_file

log = logging.getLogger("herald.cluster")

FILE_NAME = "cluster-topics.json"


class LocalTopicIds:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE_NAME
        self._ids: dict[str, int] = {}
        try:
            raw: Any = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return
        except orjson.JSONDecodeError:
            # Unreadable: every local copy adopts etcd's id (what nodes did before ids).
            log.error("%s is not JSON: topic ids start afresh", self.path)
            return
        if isinstance(raw, dict):
            self._ids = {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, int)}

    def get(self, topic: str) -> int | None:
        return self._ids.get(topic)

    async def record(self, topic: str, topic_id: int) -> None:
        if self._ids.get(topic) != topic_id:
            self._ids[topic] = topic_id
            await self._save()

    async def forget(self, topic: str) -> None:
        if self._ids.pop(topic, None) is not None:
            await self._save()

    async def _save(self) -> None:
        data = orjson.dumps(dict(sorted(self._ids.items())))
        await asyncio.to_thread(replace_file, self.path, data)
