"""Strict parsing of request bodies and query strings (PROTOCOL §2).

The rules, applied the same way everywhere:
- not JSON, a wrong JSON type, a missing required field, an unknown field, a
  value outside its enumerated set, a malformed string, a non-integral number
  where an integer is expected (``true`` is not an integer either) or two forms
  where one is expected -> ``bad_request``;
- well-formed but out of range -> ``validation_error``;
- a bad topic or subscription name -> ``invalid_name``;
- an optional field given as ``null`` is the same as leaving it out, except
  ``retention_ms``/``retention_bytes`` where ``null`` means unlimited.

A subscription config (PUT) or patch (PATCH) is first converted into its model
(herald/protocol/subscriptions.py, ``from_model``), which applies the first three rules
and names the field's path; what a type cannot say is checked after.

Validation only builds values (TopicConfig, SubscriptionConfig, PublishItem);
it never touches state, so a rejected request changes nothing.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import msgspec
import orjson
from msgspec import UNSET

from delivery.config import (
    Backoff,
    Breaker,
    DeliveryMode,
    PreviousSecret,
    PushBatch,
    PushConfig,
    PushPayload,
    SubscriptionConfig,
    SubscriptionPatch,
)
from delivery.start import StartAt
from herald.protocol import actions, pull, seek, topics
from herald.protocol import subscriptions as wire
from herald.protocol.errors import BadRequest, MessageTooLarge, ValidationError
from herald.protocol.filter import check_filter
from herald.protocol.limits import (
    DEFAULT_READ_LIMIT,
    DELAY_MS,
    MAX_BATCH,
    MAX_ID_CHARS,
    MAX_PARTITIONS,
    MAX_URL_CHARS,
    MAX_VALUE_DEPTH,
    MAX_VALUE_INT,
    MIN_VALUE_INT,
    OFFSET,
    PARTITION,
    READ_LIMIT,
    REDRIVE_DEFAULT_MAX_RECORDS,
    REDRIVE_DEFAULT_RATE,
    TIMESTAMP,
    WAIT_MS,
    IntRange,
)
from herald.protocol.names import check_name
from herald.protocol.patterns import SECRET_BYTES, SECRET_PREFIX
from storage.config import TopicConfig
from storage.record import (
    Acks,
    NewRecord,
    ValueKind,
    message_size,
    new_record,
)
from storage.topic import PublishItem

INT_TEXT_RE = re.compile(r"-?[0-9]+")  # an integer in a path or query

T = TypeVar("T")


_MISSING: Any = object()


# ---------------------------------------------------------------- primitives


def _as_int(value: Any, field: str) -> int:
    """A JSON integer. ``2.0`` is integral and accepted; ``2.5`` and ``true`` are not."""
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer():
        return int(value)
    if type(value) is float:
        raise BadRequest(f"{field} must be an integer, not {value!r}")
    raise BadRequest(f"{field} must be an integer")


def _int_in(value: Any, field: str, allowed: IntRange) -> int:
    number = _as_int(value, field)
    if not allowed.low <= number <= allowed.high:
        raise ValidationError(f"{field} must be in {allowed.low}..{allowed.high}, not {number}")
    return number


def _as_str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{field} must be a string")
    return value


def _as_object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{field} must be a JSON object")
    return value


def _check_fields(obj: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = obj.keys() - allowed
    if unknown:
        raise BadRequest(f"unknown field(s) in {where}: {', '.join(sorted(unknown))}")


def b64decode_strict(text: str, field: str) -> bytes:
    """Canonical base64 (RFC 4648 §4, padded, zero pad bits): what base64_pattern says.
    The standard library alone also takes a stray "=" after a full quad."""
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise BadRequest(f"{field} is not valid base64") from None
    if base64.b64encode(data) != text.encode("ascii"):
        raise BadRequest(f"{field} is not canonical base64 (padding or pad bits)")
    return data


def query_int(raw: str | None, field: str, allowed: IntRange, default: int | None) -> int | None:
    """An integer query parameter: ``abc``/``1.5`` -> bad_request, out of range -> validation_error."""
    if raw is None:
        return default
    if INT_TEXT_RE.fullmatch(raw) is None:
        raise BadRequest(f"query parameter {field} must be an integer, not {raw!r}")
    number = int_text(raw)
    if not allowed.low <= number <= allowed.high:
        raise ValidationError(
            f"query parameter {field} must be in {allowed.low}..{allowed.high}, not {_shown(raw)}"
        )
    return number


def path_int(raw: str, field: str) -> int:
    if INT_TEXT_RE.fullmatch(raw) is None:
        raise BadRequest(f"{field} must be an integer, not {_shown(raw)!r}")
    return int_text(raw)


def int_text(raw: str) -> int:
    """The integer of ``-?[0-9]+`` text. Beyond 25 digits it is outside 64 bits whatever
    it is: ±2**64 says so (Python refuses to convert over 4300 digits, a 500 otherwise)."""
    if len(raw) <= 25:
        return int(raw)
    return -(2**64) if raw.startswith("-") else 2**64


def _shown(raw: str) -> str:
    """Client text in a problem's detail, cut to a readable length."""
    return raw if len(raw) <= 40 else f"{raw[:20]}…({len(raw)} characters)"


# ---------------------------------------------------------------- topics


def parse_topic_config(body: Any) -> tuple[TopicConfig, frozenset[str]]:
    """A TopicConfig and the set of fields the request gave (the ones a 200 compares).

    No body is ``{}`` (server/http.py); a JSON ``null`` body is not an object."""
    request = from_model(body, topics.TopicConfig, "the topic config")
    values: dict[str, Any] = {}
    for name in ("partitions", "dedup_window_ms", "replication_factor", "min_insync_replicas"):
        if (value := getattr(request, name)) is not None:
            values[name] = value
    # PROTOCOL §2: for these two, an explicit null means unlimited, not "default".
    for name in ("retention_ms", "retention_bytes"):
        if (value := getattr(request, name)) is not UNSET:
            values[name] = value
    return TopicConfig(**values), frozenset(values)


def check_single_node_replication(config: TopicConfig) -> None:
    """PROTOCOL §7: a single node accepts only 1 for both (it has one copy to keep)."""
    for name in ("replication_factor", "min_insync_replicas"):
        if getattr(config, name) != 1:
            raise ValidationError(f"{name} must be 1 on a single node (it keeps one copy)")


def check_replication(config: TopicConfig, live_nodes: int) -> None:
    """PROTOCOL §7: 1 <= replication_factor <= live nodes; min_insync <= replication_factor."""
    if config.replication_factor > live_nodes:
        raise ValidationError(
            f"replication_factor {config.replication_factor} is more than the "
            f"{live_nodes} live node(s)"
        )
    if config.min_insync_replicas > config.replication_factor:
        raise ValidationError(
            f"min_insync_replicas {config.min_insync_replicas} is more than "
            f"replication_factor {config.replication_factor}"
        )


def topic_config_matches(existing: TopicConfig, wanted: TopicConfig, given: frozenset[str]) -> bool:
    return all(getattr(existing, f) == getattr(wanted, f) for f in given)


# ---------------------------------------------------------------- publish


@dataclass(frozen=True, slots=True)
class PublishBatch:
    items: list[PublishItem]
    max_partition: int  # highest explicit partition asked for, -1 if none
    max_partition_index: int  # position of the first message asking for it
    total_bytes: int


_MESSAGE_FIELDS = frozenset({"value", "value_b64", "key", "headers", "partition", "id", "delay_ms"})
_EMPTY_HEADERS: Mapping[str, str] = {}


def parse_acks(raw: str | None) -> Acks:
    if raw is None:
        return Acks.ALL
    try:
        return Acks(raw)
    except ValueError:
        raise BadRequest(f"acks must be 0, 1 or all, not {raw!r}") from None


class InexactIntegers(Exception):
    """A `value` may hold an integer orjson read as a float (one beyond 64 bits): the body
    must be parsed again exactly (server/http.py parse_json_exact) and validated with
    ``exact=True``. Never reaches a client."""


def parse_publish(
    body: Any,
    max_message_bytes: int,
    item_type: Any,
    partitions: int = MAX_PARTITIONS,
    *,
    exact: bool = False,
) -> PublishBatch:
    """Validates a publish batch in one pass; the first bad message's position is ``index``.

    ``item_type`` is storage's PublishItem (passed in to keep this module free of
    the storage engine's imports); ``partitions`` is the topic's partition count
    (what it will have once auto-created), so an explicit partition past it is
    reported at its own index like any other bad message (PROTOCOL §2: a
    well-formed number out of range is validation_error). ``exact``: the body was
    parsed with every integer exact; otherwise a value that may have lost an
    integer's digits raises InexactIntegers.
    """
    obj = _as_object(body, "the request body")
    _check_fields(obj, frozenset({"messages"}), "the publish request")
    messages = obj.get("messages", _MISSING)
    if messages is _MISSING:
        raise BadRequest("messages is required")
    if not isinstance(messages, list):
        raise BadRequest("messages must be an array")
    if not 1 <= len(messages) <= MAX_BATCH:
        raise ValidationError(f"a batch holds 1..{MAX_BATCH} messages, not {len(messages)}")
    items: list[Any] = []
    max_partition, max_partition_index, total = -1, -1, 0
    for index, message in enumerate(messages):
        try:
            record, partition = _parse_message(message, max_message_bytes, exact)
            if partition is not None and partition >= partitions:
                raise ValidationError(
                    f"partition {partition} does not exist (the topic has {partitions})"
                )
        except (BadRequest, ValidationError, MessageTooLarge) as exc:
            exc.extra["index"] = index
            raise
        if partition is not None and partition > max_partition:
            max_partition, max_partition_index = partition, index
        total += len(record.value)
        items.append(item_type(record, partition))
    return PublishBatch(items, max_partition, max_partition_index, total)


def _own_buffer(encoded: bytes) -> bytes:
    """A copy of exactly its length. orjson's result keeps the whole buffer it was built
    in (4 KiB at least, 8 KiB for a 1 KiB value; measured by RSS, orjson 3.13), and a
    record's value lives on in the partition's tail cache, whose bound counts value
    lengths: without the copy 32 MB of small values held about 0.8 GB. 0.2 us a value."""
    return bytes(memoryview(encoded))


# orjson writes a float of magnitude >= 1e16 as `<digits>e+NN`; an integer it read as a
# float (one beyond 64 bits) is >= 2**63, so `e+18` or more. Only a value showing that
# pattern can have lost digits (a plain large float shows it too: a rare extra parse).
_LARGE_FLOAT = re.compile(rb"[0-9]e\+(?:1[89]|[2-9][0-9]|[0-9]{3})")


_MAY_HOLD_FLOATS = frozenset({float, list, dict})


def encode_value(value: Any, exact: bool) -> bytes:
    """The compact JSON text a record stores of `value` (PROTOCOL §1).

    What orjson cannot write exactly is refused with validation_error instead of being
    changed (docs/protocol.md "Requests"): arrays and objects nested deeper than
    MAX_VALUE_DEPTH, and integers outside MIN_VALUE_INT..MAX_VALUE_INT.
    """
    try:
        encoded = orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        if "Recursion" in str(exc):
            raise ValidationError(
                f"value nests arrays and objects deeper than {MAX_VALUE_DEPTH} levels"
            ) from None
        raise ValidationError(
            f"value holds an integer outside {MIN_VALUE_INT}..{MAX_VALUE_INT}"
        ) from None
    # Only a float, or an array or object holding one, can be a read-as-float integer: a
    # string value (the common 1 KiB record) skips the scan, which costs as much as
    # encoding it (1.9 us a KiB on the 2-core VM).
    if (
        not exact
        and type(value) in _MAY_HOLD_FLOATS
        and b"e+" in encoded
        and _LARGE_FLOAT.search(encoded) is not None
    ):
        raise InexactIntegers()
    return _own_buffer(encoded)


def _parse_message(  # noqa: C901, PLR0912 (the hand-tuned publish ladder: one pass per field, the hot path)
    message: Any, max_message_bytes: int, exact: bool
) -> tuple[NewRecord, int | None]:
    if type(message) is dict and len(message) == 1 and "value" in message:
        # The common shape, `{"value": ...}`: no key, headers, partition or id to check.
        value = encode_value(message["value"], exact)
        if len(value) > max_message_bytes:
            raise MessageTooLarge(
                f"a message of {len(value)} bytes is over max_message_bytes ({max_message_bytes})"
            )
        return new_record(value, ValueKind.JSON, None, _EMPTY_HEADERS, None, 0), None
    if not isinstance(message, dict):
        raise BadRequest("a message must be a JSON object")
    if not message.keys() <= _MESSAGE_FIELDS:
        _check_fields(message, _MESSAGE_FIELDS, "a message")
    has_value = "value" in message  # `"value": null` is a value: the JSON null
    b64 = message.get("value_b64")
    if has_value == (b64 is not None):
        raise BadRequest("a message needs exactly one of value and value_b64")
    if has_value:
        value = encode_value(message["value"], exact)
        kind = ValueKind.JSON
    else:
        value = b64decode_strict(_as_str(b64, "value_b64"), "value_b64")
        kind = ValueKind.BYTES
    key = message.get("key")
    if key is not None and not isinstance(key, str):
        raise BadRequest("key must be a string or null")
    headers = message.get("headers")
    if headers is None:
        headers = _EMPTY_HEADERS
    else:
        if not isinstance(headers, dict):
            raise BadRequest("headers must be an object of string to string")
        for header in headers.values():
            if not isinstance(header, str):
                raise BadRequest("headers must be an object of string to string")
    partition = message.get("partition")
    if partition is not None:
        partition = _int_in(partition, "partition", PARTITION)
    producer_id = message.get("id")
    if producer_id is not None:
        producer_id = _as_str(producer_id, "id")
        if not 1 <= len(producer_id) <= MAX_ID_CHARS:
            raise ValidationError(f"id must be 1..{MAX_ID_CHARS} characters")
    delay_ms = message.get("delay_ms")
    delay_ms = 0 if delay_ms is None else _int_in(delay_ms, "delay_ms", DELAY_MS)
    size = message_size(value, key, headers)
    if size > max_message_bytes:
        raise MessageTooLarge(
            f"a message of {size} bytes is over max_message_bytes ({max_message_bytes})"
        )
    return new_record(value, kind, key, headers, producer_id, delay_ms), partition


# ---------------------------------------------------------------- read


@dataclass(frozen=True, slots=True)
class ReadQuery:
    offset: int | None
    timestamp: int | None
    limit: int
    wait_ms: int


def parse_read_query(params: Mapping[str, str]) -> ReadQuery:
    offset_raw, timestamp_raw = params.get("offset"), params.get("timestamp")
    if offset_raw is not None and timestamp_raw is not None:
        raise BadRequest("give offset or timestamp, not both")
    offset = query_int(offset_raw, "offset", OFFSET, None)
    timestamp = query_int(timestamp_raw, "timestamp", TIMESTAMP, None)
    limit = query_int(params.get("limit"), "limit", READ_LIMIT, DEFAULT_READ_LIMIT)
    wait_ms = query_int(params.get("wait_ms"), "wait_ms", WAIT_MS, 0)
    assert limit is not None and wait_ms is not None
    return ReadQuery(offset, timestamp, limit, wait_ms)


# ---------------------------------------------------------------- subscriptions

_MODEL_DEPTH = 8  # deeper than any model nests; deeper input is a type error anyway


def _integral(value: Any, depth: int = 0) -> Any:
    """``value`` with each integral float an int (``2.0`` is an integer, PROTOCOL §2), to
    the depth a model nests; msgspec's strict mode takes ``2.0`` for a float only."""
    if type(value) is float and value.is_integer():
        return int(value)
    if depth >= _MODEL_DEPTH:
        return value
    if type(value) is dict:
        return {k: _integral(v, depth + 1) for k, v in value.items()}
    if type(value) is list:
        return [_integral(v, depth + 1) for v in value]
    return value


# msgspec says "Expected `int` >= 100", "Expected `array` of length <= 5": a well-formed
# value out of range. Anything else (a wrong type, an unknown or missing field, a value
# outside its enumerated set) is malformed.
_OUT_OF_RANGE = re.compile(r"^Expected `[^`]*` (?:of length )?[<>]=")


def from_model(body: Any, model: type[T], what: str) -> T:
    """``body`` as ``model``, or PROTOCOL §2's problem with the field's path:
    ``validation_error`` for a value out of range, ``bad_request`` for anything else."""
    try:
        return msgspec.convert(_integral(body), model, strict=True)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `$")
        path = where.rstrip("`").lstrip(".")
        detail = f"{path}: {message}" if path else f"{what}: {message}"
        if _OUT_OF_RANGE.match(message):
            raise ValidationError(detail) from None
        raise BadRequest(detail) from None


def parse_subscription_config(body: Any) -> tuple[SubscriptionConfig, frozenset[str]]:
    """A full SubscriptionConfig (defaults filled) and the fields the request gave."""
    request = from_model(body, wire.SubscriptionConfig, "the subscription config")
    values: dict[str, Any] = {"topic": check_name(request.topic, "topic")}
    if request.start is not None:
        values["start"] = _start_at(request.start)
    if request.delivery is not None:
        values["delivery"] = DeliveryMode(request.delivery)
    for name in ("ack_deadline_ms", "max_in_flight", "max_deliveries", "ordered_by_key"):
        if (value := getattr(request, name)) is not None:
            values[name] = value
    if request.retry_backoff is not None:
        values["retry_backoff"] = _backoff(request.retry_backoff)
    if request.dead_letter_topic is not None:
        values["dead_letter_topic"] = check_name(request.dead_letter_topic, "dead_letter_topic")
    if request.push is not None:
        values["push"] = _push(request.push)
    if request.filter is not None:
        values["filter"] = check_filter(request.filter)
    return SubscriptionConfig(**values), frozenset(values)


def parse_subscription_patch(body: Any) -> SubscriptionPatch:
    """PROTOCOL §8 `PATCH /v1/subscriptions/{name}`: a JSON Merge Patch of the fields
    PATCHABLE_FIELDS (null: back to the default); FIXED_FIELDS only with their current
    value (checked by SubscriptionPatch.apply: 409). Every value is checked here, so a
    refused patch changes nothing."""
    request = from_model(body, wire.SubscriptionPatch, "the subscription patch")
    default = SubscriptionConfig(topic="-")
    fixed: dict[str, Any] = {}
    if request.topic is not None:
        fixed["topic"] = check_name(request.topic, "topic")
    if request.start is not None:
        fixed["start"] = _start_at(request.start)
    if request.delivery is not None:
        fixed["delivery"] = DeliveryMode(request.delivery)
    if request.ordered_by_key is not None:
        fixed["ordered_by_key"] = request.ordered_by_key
    changes: dict[str, Any] = {}
    for name in ("ack_deadline_ms", "max_in_flight", "max_deliveries"):
        if (value := getattr(request, name)) is not UNSET:
            changes[name] = getattr(default, name) if value is None else value
    backoff: dict[str, int | None] | None = None
    if request.retry_backoff is None:
        changes["retry_backoff"] = Backoff()
    elif request.retry_backoff is not UNSET:
        given = request.retry_backoff
        backoff = {m: v for m in ("min_ms", "max_ms") if (v := getattr(given, m)) is not UNSET}
    if request.dead_letter_topic is not UNSET:
        topic = request.dead_letter_topic
        changes["dead_letter_topic"] = (
            None if topic is None else check_name(topic, "dead_letter_topic")
        )
    if request.filter is not UNSET:
        changes["filter"] = None if request.filter is None else check_filter(request.filter)
    keeps_secret = False
    if request.push is not UNSET:
        push = request.push
        keeps_secret = push is not None and push.secret is None
        changes["push"] = None if push is None else _push(push)
    return SubscriptionPatch(fixed, changes, backoff, keeps_secret)


def _start_at(start: wire.Start) -> StartAt:
    if isinstance(start, wire.StartTimestamp):
        return StartAt.at_timestamp(start.timestamp)
    return StartAt.earliest() if start == "earliest" else StartAt.latest()


def _backoff(given: wire.RetryBackoff) -> Backoff:
    default = Backoff()
    min_ms = default.min_ms if given.min_ms is None else given.min_ms
    max_ms = default.max_ms if given.max_ms is None else given.max_ms
    if min_ms > max_ms:
        raise ValidationError("retry_backoff.min_ms must not exceed retry_backoff.max_ms")
    return Backoff(min_ms, max_ms)


def _push(given: wire.PushConfig | wire.PushConfigPatch) -> PushConfig:
    """A push config; a PATCH's without a secret leaves it empty for
    SubscriptionPatch.apply to fill with the current one."""
    values: dict[str, Any] = {
        "url": _parse_push_url(given.url),
        "secret": "" if given.secret is None else _parse_secret(given.secret, "push.secret"),
    }
    if given.previous_secrets is not None:
        values["previous_secrets"] = tuple(
            PreviousSecret(
                _parse_secret(p.secret, f"push.previous_secrets[{i}].secret"), p.expires_at
            )
            for i, p in enumerate(given.previous_secrets)
        )
    for name in ("max_in_flight", "timeout_ms"):
        if (value := getattr(given, name)) is not None:
            values[name] = value
    if given.breaker is not None:
        values["breaker"] = _breaker(given.breaker)
    if given.batch is not None:
        default = PushBatch()
        values["batch"] = PushBatch(
            default.max_records if given.batch.max_records is None else given.batch.max_records,
            default.max_wait_ms if given.batch.max_wait_ms is None else given.batch.max_wait_ms,
        )
    if given.payload is not None:
        values["payload"] = PushPayload(given.payload)
    push = PushConfig(**values)
    if push.payload is PushPayload.RAW and push.batch.batched:
        # PROTOCOL §8: a raw body is one record's value.
        raise ValidationError('push.payload "raw" needs push.batch.max_records 1')
    return push


def _breaker(given: wire.Breaker) -> Breaker:
    default = Breaker()
    breaker = Breaker(
        default.failures if given.failures is None else given.failures,
        default.open_ms if given.open_ms is None else given.open_ms,
        default.max_open_ms if given.max_open_ms is None else given.max_open_ms,
    )
    if breaker.open_ms > breaker.max_open_ms:
        raise ValidationError("push.breaker.open_ms must not exceed push.breaker.max_open_ms")
    return breaker


def _parse_push_url(value: Any) -> str:
    """An absolute http(s) URL the webhook client can POST to: the very parser that
    sends (httpx) reads it here, so a stored URL never fails at delivery time."""
    url = _as_str(value, "push.url")
    if len(url) > MAX_URL_CHARS:
        raise ValidationError(f"push.url is over {MAX_URL_CHARS} characters")
    if any(c.isspace() for c in url):
        raise BadRequest("push.url must not contain whitespace")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        raise BadRequest("push.url is not a valid URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise BadRequest("push.url must be an absolute http:// or https:// URL")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ValidationError(f"push.url port must be in 1..65535, not {parsed.port}")
    return url


def _parse_secret(value: Any, field: str) -> str:
    secret = _as_str(value, field)
    if not secret.startswith(SECRET_PREFIX):
        raise BadRequest(f'{field} must be "{SECRET_PREFIX}" followed by base64')
    low, high = SECRET_BYTES
    if not low <= len(b64decode_strict(secret[len(SECRET_PREFIX) :], field)) <= high:
        raise ValidationError(f"{field} must decode to {low}..{high} bytes of key")
    return secret


@dataclass(frozen=True, slots=True)
class SecretRotation:
    secret: str
    previous_ttl_ms: int


def parse_secret_rotation(body: Any) -> SecretRotation:
    """`POST /v1/subscriptions/{name}/push/rotate-secret`:
    `{"secret": "whsec_…", "previous_ttl_ms": PREVIOUS_TTL_MS}`."""
    request = from_model(body, actions.SecretRotation, "the rotation request")
    ttl = request.previous_ttl_ms
    return SecretRotation(
        _parse_secret(request.secret, "secret"),
        actions.DEFAULT_PREVIOUS_TTL_MS if ttl is None else ttl,
    )


# ---------------------------------------------------------------- redrive


@dataclass(frozen=True, slots=True)
class RedriveRequest:
    rate: int = REDRIVE_DEFAULT_RATE
    max_records: int = REDRIVE_DEFAULT_MAX_RECORDS
    reason: str | None = None  # only the dead letters whose last error is this one


def parse_redrive(body: Any) -> RedriveRequest:
    """`POST /v1/subscriptions/{name}/redrive` (docs/protocol.md): an optional body
    `{"rate": 1..10000, "max_records": 1..1000000, "reason": "…"}`."""
    request = from_model(body, actions.RedriveRequest, "the redrive request")
    return RedriveRequest(
        REDRIVE_DEFAULT_RATE if request.rate is None else request.rate,
        REDRIVE_DEFAULT_MAX_RECORDS if request.max_records is None else request.max_records,
        request.reason,
    )


# ---------------------------------------------------------------- pull (PROTOCOL §8)


@dataclass(frozen=True, slots=True)
class PullRequest:
    max_messages: int = pull.DEFAULT_PULL_MAX_MESSAGES
    wait_ms: int = 0


@dataclass(frozen=True, slots=True)
class NackRequest:
    ids: tuple[str, ...]
    delay_ms: int | None = None
    reason: str | None = None


def parse_pull(body: Any) -> PullRequest:
    """`POST /v1/subscriptions/{name}/pull` `{"max_messages": 1..1000, "wait_ms": 0..30000}`;
    no body is all defaults."""
    request = from_model(body, pull.PullRequest, "the pull request")
    return PullRequest(
        pull.DEFAULT_PULL_MAX_MESSAGES if request.max_messages is None else request.max_messages,
        0 if request.wait_ms is None else request.wait_ms,
    )


def parse_ack(body: Any) -> tuple[str, ...]:
    """`POST /v1/subscriptions/{name}/ack` `{"ids": [...]}`."""
    return tuple(from_model(body, pull.AckRequest, "the ack request").ids)


def parse_nack(body: Any) -> NackRequest:
    """`POST /v1/subscriptions/{name}/nack` `{"ids": [...], "delay_ms"?, "reason"?}`."""
    request = from_model(body, pull.NackRequest, "the nack request")
    return NackRequest(tuple(request.ids), request.delay_ms, request.reason)


# ---------------------------------------------------------------- seek


def parse_seek(body: Any) -> StartAt:
    """PROTOCOL §2 seek: exactly one of its forms. Partition numbers are checked
    against the topic by the engine (StartAt.check_partitions)."""
    request = from_model(body, seek.Seek, "the seek request")
    if len(request.forms()) != 1:
        raise BadRequest('give exactly one of "to", "timestamp" and "offsets"')
    if request.to is not None:
        return _start_at(request.to)
    if request.timestamp is not None:
        return StartAt.at_timestamp(request.timestamp)
    assert request.offsets is not None
    return StartAt.at_offsets({int_text(key): offset for key, offset in request.offsets.items()})
