"""The route table (server/route_table.py) is the one declaration of what a node serves
(issue 29 item 2): against a real node of a cluster with its secret (so that the
node-to-node routes, the peer proof among them, are live), every declared route is
served, and every method on every path the docs name that the node answers as a route
is a declared one. "Not a route" is the router's answer: 404 ``not_found`` "no route
for …", 405, or a WebSocket handshake refused."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from server.endpoint import WEBSOCKET, Endpoint
from server.route_table import endpoints
from tests.cluster.nodes import HeraldCluster

TABLE = endpoints(None)
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")  # HEAD is GET's (server/endpoint.py)
DOCS = Path(__file__).resolve().parents[2] / "docs"
SAMPLE = "route-probe"


@pytest.fixture(scope="module")
def node_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("routes") / "cluster"
    with HeraldCluster(root, 1, cluster_secret=True) as cluster:
        yield cluster.nodes["n1"].url


def _filled(path: str) -> str:
    """A template's path with every parameter given a value ({partition}: 0)."""
    parts = path.split("/")
    return "/".join(
        ("0" if part in ("{p}", "{partition}") else SAMPLE)
        if part.startswith("{") or part == "…"
        else part
        for part in parts
    )


def _is_no_route(response: httpx.Response) -> bool:
    if response.status_code == 405:
        return True
    if response.status_code != 404:
        return False
    body = response.json()
    return body.get("code") == "not_found" and str(body.get("detail")).startswith("no route")


async def _socket_accepted(url: str) -> bool:
    """Whether the node accepts a WebSocket on ``url`` (what it says next is the route's)."""
    try:
        async with websockets.connect(url, open_timeout=30, close_timeout=5):
            return True
    except websockets.InvalidStatus:
        return False


def _ws(http_url: str) -> str:
    return http_url.replace("http://", "ws://", 1)


def test_every_declared_route_is_served(node_url: str) -> None:
    with httpx.Client(base_url=node_url, timeout=30) as http:
        for endpoint in TABLE.all:
            path = _filled(endpoint.path) + ("/" if endpoint.prefix else "")
            if endpoint.method == WEBSOCKET:
                accepted = asyncio.run(_socket_accepted(_ws(node_url) + path))
                assert accepted, f"{endpoint.method} {endpoint.path} is declared, not served"
                continue
            answer = http.request(endpoint.method, path, content=b"{}")
            assert not _is_no_route(answer), f"{_row(endpoint)} is declared, not served"


def test_a_node_proves_itself_on_its_declared_route(node_url: str) -> None:
    nonce = secrets.token_hex(16)
    answer = httpx.post(f"{node_url}/v1/cluster/proof", json={"nonce": nonce}, timeout=30)
    assert answer.status_code == 200
    assert answer.json()["url"] == node_url
    assert answer.json()["proofs"]
    refused = httpx.post(f"{node_url}/v1/cluster/proof", json={"nonce": "short"}, timeout=30)
    assert (refused.status_code, refused.json()["code"]) == (400, "bad_request")


def _documented_paths() -> list[str]:
    """Every concrete path the docs name (a template's parameters filled in)."""
    text = "\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))
    found = re.findall(r"(/v1/[A-Za-z0-9_{}.…/-]*|/healthz|/metrics|/openapi\.json)", text)
    return sorted({_filled(path.rstrip("/.")) for path in found if path.rstrip("/.")})


def test_every_served_route_is_declared(node_url: str) -> None:
    paths = _documented_paths()
    assert "/v1/cluster/proof" in paths  # the docs' paths include the node-to-node ones
    undeclared: list[str] = []
    with httpx.Client(base_url=node_url, timeout=30) as http:
        for path in paths:
            for method in METHODS:
                answer = http.request(method, path, content=b"{}")
                declared = TABLE.match("http", method, path)[0] is not None
                if not _is_no_route(answer) and not declared:
                    undeclared.append(f"{method} {path} -> {answer.status_code}")
            accepted = asyncio.run(_socket_accepted(_ws(node_url) + path))
            if accepted and TABLE.match("websocket", "GET", path)[0] is None:
                undeclared.append(f"WS {path}")
    assert not undeclared, "served but not declared:\n" + "\n".join(undeclared)


def _row(endpoint: Endpoint) -> str:
    return f"{endpoint.method} {endpoint.path}"
