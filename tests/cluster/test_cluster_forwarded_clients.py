"""The per-address cap (PROTOCOL §6, `--max-requests-per-client`) counts clients, not the
nodes that forward for them (issue 26, item 8).

The attack it reproduces: every request a node forwards to another (a consumer relayed to
its subscription's coordinator, a publish to its partition's leader, a pull) arrived from
the forwarding node's address, so one client that parked as many consumers as the cap
through one node filled the cap of that node's address at the other node, and every
other client's forwarded requests were refused there (429) — "256 parked long-polls by one
client made the leader answer 429 to another client's publish".

Now a node proves it is one (the cluster token) and names the client it forwards for: the
other node counts that client, and not the node. The header naming the client is believed
from an authenticated node only.

Clients here have their own loopback addresses (127.0.0.2, …): the nodes listen on
127.0.0.1 and call each other from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import orjson
import pytest
import websockets

from server.peers import CLIENT, PEER_AUTHORIZATION
from tests.cluster.nodes import ClusterNode, HeraldCluster
from tests.cluster.test_cluster_subscriptions import wait_coordinated
from tests.security.conftest import write_auth_file

CAP = 8
PARKER, OTHER, FORGER = "127.0.0.2", "127.0.0.3", "127.0.0.4"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def _consumers(
    url: str, token: str, count: int, source: str, headers: dict[str, str] | None = None
) -> AsyncIterator[list[int | None]]:
    """``count`` consumers of ``parked`` through ``url`` from address ``source``, each
    open once its `ready` frame came (from the coordinator, through a relay); yields
    what refused any of them (close codes; empty when all are open)."""
    ws_url = url.replace("http", "ws", 1) + "/v1/subscriptions/parked/ws?credit=1"
    async with contextlib.AsyncExitStack() as stack:
        refused: list[int | None] = []
        for _ in range(count):
            ws = await stack.enter_async_context(
                websockets.connect(
                    ws_url,
                    additional_headers={**_bearer(token), **(headers or {})},
                    open_timeout=60,
                    local_addr=(source, 0),
                )
            )
            try:
                async with asyncio.timeout(60):
                    ready = orjson.loads(await ws.recv())
                assert ready["type"] == "ready", ready
            except websockets.ConnectionClosed as exc:
                refused.append(exc.rcvd.code if exc.rcvd else None)
        yield refused


def _past_503(call: Callable[[], httpx.Response], attempts: int = 30) -> httpx.Response:
    """PROTOCOL §7: a 503 (a leader or coordinator moving on a loaded machine) is retried;
    any other answer is the one the test judges (a 429 is never retried)."""
    for _ in range(attempts - 1):
        answer = call()
        if answer.status_code != 503:
            return answer
        time.sleep(1)
    return call()


def _client(source: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=60)


@pytest.fixture
def tokens(tmp_path: Path) -> dict[str, str]:
    return write_auth_file(
        tmp_path / "auth.toml",
        {"admin": (["admin"], []), "app": (["publish", "subscribe"], ["busy"])},
    )


def capped_cluster(tmp_path: Path, tokens: dict[str, str], size: int) -> HeraldCluster:
    """``size`` nodes with the credentials file, the per-address cap of CAP, and the
    nodes' token for each other; the test client speaks as admin."""
    cluster = HeraldCluster(
        tmp_path / "cluster",
        size,
        extra_args=[
            *("--auth-file", str(tmp_path / "auth.toml")),
            *("--max-requests-per-client", str(CAP)),
        ],
        env={"HERALD_CLUSTER_TOKEN": tokens["admin"]},
    )
    cluster.http.headers["Authorization"] = f"Bearer {tokens['admin']}"
    return cluster


def parked_subscription(cluster: HeraldCluster, partitions: int) -> ClusterNode:
    """Topic `busy` of ``partitions`` and its subscription `parked`, made through n1;
    returns the node coordinating `parked`."""
    cluster.create_topic("busy", partitions=partitions)
    made = cluster.put("n1", "/v1/subscriptions/parked", {"topic": "busy"})
    assert made.status_code == 201, made.text
    owner = cluster.nodes[wait_coordinated(cluster, "parked")]
    # Every node knows it (one whose watch lags answers 404, or closes with 4404).
    cluster.wait_known_everywhere("/v1/subscriptions/parked")
    return owner


def test_a_client_parking_the_cap_through_a_node_leaves_other_clients_served(
    tmp_path: Path, tokens: dict[str, str]
) -> None:
    cluster = capped_cluster(tmp_path, tokens, 3)
    with cluster:
        coordinator = parked_subscription(cluster, 3)
        entry = next(n for n in cluster.nodes.values() if n is not coordinator)
        led = [
            p
            for p in range(3)
            if cluster.partition_state("busy", p)["leader"] == coordinator.node_id
        ]
        assert led, "the coordinator leads one of the 3 partitions"
        app = tokens["app"]

        async def scenario() -> None:
            # One client parks as many consumers as the cap through the entry node: each is
            # relayed to the coordinator.
            async with _consumers(entry.url, app, CAP, PARKER) as refused:
                assert refused == []
                # The cap still holds at the entry node ...
                async with _consumers(entry.url, app, 1, PARKER) as over:
                    assert over == [1013]
                with _client(PARKER) as parker:
                    # ... and the coordinator counts the relayed consumers as that client's.
                    direct = parker.get(f"{coordinator.url}/v1/topics/busy", headers=_bearer(app))
                    assert direct.status_code == 429, direct.text
                with _client(OTHER) as other:
                    # Another client's publish through the entry node, to a partition the
                    # coordinator leads: forwarded there, and served.
                    published = _past_503(
                        lambda: other.post(
                            f"{entry.url}/v1/topics/busy/messages",
                            json={"messages": [{"id": "m1", "value": 1, "partition": led[0]}]},
                            headers=_bearer(app),
                        )
                    )
                    assert published.status_code == 200, published.text
                    pulled = _past_503(
                        lambda: other.post(
                            f"{entry.url}/v1/subscriptions/parked/pull",
                            json={"max_messages": 1},
                            headers=_bearer(app),
                        )
                    )
                    assert pulled.status_code == 200, pulled.text

        asyncio.run(scenario())


def test_a_client_naming_another_client_is_not_believed(
    tmp_path: Path, tokens: dict[str, str]
) -> None:
    """Without the cluster token, `herald-client` changes nothing: a client that names a
    different address on each request is still counted under its own."""
    cluster = capped_cluster(tmp_path, tokens, 2)
    with cluster:
        coordinator = parked_subscription(cluster, 1)
        app = tokens["app"]
        forged = {CLIENT: "127.0.0.9", PEER_AUTHORIZATION: f"Bearer {app}"}  # not a node's

        async def scenario() -> None:
            async with _consumers(coordinator.url, app, CAP, FORGER, forged) as refused:
                assert refused == []
                async with _consumers(coordinator.url, app, 1, FORGER, forged) as over:
                    assert over == [1013]
            with _client(FORGER) as forger:
                # Never echoed, never a 500: just not believed.
                answer = forger.get(
                    f"{coordinator.url}/v1/topics/busy",
                    headers={**_bearer(app), CLIENT: "not an address"},
                )
                assert answer.status_code == 200, answer.text

        asyncio.run(scenario())
