"""Encryption at rest: plaintext never on disk, restart with the key reads, a wrong key fails
clearly, and recovery still works on the clear framing (storage/encryption.py)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from storage import encryption
from tests.conftest import HeraldProcess

MARKER = "plaintext-marker-7f3a9c"


def key_env(*ids: int) -> dict[str, str]:
    return {encryption.ENV_VAR: "\n".join(encryption.new_key_line(i) for i in ids)}


def files_contain(directory: Path, needle: bytes) -> bool:
    return any(needle in p.read_bytes() for p in directory.rglob("*") if p.is_file())


def read_values(server: HeraldProcess, topic: str) -> list[object]:
    r = httpx.get(f"{server.url}/v1/topics/{topic}/partitions/0/messages?offset=0", timeout=10)
    assert r.status_code == 200, r.text
    return [m["value"] for m in r.json()["messages"]]


def publish(server: HeraldProcess, topic: str, value: str) -> None:
    r = httpx.post(
        f"{server.url}/v1/topics/{topic}/messages",
        json={"messages": [{"value": value, "key": f"{MARKER}-key", "id": f"{MARKER}-{value}"}]},
    )
    assert r.status_code == 200, r.text


def test_records_are_not_on_disk_in_clear_and_read_back_after_restart(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    env = key_env(1)
    server = herald_factory(env=env)
    httpx.put(f"{server.url}/v1/topics/secret", json={"partitions": 1}).raise_for_status()
    publish(server, "secret", MARKER)
    assert server.terminate() == 0
    assert not files_contain(server.data_dir, MARKER.encode())
    server.restart()
    assert read_values(server, "secret") == [MARKER]


def test_rotated_key_reads_old_batches_and_a_wrong_key_fails_clearly(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    old = encryption.new_key_line(1)
    server = herald_factory(env={encryption.ENV_VAR: old})
    httpx.put(f"{server.url}/v1/topics/rot", json={"partitions": 1}).raise_for_status()
    publish(server, "rot", "before")
    server.terminate()

    rotated = old + "\n" + encryption.new_key_line(2)
    server.env = {encryption.ENV_VAR: rotated}
    server.restart()
    publish(server, "rot", "after")  # written with key 2, the highest
    assert read_values(server, "rot") == ["before", "after"]
    server.terminate()

    server.env = {
        encryption.ENV_VAR: encryption.new_key_line(1) + "\n" + encryption.new_key_line(2)
    }
    try:
        server.restart()
    except RuntimeError:
        pass  # refusing to start is a clear failure too, if the log says why
    else:
        r = httpx.get(f"{server.url}/v1/topics/rot/partitions/0/messages?offset=0", timeout=10)
        assert r.status_code == 503
        assert "wrong key" in r.json()["detail"]
        server.terminate()
    assert "wrong key" in server.log()
    # Nothing was cut: with the right keys everything is still there.
    server.env = {encryption.ENV_VAR: rotated}
    server.restart()
    assert read_values(server, "rot") == ["before", "after"]


def test_missing_key_names_the_key_id(herald_factory: Callable[..., HeraldProcess]) -> None:
    server = herald_factory(env=key_env(7))
    httpx.put(f"{server.url}/v1/topics/nokey", json={"partitions": 1}).raise_for_status()
    publish(server, "nokey", "x")
    server.terminate()
    server.env = {}
    try:
        server.restart()
    except RuntimeError:
        pass
    else:
        r = httpx.get(f"{server.url}/v1/topics/nokey/partitions/0/messages?offset=0", timeout=10)
        assert r.status_code == 503 and "key id 7" in r.json()["detail"]
        server.terminate()
    assert "key id 7" in server.log()


@pytest.mark.parametrize("line", ["1:short", "x:AAAA", "0:" + "A" * 44])
def test_bad_key_lines_are_refused(line: str) -> None:
    with pytest.raises(encryption.KeyFileError):
        encryption.Keyring.parse(line)


PUSH_SECRET = "whsec_" + base64.b64encode(b"meta-db-secret-" + MARKER.encode()).decode()
PUSH_URL = f"http://user:{MARKER}-pw@127.0.0.1:9/hook"  # never dialled: only stored


def _make_push_subscription(server: HeraldProcess) -> None:
    httpx.put(f"{server.url}/v1/topics/hooked", json={"partitions": 1}).raise_for_status()
    made = httpx.put(
        f"{server.url}/v1/subscriptions/hook",
        json={"topic": "hooked", "push": {"url": PUSH_URL, "secret": PUSH_SECRET}},
    )
    assert made.status_code == 201, made.text


def _meta_db_holds_a_secret(server: HeraldProcess) -> bool:
    """meta.db and its WAL, byte for byte: the secret, its key, the URL's password."""
    needles = [PUSH_SECRET.encode(), PUSH_SECRET.removeprefix("whsec_").encode(), MARKER.encode()]
    files = [p for p in server.data_dir.glob("meta.db*") if p.is_file()]
    assert files, "no meta.db"
    return any(n in p.read_bytes() for p in files for n in needles)


def test_push_secrets_are_not_in_meta_db_in_clear(
    herald_factory: Callable[..., HeraldProcess],
) -> None:
    """Issue 26 item 9: with encryption at rest, a push subscription's secret and URL
    credentials are sealed in meta.db too, and the subscription comes back after a
    restart."""
    server = herald_factory(env=key_env(1))
    _make_push_subscription(server)
    assert server.terminate() == 0
    assert not _meta_db_holds_a_secret(server)
    server.restart()
    got = httpx.get(f"{server.url}/v1/subscriptions/hook", timeout=10)
    assert got.status_code == 200, got.text
    assert got.json()["config"]["push"]["url"].startswith("http://")


def test_configs_written_before_a_key_are_sealed_once_there_is_one(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "migrated"
    clear = herald_factory(data_dir=data_dir)
    _make_push_subscription(clear)
    assert clear.terminate() == 0
    assert _meta_db_holds_a_secret(clear)  # the premise: no key, in clear

    keyed = herald_factory(data_dir=data_dir, env=key_env(1))
    assert httpx.get(f"{keyed.url}/v1/subscriptions/hook", timeout=10).status_code == 200
    assert keyed.terminate() == 0
    assert not _meta_db_holds_a_secret(keyed)


def test_a_sealed_config_without_its_key_refuses_the_start(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "sealed"
    keyed = herald_factory(data_dir=data_dir, env=key_env(1))
    _make_push_subscription(keyed)
    assert keyed.terminate() == 0
    for path in data_dir.rglob("*.log"):  # only meta.db needs the key now
        path.unlink()
    keyless = HeraldProcess(data_dir)
    try:
        with pytest.raises(RuntimeError, match="key id 1"):
            keyless.start()
    finally:
        keyless.kill()  # reaped, had it started
