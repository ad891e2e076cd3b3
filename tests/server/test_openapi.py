"""/openapi.json says what the validators do (issue 12 §6, issue 20 §4): its ranges,
patterns and defaults are the server's own, checked here without a network; the live
comparison is tests/security/test_fuzz_api.py (schemathesis)."""

from __future__ import annotations

import base64
import re
from typing import Any

import jsonschema_rs
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server import validation as v
from server.openapi import document
from storage.errors import HeraldError

SCHEMAS: dict[str, Any] = document()["components"]["schemas"]


def _bounds(schema: dict[str, Any]) -> tuple[int, int]:
    """(minimum, maximum) of an integer schema, nullable (type list or anyOf) or not."""
    if "anyOf" in schema:
        schema = next(s for s in schema["anyOf"] if s.get("type") != "null")
    return schema["minimum"], schema["maximum"]


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        (("TopicConfig", "partitions"), v.PARTITIONS),
        (("TopicConfig", "retention_ms"), v.RETENTION_MS),
        (("TopicConfig", "retention_bytes"), v.RETENTION_BYTES),
        (("TopicConfig", "dedup_window_ms"), v.DEDUP_WINDOW_MS),
        (("Message", "partition"), v.PARTITION),
        (("SubscriptionConfig", "ack_deadline_ms"), v.ACK_DEADLINE_MS),
        (("SubscriptionConfig", "max_in_flight"), v.MAX_IN_FLIGHT),
        (("SubscriptionConfig", "max_deliveries"), v.MAX_DELIVERIES),
        (("PushConfig", "max_in_flight"), v.PUSH_MAX_IN_FLIGHT),
        (("PushConfig", "timeout_ms"), v.PUSH_TIMEOUT_MS),
        (("RedriveRequest", "rate"), v.REDRIVE_RATE),
        (("RedriveRequest", "max_records"), v.REDRIVE_MAX_RECORDS),
        (("SecretRotation", "previous_ttl_ms"), v.PREVIOUS_TTL_MS),
    ],
)
def test_each_range_is_the_validators(path: tuple[str, str], allowed: v.IntRange) -> None:
    schema, field = path
    assert _bounds(SCHEMAS[schema]["properties"][field]) == (allowed.low, allowed.high)
    assert allowed.high <= v.MAX_INT64  # every bound fits int64 (issue 20 §4)


def test_the_document_is_valid_json_schema_2020_12() -> None:
    for schema in SCHEMAS.values():
        jsonschema_rs.meta.validate(
            {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
        )


@pytest.mark.parametrize("size", range(80))
def test_the_secret_pattern_accepts_exactly_what_the_validator_does(size: int) -> None:
    secret = v.SECRET_PREFIX + base64.b64encode(b"k" * size).decode()
    try:
        v.parse_secret_rotation({"secret": secret})
        accepted = True
    except HeraldError:
        accepted = False
    assert (re.fullmatch(v.SECRET_PATTERN.strip("^$"), secret) is not None) == accepted


@settings(max_examples=300, suppress_health_check=list(HealthCheck), deadline=None)
@given(st.from_regex(re.compile(v.PUSH_URL_PATTERN), fullmatch=True))
def test_every_url_the_pattern_allows_is_accepted(url: str) -> None:
    if len(url) <= v.MAX_URL_CHARS:
        v.parse_subscription_config(
            {"topic": "t", "push": {"url": url, "secret": "whsec_" + "A" * 24}}
        )


@settings(max_examples=300, suppress_health_check=list(HealthCheck), deadline=None)
@given(st.binary(max_size=64), st.text("AQgw=+/", max_size=3))
def test_value_b64_pattern_matches_strict_base64(data: bytes, noise: str) -> None:
    text = base64.b64encode(data).decode()
    assert re.fullmatch(v.base64_pattern(), text)
    assert v.b64decode_strict(text, "value_b64") == data
    for other in (text + noise, text[:-1] + noise, noise + text):
        try:
            v.b64decode_strict(other, "value_b64")
            accepted = True
        except HeraldError:
            accepted = False
        assert (re.fullmatch(v.base64_pattern(), other) is not None) == accepted, other


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
        assert {"4401", "4403"} <= set(route["close_codes"])
