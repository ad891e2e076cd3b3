"""PROTOCOL §6 (settled 2026-11-26): rights per subscription (issue 26, item 5).

The attack: any token with `subscribe` on `orders` pulled and acked another team's
push subscription's records (which its endpoint then never got) and could seek it.
Now a token may be narrowed to subscription name patterns (`subscriptions = [...]` in
the auth file), and pull, ack, nack, seek and consumers of a push subscription need
`admin`; reading its state (GET) still needs only `subscribe` on its topic.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from pathlib import Path

import httpx
import websockets

from server.auth import new_token, toml_entry
from tests.conftest import HeraldProcess, free_port

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _consumer_close_code(url: str, name: str, token: str) -> int | None:
    ws_url = url.replace("http", "ws", 1) + f"/v1/subscriptions/{name}/ws?credit=10"
    async with websockets.connect(ws_url, additional_headers=_bearer(token), open_timeout=60) as ws:
        try:
            async with asyncio.timeout(30):
                async for _ in ws:
                    pass
        except websockets.ConnectionClosed:
            pass
        return ws.close_code


def test_subscription_patterns_and_push_subscriptions_are_enforced(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    tokens: dict[str, str] = {}
    entries = []
    for who, roles, extra in (
        ("admin", ["admin"], ""),
        ("team_a", ["subscribe"], 'subscriptions = ["team-a.*"]\n'),
        ("plain", ["subscribe"], ""),
    ):
        token_id, token = new_token()
        tokens[who] = token
        entries.append(
            toml_entry(token_id, token, roles, [] if who == "admin" else ["orders*"]) + extra
        )
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text("\n".join(entries))
    # The push endpoint is a closed loopback port (allowed here): deliveries just fail.
    server = herald_factory("--auth-file", str(auth_file), "--webhook-allow-cidr", "127.0.0.0/8")
    admin = _bearer(tokens["admin"])
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.put("/v1/topics/orders", json={}, headers=admin).status_code == 201
        for name, extra in (
            ("team-a.pull", {}),
            ("team-b.pull", {}),
            ("hook", {"push": {"url": f"http://127.0.0.1:{free_port()}/", "secret": SECRET}}),
        ):
            body = {"topic": "orders", "start": "earliest", **extra}
            made = http.put(f"/v1/subscriptions/{name}", json=body, headers=admin)
            assert made.status_code == 201, made.text
        published = http.post(
            "/v1/topics/orders/messages", json={"messages": [{"value": 1}]}, headers=admin
        )
        assert published.status_code == 200

        def status(who: str, verb: str, name: str) -> int:
            headers = _bearer(tokens[who])
            if verb == "get":
                return http.get(f"/v1/subscriptions/{name}", headers=headers).status_code
            body = {
                "pull": {"max_messages": 1, "wait_ms": 0},
                "ack": {"ids": ["0-0"]},
                "nack": {"ids": ["0-0"]},
                "seek": {"to": "earliest"},
            }[verb]
            return http.post(
                f"/v1/subscriptions/{name}/{verb}", json=body, headers=headers
            ).status_code

        # Subscription name patterns.
        assert status("team_a", "pull", "team-a.pull") == 200
        for verb in ("get", "pull", "ack", "nack", "seek"):
            assert status("team_a", verb, "team-b.pull") == 403, verb
        assert (
            asyncio.run(_consumer_close_code(server.url, "team-b.pull", tokens["team_a"])) == 4403
        )
        # A token without patterns keeps every subscription of its topics ...
        assert status("plain", "pull", "team-b.pull") == 200
        # ... but a push subscription's records are its endpoint's: admin only.
        assert status("plain", "get", "hook") == 200
        for verb in ("pull", "ack", "nack", "seek"):
            assert status("plain", verb, "hook") == 403, verb
        assert asyncio.run(_consumer_close_code(server.url, "hook", tokens["plain"])) == 4403
        assert status("admin", "seek", "hook") == 200
