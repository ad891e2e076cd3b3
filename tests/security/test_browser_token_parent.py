"""PROTOCOL §6 (settled 2026-11-26): a browser token has, at every use, the rights it was
minted with intersected with its parent's rights at that moment, and spends its parent's
rate-limit bucket under the parent's current limits (issue 26, item 6).

The attacks: narrowing the parent left its browser token reading, minting and opening
tails until it expired; a browser token minted before the parent's limits changed had a
bucket of its own that each alternating use reset, so parent and child together
published hundreds of times the parent's rate.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import websockets

from server.auth import new_signing_key_line, new_token, toml_entry
from tests.conftest import HeraldProcess
from tests.helpers import wait_until_sync

_SIGNING_KEYS: dict[Path, str] = {}  # one signing key per auth file, kept across edits


def _auth_file(path: Path, entries: list[str]) -> None:
    keys = _SIGNING_KEYS.setdefault(path, new_signing_key_line())
    path.write_text("\n".join(entries) + "\n" + keys)


def _entry(token_id: str, token: str, topics: list[str], extra: str = "") -> str:
    return toml_entry(token_id, token, ["publish", "subscribe"], topics) + extra


def _reload(server: HeraldProcess) -> None:
    os.kill(server.pid, signal.SIGHUP)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _mint(server: HeraldProcess, token: str, **rights: list[str]) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/tokens", json={"ttl_ms": 3_600_000, **rights}, headers=_bearer(token)
    )


async def _tail_close_code(url: str, token: str) -> int | None:
    ws_url = url.replace("http", "ws", 1) + "/v1/topics/orders.a/ws?from=earliest"
    async with websockets.connect(ws_url, additional_headers=_bearer(token), open_timeout=60) as ws:
        try:
            async with asyncio.timeout(30):
                async for _ in ws:
                    pass
        except websockets.ConnectionClosed:
            pass
        except TimeoutError:
            return None
        return ws.close_code


def test_a_browser_token_loses_what_its_parent_loses(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    auth_file = tmp_path / "auth.toml"
    admin_id, admin = new_token()
    parent_id, parent = new_token()
    admin_entry = toml_entry(admin_id, admin, ["admin"], [])
    parent_entry = _entry(parent_id, parent, ["orders.*"])
    _auth_file(auth_file, [admin_entry, parent_entry])
    server = herald_factory("--auth-file", str(auth_file))
    made = httpx.put(f"{server.url}/v1/topics/orders.a", json={}, headers=_bearer(admin))
    assert made.status_code == 201, made.text
    minted = _mint(server, parent, subscribe=["orders.a"], publish=["orders.a"])
    assert minted.status_code == 201, minted.text
    child = minted.json()["token"]
    read = f"{server.url}/v1/topics/orders.a/partitions/0/messages"
    assert httpx.get(read, headers=_bearer(child)).status_code == 200

    # The operator narrows the parent to other topics (same token, same hash).
    narrowed = parent_entry.replace('topics = ["orders.*"]', 'topics = ["other.*"]')
    assert narrowed != parent_entry
    _auth_file(auth_file, [admin_entry, narrowed])
    _reload(server)
    wait_until_sync(
        lambda: httpx.get(read, headers=_bearer(parent)).status_code == 403,
        within=60,
        what="the reload",
    )
    assert httpx.get(read, headers=_bearer(child)).status_code == 403
    published = httpx.post(
        f"{server.url}/v1/topics/orders.a/messages",
        json={"messages": [{"value": 1}]},
        headers=_bearer(child),
    )
    assert published.status_code == 403
    assert _mint(server, child, subscribe=["orders.a"]).status_code == 403
    assert asyncio.run(_tail_close_code(server.url, child)) == 4403


def test_a_browser_token_spends_its_parents_bucket_under_its_current_limits(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    auth_file = tmp_path / "auth.toml"
    parent_id, parent = new_token()
    generous = _entry(parent_id, parent, ["orders.*"], "messages_per_second = 1000\n")
    _auth_file(auth_file, [generous])
    server = herald_factory("--auth-file", str(auth_file))
    minted = _mint(server, parent, publish=["orders.a"])
    assert minted.status_code == 201, minted.text
    child = minted.json()["token"]

    # The operator lowers the parent's limit to 2 messages a second.
    _auth_file(auth_file, [generous.replace("= 1000", "= 2")])
    _reload(server)

    def publish(token: str, messages: int = 1) -> int:
        return httpx.post(
            f"{server.url}/v1/topics/orders.a/messages",
            json={"messages": [{"value": k} for k in range(messages)]},
            headers=_bearer(token),
        ).status_code

    def over_the_lower_limit() -> bool:
        # 50 messages at once are admitted into a full bucket and leave it 48 in debt
        # (24 s at 2 a second), so the next publish is refused however slow the machine
        # (a count of refusals over time depended on it and failed at load 30).
        publish(parent, 50)
        return publish(parent) == 429

    wait_until_sync(over_the_lower_limit, within=60, what="the lower limit")
    # The child spends that same bucket, in debt: refused at once. Its own bucket, or the
    # parent's under the limit the child was minted with (1000), would admit it.
    assert publish(child) == 429
