"""`GET /v1/cluster` (PROTOCOL §7), and the routes nodes use among themselves.

A single node (no ``--cluster``) is a cluster of one with no name: it is live, and it
leads every partition it has. In a cluster the answer lists the live members (a node
is live while it holds its etcd lease) and, as an extension (docs/protocol.md), every
partition as its leader reports it — gathered from the live nodes'
``GET /v1/cluster/replication`` — with each follower's lag in records.

``/v1/cluster/fetch`` is the replication connection (cluster/wire.py): a WebSocket on
which a follower node sends fetch requests and its leader answers them in order.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from cluster.wire import BadMessage, decode_request
from herald.protocol.errors import NotFound
from server.errors import InvalidFrame, close_socket
from server.runtime import Services, app_services, services

log = logging.getLogger("herald.server")


async def get_cluster(request: Request) -> Response:
    state = services(request)
    node = state.config.node_id
    if state.cluster is None:
        leads = sum(len(topic.partitions) for topic in state.storage.topics())
        url = str(request.base_url).rstrip("/")
        body: dict[str, Any] = {
            "name": None,
            "node": node,
            "nodes": [
                {
                    "id": node,
                    "url": url,
                    "live": True,
                    "leads": leads,
                    "credentials": getattr(request.state, "credentials_digest", None),
                }
            ],
            "partitions": [
                {
                    "topic": topic.name,
                    "partition": p.partition,
                    "leader": node,
                    "epoch": 0,
                    "replicas": [node],
                    "isr": [node],
                    "high_watermark": p.end_offset,
                    "log_end": p.end_offset,
                    "lag": {},
                }
                for topic in state.storage.topics()
                for p in topic.partitions
            ],
            "subscriptions": [
                {"name": name, "coordinator": node} for name in sorted(state.engine.names())
            ],
        }
        return Response(orjson.dumps(body), media_type="application/json")
    reports = await node_reports(state, getattr(request.state, "credentials_digest", None))
    body = {
        "name": state.cluster.name,
        "node": node,
        # PROTOCOL §7 (stale reads): whether this node holds its etcd lease right now.
        "holds_lease": state.cluster.membership.holds_lease(),
        "nodes": _nodes(state, reports),
        "partitions": cluster_partitions_of(state, reports),
        "subscriptions": [
            {
                "name": name,
                "coordinator": (
                    coordinator.node
                    if (coordinator := state.cluster.coordinators.get(name)) is not None
                    else None
                ),
            }
            for name in sorted(state.cluster.subscriptions)
        ],
    }
    return Response(orjson.dumps(body), media_type="application/json")


def _nodes(state: Services, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The live members, and the nodes the partitions name that are not live (a dead
    node's key is gone from etcd: it is shown not live, with the URL it last had).

    ``credentials``: the digest of the credentials file each node has loaded now, as its
    report says (null for a node without one, or that did not answer): revocations and
    rate limits are per node (docs/security.md), and a mismatch shows here."""
    assert state.cluster is not None
    live = state.cluster.membership.members
    counts = state.cluster.leader_counts()
    digests = {r.get("node"): r.get("credentials") for r in reports}
    return [
        {
            "id": node,
            "url": url,
            "live": node in live,
            "leads": counts.get(node, 0),
            "credentials": digests.get(node) if node in live else None,
        }
        for node, url in sorted(state.cluster.known_nodes().items())
    ]


def _members(state: Services) -> list[tuple[str, str, int]]:
    assert state.cluster is not None
    counts = state.cluster.leader_counts()
    members = state.cluster.membership.members
    return [(node, members[node].url, counts.get(node, 0)) for node in sorted(members)]


async def node_reports(state: Services, own_digest: str | None) -> list[dict[str, Any]]:
    """This node's replication report and every other live node's."""
    cluster, peers = state.cluster, state.peers
    assert cluster is not None and peers is not None
    own = _report(state, own_digest)
    others = [url for node, url, _ in _members(state) if node != cluster.node_id]
    return [own, *await peers.replication(others)]


def _report(state: Services, digest: str | None) -> dict[str, Any]:
    assert state.cluster is not None
    return {
        "node": state.cluster.node_id,
        "partitions": state.cluster.replication_report(),
        "credentials": digest,
    }


async def cluster_partitions(state: Services) -> list[dict[str, Any]]:
    """Every partition, as its live leader reports it (etcd's view where none answers)."""
    return cluster_partitions_of(state, await node_reports(state, None))


def cluster_partitions_of(state: Services, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cluster = state.cluster
    assert cluster is not None
    reported = {
        (p["topic"], p["partition"]): p
        for report in reports
        for p in report["partitions"]
        if isinstance(p, dict) and "topic" in p and "partition" in p  # else: no report
    }
    rows = []
    for (topic, number), _versioned in sorted(cluster.states.items()):
        if topic not in cluster.topics:
            continue
        row = reported.get((topic, number))
        if row is None:
            summary = cluster.partition_summary(topic, number)
            del summary["leader_url"]  # GET /v1/cluster names each node's URL once
            row = {
                "topic": topic,
                "partition": number,
                **summary,
                "high_watermark": None,
                "log_end": None,
                "lag": {},
            }
        rows.append(row)
    return rows


async def get_replication(request: Request) -> Response:
    """The partitions this node leads, as their leader sees them (node to node)."""
    state = services(request)
    if state.cluster is None:
        raise NotFound("not a cluster")
    body = _report(state, getattr(request.state, "credentials_digest", None))
    return Response(orjson.dumps(body), media_type="application/json")


async def get_lease(request: Request) -> Response:
    """How long ago this node sent the last renewal of its lease that etcd answered (node
    to node; cluster/fence.py): another node that cannot renew its own tells from it
    whether etcd is down for every node or for that node alone (PROTOCOL §7)."""
    state = services(request)
    if state.cluster is None:
        raise NotFound("not a cluster")
    ago = state.cluster.membership.renewed_ago_s()
    body = {
        "node": state.cluster.node_id,
        "renewed_ms_ago": None if ago is None else round(ago * 1000, 3),
    }
    return Response(orjson.dumps(body), media_type="application/json")


async def fetch_socket(websocket: WebSocket) -> None:
    state = app_services(websocket.app)
    if state.cluster is None:
        await close_socket(websocket, NotFound("not a cluster"))
        return
    await websocket.accept()
    node = state.cluster
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes") or message.get("text")
            if data is None:
                continue
            try:
                fetch = decode_request(data)
            except BadMessage as exc:
                await close_socket(websocket, InvalidFrame(str(exc)))
                return
            await websocket.send_bytes(await node.serve_fetch(fetch))
    except WebSocketDisconnect:
        return
