"""Every endpoint of the API, declared once (issue 29 item 2; STYLE principle 13).

A row says the method and path, the handler, who may call it (PROTOCOL §6: a row
without a rule needs admin, and so does anything not in the table), the audit event
it records, whether it runs on the subscription's coordinator (PROTOCOL §7) and the
body limit it reads under. server/endpoint.py compiles the table; from it come the
Starlette routes, the access check (server/access.py), the audit log, forwarding to
the coordinator (server/coordinated.py) and the publish fast path (server/publish.py).
"""

from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import Response

from server import console, openapi
from server.access import AccessGuard
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
from subscribers.websocket import subscription_socket, topic_tail_socket


async def openapi_route(request: Request) -> Response:
    cluster = services(request).config.clustered
    return Response(openapi_document(cluster), media_type=JSON)


@functools.cache
def openapi_document(cluster: bool) -> bytes:
    """/openapi.json, built once per kind of server."""
    return openapi.document_bytes(cluster=cluster)


# Taking a subscription's records or moving its cursor (PROTOCOL §6: of a push
# subscription, admin only; per subscription, the token's subscription patterns too).
_CONSUMES = on_subscription("subscribe", operates=True)


def endpoints(guard: AccessGuard | None) -> Endpoints:
    """The table. ``guard``: the credentials in force (minting browser tokens signs with
    them); None: an open server."""
    return Endpoints(
        (
            Endpoint("GET", "/healthz", healthz, OPEN),
            Endpoint("GET", "/metrics", metrics_route, METRICS),
            Endpoint("GET", "/openapi.json", openapi_route, OPEN),
            # -- topics (PROTOCOL §1, §2)
            Endpoint("GET", "/v1/topics", list_topics),
            # Inspecting a topic: anyone who may publish to it or subscribe on it.
            Endpoint("GET", "/v1/topics/{topic}", get_topic_route, on_topic("topic")),
            Endpoint("PUT", "/v1/topics/{topic}", put_topic, audit="topic_created"),
            Endpoint("DELETE", "/v1/topics/{topic}", delete_topic, audit="topic_deleted"),
            Endpoint(
                "POST",
                "/v1/topics/{topic}/messages",
                publish_route,
                on_topic("publish"),
                body_limit=None,  # the server's max_request_bytes
            ),
            Endpoint(
                "GET",
                "/v1/topics/{topic}/partitions/{partition}/messages",
                read_messages,
                on_topic("subscribe"),
            ),
            Endpoint(WEBSOCKET, "/v1/topics/{topic}/ws", topic_tail_socket, on_topic("subscribe")),
            # -- subscriptions (PROTOCOL §2, §3, §8); creating and deleting go to etcd
            # from any node, the rest to the coordinator of an existing subscription.
            Endpoint("GET", "/v1/subscriptions", list_subscriptions),
            Endpoint(
                "GET",
                "/v1/subscriptions/{name}",
                get_subscription,
                on_subscription("subscribe"),
                coordinated=True,
            ),
            Endpoint(
                "PUT",
                "/v1/subscriptions/{name}",
                put_subscription,
                audit="subscription_created",
                coordinated=True,
            ),
            Endpoint(
                "PATCH",
                "/v1/subscriptions/{name}",
                patch_subscription,
                audit="subscription_updated",
                coordinated=True,
            ),
            Endpoint(
                "DELETE",
                "/v1/subscriptions/{name}",
                delete_subscription,
                audit="subscription_deleted",
            ),
            Endpoint(
                "POST",
                "/v1/subscriptions/{name}/seek",
                seek,
                _CONSUMES,
                audit="subscription_seek",
                coordinated=True,
            ),
            Endpoint("POST", "/v1/subscriptions/{name}/pull", pull, _CONSUMES, coordinated=True),
            Endpoint("POST", "/v1/subscriptions/{name}/ack", ack, _CONSUMES, coordinated=True),
            Endpoint("POST", "/v1/subscriptions/{name}/nack", nack, _CONSUMES, coordinated=True),
            Endpoint(
                WEBSOCKET,
                "/v1/subscriptions/{name}/ws",
                subscription_socket,
                _CONSUMES,
                coordinated=True,
            ),
            Endpoint("GET", "/v1/subscriptions/{name}/attempts", get_attempts, coordinated=True),
            # Rotating a push secret is an operator's act, even for a subscriber of the topic.
            Endpoint(
                "POST",
                "/v1/subscriptions/{name}/push/rotate-secret",
                rotate_secret,
                audit="subscription_secret_rotated",
                coordinated=True,
            ),
            Endpoint(
                "POST",
                "/v1/subscriptions/{name}/redrive",
                redrive,
                audit="subscription_redrive",
                coordinated=True,
            ),
            # -- the console's view (PROTOCOL §5)
            Endpoint("GET", "/v1/stats", get_stats, METRICS),
            Endpoint("GET", "/v1/stats/history", get_history, METRICS),
            Endpoint(WEBSOCKET, "/v1/stats/ws", stats_socket, METRICS),
            # -- the cluster (PROTOCOL §7); node to node: admin, i.e. the cluster token
            Endpoint("GET", "/v1/cluster", get_cluster, METRICS),
            Endpoint("GET", "/v1/cluster/replication", get_replication),
            Endpoint("GET", "/v1/cluster/lease", get_lease),
            Endpoint(WEBSOCKET, "/v1/cluster/fetch", fetch_socket),
            # Minting a browser token: any token, for rights within its own.
            Endpoint("POST", "/v1/tokens", mint_route(guard), ANY_TOKEN),
            # The console's static files and the browser SDK (docs/browser.md): public
            # code, no data; the console's API calls are checked like any other.
            Endpoint("GET", "/console", console.console_app, OPEN, prefix=True),
            Endpoint("GET", "/sdk", console.sdk_app, OPEN, prefix=True),
        )
    )
