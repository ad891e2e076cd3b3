"""Serves the browser console's static files (web_console/static/) at `/console`.

Files are read with aiofiles so a slow disk never blocks the event loop. The
resolved path must stay inside the static folder (no `..`, no symlink escape,
no absolute paths); anything else is a 404. Responses carry an ETag made
of size and mtime, `Cache-Control: no-cache` and a strict Content-Security-Policy, so browsers revalidate and get
a 304 when nothing changed — the console is small, freshness matters more.
"""

from __future__ import annotations

import asyncio
import mimetypes
import stat
from pathlib import Path

import aiofiles
import aiofiles.os
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from server.errors import problem_response

STATIC_DIR = Path(__file__).resolve().parent.parent / "web_console" / "static"
SDK_DIR = STATIC_DIR / "sdk"  # the browser SDK, also served at /sdk (docs/browser.md)

# The SDK is imported by pages of other origins (module scripts are fetched with CORS):
# public code, no data, so any origin may load it.
SDK_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Access-Control-Allow-Origin": "*",
    "Cross-Origin-Resource-Policy": "cross-origin",
}

# The console is its own scripts talking to its own origin: nothing inline, nothing
# third-party, not framed by another site.
SECURITY_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "style-src 'self'; script-src 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "Referrer-Policy": "no-referrer",
}

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".txt": "text/plain; charset=utf-8",
    ".ts": "text/plain; charset=utf-8",  # herald.d.ts (not MPEG transport streams)
}


def resolve(root: Path, relative: str) -> Path | None:
    """The file ``relative`` names under ``root``, or None if it would leave ``root``."""
    if "\x00" in relative or "\\" in relative:
        return None
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return None
    candidate = (root / Path(*parts)) if parts else root / "index.html"
    try:
        real = candidate.resolve(strict=False)
    except (OSError, RuntimeError):
        return None
    if not real.is_relative_to(root.resolve()):
        return None
    return real


def _not_found() -> Response:
    return problem_response(404, "Not Found", "not_found", "no such console file")


async def console_file(
    request: Request,
    root: Path = STATIC_DIR,
    prefix: str = "/console",
    security_headers: dict[str, str] = SECURITY_HEADERS,
) -> Response:
    if request.method not in ("GET", "HEAD"):
        return problem_response(
            405,
            "Method Not Allowed",
            "method_not_allowed",
            "GET only",
            headers={"Allow": "GET, HEAD"},
        )
    # resolve() and stat() touch the disk: off the event loop, like the read.
    relative = request.scope["path"].removeprefix(prefix)
    real = await asyncio.to_thread(resolve, root, relative)
    if real is None:
        return _not_found()
    try:
        info = await aiofiles.os.stat(real)
    except OSError:
        return _not_found()
    if not stat.S_ISREG(info.st_mode):
        return _not_found()
    etag = f'"{info.st_size:x}-{info.st_mtime_ns:x}"'
    headers = {"ETag": etag, **security_headers}
    if etag in {t.strip() for t in request.headers.get("if-none-match", "").split(",")}:
        return Response(status_code=304, headers=headers)
    content_type = CONTENT_TYPES.get(real.suffix) or (
        mimetypes.guess_type(real.name)[0] or "application/octet-stream"
    )
    if request.method == "HEAD":
        headers["Content-Length"] = str(info.st_size)
        return Response(status_code=200, headers=headers, media_type=content_type)
    async with aiofiles.open(real, "rb") as f:
        body = await f.read()
    return Response(body, headers=headers, media_type=content_type)


async def console_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Everything under /console: a Mount, so it is not a documented API route."""
    # "/console" itself never gets here: the router redirects it to "/console/".
    response = await console_file(Request(scope, receive))
    await response(scope, receive, send)


async def sdk_app(scope: Scope, receive: Receive, send: Send) -> None:
    """/sdk/herald.js and /sdk/herald.d.ts (the files of web_console/static/sdk/)."""
    response = await console_file(Request(scope, receive), SDK_DIR, "/sdk", SDK_HEADERS)
    await response(scope, receive, send)
