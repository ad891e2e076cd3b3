"""The components of /openapi.json, every one generated from the protocol's models
(herald/protocol/): the very types the server fills in and validates with, so their
published schema cannot drift from them (issue 29: `delayed` was once missing from the
hand-written SubscriptionStats, and `filter` from SubscriptionConfigView)."""

from __future__ import annotations

import copy
from typing import Any, get_args

import msgspec

from herald.protocol import (
    actions,
    frames,
    limits,
    publish,
    pull,
    records,
    seek,
    snapshot,
    tokens,
    topics,
)
from herald.protocol import subscriptions as wire
from herald.protocol.errors import Problem
from herald.protocol.stats import PushStats, SubscriptionStats

REF_TEMPLATE = "#/components/schemas/{name}"

MODELS: tuple[Any, ...] = (
    topics.TopicConfig,
    topics.TopicConfigView,
    topics.Topic,
    topics.TopicList,
    wire.SubscriptionConfig,
    wire.SubscriptionPatch,
    wire.SubscriptionConfigView,
    SubscriptionStats,
    actions.RedriveRequest,
    actions.SecretRotation,
    pull.PullRequest,
    pull.AckRequest,
    pull.NackRequest,
    tokens.TokenRequest,
    seek.Seek,
    records.Record,
    records.ReadResponse,
    records.PublishResponse,
    pull.PullResponse,
    pull.AckResponse,
    wire.Subscription,
    wire.SubscriptionList,
    Problem,
    publish.PublishRequest,
    publish.PackedPublishRequest,  # docs/protocol.md "MessagePack"
    # PROTOCOL §3's frames, published under x-websockets (see socket_frames)
    *get_args(frames.ClientFrame),
    *get_args(frames.ConsumerFrame),
    frames.TailDeliverFrame,
    # docs/protocol.md "MessagePack": the deliver frames of herald.msgpack sockets
    frames.PackedDeliverFrame,
    frames.PackedTailDeliverFrame,
    # docs/protocol.md "Stats": the console's snapshot, its frame and its samples
    snapshot.StatsResponse,
    snapshot.StatsFrame,
    snapshot.TopicHistory,
    snapshot.SubscriptionHistory,
)
# What their types cannot say.
EXTRA: dict[str, dict[str, Any]] = {
    "Seek": seek.ONE_FORM,
    "Record": records.ONE_VALUE,
    "DeliveredRecord": records.ONE_VALUE,
    "TailRecord": records.ONE_VALUE,
    "PackedDeliveredRecord": records.ONE_PACKED_VALUE,
    "PackedTailRecord": records.ONE_PACKED_VALUE,
    "Message": publish.ONE_VALUE,
    "PackedMessage": records.ONE_PACKED_VALUE,  # msgpack: value a bin, value_json text
    # docs/protocol.md: a push subscription's stats carry every push member, others none
    "SubscriptionStatsView": {
        "dependentRequired": {PushStats.__struct_fields__[0]: list(PushStats.__struct_fields__[1:])}
    },
}


_SINGLE_NODE = limits.IntRange(1, 1)  # PROTOCOL §7: a single node keeps one copy


def model_components(*, cluster: bool = False) -> dict[str, dict[str, Any]]:
    """Each model's JSON Schema (and those of the models it refers to) under its class
    name, which is the component name the paths refer to. On a single node a topic's
    replication_factor and min_insync_replicas can only be 1 (the model takes a
    cluster's range; the server refuses more with validation_error)."""
    _, components = msgspec.json.schema_components(MODELS, ref_template=REF_TEMPLATE)
    for name, extra in EXTRA.items():  # copies: a document's reader may change its own
        components[name].update(copy.deepcopy(extra))
    components["JsonValue"] = copy.deepcopy(publish.JSON_VALUE_SCHEMA)  # a value, recursive
    if not cluster:
        properties = components["TopicConfig"]["properties"]
        for name in ("replication_factor", "min_insync_replicas"):
            number = properties[name]["anyOf"][0]
            number["minimum"], number["maximum"] = _SINGLE_NODE.low, _SINGLE_NODE.high
    return components


def socket_frames(server: Any) -> dict[str, Any]:
    """A consumer socket's frames for its x-websockets entry: what a client sends and
    what ``server`` (a union of frame models) answers, each told apart by `type`, as
    references to the frames' components."""
    return {"client": _one_of(frames.ClientFrame), "server": _one_of(server)}


def _one_of(union: Any) -> dict[str, Any]:
    return {
        "oneOf": [{"$ref": REF_TEMPLATE.format(name=m.__name__)} for m in get_args(union)],
        "discriminator": {"propertyName": "type"},
    }
