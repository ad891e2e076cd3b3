"""PROTOCOL §6 (settled 2026-11-26): with a credentials file, webhooks cannot reach inside.

A push `url` whose host is, in any spelling, or resolves to a loopback, private,
link-local (cloud metadata), CGNAT, unspecified or multicast address is refused at
configuration (400 naming `push.url`) and again at every connection, after resolution:
a destination stored while it was allowed is not reached once it is not
(`--webhook-allow-cidr` dropped at a restart), which is what a DNS name that rebinds to
an inside address meets too. Non-admins see a failure's category, and a push url
without user info or query.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.conftest import HeraldProcess, free_port
from tests.helpers import wait_until_sync
from tests.security.conftest import write_auth_file
from tests.webhooks.receiver import Receiver, body_json

SECRET = "whsec_" + base64.b64encode(b"d" * 32).decode()
TOKENS = {
    "admin": (["admin"], []),
    "reader": (["subscribe", "publish"], ["dest.*"]),
    "metrics": (["metrics"], []),
}

# Every spelling of an inside address the issue found accepted, and the ranges of §6.
INSIDE = [
    "http://127.0.0.1:{port}/hook",
    "http://127.1:{port}/hook",
    "http://2130706433:{port}/hook",
    "http://0x7f000001:{port}/hook",
    "http://0177.0.0.1:{port}/hook",
    "http://[::ffff:127.0.0.1]:{port}/hook",
    "http://[::1]:{port}/hook",
    "http://localhost:{port}/hook",
    "http://0.0.0.0:{port}/hook",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://10.1.2.3/hook",
    "http://172.16.0.1/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",
    "http://224.0.0.1/hook",
    "http://[fe80::1]/hook",
    "http://[64:ff9b::7f00:1]/hook",
]


def _server(
    factory: Callable[..., HeraldProcess], tmp_path: Path, *flags: str
) -> tuple[HeraldProcess, dict[str, str]]:
    auth_file = tmp_path / "auth.toml"
    tokens = write_auth_file(auth_file, TOKENS)
    return factory("--auth-file", str(auth_file), *flags), tokens


def _put(server: HeraldProcess, token: str, name: str, url: str) -> httpx.Response:
    body = {"topic": "dest.t", "start": "earliest", "push": {"url": url, "secret": SECRET}}
    return httpx.put(
        f"{server.url}/v1/subscriptions/{name}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def test_inside_destinations_are_refused_at_configuration_in_every_spelling(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    server, tokens = _server(herald_factory, tmp_path)
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    port = free_port()
    accepted = []
    for i, template in enumerate(INSIDE):
        url = template.format(port=port)
        r = _put(server, tokens["admin"], f"in-{i}", url)
        if r.status_code != 400 or "push.url" not in r.json()["detail"]:
            accepted.append((url, r.status_code, r.text[:200]))
    assert accepted == []
    # PATCH is the other way to set a url.
    made = httpx.put(
        f"{server.url}/v1/subscriptions/plain", json={"topic": "dest.t"}, headers=admin
    )
    assert made.status_code == 201, made.text
    patched = httpx.patch(
        f"{server.url}/v1/subscriptions/plain",
        json={"push": {"url": f"http://127.1:{port}/", "secret": SECRET}},
        headers=admin,
    )
    assert (patched.status_code, patched.json()["code"]) == (400, "validation_error")
    assert "push.url" in patched.json()["detail"]
    # A public destination is still accepted (nothing is sent to it: no records).
    assert _put(server, tokens["admin"], "public", "https://93.184.215.14/hook").status_code == 201


def test_allowed_ranges_and_servers_without_credentials_reach_loopback(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    allowing, tokens = _server(herald_factory, tmp_path, "--webhook-allow-cidr", "127.0.0.0/8")
    by_env = herald_factory(
        "--auth-file", str(tmp_path / "auth.toml"),
        env={"HERALD_WEBHOOK_ALLOW_CIDR": "10.0.0.0/8, 127.0.0.0/8"},
    )  # fmt: skip
    open_server = herald_factory()
    with Receiver([SECRET]) as receiver:
        for i, server in enumerate((allowing, by_env, open_server)):
            made = _put(server, tokens["admin"], "hooked", receiver.url)
            assert made.status_code == 201, made.text
            r = httpx.post(
                f"{server.url}/v1/topics/dest.t/messages",
                json={"messages": [{"value": i}]},
                headers={"Authorization": f"Bearer {tokens['admin']}"},
            )
            assert r.status_code == 200, r.text
        # Record ids repeat across servers: the values tell them apart.
        receiver.wait_for(
            lambda: {body_json(r)["value"] for r in receiver.snapshot()} == {0, 1, 2}, timeout=60
        )
        # [::1] is not in 127.0.0.0/8: still refused where only that range is allowed.
        refused = _put(allowing, tokens["admin"], "v6", f"http://[::1]:{free_port()}/")
        assert refused.status_code == 400


def test_a_stored_inside_destination_is_refused_at_connection(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    """The check is made again at every connection, after resolution: a url stored
    while its range was allowed is not reached after a restart without the allowance,
    as a name that later resolves inside (DNS rebinding) is not."""
    data_dir = tmp_path / "data"
    auth_file = tmp_path / "auth.toml"
    tokens = write_auth_file(auth_file, TOKENS)
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    reader = {"Authorization": f"Bearer {tokens['reader']}"}
    server = herald_factory(
        "--auth-file", str(auth_file), "--webhook-allow-cidr", "127.0.0.0/8", data_dir=data_dir
    )
    with Receiver([SECRET]) as receiver:
        # localhost: a name, resolved at each connection.
        url = receiver.url.replace("127.0.0.1", "localhost") + "?key=hunter2"
        body = {"topic": "dest.t", "start": "earliest", "push": {"url": url, "secret": SECRET}}
        made = httpx.put(f"{server.url}/v1/subscriptions/hooked", json=body, headers=admin)
        assert made.status_code == 201, made.text  # (localhost is 127.0.0.1 only here)
        server.terminate()
        restarted = herald_factory("--auth-file", str(auth_file), data_dir=data_dir)
        r = httpx.post(
            f"{restarted.url}/v1/topics/dest.t/messages",
            json={"messages": [{"value": "inside"}]},
            headers=admin,
        )
        assert r.status_code == 200, r.text

        def failed() -> bool:
            got = httpx.get(f"{restarted.url}/v1/subscriptions/hooked", headers=reader).json()
            return got["stats"].get("last_error") is not None

        wait_until_sync(failed, within=60)
        shown = httpx.get(f"{restarted.url}/v1/subscriptions/hooked", headers=reader).json()
        assert shown["stats"]["last_error"] == "destination not allowed"
        # A non-admin sees the url without its query (credentials hide there).
        assert shown["config"]["push"]["url"] == url.split("?")[0]
        as_admin = httpx.get(f"{restarted.url}/v1/subscriptions/hooked", headers=admin).json()
        assert as_admin["config"]["push"]["url"] == url

        def stats_url(who: str) -> str:
            got = httpx.get(
                f"{restarted.url}/v1/stats", headers={"Authorization": f"Bearer {tokens[who]}"}
            ).json()
            (hooked,) = [s for s in got["subscriptions"] if s["name"] == "hooked"]
            shown: str = hooked["config"]["push"]["url"]
            return shown

        assert stats_url("metrics") == url.split("?")[0]
        assert stats_url("admin") == url
        assert receiver.snapshot() == [], "nothing reached the inside receiver"


def test_non_admins_see_categories_of_connection_errors(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    server, tokens = _server(herald_factory, tmp_path, "--webhook-allow-cidr", "127.0.0.0/8")
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    reader = {"Authorization": f"Bearer {tokens['reader']}"}
    with Receiver([SECRET]) as receiver:
        # TLS spoken to a plain HTTP port: the error text would name the TLS failure.
        tls_url = receiver.url.replace("http://", "https://")
        assert _put(server, tokens["admin"], "tls", tls_url).status_code == 201
        assert (
            httpx.post(
                f"{server.url}/v1/topics/dest.t/messages",
                json={"messages": [{"value": 1}]},
                headers=admin,
            ).status_code
            == 200
        )

        def last_error() -> str | None:
            got = httpx.get(f"{server.url}/v1/subscriptions/tls", headers=reader).json()
            error: str | None = got["stats"].get("last_error")
            return error

        wait_until_sync(lambda: last_error() is not None, within=60)
        assert last_error() == "tls error"
