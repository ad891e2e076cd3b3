"""/openapi.json says what the validators do (issue 12 §6, issue 20 §4): its ranges,
patterns and defaults are the server's own, checked here without a network; the live
comparison is tests/security/test_fuzz_api.py (schemathesis)."""

from __future__ import annotations

import base64
import copy
import datetime
import re
from typing import Any

import httpx
import jsonschema_rs
import msgspec
import orjson
import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from herald.protocol import limits
from herald.protocol.errors import HeraldError
from herald.protocol.patterns import PUSH_URL_PATTERN, SECRET_PATTERN, SECRET_PREFIX, base64_pattern
from herald.protocol.stats import PushStats, SubscriptionStats, SubscriptionStatsView
from server import validation as v
from server.openapi import document
from tests.server import conformance

SCHEMAS: dict[str, Any] = document()["components"]["schemas"]


def _bounds(schema: dict[str, Any]) -> tuple[int, int]:
    """(minimum, maximum) of an integer schema, nullable (type list or anyOf) or not."""
    if "anyOf" in schema:
        schema = next(s for s in schema["anyOf"] if s.get("type") != "null")
    return schema["minimum"], schema["maximum"]


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        (("TopicConfig", "partitions"), limits.PARTITIONS),
        (("TopicConfig", "retention_ms"), limits.RETENTION_MS),
        (("TopicConfig", "retention_bytes"), limits.RETENTION_BYTES),
        (("TopicConfig", "dedup_window_ms"), limits.DEDUP_WINDOW_MS),
        (("Message", "partition"), limits.PARTITION),
        (("SubscriptionConfig", "ack_deadline_ms"), limits.ACK_DEADLINE_MS),
        (("SubscriptionConfig", "max_in_flight"), limits.MAX_IN_FLIGHT),
        (("SubscriptionConfig", "max_deliveries"), limits.MAX_DELIVERIES),
        (("PushConfig", "max_in_flight"), limits.PUSH_MAX_IN_FLIGHT),
        (("PushConfig", "timeout_ms"), limits.PUSH_TIMEOUT_MS),
        (("RedriveRequest", "rate"), limits.REDRIVE_RATE),
        (("RedriveRequest", "max_records"), limits.REDRIVE_MAX_RECORDS),
        (("SecretRotation", "previous_ttl_ms"), limits.PREVIOUS_TTL_MS),
        (("TokenRequest", "ttl_ms"), limits.TOKEN_TTL_MS),
        (("Seek", "timestamp"), limits.TIMESTAMP),
        (("Message", "delay_ms"), limits.DELAY_MS),
        (("CreditFrame", "n"), limits.IntRange(1, limits.MAX_CREDIT)),
        (("NackFrame", "delay_ms"), limits.NACK_DELAY_MS),
        (("ExtendFrame", "ms"), limits.EXTEND_MS),
    ],
)
def test_each_range_is_the_validators(path: tuple[str, str], allowed: limits.IntRange) -> None:
    schema, field = path
    assert _bounds(SCHEMAS[schema]["properties"][field]) == (allowed.low, allowed.high)
    assert allowed.high <= limits.MAX_INT64  # every bound fits int64 (issue 20 §4)


@pytest.mark.parametrize("field", ["replication_factor", "min_insync_replicas"])
def test_a_topics_replication_range_is_the_nodes(field: str) -> None:
    """PROTOCOL §7: a single node takes only 1 (the model takes a cluster's range and the
    server refuses more than 1 alone), a cluster up to REPLICATION_FACTOR's bound."""
    alone = SCHEMAS["TopicConfig"]["properties"][field]
    cluster = document(cluster=True)["components"]["schemas"]["TopicConfig"]["properties"][field]
    assert _bounds(alone) == (1, 1)
    assert _bounds(cluster) == (limits.REPLICATION_FACTOR.low, limits.REPLICATION_FACTOR.high)


def test_the_document_is_valid_json_schema_2020_12() -> None:
    for schema in SCHEMAS.values():
        jsonschema_rs.meta.validate(
            {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
        )


@pytest.mark.parametrize("size", range(80))
def test_the_secret_pattern_accepts_exactly_what_the_validator_does(size: int) -> None:
    secret = SECRET_PREFIX + base64.b64encode(b"k" * size).decode()
    try:
        v.parse_secret_rotation({"secret": secret})
        accepted = True
    except HeraldError:
        accepted = False
    assert (re.fullmatch(SECRET_PATTERN.strip("^$"), secret) is not None) == accepted


@settings(max_examples=300, suppress_health_check=list(HealthCheck), deadline=None)
@given(st.from_regex(re.compile(PUSH_URL_PATTERN), fullmatch=True))
def test_every_url_the_pattern_allows_is_accepted(url: str) -> None:
    if len(url) <= limits.MAX_URL_CHARS:
        v.parse_subscription_config(
            {"topic": "t", "push": {"url": url, "secret": "whsec_" + "A" * 24}}
        )


@settings(max_examples=300, suppress_health_check=list(HealthCheck), deadline=None)
@given(st.binary(max_size=64), st.text("AQgw=+/", max_size=3))
def test_value_b64_pattern_matches_strict_base64(data: bytes, noise: str) -> None:
    text = base64.b64encode(data).decode()
    assert re.fullmatch(base64_pattern(), text)
    assert v.b64decode_strict(text, "value_b64") == data
    for other in (text + noise, text[:-1] + noise, noise + text):
        try:
            v.b64decode_strict(other, "value_b64")
            accepted = True
        except HeraldError:
            accepted = False
        assert (re.fullmatch(base64_pattern(), other) is not None) == accepted, other


def test_a_message_is_exactly_one_of_value_and_value_b64() -> None:
    validator = jsonschema_rs.Draft202012Validator(
        {"$ref": "#/components/schemas/Message", "components": {"schemas": SCHEMAS}}
    )
    for message, valid in (
        ({"value": None}, True),
        ({"value": 1, "value_b64": None}, True),
        ({"value_b64": ""}, True),
        ({"value": 1, "value_b64": "AA=="}, False),
        ({}, False),
        ({"value_b64": None}, False),
        ({"value": 2**64}, False),
        ({"value": [-(2**63)]}, True),
    ):
        assert validator.is_valid(message) == valid, message


def test_the_websocket_routes_are_described() -> None:
    """OpenAPI cannot describe a WebSocket: the `x-websockets` extension lists each route
    the server serves, how to pass a token and the close codes (issue 26, item 9)."""
    from starlette.routing import WebSocketRoute

    from server.app import create_app  # the routes the server really serves
    from server.route_table import openapi_document  # the document it serves

    served = {r.path for r in create_app().routes if isinstance(r, WebSocketRoute)}
    described = orjson.loads(openapi_document(cluster=False))["x-websockets"]
    assert served and served == set(described)
    for route in described.values():
        assert "herald.token." in route["authentication"]
        assert {"4401", "4403", "1012"} <= set(route["close_codes"])
    # Said once: the close codes' table in herald/protocol/close_codes.py, every code the
    # server closes with but the two it never says (1000 is a client's, 1006 no frame).
    from herald.protocol.close_codes import MEANINGS, CloseCode

    assert set(MEANINGS) == set(CloseCode) - {CloseCode.NORMAL, CloseCode.ABNORMAL}


def test_the_consumer_frames_are_published_from_their_models() -> None:
    """Issue 29: each consumer socket's frames (PROTOCOL §3) are the components generated
    from herald/protocol/frames.py; what the server writes and what a client may send
    validate against them, and what it refuses does not."""
    from delivery.events import Delivery
    from server.route_table import openapi_document
    from storage.record import Record, ValueKind
    from subscribers import wire

    served = orjson.loads(openapi_document(cluster=False))
    sockets = served["x-websockets"]

    def validator(path: str, side: str) -> Any:
        schema = {**sockets[path]["frames"][side], "components": served["components"]}
        return jsonschema_rs.Draft202012Validator(schema)

    consumer, tail = "/v1/subscriptions/{name}/ws", "/v1/topics/{topic}/ws"
    records = [
        Record(0, 7, 1_700_000_000_000, b'{"a":1}'),
        Record(
            1, 8, 1_700_000_000_001, b"\x00", ValueKind.BYTES, "k", {"h": "v"}, 1_700_000_001_001
        ),
    ]
    deliveries = [Delivery(r, 2) for r in records]
    for path, frame in (
        (consumer, wire.ready_frame("s", "c-1", 10)),
        (tail, wire.ready_frame(None, "c-1", 0)),
        (consumer, wire.deliver_frame(wire.deliveries_json("t", deliveries, "s"))),
        (tail, wire.deliver_frame(wire.deliveries_json("t", deliveries, None))),
        (consumer, wire.acked_frame(msgspec.Raw(b'{"n": [1]}'), ["0-7"], ["x"])),
        (tail, wire.error_frame("unknown_type", "unknown frame type 'x'")),
    ):
        validator(path, "server").validate(orjson.loads(frame))
    client = validator(consumer, "client")
    for frame, valid in (
        ({"type": "credit", "n": 5}, True),
        ({"type": "ack", "ids": ["0-1"], "req": {"any": None}}, True),
        ({"type": "nack", "ids": [], "delay_ms": 600_000, "reason": "r"}, True),
        ({"type": "extend", "ids": ["0-1"], "ms": 100}, True),
        ({"type": "credit", "n": 0}, False),
        ({"type": "extend", "ids": ["0-1"], "ms": 99}, False),
        ({"type": "ack", "ids": [1]}, False),
        ({"type": "subscribe"}, False),
    ):
        assert client.is_valid(frame) == valid, frame
    assert not validator(tail, "server").is_valid(
        orjson.loads(wire.acked_frame(msgspec.Raw(b"1"), [], []))
    )


async def test_the_stats_answers_and_frames_are_published_from_their_models(
    herald_url: str,
) -> None:
    """Issue 29: GET /v1/stats and the frames of /v1/stats/ws are described by components
    generated from herald/protocol/snapshot.py (they were `{"type": "object"}`): a
    snapshot with a push subscription and a connected consumer validates against them,
    and one without its totals does not."""
    from server.route_table import openapi_document

    served = orjson.loads(openapi_document(cluster=False))

    def validator(schema: dict[str, Any]) -> Any:
        return jsonschema_rs.Draft202012Validator({**schema, "components": served["components"]})

    answer = validator(
        served["paths"]["/v1/stats"]["get"]["responses"]["200"]["content"]["application/json"][
            "schema"
        ]
    )
    socket = validator(served["x-websockets"]["/v1/stats/ws"]["frames"]["server"])
    ws_url = herald_url.replace("http://", "ws://")
    hook = {"url": "http://user:pw@127.0.0.1:9/hook?key=1", "secret": SECRET_PREFIX + "A" * 24}
    async with httpx.AsyncClient(base_url=herald_url) as http:
        body = {"messages": [{"value": 1, "key": "k"}]}
        assert (await http.post("/v1/topics/t/messages", json=body)).status_code == 200
        for name, config in (
            ("workers", {"topic": "t", "start": "earliest"}),
            ("hooked", {"topic": "quiet", "push": hook}),  # nothing to send: no posts
        ):
            created = await http.put(f"/v1/subscriptions/{name}", json=config)
            assert created.status_code == 201, created.text
        async with websockets.connect(f"{ws_url}/v1/subscriptions/workers/ws?credit=1") as ws:
            assert orjson.loads(await ws.recv())["type"] == "ready"
            async with websockets.connect(f"{ws_url}/v1/stats/ws") as stats:
                frame = orjson.loads(await stats.recv())
            snapshot = (await http.get("/v1/stats", params={"history": "1"})).json()
    for found in (frame, snapshot):
        subscriptions = {s["name"]: s for s in found["subscriptions"]}
        assert subscriptions["hooked"]["push"]["endpoint_state"] == "closed"
        assert [c["credit"] for c in subscriptions["workers"]["consumers"]] in ([0], [1])
    assert frame["type"] == "stats" and "history" in snapshot
    socket.validate(frame)
    answer.validate(snapshot)
    assert not socket.is_valid({k: v for k, v in frame.items() if k != "totals"})
    assert not answer.is_valid({k: v for k, v in snapshot.items() if k != "totals"})


def test_a_subscription_is_published_from_its_models(herald_url: str) -> None:
    """Issue 29: the published SubscriptionStats and SubscriptionConfigView are generated
    from the models the server fills in, so every member a server answers is described
    (`delayed` and `filter` once were not), and a real answer validates against them."""
    published = SCHEMAS["SubscriptionStats"]
    assert set(published["properties"]) == set(SubscriptionStats.__struct_fields__)
    assert set(published["required"]) == set(SubscriptionStats.__struct_fields__)
    validator = jsonschema_rs.Draft202012Validator(
        {"$ref": "#/components/schemas/Subscription", "components": {"schemas": SCHEMAS}}
    )
    with httpx.Client(base_url=herald_url) as http:
        body = {"messages": [{"value": 1}, {"value": 2, "delay_ms": 60_000}]}
        assert http.post("/v1/topics/t/messages", json=body).status_code == 200
        config = {"topic": "t", "start": "earliest", "filter": 'key = "a"'}
        created = http.put("/v1/subscriptions/s", json=config)
        assert created.status_code == 201, created.text
        answer = http.get("/v1/subscriptions/s").json()
    assert "delayed" in answer["stats"] and answer["config"]["filter"] == 'key = "a"'
    validator.validate(answer)
    assert set(SCHEMAS["SubscriptionConfigView"]["properties"]) == set(answer["config"])


def test_every_member_of_a_push_subscriptions_stats_is_published(herald_url: str) -> None:
    """Issue 29: a push subscription's stats carry the push members of docs/protocol.md
    (`endpoint_state`, `last_status`, …); the published Subscription schema names each
    of them, so its answer validates with the stats object closed (it once validated
    only because the object was open)."""
    schemas = copy.deepcopy(SCHEMAS)
    stats = schemas["Subscription"]["properties"]["stats"]
    while "$ref" in stats:
        stats = schemas[stats["$ref"].rsplit("/", 1)[-1]]
    stats["additionalProperties"] = False
    push_members = set(PushStats.__struct_fields__)
    assert set(stats["properties"]) == set(SubscriptionStats.__struct_fields__) | push_members
    assert set(SubscriptionStatsView.__struct_fields__) == set(stats["properties"])
    closed = jsonschema_rs.Draft202012Validator(
        {"$ref": "#/components/schemas/Subscription", "components": {"schemas": schemas}}
    )
    hook = {"url": "http://127.0.0.1:9/hook", "secret": SECRET_PREFIX + "A" * 24}
    with httpx.Client(base_url=herald_url) as http:
        created = http.put("/v1/subscriptions/hooked", json={"topic": "quiet", "push": hook})
        assert created.status_code == 201, created.text
        answer = http.get("/v1/subscriptions/hooked").json()
    assert push_members <= set(answer["stats"]) and answer["stats"]["endpoint_state"] == "closed"
    closed.validate(answer)
    unknown = {**answer, "stats": {**answer["stats"], "endpoint_unknown": 1}}
    assert not closed.is_valid(unknown)


def test_an_answer_the_document_does_not_describe_is_caught() -> None:
    """The check tests/server/conftest.py runs on every answer of this folder's tests."""
    request = httpx.Request("GET", "http://127.0.0.1:1/v1/subscriptions/s")
    for body, caught in (({"name": "s"}, True), ({"subscriptions": []}, True)):
        response = httpx.Response(200, json=body, request=request)
        response.read()
        response.elapsed = datetime.timedelta(0)
        assert (conformance(response) is not None) == caught
    listing = httpx.Request("GET", "http://127.0.0.1:1/v1/subscriptions")
    response = httpx.Response(200, json={"subscriptions": []}, request=listing)
    response.read()
    response.elapsed = datetime.timedelta(0)
    assert conformance(response) is None
