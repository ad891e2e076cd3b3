"""A Herald server with an auth file of one token per role (PROTOCOL §6)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from server.auth import new_token, toml_entry
from tests.conftest import HeraldProcess

# name -> (roles, topic patterns)
TOKENS: dict[str, tuple[list[str], list[str]]] = {
    "admin": (["admin"], []),
    "metrics": (["metrics"], []),
    "publisher": (["publish"], ["orders.*"]),
    "subscriber": (["subscribe"], ["orders.*"]),
    "stranger": (["publish", "subscribe"], ["other.*"]),
}


@dataclass
class Secured:
    server: HeraldProcess
    auth_file: Path
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    def headers(self, who: str | None) -> dict[str, str]:
        return {} if who is None else {"Authorization": f"Bearer {self.tokens[who]}"}


def write_auth_file(path: Path, tokens: dict[str, tuple[list[str], list[str]]]) -> dict[str, str]:
    clear: dict[str, str] = {}
    lines = []
    for who, (roles, topics) in tokens.items():
        token_id, token = new_token()
        clear[who] = token
        lines.append(f"# {who}\n" + toml_entry(token_id, token, roles, topics))
    path.write_text("\n".join(lines))
    return clear


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("secured")
    auth_file = base / "auth.toml"
    tokens = write_auth_file(auth_file, TOKENS)
    server = HeraldProcess(
        base / "data",
        extra_args=["--auth-file", str(auth_file), "--audit-log", str(base / "audit.jsonl")],
    ).start()
    s = Secured(server, auth_file, tokens)
    admin = s.headers("admin")
    httpx.put(f"{s.url}/v1/topics/orders.a", json={"partitions": 1}, headers=admin)
    httpx.put(f"{s.url}/v1/subscriptions/s-orders", json={"topic": "orders.a"}, headers=admin)
    try:
        yield s
    finally:
        server.terminate()
