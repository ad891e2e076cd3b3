"""Permission matrix of PROTOCOL §6: every route and socket by no token / wrong role / right
role, on one node and through every node of a 3-node cluster (PROTOCOL §7: any node serves
everything a token allows, and refuses the rest, whichever node coordinates what)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import websockets

from tests.security.conftest import TOKENS, Secured, SecuredCluster

WHO = list(TOKENS)

# (method, path, body, who may) — "admin" may everything.
HTTP_MATRIX: list[tuple[str, str, Any, set[str]]] = [
    ("GET", "/metrics", None, {"admin", "metrics"}),
    ("GET", "/v1/stats", None, {"admin", "metrics"}),
    ("GET", "/v1/stats/history?topic=orders.a", None, {"admin", "metrics"}),
    ("GET", "/v1/cluster", None, {"admin", "metrics"}),
    ("GET", "/v1/topics", None, {"admin"}),
    ("GET", "/v1/topics/orders.a", None, {"admin", "publisher", "subscriber"}),
    ("PUT", "/v1/topics/orders.made", {"partitions": 1}, {"admin"}),
    ("DELETE", "/v1/topics/orders.never", None, {"admin"}),
    ("POST", "/v1/topics/orders.a/messages", {"messages": [{"value": 1}]}, {"admin", "publisher"}),
    ("POST", "/v1/topics/other.a/messages", {"messages": [{"value": 1}]}, {"admin", "stranger"}),
    ("GET", "/v1/topics/orders.a/partitions/0/messages", None, {"admin", "subscriber"}),
    ("GET", "/v1/subscriptions", None, {"admin"}),
    ("GET", "/v1/subscriptions/s-orders", None, {"admin", "subscriber"}),
    ("GET", "/v1/subscriptions/s-missing", None, {"admin"}),
    ("PUT", "/v1/subscriptions/s-made", {"topic": "orders.a"}, {"admin"}),
    ("DELETE", "/v1/subscriptions/s-never", None, {"admin"}),
    ("POST", "/v1/subscriptions/s-orders/seek", {"to": "latest"}, {"admin", "subscriber"}),
    # Minting a browser token: any valid token (404 here: this auth file has no signing key;
    # tests/security/test_browser_tokens.py covers the rest).
    ("POST", "/v1/tokens", {"ttl_ms": 60_000, "publish": ["orders.a"]}, set(TOKENS)),
    # PROTOCOL §8: changing a subscription in place is an operator's act.
    ("PATCH", "/v1/subscriptions/s-orders", {"max_in_flight": 1000}, {"admin"}),
    # PROTOCOL §8 pull: subscribe on the subscription's topic, like its WebSocket.
    ("POST", "/v1/subscriptions/s-orders/pull", {"max_messages": 1}, {"admin", "subscriber"}),
    ("POST", "/v1/subscriptions/s-orders/ack", {"ids": ["0-0"]}, {"admin", "subscriber"}),
    ("POST", "/v1/subscriptions/s-orders/nack", {"ids": ["0-0"]}, {"admin", "subscriber"}),
    # Routes no rule names (console redrive, webhook attempts, future ones) need admin.
    ("POST", "/v1/subscriptions/s-orders/redrive", {}, {"admin"}),
    ("GET", "/v1/subscriptions/s-orders/attempts", None, {"admin"}),
    ("GET", "/v1/some-future-route", None, {"admin"}),
]


def call(secured: Secured, method: str, path: str, body: Any, who: str | None) -> httpx.Response:
    return httpx.request(
        method, secured.url + path, json=body, headers=secured.headers(who), timeout=10
    )


def check_route(
    url: str,
    headers: Callable[[str | None], dict[str, str]],
    method: str,
    path: str,
    body: Any,
    allowed: set[str],
) -> None:
    def request(who: str | None) -> httpx.Response:
        return httpx.request(method, url + path, json=body, headers=headers(who), timeout=30)

    anonymous = request(None)
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["code"] == "unauthorized"
    for who in WHO:
        r = request(who)
        if who in allowed:
            assert r.status_code not in (401, 403), (url, who, r.text)
        else:
            assert r.status_code == 403, (url, who, r.status_code, r.text)
            assert r.json()["code"] == "forbidden"


@pytest.mark.parametrize(("method", "path", "body", "allowed"), HTTP_MATRIX)
def test_http_route_needs_the_right_role(
    secured: Secured, method: str, path: str, body: Any, allowed: set[str]
) -> None:
    check_route(secured.url, secured.headers, method, path, body, allowed)


@pytest.mark.parametrize(("method", "path", "body", "allowed"), HTTP_MATRIX)
def test_http_route_needs_the_right_role_at_every_cluster_node(
    secured_cluster: SecuredCluster, method: str, path: str, body: Any, allowed: set[str]
) -> None:
    for url in secured_cluster.urls:
        check_route(url, secured_cluster.headers, method, path, body, allowed)


def test_open_routes_need_no_token(secured: Secured) -> None:
    assert httpx.get(f"{secured.url}/healthz").status_code == 200
    assert httpx.get(f"{secured.url}/openapi.json").status_code == 200
    assert httpx.get(f"{secured.url}/sdk/herald.js").status_code == 200


def test_bad_and_malformed_tokens_are_401(secured: Secured) -> None:
    valid = secured.tokens["admin"]
    forged = valid[:-4] + ("AAAA" if not valid.endswith("AAAA") else "BBBB")
    for token in (forged, "nonsense", "hrd_00000000_" + "x" * 43):
        r = httpx.get(f"{secured.url}/v1/topics", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 401, token
        assert valid not in r.text and token not in r.text
    basic = httpx.get(f"{secured.url}/v1/topics", headers={"Authorization": f"Basic {valid}"})
    assert basic.status_code == 401


def test_tokens_never_reach_the_logs(secured: Secured) -> None:
    token = secured.tokens["subscriber"]
    httpx.get(f"{secured.url}/v1/topics?token={token}", headers=secured.headers("subscriber"))
    for value in secured.tokens.values():
        assert value not in secured.server.log()
        assert value not in (secured.server.data_dir.parent / "audit.jsonl").read_text()


# ------------------------------------------------------------------ WebSockets


async def ws_outcome(url: str, headers: dict[str, str]) -> int | None:
    """The close code the server refused with, or None if the socket was served: every
    socket route sends a first frame (`ready`, a stats snapshot) once it serves, and a
    refusal closes instead, however late a loaded host sends either."""
    try:
        async with websockets.connect(url, additional_headers=headers, open_timeout=10) as ws:
            try:
                async with asyncio.timeout(10):
                    await ws.recv()
            except TimeoutError:
                return None
            except websockets.ConnectionClosed as exc:
                return exc.rcvd.code if exc.rcvd else None
            return None
    except websockets.ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd else None


WS_MATRIX = [
    ("/v1/subscriptions/s-orders/ws?credit=1", {"admin", "subscriber"}),
    ("/v1/topics/orders.a/ws", {"admin", "subscriber"}),
    ("/v1/stats/ws", {"admin", "metrics"}),
]


async def check_socket(url: str, tokens: dict[str, str], path: str, allowed: set[str]) -> None:
    ws_url = url.replace("http://", "ws://") + path
    assert await ws_outcome(ws_url, {}) == 4401
    joiner = "&" if "?" in path else "?"
    for who in WHO:
        by_header = await ws_outcome(ws_url, {"Authorization": f"Bearer {tokens[who]}"})
        by_query = await ws_outcome(f"{ws_url}{joiner}token={tokens[who]}", {})
        expected = None if who in allowed else 4403
        assert by_header == expected, (url, who, by_header)
        assert by_query == expected, (url, who, by_query)


@pytest.mark.parametrize(("path", "allowed"), WS_MATRIX)
async def test_websocket_needs_the_right_role(
    secured: Secured, path: str, allowed: set[str]
) -> None:
    await check_socket(secured.url, secured.tokens, path, allowed)


@pytest.mark.parametrize(("path", "allowed"), WS_MATRIX)
async def test_websocket_needs_the_right_role_at_every_cluster_node(
    secured_cluster: SecuredCluster, path: str, allowed: set[str]
) -> None:
    for url in secured_cluster.urls:
        await check_socket(url, secured_cluster.tokens, path, allowed)


def test_audit_log_names_token_ids_of_admin_actions_and_refusals(secured: Secured) -> None:
    admin = secured.headers("admin")
    httpx.put(f"{secured.url}/v1/topics/orders.audited", json={}, headers=admin)
    httpx.delete(f"{secured.url}/v1/topics/orders.audited", headers=secured.headers("publisher"))
    lines = (secured.server.data_dir.parent / "audit.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    admin_id = secured.tokens["admin"].split("_")[1]
    publisher_id = secured.tokens["publisher"].split("_")[1]
    assert any(
        e["event"] == "topic_created"
        and e["token_id"] == admin_id
        and e["path"].endswith("audited")
        for e in entries
    )
    assert any(e["event"] == "auth_failure" and e["code"] == "forbidden" for e in entries)
    assert any(e["event"] == "auth_failure" and e["code"] == "unauthorized" for e in entries)
    assert publisher_id  # ids are in entries; tokens never are (test_tokens_never_reach_the_logs)


def token_id(secured: Secured, who: str) -> str:
    return secured.tokens[who].split("_")[1]


@pytest.mark.parametrize(
    ("who", "method", "path", "body", "detail"),
    [
        (
            "publisher",
            "POST",
            "/v1/topics/other.a/messages",
            {"messages": [{"value": 1}]},
            "token {id} may publish to `orders.*`, not to `other.a`",
        ),
        (
            "subscriber",
            "POST",
            "/v1/topics/orders.a/messages",
            {"messages": [{"value": 1}]},
            "token {id} lacks the publish permission (it has: subscribe)",
        ),
        (
            "stranger",
            "GET",
            "/v1/topics/orders.a",
            None,
            "token {id} may publish to or subscribe on `other.*`, not `orders.a`",
        ),
        (
            "stranger",
            "GET",
            "/v1/subscriptions/s-orders",
            None,
            "token {id} may subscribe on `other.*`, not on `orders.a` "
            "(the topic of subscription 's-orders')",
        ),
        (
            "publisher",
            "GET",
            "/v1/topics",
            None,
            "token {id} lacks the admin permission (it has: publish)",
        ),
    ],
)
def test_a_403_says_which_permission_and_topic_pattern_were_missing(
    secured: Secured, who: str, method: str, path: str, body: Any, detail: str
) -> None:
    r = call(secured, method, path, body, who)
    assert r.status_code == 403, r.text
    assert r.json()["detail"] == detail.format(id=token_id(secured, who))


def test_a_403_on_a_missing_subscription_does_not_reveal_that_it_is_missing(
    secured: Secured,
) -> None:
    missing = call(secured, "GET", "/v1/subscriptions/s-missing", None, "subscriber").json()
    assert missing["detail"] == (
        f"token {token_id(secured, 'subscriber')} may not subscribe on subscription 's-missing'"
    )
