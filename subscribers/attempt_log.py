"""The delivery history of a push subscription: its last 1,000 webhook attempts, for
`GET /v1/subscriptions/{name}/attempts` (PROTOCOL §8 "Delivery history"; newest first).

Bounded in memory (STYLE principle 3) and kept in `<data_dir>/attempts/<name>.jsonl`, so
the history survives a restart. Attempts are appended to the file in batches, once a
second, by the dispatcher's own task through aiofiles: never a write per attempt, never
on the request path. So a kill -9 loses at most the last second of attempts; a line torn
by it is skipped on load. Once the file holds twice the bound it is rewritten with the
newest entries (temp file, fsync, rename).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiofiles
import aiofiles.os
import orjson

log = logging.getLogger(__name__)

ATTEMPT_LOG_SIZE = 1000  # PROTOCOL §8: the last 1000 per subscription
FLUSH_INTERVAL_S = 1.0  # PROTOCOL §8: after kill -9 at most the last second may be missing


@dataclass(frozen=True, slots=True)
class Attempt:
    """One webhook request. A batch (PROTOCOL §8) is one attempt: ``id`` is its first
    record's (as in its `webhook-id`), ``count`` how many records it carried and
    ``attempt`` the highest attempt among them."""

    time_ms: int  # wall clock when the request was sent
    id: str  # the record id "{partition}-{offset}"
    attempt: int
    status: int | None  # the HTTP status; None when no response came
    latency_ms: float
    error: str | None  # "timeout", "connection refused"… or "http 500"; None on success
    count: int = 1  # records in the request

    def as_dict(self) -> dict[str, Any]:
        return {
            "time": self.time_ms,
            "id": self.id,
            "count": self.count,
            "attempt": self.attempt,
            "status": self.status,
            "latency_ms": round(self.latency_ms, 3),
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        return cls(
            int(data["time"]),
            str(data["id"]),
            int(data["attempt"]),
            None if data["status"] is None else int(data["status"]),
            float(data["latency_ms"]),
            None if data["error"] is None else str(data["error"]),
            int(data.get("count", 1)),  # lines written before batches have none
        )


class AttemptLog:
    """The newest ``size`` attempts in memory; with a ``path``, also on disk."""

    def __init__(self, path: Path | None = None, size: int = ATTEMPT_LOG_SIZE) -> None:
        self.path = path
        self._size = size
        self._attempts: deque[Attempt] = deque(maxlen=size)
        self._unwritten: list[Attempt] = []
        self._lines_on_disk = 0
        self._flushing = asyncio.Lock()
        self.total = 0  # added since this log was made (not loaded)

    def add(self, attempt: Attempt) -> None:
        self._attempts.append(attempt)
        if self.path is not None:
            self._unwritten.append(attempt)
        self.total += 1

    def recent(self) -> list[Attempt]:
        """Newest first (PROTOCOL §8)."""
        return list(reversed(self._attempts))

    @property
    def last(self) -> Attempt | None:
        return self._attempts[-1] if self._attempts else None

    async def load(self) -> None:
        """Read the history kept on disk (a torn or damaged line is skipped)."""
        if self.path is None:
            return
        try:
            async with aiofiles.open(self.path, "rb") as file:
                data = await file.read()
        except FileNotFoundError:
            return
        lines = data.splitlines()
        loaded: list[Attempt] = []
        for line in lines[-self._size :]:
            try:
                loaded.append(Attempt.from_dict(orjson.loads(line)))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # the last line of a kill -9, or a damaged one
        self._attempts.extendleft(reversed(loaded[-self._size :]))
        self._lines_on_disk = len(lines)

    async def flush(self) -> None:
        """Append what was added since the last flush; rewrite the file once it holds
        twice the bound. Failures are logged: the history is best effort, delivery is not
        held up by it.

        A flush that has taken its batch finishes even when cancelled: the periodic
        flush is cancelled at shutdown, and one cut short there lost the batch it held
        (the final flush found nothing left to write: a graceful restart came back
        with an empty history, 2 runs in ~65 of the webhooks folder). Flushes run one
        at a time, so the lines keep their order."""
        if self.path is None or not self._unwritten:
            return
        await asyncio.shield(self._flush_in_turn())

    async def _flush_in_turn(self) -> None:
        async with self._flushing:
            await self._write_unwritten()

    async def _write_unwritten(self) -> None:
        assert self.path is not None
        if not self._unwritten:
            return
        batch, self._unwritten = self._unwritten, []
        data = b"".join(orjson.dumps(a.as_dict()) + b"\n" for a in batch)
        try:
            await aiofiles.os.makedirs(self.path.parent, exist_ok=True)
            async with aiofiles.open(self.path, "ab") as file:
                await file.write(data)
            self._lines_on_disk += len(batch)
            if self._lines_on_disk >= 2 * self._size:
                await self._compact()
        except OSError as exc:
            log.warning("cannot keep the attempt log %s: %s", self.path, exc)

    async def _compact(self) -> None:
        assert self.path is not None
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = b"".join(orjson.dumps(a.as_dict()) + b"\n" for a in self._attempts)
        async with aiofiles.open(tmp, "wb") as file:
            await file.write(data)
            await file.flush()
            await aiofiles.os.wrap(os.fsync)(file.fileno())
        await aiofiles.os.replace(tmp, self.path)
        self._lines_on_disk = len(self._attempts)

    async def remove(self) -> None:
        """Forget the history on disk too (the subscription was deleted); after a flush
        still writing, so that it cannot bring the file back."""
        async with self._flushing:
            self._unwritten = []
            if self.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    await aiofiles.os.remove(self.path)
