"""The /console static handler: content types, caching, and no way out of its folder."""

from __future__ import annotations

import httpx


def test_index_and_assets_have_types_and_etags(herald_url: str) -> None:
    redirect = httpx.get(f"{herald_url}/console")
    assert redirect.status_code in (307, 308)
    assert redirect.headers["location"].endswith("/console/")
    index = httpx.get(f"{herald_url}/console/")
    assert index.status_code == 200
    assert index.headers["content-type"].startswith("text/html")
    assert "<title>Herald console</title>" in index.text
    script = httpx.get(f"{herald_url}/console/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    etag = script.headers["etag"]
    assert script.headers["cache-control"] == "no-cache"
    again = httpx.get(f"{herald_url}/console/app.js", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert "script-src 'self'" in index.headers["content-security-policy"]
    head = httpx.head(f"{herald_url}/console/app.js")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(script.content))
    post = httpx.post(f"{herald_url}/console/app.js")
    assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"


def test_static_handler_refuses_path_traversal(herald_url: str) -> None:
    for raw in (
        b"/console/../server/app.py",
        b"/console/%2e%2e/%2e%2e/pyproject.toml",
        b"/console/..%2f..%2fpyproject.toml",
        b"/console/%2e%2e%5c%2e%2e%5cpyproject.toml",
        b"/console//etc/passwd",
        b"/console/nope.js",
    ):
        # httpx would normalise the dots away; send the raw target as a browser could not.
        request = httpx.Request("GET", f"{herald_url}/", extensions={"target": raw})
        with httpx.Client() as client:
            response = client.send(request)
        assert response.status_code == 404, raw
        assert b"[project]" not in response.content and b"root:" not in response.content
