"""The errors of the storage engine itself: a log whose bytes fail their checks, and the
errors of the operating system and SQLite that mean a resource ran out (PROTOCOL §6:
503 storage_unavailable, never 500). The errors Herald reports to a client are the
protocol's (herald/protocol/errors.py)."""

from __future__ import annotations

import errno
import sqlite3

from herald.protocol.errors import RETRY_AFTER_S, StorageUnavailable


class CorruptLog(Exception):
    """Raised inside storage when bytes on disk fail their checks; never reaches a client."""


class WrittenNotSynced(StorageUnavailable):
    """An acks=all append that was written to the log but whose fsync failed: answered
    503, yet its records are in the log (readable once synced, copied by followers), so a
    retry of their producer ids must find them (PROTOCOL §2: deduplicated, not appended
    twice) and make them durable before it answers."""

    def __init__(self, detail: str, first_offset: int, timestamp: int) -> None:
        super().__init__(detail)
        self.first_offset = first_offset
        self.timestamp = timestamp


# PROTOCOL §6: running out of a resource is 503 storage_unavailable, never 500.
_EXHAUSTED_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT})
_EXHAUSTED_SQLITE = frozenset({"SQLITE_CANTOPEN", "SQLITE_FULL"})


def resource_exhausted(exc: BaseException) -> StorageUnavailable | None:
    """The 503 for an error (or one in its cause chain) that means the process ran out
    of descriptors or the disk of space; None for anything else."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, BaseExceptionGroup):  # a task group's: the first that is
            found = (resource_exhausted(inner) for inner in seen.exceptions)
            return next((f for f in found if f is not None), None)
        if isinstance(seen, OSError) and seen.errno in _EXHAUSTED_ERRNOS:
            return StorageUnavailable(
                f"the server is out of resources ({seen.strerror}); try again",
                retry_after=RETRY_AFTER_S,
            )
        if isinstance(seen, sqlite3.Error) and (
            getattr(seen, "sqlite_errorname", None) in _EXHAUSTED_SQLITE
        ):
            return StorageUnavailable(
                "the server is out of resources (metadata store); try again",
                retry_after=RETRY_AFTER_S,
            )
        seen = seen.__cause__ or seen.__context__
    return None
