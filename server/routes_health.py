"""``GET /healthz`` (readiness) and ``GET /metrics`` (Prometheus text)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server import metrics
from server.errors import problem_response
from server.http import push_stats
from server.runtime import services


async def healthz(request: Request) -> Response:
    if services(request).stopping.is_set():
        return problem_response(
            503, "Service Unavailable", "storage_unavailable", "the server is shutting down"
        )
    return Response(b'{"status":"ok"}', media_type="application/json")


async def metrics_route(request: Request) -> Response:
    running = services(request)
    engine = running.engine
    stats = {
        name: engine.stats(name) | push_stats(running.webhooks, name)
        for name in sorted(engine.names())
    }
    topics = sorted(running.storage.topics(), key=lambda t: t.name)
    text = metrics.render(topics, stats, running.publish_duration, running.cluster)
    return Response(text, media_type=metrics.CONTENT_TYPE)
