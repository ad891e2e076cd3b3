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

Each body is converted into its model (herald/protocol/, ``from_model``; a publish body
is decoded from bytes, ``decode_publish``), which applies the first two rules with the
field's path, range and relations between fields included; names, the filter grammar
and what depends on other records (a publish's size, its partitions) are checked after.

Validation only builds values (TopicConfig, SubscriptionConfig, PublishItem);
it never touches state, so a rejected request changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Any, TypeVar

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
from herald.protocol import actions, publish, pull, seek, topics
from herald.protocol import subscriptions as wire
from herald.protocol.convert import from_model, model_error
from herald.protocol.errors import (
    BadRequest,
    HeraldError,
    MessageTooLarge,
    ValidationError,
)
from herald.protocol.filter import check_filter
from herald.protocol.limits import (
    DEFAULT_READ_LIMIT,
    MAX_PARTITIONS,
    MAX_VALUE_DEPTH,
    MAX_VALUE_INT,
    MIN_VALUE_INT,
    OFFSET,
    READ_LIMIT,
    REDRIVE_DEFAULT_MAX_RECORDS,
    REDRIVE_DEFAULT_RATE,
    TIMESTAMP,
    WAIT_MS,
    IntRange,
)
from herald.protocol.names import check_name
from storage.config import TopicConfig
from storage.record import (
    Acks,
    NewRecord,
    ValueKind,
    message_size,
    new_record,
)
from storage.topic import PublishItem

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

INT_TEXT_RE = re.compile(r"-?[0-9]+")  # an integer in a path or query

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")


# ---------------------------------------------------------------- primitives


def b64decode_strict(text: str, field: str) -> bytes:
    """Canonical base64 (RFC 4648 §4, padded, zero pad bits): what base64_pattern says.

    msgspec decodes it (in C, a third of the CPU of ``base64.b64decode(validate=True)``
    with the re-encoding it needs to find nonzero pad bits: 2.7 against 8.5 µs a KiB), and
    refuses what is not alphabet or padding; a quote or a backslash, which would be JSON
    syntax to it, is refused before. Pad bits are zero when the last character before
    "=" ("==") is one whose low 2 (4) bits are.
    """
    if '"' in text or "\\" in text:
        raise BadRequest(f"{field} is not valid base64")
    try:
        data = _BASE64.decode(b'"%b"' % text.encode("ascii"))
    except (msgspec.DecodeError, UnicodeEncodeError):
        raise BadRequest(f"{field} is not valid base64") from None
    if text.endswith("=="):
        canonical = text[-3] in _BEFORE_TWO_PADS
    elif text.endswith("="):
        canonical = text[-2] in _BEFORE_ONE_PAD
    else:
        canonical = True
    if not canonical:
        raise BadRequest(f"{field} is not canonical base64 (padding or pad bits)")
    return data


_BASE64 = msgspec.json.Decoder(bytes)
# The alphabet's characters (index i) with zero low bits: i % 4 == 0, i % 16 == 0.
_BEFORE_ONE_PAD = frozenset("AEIMQUYcgkosw048")
_BEFORE_TWO_PADS = frozenset("AQgw")


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


_EMPTY_HEADERS: Mapping[str, str] = {}
_MESSAGE_PATH = re.compile(r"messages\[([0-9]+)\]")


_ACKS = {acks.value: acks for acks in Acks}  # a dict lookup: Acks(raw) costs ~5 µs


def parse_acks(raw: str | None) -> Acks:
    if raw is None:
        return Acks.ALL
    acks = _ACKS.get(raw)
    if acks is None:
        raise BadRequest(f"acks must be 0, 1 or all, not {raw!r}")
    return acks


def decode_publish(raw: bytes) -> publish.PublishRequest | None:
    """The body as its model (herald/protocol/publish.py), in one strict pass from bytes
    with every integer exact: the common case, 7-10% less CPU than parsing to Python
    objects first (bench/publish_parse.py). None when it is not: not JSON, a malformed
    message, or an integral float where an integer goes (``"partition": 1.0`` is 1,
    PROTOCOL §2); parse_publish then reads the parsed JSON for the answer."""
    try:
        return msgspec.json.decode(raw, type=publish.PublishRequest)
    except (msgspec.MsgspecError, ValueError, RecursionError):  # UnicodeDecodeError too
        return None


def decode_packed_publish(raw: bytes) -> publish.PackedPublishRequest | Any:
    """A msgpack body (docs/protocol.md "MessagePack") as its model, in one pass; or, when
    a message is malformed, as the msgpack values it holds, for parse_publish to find the
    first bad one. Not one msgpack value (trailing bytes included): bad_request."""
    try:
        return _PACKED_PUBLISH(raw)
    except msgspec.ValidationError:
        pass
    except msgspec.DecodeError:
        raise BadRequest("the request body is not one msgpack value") from None
    except RecursionError:
        raise BadRequest(_TOO_DEEP) from None
    try:
        return _PACKED(raw)
    except msgspec.DecodeError:  # pragma: no cover - decoded above
        raise BadRequest("the request body is not one msgpack value") from None
    except RecursionError:
        raise BadRequest(_TOO_DEEP) from None


_TOO_DEEP = "the request body nests arrays and maps deeper than a publish body can"


_PACKED_PUBLISH = msgspec.msgpack.Decoder(publish.PackedPublishRequest).decode
_PACKED = msgspec.msgpack.Decoder().decode


def parse_publish(
    body: publish.PublishRequest | publish.PackedPublishRequest | Any,
    max_message_bytes: int,
    item_type: Any,
    partitions: int = MAX_PARTITIONS,
    packed: bool = False,
) -> PublishBatch:
    """A publish batch, the decoded model or the parsed JSON body; the first bad message's
    position is the problem's ``index`` (PROTOCOL §2).

    ``item_type`` is storage's PublishItem (passed in to keep this module free of
    the storage engine's imports); ``partitions`` is the topic's partition count
    (what it will have once auto-created), so an explicit partition past it is
    reported at its own index like any other bad message (PROTOCOL §2: a
    well-formed number out of range is validation_error). ``packed``: the body was
    msgpack (decode_packed_publish).
    """
    messages: Sequence[publish.Message | publish.PackedMessage]
    if isinstance(body, publish.PublishRequest | publish.PackedPublishRequest):
        messages, malformed = body.messages, None
    else:
        messages, malformed = _messages(body, packed)
    items: list[Any] = []
    max_partition, max_partition_index, total = -1, -1, 0
    for index, message in enumerate(messages):
        try:
            record = _record(message, max_message_bytes)
            if message.partition is not None and message.partition >= partitions:
                raise ValidationError(
                    f"partition {message.partition} does not exist (the topic has {partitions})"
                )
        except (BadRequest, ValidationError, MessageTooLarge) as exc:
            exc.extra["index"] = index
            raise
        if message.partition is not None and message.partition > max_partition:
            max_partition, max_partition_index = message.partition, index
        total += len(record.value)
        items.append(item_type(record, message.partition))
    if malformed is not None:
        raise malformed
    return PublishBatch(items, max_partition, max_partition_index, total)


def _messages(
    body: Any, packed: bool = False
) -> tuple[Sequence[publish.Message | publish.PackedMessage], HeraldError | None]:
    """A parsed body's messages up to its first malformed one, and that one's problem (the
    ones before it may still hold the first bad message, for what a type cannot say).
    ``packed``: the body was msgpack, whose integers are integers already."""
    if not packed and type(body) is dict and type(body.get("messages")) is list:
        body = {**body, "messages": [_integral_fields(m) for m in body["messages"]]}
    request = publish.PackedPublishRequest if packed else publish.PublishRequest
    try:
        decoded = msgspec.convert(body, request, strict=True)
        return decoded.messages, None  # type: ignore[attr-defined]
    except msgspec.ValidationError as exc:
        error = model_error(exc, "the publish request")
    found = _MESSAGE_PATH.match(error.detail)
    if found is None:
        raise error  # the request itself, not one of its messages
    index = int(found[1])
    error.extra["index"] = index
    before = body["messages"][:index]
    if packed:
        return msgspec.convert(before, list[publish.PackedMessage], strict=True), error
    return msgspec.convert(before, list[publish.Message], strict=True), error


def _integral_fields(message: Any) -> Any:
    """PROTOCOL §2: an integral float is the integer it is, in a message's own integer
    fields (never inside its value, which is stored as it came)."""
    if type(message) is not dict:
        return message
    return {
        k: int(v) if type(v) is float and k != "value" and v.is_integer() else v
        for k, v in message.items()
    }


def _record(message: publish.Message | publish.PackedMessage, max_message_bytes: int) -> NewRecord:
    """What a type cannot say of a message: exactly one of value (null included) and
    value_b64, canonical base64, and its size (PROTOCOL §2); in msgpack, exactly one of
    value (bin) and value_json, JSON text (docs/protocol.md "MessagePack")."""
    value: bytes
    if isinstance(message, publish.PackedMessage):
        if message.value_json is not UNSET:
            if message.value is not UNSET:
                raise BadRequest("a message needs exactly one of value (bin) and value_json")
            value, kind = encode_value(_json_text_value(message.value_json)), ValueKind.JSON
        elif message.value is UNSET:
            raise BadRequest("a message needs exactly one of value (bin) and value_json")
        else:
            value, kind = message.value, ValueKind.BYTES
    elif (message.value is UNSET) == (message.value_b64 is None):
        raise BadRequest("a message needs exactly one of value and value_b64")
    elif message.value_b64 is None:
        value, kind = encode_value(message.value), ValueKind.JSON
    else:
        value, kind = b64decode_strict(message.value_b64, "value_b64"), ValueKind.BYTES
    headers = _EMPTY_HEADERS if message.headers is None else message.headers
    size = message_size(value, message.key, headers)
    if size > max_message_bytes:
        raise MessageTooLarge(
            f"a message of {size} bytes is over max_message_bytes ({max_message_bytes})"
        )
    return new_record(value, kind, message.key, headers, message.id, message.delay_ms or 0)


def _json_text_value(text: str) -> Any:
    """The value a msgpack message's `value_json` holds, read as a JSON body's `value` is
    (every integer exact; encode_value then refuses what it cannot store exactly)."""
    try:
        return _JSON_VALUE(text)
    except RecursionError:
        raise ValidationError(
            f"value nests arrays and objects deeper than {MAX_VALUE_DEPTH} levels"
        ) from None
    except (msgspec.MsgspecError, ValueError):
        raise BadRequest("value_json is not JSON text") from None


_JSON_VALUE = msgspec.json.Decoder().decode


def _own_buffer(encoded: bytes) -> bytes:
    """A copy of exactly its length. orjson's result keeps the whole buffer it was built
    in (4 KiB at least, 8 KiB for a 1 KiB value; measured by RSS, orjson 3.13), and a
    record's value lives on in the partition's tail cache, whose bound counts value
    lengths: without the copy 32 MB of small values held about 0.8 GB. 0.2 us a value."""
    return bytes(memoryview(encoded))


def encode_value(value: Any) -> bytes:
    """The compact JSON text a record stores of `value` (PROTOCOL §1).

    What orjson cannot write exactly is refused with validation_error instead of being
    changed (docs/protocol.md "Requests"): arrays and objects nested deeper than
    MAX_VALUE_DEPTH, and integers outside MIN_VALUE_INT..MAX_VALUE_INT.
    """
    try:
        return _own_buffer(orjson.dumps(value))
    except orjson.JSONEncodeError as exc:
        if "Recursion" in str(exc):
            raise ValidationError(
                f"value nests arrays and objects deeper than {MAX_VALUE_DEPTH} levels"
            ) from None
        raise ValidationError(
            f"value holds an integer outside {MIN_VALUE_INT}..{MAX_VALUE_INT}"
        ) from None


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
        values["retry_backoff"] = _filled(Backoff, request.retry_backoff)
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


def _filled(made: type[D], given: Any, **values: Any) -> D:
    """``made`` (a dataclass with defaults) from ``values`` and the request model's members
    of the same names; a member left out (or null, PROTOCOL §2) keeps its default."""
    for field in dataclass_fields(made):
        if field.name not in values and (value := getattr(given, field.name, None)) is not None:
            values[field.name] = value
    return made(**values)


def _push(given: wire.PushConfig | wire.PushConfigPatch) -> PushConfig:
    """A push config; a PATCH's without a secret leaves it empty for
    SubscriptionPatch.apply to fill with the current one."""
    values: dict[str, Any] = {"secret": "" if given.secret is None else given.secret}
    if given.previous_secrets is not None:
        values["previous_secrets"] = tuple(
            PreviousSecret(p.secret, p.expires_at) for p in given.previous_secrets
        )
    if given.breaker is not None:
        values["breaker"] = _filled(Breaker, given.breaker)
    if given.batch is not None:
        values["batch"] = _filled(PushBatch, given.batch)
    if given.payload is not None:
        values["payload"] = PushPayload(given.payload)
    return _filled(PushConfig, given, **values)


@dataclass(frozen=True, slots=True)
class SecretRotation:
    secret: str
    previous_ttl_ms: int = actions.DEFAULT_PREVIOUS_TTL_MS


def parse_secret_rotation(body: Any) -> SecretRotation:
    """`POST /v1/subscriptions/{name}/push/rotate-secret`:
    `{"secret": "whsec_…", "previous_ttl_ms": PREVIOUS_TTL_MS}`."""
    return _filled(SecretRotation, from_model(body, actions.SecretRotation, "the rotation request"))


# ---------------------------------------------------------------- redrive


@dataclass(frozen=True, slots=True)
class RedriveRequest:
    rate: int = REDRIVE_DEFAULT_RATE
    max_records: int = REDRIVE_DEFAULT_MAX_RECORDS
    reason: str | None = None  # only the dead letters whose last error is this one


def parse_redrive(body: Any) -> RedriveRequest:
    """`POST /v1/subscriptions/{name}/redrive` (docs/protocol.md): an optional body
    `{"rate": 1..10000, "max_records": 1..1000000, "reason": "…"}`."""
    return _filled(RedriveRequest, from_model(body, actions.RedriveRequest, "the redrive request"))


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
    return _filled(PullRequest, from_model(body, pull.PullRequest, "the pull request"))


def parse_ack(body: Any) -> tuple[str, ...]:
    """`POST /v1/subscriptions/{name}/ack` `{"ids": [...]}`."""
    return tuple(from_model(body, pull.AckRequest, "the ack request").ids)


def parse_nack(body: Any) -> NackRequest:
    """`POST /v1/subscriptions/{name}/nack` `{"ids": [...], "delay_ms"?, "reason"?}`."""
    request = from_model(body, pull.NackRequest, "the nack request")
    return _filled(NackRequest, request, ids=tuple(request.ids))


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
