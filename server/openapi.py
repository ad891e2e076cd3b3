"""The OpenAPI 3.1 description of the HTTP API (PROTOCOL §2, §5), served at /openapi.json.

Built from what the server itself uses, so it cannot drift from it: the schemas of
the subscription config (as sent and as shown) and of its stats are generated from the
protocol's models the server validates with and answers from (server/schemas.py);
every other range, pattern and enum comes from herald.protocol (``IntRange``
constants, the name, base64 and push URL patterns), every default from the config
dataclasses. Requests and responses have separate schemas (a push secret is
required in a request and never shown in a response). PROTOCOL §2's "an optional
field given as null is the same as the field left out" is written out: each
optional request field also takes ``null``.

What JSON Schema cannot say, the descriptions say, and tests/security/test_fuzz_api.py
allows explicitly: ``offset`` together with ``timestamp`` (bad_request), min <= max
between two fields (validation_error), reads past a partition's end
(offset_out_of_range) and partitions a topic does not have (state, not shape).
The ``paths`` and ``x-websockets`` are made from the endpoint table
(server/route_table.py, server/openapi_paths.py); a test checks that the document's
paths and methods are exactly the app's routes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from herald.protocol import limits, names
from herald.protocol.patterns import base64_pattern
from server.schemas import with_models

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _int(allowed: limits.IntRange | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", **extra}
    if allowed is not None:
        schema["minimum"] = allowed.low
        schema["maximum"] = allowed.high
    return schema


_COUNT = _int(limits.IntRange(0))


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """PROTOCOL §2: an optional field given as null is the same as the field left out."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    annotations: dict[str, Any] = {k: schema[k] for k in ("default", "description") if k in schema}
    core = {k: x for k, x in schema.items() if k not in annotations}
    return {"anyOf": [core, {"type": "null"}], **annotations}


def _object(
    properties: dict[str, Any], required: tuple[str, ...] = (), *, closed: bool = True, **extra: Any
) -> dict[str, Any]:
    """An object; request objects are ``closed`` (PROTOCOL §2: unknown fields -> 400)."""
    schema: dict[str, Any] = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def _pattern(regex: str) -> str:
    return regex if regex.startswith("^") else f"^{regex}$"


_NAME = {"type": "string", "pattern": _pattern(names.NAME_PATTERN)}
_BASE64 = {"type": "string", "pattern": _pattern(base64_pattern()), "contentEncoding": "base64"}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}


# ------------------------------------------------------------------ requests


# Any JSON value, with integers within what the server stores exactly. Nesting is at
# most MAX_VALUE_DEPTH levels deep, which JSON Schema cannot say short of unrolling it.
_JSON_VALUE = {
    "description": "any JSON value; integers within "
    f"{limits.MIN_VALUE_INT}..{limits.MAX_VALUE_INT}, arrays and objects nested at most "
    f"{limits.MAX_VALUE_DEPTH} levels (else 400 validation_error)",
    "if": {"type": "integer"},
    "then": {"minimum": limits.MIN_VALUE_INT, "maximum": limits.MAX_VALUE_INT},
    "items": {"$ref": _REF + "JsonValue"},
    "additionalProperties": {"$ref": _REF + "JsonValue"},
}


def _message() -> dict[str, Any]:
    return _object(
        {
            "value": _ref("JsonValue"),
            "value_b64": _nullable(_BASE64),
            "key": {"type": ["string", "null"]},
            "headers": _nullable(_STRINGS),
            "partition": _nullable(
                _int(
                    limits.PARTITION,
                    description="a partition the topic has (else 400 validation_error)",
                )
            ),
            "id": _nullable({"type": "string", "minLength": 1, "maxLength": limits.MAX_ID_CHARS}),
            "delay_ms": _nullable(
                _int(
                    limits.DELAY_MS,
                    description="PROTOCOL §8 delayed delivery: appended at once, first sent to "
                    "subscriptions no earlier than the record's timestamp + delay_ms "
                    "(its deliver_at); 0 or absent: no delay",
                )
            ),
        },
        description="exactly one of value (null included) and value_b64",
        # `"value": null` is a value; `"value_b64": null` is absent (PROTOCOL §1, §2).
        oneOf=[
            {"required": ["value"]},
            {"required": ["value_b64"], "properties": {"value_b64": {"type": "string"}}},
        ],
    )


# ------------------------------------------------------------------ responses


def _schemas(cluster: bool) -> dict[str, Any]:
    return with_models(
        {
            "JsonValue": _JSON_VALUE,
            "Message": _message(),
            "PublishRequest": _object(
                {
                    "messages": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": limits.MAX_BATCH,
                        "items": _ref("Message"),
                    }
                },
                ("messages",),
            ),
        },
        cluster=cluster,
    )


def document(
    version: str = "0.1.0",
    *,
    cluster: bool = False,
    paths: Mapping[str, Any] | None = None,
    websockets: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The document: ``paths`` and ``websockets`` (``x-websockets``) come from the
    endpoint table (server/route_table.py), the schemas from here."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Herald",
            "version": version,
            "description": "Push-delivery pub/sub. WebSocket consumers (PROTOCOL §3) are "
            "GET /v1/subscriptions/{name}/ws and GET /v1/topics/{topic}/ws; "
            "the stats WebSocket is GET /v1/stats/ws; the browser console is /console/.",
        },
        "paths": dict(paths or {}),
        "components": {"schemas": _schemas(cluster)},
        "x-websockets": dict(websockets or {}),
    }


def document_bytes(
    *,
    cluster: bool = False,
    paths: Mapping[str, Any] | None = None,
    websockets: Mapping[str, Any] | None = None,
) -> bytes:
    return orjson.dumps(document(cluster=cluster, paths=paths, websockets=websockets))
