"""The endpoint table (server/route_table.py) is the one declaration of every route: the
router, the access check, audit, forwarding and the publish fast path all take a
request's endpoint from its one match (server/endpoint.py). Checked here without a
network: the table's match is the router's, for every endpoint and method, and for
paths that are not quite an endpoint's."""

from __future__ import annotations

import pytest
from starlette.routing import Match, Router

from server.endpoint import ADMIN, OPEN, WEBSOCKET, Endpoint, Endpoints, rule_of
from server.route_table import endpoints

TABLE = endpoints(None)
ROUTER = Router(routes=TABLE.routes())
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _sample(endpoint: Endpoint, value: str = "x") -> str:
    return "/".join(value if p.startswith("{") else p for p in endpoint.path.split("/"))


def _paths() -> list[tuple[str, str]]:
    """Each endpoint's path filled in, and near misses: an empty parameter, a trailing
    slash, one segment more, a parameter holding what is a literal elsewhere."""
    out: list[tuple[str, str]] = []
    for endpoint in TABLE.all:
        if endpoint.prefix:
            out += [("http", endpoint.path + "/index.html"), ("http", endpoint.path + "x")]
            continue
        for path in (
            _sample(endpoint),
            _sample(endpoint, ""),
            _sample(endpoint, "ws"),
            _sample(endpoint) + "/",
            _sample(endpoint) + "/more",
        ):
            out.append((endpoint.kind, path))
    return out


def _router_match(kind: str, method: str, path: str) -> tuple[Match, dict[str, str]]:
    scope = {"type": kind, "method": method, "path": path, "root_path": ""}
    partial: tuple[Match, dict[str, str]] = (Match.NONE, {})
    for route in ROUTER.routes:
        match, child = route.matches(scope)
        if match is Match.FULL:
            return match, child.get("path_params", {})
        if match is Match.PARTIAL and partial[0] is Match.NONE:
            partial = (match, child.get("path_params", {}))
    return partial


@pytest.mark.parametrize(("kind", "path"), _paths())
def test_the_table_matches_what_the_router_serves(kind: str, path: str) -> None:
    for method in METHODS if kind == "http" else ("GET",):
        endpoint, params = TABLE.match(kind, method, path)
        match, router_params = _router_match(kind, method, path)
        mounted = any(e.prefix and path.startswith(e.path + "/") for e in TABLE.all)
        if mounted:  # the mount serves any method; the table opens GET and HEAD only
            assert match is Match.FULL
            assert (endpoint is not None) == (method in ("GET", "HEAD")), (method, path)
            assert rule_of(endpoint) is (OPEN if endpoint is not None else ADMIN)
            continue
        # PROTOCOL §6: no endpoint (a 404, or a 405 from a partial match) needs admin.
        assert (endpoint is not None) == (match is Match.FULL), (method, path)
        if endpoint is not None:
            assert params == router_params
        else:
            assert rule_of(endpoint) is ADMIN


def test_each_method_and_path_is_declared_once() -> None:
    seen = [(e.method, e.path) for e in TABLE.all]
    assert len(seen) == len(set(seen))


def test_only_health_the_document_static_files_and_the_peer_proof_are_open() -> None:
    opened = {(e.method, e.path) for e in TABLE.all if e.rule is OPEN}
    assert opened == {
        ("GET", "/healthz"),
        ("GET", "/openapi.json"),
        ("GET", "/console"),
        ("GET", "/sdk"),
        # A node proves itself before anyone sends it a credential (cluster/trust.py).
        ("POST", "/v1/cluster/proof"),
    }


def test_forwarded_endpoints_are_a_subscriptions_and_audited_ones_change_state() -> None:
    for endpoint in TABLE.all:
        if endpoint.coordinated:
            assert endpoint.path.startswith("/v1/subscriptions/{name}")
        if endpoint.audit is not None:
            assert endpoint.method not in ("GET", WEBSOCKET)
            assert endpoint.rule is ADMIN or endpoint.rule.operates


def test_a_row_without_its_openapi_operation_is_refused() -> None:
    async def handler() -> None:
        return None

    with pytest.raises(ValueError, match="no OpenAPI operation"):
        Endpoints([Endpoint("GET", "/v1/new", handler)])
