"""The auth file is reloaded on change and on SIGHUP, and a bad file keeps the old tokens."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest
import websockets

from server.auth import new_token, toml_entry
from tests.conftest import PROJECT_ROOT, HeraldProcess
from tests.helpers import wait_until, wait_until_sync
from tests.security.conftest import write_auth_file


def status_with(server: HeraldProcess, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{server.url}/v1/topics", headers=headers, timeout=10).status_code


def add_admin(auth_file: Path) -> str:
    token_id, token = new_token()
    auth_file.write_text(auth_file.read_text() + "\n" + toml_entry(token_id, token, ["admin"], []))
    return token


def test_changed_file_is_reloaded_and_a_bad_one_keeps_the_old_tokens(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    auth_file = tmp_path / "auth.toml"
    first = write_auth_file(auth_file, {"admin": (["admin"], [])})["admin"]
    server = herald_factory("--auth-file", str(auth_file))
    assert status_with(server, first) == 200

    second = add_admin(auth_file)
    wait_until_sync(lambda: status_with(server, second) == 200)

    auth_file.write_text(auth_file.read_text() + "\n[tokens.zz\n")  # not TOML
    wait_until_sync(lambda: "not reloaded" in server.log())
    assert status_with(server, first) == 200
    assert status_with(server, second) == 200


def test_sighup_reloads_even_when_the_mtime_did_not_move(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    auth_file = tmp_path / "auth.toml"
    first = write_auth_file(auth_file, {"admin": (["admin"], [])})["admin"]
    entries = auth_file.read_text()
    placeholder_id, placeholder = new_token()
    auth_file.write_text(entries + "\n" + toml_entry(placeholder_id, placeholder, ["admin"], []))
    server = herald_factory("--auth-file", str(auth_file))
    before = auth_file.stat()
    token_id, second = new_token()  # in the placeholder's place: the same size
    # Written and stamped aside, then moved in: the file never shows the watcher (which
    # looks every second) a new mtime.
    aside = tmp_path / "auth.toml.new"
    aside.write_text(entries + "\n" + toml_entry(token_id, second, ["admin"], []))
    os.utime(aside, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(aside, auth_file)
    changed = auth_file.stat()
    assert (changed.st_mtime_ns, changed.st_size) == (before.st_mtime_ns, before.st_size)
    assert status_with(server, second) == 401  # nothing for the watcher
    os.kill(server.pid, signal.SIGHUP)
    wait_until_sync(lambda: status_with(server, second) == 200)
    assert status_with(server, first) == 200


def test_a_file_rewritten_within_one_tick_of_its_mtime_is_reloaded(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    """A file rewritten in place (truncated, then written: what most tools and
    Path.write_text do) can keep its mtime when both writes fall within one tick of the
    clock that stamps it; the server read it half-written at load 30 and never again. Its
    size tells the watcher."""
    auth_file = tmp_path / "auth.toml"
    first = write_auth_file(auth_file, {"admin": (["admin"], [])})["admin"]
    server = herald_factory("--auth-file", str(auth_file))
    before = auth_file.stat()
    second = add_admin(auth_file)
    os.utime(auth_file, ns=(before.st_atime_ns, before.st_mtime_ns))
    wait_until_sync(lambda: status_with(server, second) == 200)
    assert status_with(server, first) == 200


def test_a_bad_auth_file_at_startup_is_fatal(tmp_path: Path) -> None:
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text('[tokens.1234abcd]\nhash = "plain"\nroles = ["admin"]\n')
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--port", "0", "--auth-file", str(auth_file),
         "--data-dir", str(tmp_path / "d")],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "hash must be" in done.stderr


def test_token_create_prints_a_token_and_only_its_hash_for_the_file(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "token", "create", "--role", "publish",
         "--topics", "orders.*"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    # `herald token create … >> auth.toml`: stdout is only the file's lines; the token
    # goes to stderr, which says so.
    token = done.stderr.splitlines()[0].removeprefix("token: ")
    entry = done.stdout
    assert token.startswith("hrd_") and token not in entry
    assert "stderr" in done.stderr and ">> auth.toml" in done.stderr
    assert 'roles = ["publish"]' in entry and 'topics = ["orders.*"]' in entry
    from server.auth import Credentials

    (tmp_path / "auth.toml").write_text(entry)
    principal = Credentials(tmp_path / "auth.toml").verify(token)
    assert principal is not None and principal.may("publish", "orders.eu")
    assert not principal.may("publish", "billing") and not principal.may("subscribe", "orders.eu")


async def test_open_websockets_lose_access_when_the_file_takes_it_away(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    """A removed token's consumers are closed 4401, a narrowed one's 4403 (their in-flight
    records go back at once); a token the new file keeps as it was stays connected."""
    auth_file = tmp_path / "auth.toml"
    specs = {
        "admin": (["admin"], []),
        "leaving": (["subscribe"], ["orders.*"]),
        "narrowed": (["subscribe"], ["orders.*"]),
        "staying": (["subscribe"], ["orders.*"]),
    }
    tokens = write_auth_file(auth_file, specs)
    server = herald_factory("--auth-file", str(auth_file))
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    async with httpx.AsyncClient(base_url=server.url, headers=admin, timeout=30) as http:
        for name in ("leaving", "narrowed", "staying"):
            body = {"topic": "orders.a", "ack_deadline_ms": 600_000}
            reply = await http.put(f"/v1/subscriptions/s-{name}", json=body)
            assert reply.status_code == 201, reply.text
        reply = await http.post("/v1/topics/orders.a/messages", json={"messages": [{"value": 1}]})
        assert reply.status_code == 200

        async with contextlib.AsyncExitStack() as stack:
            await _revocation_rounds(stack, server, http, tokens, auth_file)


def take_access_away(auth_file: Path) -> None:
    """The new file: "leaving" gone, "narrowed" on other topics, the rest unchanged."""
    sections = {}
    for chunk in auth_file.read_text().split("# ")[1:]:
        who, _, entry = chunk.partition("\n")
        sections[who] = entry
    del sections["leaving"]
    sections["narrowed"] = sections["narrowed"].replace('"orders.*"', '"other.*"')
    auth_file.write_text("\n".join(f"# {who}\n{entry}" for who, entry in sections.items()))


async def _revocation_rounds(
    stack: contextlib.AsyncExitStack,
    server: HeraldProcess,
    http: httpx.AsyncClient,
    tokens: dict[str, str],
    auth_file: Path,
) -> None:
    sockets = {}
    for name in ("leaving", "narrowed", "staying"):
        url = server.url.replace("http", "ws", 1) + f"/v1/subscriptions/s-{name}/ws?credit=5"
        ws = await stack.enter_async_context(
            websockets.connect(url, additional_headers={"Authorization": f"Bearer {tokens[name]}"})
        )
        assert orjson.loads(await ws.recv())["type"] == "ready"
        assert orjson.loads(await ws.recv())["type"] == "deliver"  # in flight, not acked
        sockets[name] = ws

    take_access_away(auth_file)
    os.kill(server.pid, signal.SIGHUP)

    for name, code in (("leaving", 4401), ("narrowed", 4403)):
        with pytest.raises(websockets.ConnectionClosed) as closed:
            async with asyncio.timeout(15):
                while True:
                    await sockets[name].recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == code, name

    async def given_back(name: str) -> bool:
        stats = (await http.get(f"/v1/subscriptions/s-{name}")).json()["stats"]
        return bool(stats["in_flight"] == 0)

    for name in ("leaving", "narrowed"):
        await wait_until(lambda n=name: given_back(n), what=f"{name}'s in-flight record given back")

    staying = sockets["staying"]
    await staying.send(orjson.dumps({"type": "credit", "n": 1}).decode())
    reply = await http.post("/v1/topics/orders.a/messages", json={"messages": [{"value": 2}]})
    assert reply.status_code == 200
    frame = orjson.loads(await asyncio.wait_for(staying.recv(), 15))
    assert frame["type"] == "deliver" and frame["messages"][0]["value"] == 2
