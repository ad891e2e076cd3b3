"""CORS for the HTTP API (docs/browser.md): only the configured origins, preflights answered
without a token, refusals readable by the page. Real server, real HTTP."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.conftest import PROJECT_ROOT, HeraldProcess
from tests.security.conftest import write_auth_file

APP = "https://app.example"
DEV = "http://localhost:5173"


def preflight(url: str, origin: str, method: str = "POST") -> httpx.Response:
    return httpx.options(
        url,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": "authorization, content-type",
        },
        timeout=30,
    )


def test_configured_origins_get_preflights_and_headers(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    tokens = write_auth_file(tmp_path / "auth.toml", {"admin": (["admin"], [])})
    server = herald_factory(
        "--auth-file", str(tmp_path / "auth.toml"), "--cors-origin", APP, "--cors-origin", DEV
    )
    url = f"{server.url}/v1/topics/t/messages"
    for origin in (APP, DEV):
        ok = preflight(url, origin)  # no token: a preflight carries none
        assert ok.status_code == 200, ok.text
        assert ok.headers["access-control-allow-origin"] == origin
        assert "POST" in ok.headers["access-control-allow-methods"]
        allowed = ok.headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed and "content-type" in allowed
    refused = preflight(url, "https://evil.example")
    assert refused.status_code == 400
    assert "access-control-allow-origin" not in refused.headers

    admin = {"Authorization": f"Bearer {tokens['admin']}", "Origin": APP}
    published = httpx.post(url, json={"messages": [{"value": 1}]}, headers=admin, timeout=30)
    assert published.status_code == 200, published.text
    assert published.headers["access-control-allow-origin"] == APP
    assert "x-request-id" in published.headers["access-control-expose-headers"].lower()
    # A refusal is readable by the page too (it must see 401 to fetch a fresh token).
    anonymous = httpx.post(
        url, json={"messages": [{"value": 1}]}, headers={"Origin": APP}, timeout=30
    )
    assert anonymous.status_code == 401
    assert anonymous.headers["access-control-allow-origin"] == APP
    other = httpx.get(
        f"{server.url}/healthz", headers={"Origin": "https://evil.example"}, timeout=30
    )
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers


def test_no_origin_is_allowed_by_default(herald_server: HeraldProcess) -> None:
    url = f"{herald_server.url}/v1/topics/t/messages"
    assert "access-control-allow-origin" not in preflight(url, APP).headers
    r = httpx.post(url, json={"messages": [{"value": 1}]}, headers={"Origin": APP}, timeout=10)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_env_variable_sets_origins(tmp_path: Path) -> None:
    server = HeraldProcess(tmp_path / "data", env={"HERALD_CORS_ORIGINS": f"{APP}, {DEV}"})
    server.start()
    try:
        r = preflight(f"{server.url}/v1/topics", DEV, "GET")
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == DEV
    finally:
        server.terminate()


def test_a_bad_origin_is_refused_at_startup(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--port", "0", "--data-dir",
         str(tmp_path / "d"), "--cors-origin", "https://app.example/path"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "cors_origins" in done.stderr
