"""Herald's exception tree. Each error carries its wire code and an HTTP status hint
(as h11's ``error_status_hint``); the server turns them into RFC 9457 problem JSON
or WebSocket close codes in one place. It lives in the lowest layer so every
layer above can raise it."""

from __future__ import annotations

import errno
import sqlite3
from typing import Any, ClassVar


class HeraldError(Exception):
    """Base of every error Herald reports to a client."""

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal Server Error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra  # extra problem members, e.g. ``index`` for a bad batch


class BadRequest(HeraldError):
    code, status, title = "bad_request", 400, "Bad Request"


class ValidationError(HeraldError):
    code, status, title = "validation_error", 400, "Bad Request"


class InvalidName(HeraldError):
    code, status, title = "invalid_name", 400, "Bad Request"


class NotFound(HeraldError):
    code, status, title = "not_found", 404, "Not Found"


class TopicNotFound(NotFound):
    code = "topic_not_found"


class SubscriptionNotFound(NotFound):
    code = "subscription_not_found"


class PartitionNotFound(NotFound):
    code = "partition_not_found"


class OffsetOutOfRange(HeraldError):
    code, status, title = "offset_out_of_range", 400, "Bad Request"


class MessageTooLarge(HeraldError):
    code, status, title = "message_too_large", 413, "Content Too Large"


class PayloadTooLarge(HeraldError):
    code, status, title = "payload_too_large", 413, "Content Too Large"


class TopicConflict(HeraldError):
    code, status, title = "topic_conflict", 409, "Conflict"


class SubscriptionConflict(HeraldError):
    code, status, title = "subscription_conflict", 409, "Conflict"


class LimitExceeded(HeraldError):
    """PROTOCOL §6: one more would pass a configured cap (``--max-topics``)."""

    code, status, title = "limit_exceeded", 409, "Conflict"


class Unauthorized(HeraldError):
    code, status, title = "unauthorized", 401, "Unauthorized"


class Forbidden(HeraldError):
    code, status, title = "forbidden", 403, "Forbidden"


class RateLimited(HeraldError):
    code, status, title = "rate_limited", 429, "Too Many Requests"


class StorageUnavailable(HeraldError):
    """A write could not be made durable (disk full, I/O error, log closed)."""

    code, status, title = "storage_unavailable", 503, "Service Unavailable"


class CorruptLog(Exception):
    """Raised inside storage when bytes on disk fail their checks; never reaches a client."""


# PROTOCOL §6: running out of a resource is 503 storage_unavailable, never 500.
_EXHAUSTED_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT})
_EXHAUSTED_SQLITE = frozenset({"SQLITE_CANTOPEN", "SQLITE_FULL"})
RETRY_AFTER_S = 1  # what a 503 without a better figure asks the client to wait


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
