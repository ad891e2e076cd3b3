"""Every endpoint of the API, declared once (issue 29 item 2; STYLE principle 13).

A row says the method and path, the handler, who may call it (PROTOCOL §6: a row
without a rule needs admin, and so does anything not in the table), the audit event
it records, whether it runs on the subscription's coordinator (PROTOCOL §7), the
body limit it reads under and its OpenAPI operation (server/openapi_paths.py; a
WebSocket's, server/openapi_sockets.py). server/endpoint.py compiles the table; from it come the
Starlette routes, the access check (server/access.py), the audit log, forwarding to
the coordinator (server/coordinated.py), the publish fast path (server/publish.py) and
the ``paths`` and ``x-websockets`` of /openapi.json.
"""

from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import Response

from cluster.trust import PROOF_PATH, ClusterKeys
from herald.protocol import frames
from server import console, openapi
from server import openapi_paths as api
from server import openapi_sockets as sockets
from server.access import AccessGuard
from server.cluster_trust import PROOF_BODY_LIMIT, peer_proof_route
from server.endpoint import (
    ANY_TOKEN,
    METRICS,
    OPEN,
    WEBSOCKET,
    Endpoint,
    Endpoints,
    on_subscription,
    on_topic,
)
from server.http import JSON
from server.publish import publish_route
from server.routes_cluster import fetch_socket, get_cluster, get_lease, get_replication
from server.routes_health import healthz, metrics_route
from server.routes_stats import get_history, get_stats, redrive, stats_socket
from server.routes_subscriptions import (
    ack,
    delete_subscription,
    get_subscription,
    list_subscriptions,
    nack,
    patch_subscription,
    pull,
    put_subscription,
    seek,
)
from server.routes_tokens import mint_route
from server.routes_topics import (
    delete_topic,
    get_topic_route,
    list_topics,
    put_topic,
    read_messages,
)
from server.routes_webhooks import get_attempts, rotate_secret
from server.runtime import services
from server.schemas import socket_frames
from subscribers.websocket import subscription_socket, topic_tail_socket


async def openapi_route(request: Request) -> Response:
    cluster = services(request).config.clustered
    return Response(openapi_document(cluster), media_type=JSON)


@functools.cache
def openapi_document(cluster: bool) -> bytes:
    """/openapi.json, made from the table once per kind of server."""
    table = endpoints(None)
    return openapi.document_bytes(
        cluster=cluster,
        paths=table.openapi_paths(api.PATH_PARAMETERS),
        websockets=table.websocket_docs(),
    )


# Taking a subscription's records or moving its cursor (PROTOCOL §6: of a push
# subscription, admin only; per subscription, the token's subscription patterns too).
_CONSUMES = on_subscription("subscribe", operates=True)


def endpoints(
    guard: AccessGuard | None, keys: ClusterKeys | None = None, url: str = ""
) -> Endpoints:
    """The table. ``guard``: the credentials in force (minting browser tokens signs with
    them); None: an open server. ``keys``: the cluster's shared keys, which the node at
    ``url`` proves it holds (cluster/trust.py); None: not a cluster, or one without."""
    return Endpoints(
        (
            Endpoint("GET", "/healthz", healthz, OPEN, doc=api.HEALTHZ),
            Endpoint("GET", "/metrics", metrics_route, METRICS, doc=api.METRICS),
            Endpoint("GET", "/openapi.json", openapi_route, OPEN, doc=api.OPENAPI),
            # -- topics (PROTOCOL §1, §2)
            Endpoint("GET", "/v1/topics", list_topics, doc=api.LIST_TOPICS),
            # Inspecting a topic: anyone who may publish to it or subscribe on it.
            Endpoint(
                "GET", "/v1/topics/{topic}", get_topic_route, on_topic("topic"), doc=api.GET_TOPIC
            ),
            Endpoint(
                "PUT", "/v1/topics/{topic}", put_topic, audit="topic_created", doc=api.PUT_TOPIC
            ),
            Endpoint(
                "DELETE",
                "/v1/topics/{topic}",
                delete_topic,
                audit="topic_deleted",
                doc=api.DELETE_TOPIC,
            ),
            Endpoint(
                "POST",
                "/v1/topics/{topic}/messages",
                publish_route,
                on_topic("publish"),
                body_limit=None,  # the server's max_request_bytes
                doc=api.PUBLISH,
                hot=True,  # served by server/publish.py without the router
            ),
            Endpoint(
                "GET",
                "/v1/topics/{topic}/partitions/{partition}/messages",
                read_messages,
                on_topic("subscribe"),
                doc=api.READ,
            ),
            Endpoint(
                WEBSOCKET,
                "/v1/topics/{topic}/ws",
                topic_tail_socket,
                on_topic("subscribe"),
                doc=sockets.TOPIC_TAIL_SOCKET | {"frames": socket_frames(frames.TailFrame)},
            ),
            # -- subscriptions (PROTOCOL §2, §3, §8); creating and deleting go to etcd
            # from any node, the rest to the coordinator of an existing subscription.
            Endpoint("GET", "/v1/subscriptions", list_subscriptions, doc=api.LIST_SUBSCRIPTIONS),
            Endpoint(
                "GET",
                "/v1/subscriptions/{name}",
                get_subscription,
                on_subscription("subscribe"),
                coordinated=True,
                doc=api.GET_SUBSCRIPTION,
            ),
            Endpoint(
                "PUT",
                "/v1/subscriptions/{name}",
                put_subscription,
                audit="subscription_created",
                coordinated=True,
                doc=api.PUT_SUBSCRIPTION,
            ),
            Endpoint(
                "PATCH",
                "/v1/subscriptions/{name}",
                patch_subscription,
                audit="subscription_updated",
                coordinated=True,
                doc=api.PATCH_SUBSCRIPTION,
            ),
            Endpoint(
                "DELETE",
                "/v1/subscriptions/{name}",
                delete_subscription,
                audit="subscription_deleted",
                doc=api.DELETE_SUBSCRIPTION,
            ),
            Endpoint(
                "POST",
                "/v1/subscriptions/{name}/seek",
                seek,
                _CONSUMES,
                audit="subscription_seek",
                coordinated=True,
                doc=api.SEEK,
            ),
            Endpoint(
                "POST",
                "/v1/subscriptions/{name}/pull",
                pull,
                _CONSUMES,
                coordinated=True,
                doc=api.PULL,
            ),
            Endpoint(
                "POST",
                "/v1/subscriptions/{name}/ack",
                ack,
                _CONSUMES,
                coordinated=True,
                doc=api.ACK,
            ),
            Endpoint(
                "POST",
                "/v1/subscriptions/{name}/nack",
                nack,
                _CONSUMES,
                coordinated=True,
                doc=api.NACK,
            ),
            Endpoint(
                WEBSOCKET,
                "/v1/subscriptions/{name}/ws",
                subscription_socket,
                _CONSUMES,
                coordinated=True,
                doc=sockets.SUBSCRIPTION_SOCKET | {"frames": socket_frames(frames.ConsumerFrame)},
            ),
            Endpoint(
                "GET",
                "/v1/subscriptions/{name}/attempts",
                get_attempts,
                coordinated=True,
                doc=api.ATTEMPTS,
            ),
            # Rotating a push secret is an operator's act, even for a subscriber of the topic.
            Endpoint(
                "POST",
                "/v1/subscriptions/{name}/push/rotate-secret",
                rotate_secret,
                audit="subscription_secret_rotated",
                coordinated=True,
                doc=api.ROTATE_SECRET,
            ),
            Endpoint(
                "POST",
                "/v1/subscriptions/{name}/redrive",
                redrive,
                audit="subscription_redrive",
                coordinated=True,
                doc=api.REDRIVE,
            ),
            # -- the console's view (PROTOCOL §5)
            Endpoint("GET", "/v1/stats", get_stats, METRICS, doc=api.STATS),
            Endpoint("GET", "/v1/stats/history", get_history, METRICS, doc=api.STATS_HISTORY),
            Endpoint(WEBSOCKET, "/v1/stats/ws", stats_socket, METRICS, doc=sockets.STATS_SOCKET),
            # -- the cluster (PROTOCOL §7); node to node: admin, i.e. the cluster token
            Endpoint("GET", "/v1/cluster", get_cluster, METRICS, doc=api.CLUSTER),
            Endpoint("GET", "/v1/cluster/replication", get_replication, doc=api.REPLICATION),
            Endpoint("GET", "/v1/cluster/lease", get_lease, doc=api.LEASE),
            Endpoint(
                WEBSOCKET, "/v1/cluster/fetch", fetch_socket, doc=sockets.CLUSTER_FETCH_SOCKET
            ),
            # A node proving itself to another: before the asker sends it any credential.
            Endpoint(
                "POST",
                PROOF_PATH,
                peer_proof_route(keys, url),
                OPEN,
                body_limit=PROOF_BODY_LIMIT,
                doc=api.PEER_PROOF,
            ),
            # Minting a browser token: any token, for rights within its own.
            Endpoint("POST", "/v1/tokens", mint_route(guard), ANY_TOKEN, doc=api.MINT_TOKEN),
            # The console's static files and the browser SDK (docs/browser.md): public
            # code, no data; the console's API calls are checked like any other.
            Endpoint("GET", "/console", console.console_app, OPEN, prefix=True),
            Endpoint("GET", "/sdk", console.sdk_app, OPEN, prefix=True),
        )
    )
