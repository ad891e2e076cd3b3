"""The errors of PROTOCOL §2, shared by the server and the SDK. Each carries its problem
code, its HTTP status (as h11's ``error_status_hint``) and the WebSocket close code (§3)
a consumer is refused with; the server turns them into RFC 9457 problem JSON or a close
in one place (server/errors.py), and every layer of the server can raise them."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import UNSET, Meta, UnsetType

from herald.protocol.close_codes import CloseCode

RETRY_AFTER_S = 1  # what a 503 without a better figure asks the client to wait
MAX_CLOSE_REASON_BYTES = 123  # RFC 6455 §5.5: what a close frame's reason holds


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """RFC 9457 problem details: what a client gets of a HeraldError."""

    status: int
    title: str
    detail: str
    code: str
    index: (
        Annotated[int, Meta(description="position of the first bad message of a batch")] | UnsetType
    ) = UNSET


class OutOfRange(ValueError):
    """A model's own check (its ``__post_init__``) found a well-formed value out of range,
    as a relation between two fields. msgspec keeps it as the cause of the ValidationError
    it raises, with the field's path; the server answers it with validation_error (PROTOCOL
    §2). Any other ValueError a model raises means malformed: bad_request. Either names
    its field first ("url must ..."): the server prefixes the path of the model."""


class HeraldError(Exception):
    """Base of every error Herald reports to a client."""

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal Server Error"
    close_code: ClassVar[int] = CloseCode.INTERNAL  # what a WebSocket is closed with

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra  # extra problem members, e.g. ``index`` for a bad batch

    def close_frame(self, reason: str | None = None) -> tuple[int, str]:
        """What a WebSocket is closed with for this error (PROTOCOL §3): its close code,
        and ``reason`` (else the detail) cut to what a close frame holds."""
        text = self.detail if reason is None else reason
        return self.close_code, text.encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")


class BadRequest(HeraldError):
    code, status, title = "bad_request", 400, "Bad Request"
    close_code = CloseCode.BAD_QUERY


class ValidationError(HeraldError):
    code, status, title = "validation_error", 400, "Bad Request"
    close_code = CloseCode.BAD_QUERY


class InvalidName(HeraldError):
    code, status, title = "invalid_name", 400, "Bad Request"
    close_code = CloseCode.BAD_QUERY


class NotFound(HeraldError):
    code, status, title = "not_found", 404, "Not Found"
    close_code = CloseCode.NOT_FOUND


class TopicNotFound(NotFound):
    code = "topic_not_found"


class SubscriptionNotFound(NotFound):
    code = "subscription_not_found"


class PartitionNotFound(NotFound):
    code = "partition_not_found"


class OffsetOutOfRange(HeraldError):
    code, status, title = "offset_out_of_range", 400, "Bad Request"
    close_code = CloseCode.BAD_QUERY


class PushSubscription(HeraldError):
    """A WebSocket consumer of a push subscription: its records are its endpoint's
    (PROTOCOL §4); only ever a close (4409)."""

    code, status, title = "push_subscription", 409, "Conflict"
    close_code = CloseCode.PUSH_SUBSCRIPTION


class NodeCannotServe(HeraldError):
    """This node cannot serve the request now, another node can (PROTOCOL §7: cut off
    from etcd, or holding the copy of a topic deleted and created again since); to a
    WebSocket, 1012: reconnect."""

    code, status, title = "cluster_unavailable", 503, "Service Unavailable"
    close_code = CloseCode.SERVICE_RESTART


class MessageTooLarge(HeraldError):
    code, status, title = "message_too_large", 413, "Content Too Large"


class PayloadTooLarge(HeraldError):
    code, status, title = "payload_too_large", 413, "Content Too Large"


class TopicConflict(HeraldError):
    code, status, title = "topic_conflict", 409, "Conflict"


class SubscriptionConflict(HeraldError):
    code, status, title = "subscription_conflict", 409, "Conflict"


class RedriveConflict(HeraldError):
    """No dead_letter_topic to redrive, or a redrive of it is already running."""

    code, status, title = "redrive_conflict", 409, "Conflict"


class LimitExceeded(HeraldError):
    """PROTOCOL §6: one more would pass a configured cap (``--max-topics``)."""

    code, status, title = "limit_exceeded", 409, "Conflict"


class RequestTimeout(HeraldError):
    """The request body stalled (docs/protocol.md: ``request_timeout``)."""

    code, status, title = "request_timeout", 408, "Request Timeout"


class Unauthorized(HeraldError):
    code, status, title = "unauthorized", 401, "Unauthorized"
    close_code = CloseCode.UNAUTHORIZED


class Forbidden(HeraldError):
    code, status, title = "forbidden", 403, "Forbidden"
    close_code = CloseCode.FORBIDDEN


class RateLimited(HeraldError):
    code, status, title = "rate_limited", 429, "Too Many Requests"
    close_code = CloseCode.TRY_AGAIN_LATER


class StorageUnavailable(HeraldError):
    """A write could not be made durable (disk full, I/O error, log closed)."""

    code, status, title = "storage_unavailable", 503, "Service Unavailable"
    close_code = CloseCode.TRY_AGAIN_LATER
