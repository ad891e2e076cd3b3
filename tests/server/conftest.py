"""Every answer the API tests of this folder get from a server is checked against the
server's own OpenAPI document (issue 29: the document validates every response the suite
sees). Schemathesis does the checking, as it does for the fuzzed requests of
tests/security/test_fuzz_api.py; here the requests are the tests' own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server import conformance


@pytest.fixture(autouse=True)
def responses_follow_the_document(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    disagreements: list[str] = []
    sync_send, async_send = httpx.Client.send, httpx.AsyncClient.send

    def send(client: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        response = sync_send(client, request, **kwargs)
        if (found := conformance(response)) is not None:
            disagreements.append(found)
        return response

    async def send_async(
        client: httpx.AsyncClient, request: httpx.Request, **kwargs: Any
    ) -> httpx.Response:
        response = await async_send(client, request, **kwargs)
        if (found := conformance(response)) is not None:
            disagreements.append(found)
        return response

    monkeypatch.setattr(httpx.Client, "send", send)
    monkeypatch.setattr(httpx.AsyncClient, "send", send_async)
    yield
    assert not disagreements, "answers the OpenAPI document does not describe:\n" + "\n".join(
        disagreements
    )
