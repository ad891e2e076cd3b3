"""Guessing at a real token id costs the server an HMAC, not a scrypt (issue 26, item 9).

Tokens carry 256 random bits, so the auth file stores a salted HMAC-SHA256 of each
(`hmac-sha256$…`); files written by older versions hold scrypt hashes, which keep
working. A guess with a real id used to cost one scrypt (~55 ms of server CPU): 100
guesses were over 5 s of CPU. The bound below (2 s for 100 guesses, HTTP included) is
40x what they cost now and well under what one scrypt each would cost.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

import httpx

from server.auth import new_token, scrypt_hash, toml_entry
from tests.conftest import HeraldProcess

GUESSES = 100
CPU_BOUND_S = 2.0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _guesses_cpu(server: HeraldProcess, token_id: str) -> float:
    before = _cpu_seconds(server.pid)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for _ in range(GUESSES):
            guess = f"hrd_{token_id}_{secrets.token_urlsafe(32)}"
            r = http.get("/v1/stats", headers={"Authorization": f"Bearer {guess}"})
            assert r.status_code == 401
    return _cpu_seconds(server.pid) - before


def test_new_tokens_are_hmac_hashed_and_guesses_at_a_real_id_are_cheap(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    new_id, new = new_token()
    old_id, old = new_token()
    entry = toml_entry(new_id, new, ["admin"], [])
    assert 'hash = "hmac-sha256$' in entry and new not in entry
    # An auth file of an older version: a scrypt hash.
    old_entry = f'[tokens.{old_id}]\nhash = "{scrypt_hash(old)}"\nroles = ["admin"]\n'
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text(entry + "\n" + old_entry)
    server = herald_factory("--auth-file", str(auth_file))
    for token in (new, old):
        r = httpx.get(f"{server.url}/v1/stats", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text

    spent = _guesses_cpu(server, new_id)
    assert spent < CPU_BOUND_S, f"{GUESSES} guesses cost {spent:.2f} s of server CPU"
    # The old entry, once its token was used, is checked with an HMAC too.
    spent = _guesses_cpu(server, old_id)
    assert spent < CPU_BOUND_S, f"{GUESSES} guesses cost {spent:.2f} s of server CPU"
    for token in (new, old):  # and the real tokens still work
        r = httpx.get(f"{server.url}/v1/stats", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
