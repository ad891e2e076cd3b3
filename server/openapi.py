"""The OpenAPI 3.1 description of the HTTP API (PROTOCOL §2, §5), served at /openapi.json.

Built from what the server itself uses, so it cannot drift from it: every schema in
its components is generated from the protocol's models (herald/protocol/, through
server/schemas.py), the ones the server validates requests with and answers from;
the ``paths`` and ``x-websockets`` are made from the endpoint table
(server/route_table.py, server/openapi_paths.py, server/openapi_sockets.py), with
the small helpers below, and a test checks that the document's paths and methods are
exactly the app's routes.
Requests and responses have separate schemas (a push secret is required in a request
and never shown in a response); PROTOCOL §2's "an optional field given as null is the
same as the field left out" is written out: each optional request field also takes
``null``.

What JSON Schema cannot say, the descriptions say, and tests/security/test_fuzz_api.py
allows explicitly: ``offset`` together with ``timestamp`` (bad_request), min <= max
between two fields (validation_error), reads past a partition's end
(offset_out_of_range) and partitions a topic does not have (state, not shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from herald.protocol import limits, names
from server.schemas import model_components

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


# ------------------------------------------------------------------ the document


def document(
    version: str = "0.1.0",
    *,
    cluster: bool = False,
    paths: Mapping[str, Any] | None = None,
    websockets: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The document: ``paths`` and ``websockets`` (``x-websockets``) come from the
    endpoint table (server/route_table.py), the schemas from the protocol's models
    (server/schemas.py)."""
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
        "components": {"schemas": model_components(cluster=cluster)},
        "x-websockets": dict(websockets or {}),
    }


def document_bytes(
    *,
    cluster: bool = False,
    paths: Mapping[str, Any] | None = None,
    websockets: Mapping[str, Any] | None = None,
) -> bytes:
    return orjson.dumps(document(cluster=cluster, paths=paths, websockets=websockets))
