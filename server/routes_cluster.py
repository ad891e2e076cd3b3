"""`GET /v1/cluster` (PROTOCOL §7): the nodes of the cluster and what each leads.

A single node (no ``--cluster``) is a cluster of one with no name: it is live, and it
leads every partition it has.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from server.routing import method_route
from server.runtime import services


async def get_cluster(request: Request) -> Response:
    state = services(request)
    node = state.config.node_id
    leads = sum(len(topic.partitions) for topic in state.storage.topics())
    url = str(request.base_url).rstrip("/")
    body = {
        "name": None,
        "node": node,
        "nodes": [{"id": node, "url": url, "live": True, "leads": leads}],
    }
    return Response(orjson.dumps(body), media_type="application/json")


routes = [method_route("/v1/cluster", GET=get_cluster)]
