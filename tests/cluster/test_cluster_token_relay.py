"""A consumer relayed by a node that does not coordinate its subscription (PROTOCOL §7)
keeps its token out of both nodes' logs (issue 26, item 1): whichever way the client
gave it (the `herald.token.<token>` subprotocol, `?token=`), the relay passes it on as
`Authorization`, never in the URL, and both nodes scrub what they log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
import websockets

from server.access import SUBPROTOCOL, TOKEN_SUBPROTOCOL
from tests.cluster.nodes import HeraldCluster
from tests.cluster.test_cluster_subscriptions import wait_coordinated
from tests.security.conftest import write_auth_file


async def _first_record(ws_url: str, **options: object) -> dict[str, object]:
    async with websockets.connect(ws_url, open_timeout=60, **options) as ws:  # type: ignore[arg-type]
        ready = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
        assert ready["type"] == "ready", ready
        deliver = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
        assert deliver["type"] == "deliver", deliver
        record: dict[str, object] = deliver["messages"][0]
        return record


def test_a_relayed_consumers_token_reaches_no_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth_file = tmp_path / "auth.toml"
    tokens = write_auth_file(
        auth_file, {"admin": (["admin"], []), "reader": (["subscribe"], ["relay.*"])}
    )
    # The nodes' token for each other (env only), inherited by the node processes.
    monkeypatch.setenv("HERALD_CLUSTER_TOKEN", tokens["admin"])
    cluster = HeraldCluster(
        tmp_path / "cluster", 2, extra_args=["--auth-file", str(auth_file), "--access-log"]
    )
    cluster.http.headers["Authorization"] = f"Bearer {tokens['admin']}"
    with cluster:
        cluster.create_topic("relay.t", partitions=1, replication_factor=2)
        made = cluster.put("n1", "/v1/subscriptions/relayed", {"topic": "relay.t"})
        assert made.status_code == 201, made.text
        owner = wait_coordinated(cluster, "relayed")
        # Every node knows it (one whose watch lags answers 404, or closes with 4404).
        cluster.wait_known_everywhere("/v1/subscriptions/relayed")
        other = next(n for n in cluster.nodes if n != owner)
        published = cluster.post("n1", "/v1/topics/relay.t/messages", {"messages": [{"value": 7}]})
        assert published.status_code == 200, published.text

        base = cluster.nodes[other].url.replace("http", "ws", 1) + "/v1/subscriptions/relayed/ws"
        # A subscribe token: any node serves its subscription (issue 26 item 8).
        token = tokens["reader"]
        by_subprotocol = asyncio.run(
            _first_record(f"{base}?credit=1", subprotocols=[SUBPROTOCOL, TOKEN_SUBPROTOCOL + token])
        )
        assert by_subprotocol["value"] == 7
        by_query = asyncio.run(_first_record(f"{base}?credit=1&token={token}"))
        assert by_query["value"] == 7  # redelivered: the first consumer never acked

        for node in cluster.nodes.values():
            log = node.log()
            assert "WebSocket" in log or "ws" in log
            for token in tokens.values():
                # The whole secret (after ``hrd_<id>_``): it may hold ``_`` itself, and
                # the part after its last one can be short enough to match by chance.
                assert token.split("_", 2)[2] not in log, node.node_id
