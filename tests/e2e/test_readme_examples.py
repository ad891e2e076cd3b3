"""The README's Python examples, taken from README.md itself and run as written against a
real server (only the URL and the secret are swapped for the test's), in the README's
order and on the state its curl and CLI steps leave. A README edit that breaks an example
breaks this test."""

from __future__ import annotations

import base64
import re
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import PROJECT_ROOT, START_TIMEOUT_S, HeraldProcess, free_port
from tests.helpers import wait_until_sync

README = PROJECT_ROOT / "README.md"
README_URL = "http://127.0.0.1:8080"
RUN_TIMEOUT_S = 120


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), re.S | re.M)


def block_with(text: str) -> str:
    (block,) = [b for b in python_blocks() if text in b]
    return block


def console_output_after(command: str) -> list[str]:
    """The lines the README shows under ``$ command`` in a console block."""
    text = README.read_text(encoding="utf-8")
    after = text.split(f"$ {command}\n", 1)[1]
    return after.split("```", 1)[0].splitlines()


def run_example(code: str, url: str, tmp_path: Path, name: str) -> list[str]:
    script = tmp_path / f"{name}.py"
    script.write_text(code.replace(README_URL, url), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture
def readme_server(herald_factory: Callable[..., HeraldProcess]) -> HeraldProcess:
    """A fresh server with what the README's curl steps make before its first example."""
    server = herald_factory()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.put("/v1/topics/orders").status_code in (200, 201)
        messages = [{"value": {"item": "book", "qty": 1}, "key": "alice"}, {"value": "hello"}]
        assert http.post("/v1/topics/orders/messages", json={"messages": messages}).is_success
        created = http.put(
            "/v1/subscriptions/orders-worker", json={"topic": "orders", "start": "earliest"}
        )
        assert created.status_code == 201, created.text
    return server


def test_the_producer_consumer_pull_and_admin_examples_run_as_written(
    readme_server: HeraldProcess, tmp_path: Path
) -> None:
    url = readme_server.url
    consumed = run_example(block_with("Consumer("), url, tmp_path, "consume")
    assert consumed == console_output_after("python consume.py")

    # The CLI step publishes an object and a string (not every record is an object).
    with httpx.Client(base_url=url, timeout=30) as http:
        messages = [{"value": {"item": "pen", "qty": 2}, "key": "carol"}, {"value": "plain text"}]
        assert http.post("/v1/topics/orders/messages", json={"messages": messages}).is_success
    pulled = run_example(block_with("Puller("), url, tmp_path, "pull")  # it ends
    assert pulled == ["0-5 {'item': 'pen', 'qty': 2}", "0-6 plain text"]
    with httpx.Client(base_url=url, timeout=30) as http:
        stats = http.get("/v1/subscriptions/orders-worker").json()["stats"]
    assert (stats["acked_total"], stats["backlog"]) == (7, 0)

    assert run_example(block_with("Admin("), url, tmp_path, "admin") == ["50"]
    with httpx.Client(base_url=url, timeout=30) as http:
        config = http.get("/v1/subscriptions/orders-worker").json()["config"]
    assert (config["max_in_flight"], config["dead_letter_topic"]) == (50, None)


def test_the_webhook_receiver_takes_single_and_batch_subscriptions(
    readme_server: HeraldProcess, tmp_path: Path
) -> None:
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
    receiver = block_with("def hook(").replace('SECRET = "whsec_..."', f'SECRET = "{secret}"')
    (tmp_path / "receiver.py").write_text(receiver, encoding="utf-8")
    port = free_port()
    out = tmp_path / "receiver.out"
    with out.open("wb") as sink:
        uvicorn = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "receiver:app", "--port", str(port)],
            cwd=tmp_path,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        hook = f"http://127.0.0.1:{port}/hook"

        def up() -> bool:
            assert uvicorn.poll() is None, out.read_text(errors="replace")
            return _answers(f"http://127.0.0.1:{port}/")

        # A Python process's start took more than 10 s on this host under load.
        wait_until_sync(up, within=START_TIMEOUT_S, what="uvicorn up")
        url = readme_server.url
        with httpx.Client(base_url=url, timeout=30) as http:
            # As the README subscribes it, and the same with batches (its "Batches" shape).
            push = {"url": hook, "secret": secret}
            batched = {**push, "batch": {"max_records": 100, "max_wait_ms": 500}}
            for name, body in (("orders-hook", push), ("orders-batch", batched)):
                answer = http.put(
                    f"/v1/subscriptions/{name}",
                    json={"topic": "orders", "dead_letter_topic": "orders-dead", "push": body},
                )
                assert answer.status_code == 201, answer.text
            sent = http.post(
                "/v1/topics/orders/messages", json={"messages": [{"value": {"order": 1}}]}
            )
            assert sent.is_success, sent.text
            record_id = f"0-{sent.json()['results'][0]['offset']}"

            def acked(name: str) -> bool:
                stats = http.get(f"/v1/subscriptions/{name}").json()["stats"]
                return bool(stats["backlog"] == 0 and stats["acked_total"] >= 1)

            wait_until_sync(lambda: acked("orders-hook") and acked("orders-batch"), within=30)
            for name in ("orders-hook", "orders-batch"):
                stats = http.get(f"/v1/subscriptions/{name}").json()["stats"]
                assert stats["dead_lettered_total"] == 0
                assert stats["last_status"] == 204
    finally:
        uvicorn.terminate()
        uvicorn.wait(timeout=30)
    printed = out.read_text(encoding="utf-8")
    assert "Traceback" not in printed
    assert printed.count(f"got {record_id} {{'order': 1}} attempt 1") == 2, printed


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.TransportError:
        return False
    return True
