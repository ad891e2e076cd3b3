"""One route per path with a handler per method, so a 405 lists every allowed method.

Starlette tries routes in order and answers 405 from the first one whose path
matched, so two ``Route`` objects on one path would give an ``Allow`` header
that names only one of them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

Handler = Callable[[Request], Awaitable[Response]]


def method_route(path: str, **handlers: Handler) -> Route:
    """``method_route("/x", GET=get_x, PUT=put_x)``."""
    table = {method.upper(): handler for method, handler in handlers.items()}
    if "GET" in table:
        table.setdefault("HEAD", table["GET"])

    async def dispatch(request: Request) -> Response:
        return await table[request.method](request)

    dispatch.__name__ = "_".join(h.__name__ for h in handlers.values())
    return Route(path, dispatch, methods=list(table))
