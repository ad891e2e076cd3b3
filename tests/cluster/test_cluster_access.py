"""PROTOCOL §6 and §7 together (issue 26, item 8): with a credentials file, any node serves
everything a token allows — a subscribe token pulls, acks, nacks, seeks, reads the stats
of and consumes its subscription through every node, not only through the subscription's
coordinator — and every node refuses the same things: another team's subscription (name
patterns), a push subscription's records (admin only), a subscription on a topic the token
has no right on, and a missing one (403, not 404: only admins learn which exist).

The attack it reproduces: the access check looked the subscription up in the node's own
delivery engine, which runs only the subscriptions the node coordinates, so a subscribe
token got 403 / 4403 at two nodes out of three.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import httpx
import orjson
import websockets

from server.auth import credentials_digest, new_token, toml_entry
from tests.cluster.nodes import HeraldCluster
from tests.cluster.test_cluster_subscriptions import wait_coordinated
from tests.conftest import free_port

ALLOW_LOOPBACK = ("--webhook-allow-cidr", "127.0.0.0/8")
SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
VERBS = {
    "pull": {"max_messages": 1, "wait_ms": 10_000},
    "ack": {"ids": ["0-0"]},
    "nack": {"ids": ["0-0"]},
    "seek": {"to": "earliest"},
}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _auth_file(path: Path) -> dict[str, str]:
    tokens: dict[str, str] = {}
    entries = []
    for who, roles, topics, extra in (
        ("admin", ["admin"], [], ""),
        ("reader", ["subscribe"], ["orders*"], ""),
        ("team_a", ["subscribe"], ["orders*"], 'subscriptions = ["team-a.*"]\n'),
    ):
        token_id, token = new_token()
        tokens[who] = token
        entries.append(toml_entry(token_id, token, roles, topics) + extra)
    path.write_text("\n".join(entries))
    return tokens


async def _first_delivery(url: str, name: str, token: str) -> dict[str, object] | int | None:
    """The first record a consumer is sent through the node at ``url``, or the close code
    it was refused with."""
    ws_url = url.replace("http", "ws", 1) + f"/v1/subscriptions/{name}/ws?credit=1"
    try:
        async with websockets.connect(
            ws_url, additional_headers=_bearer(token), open_timeout=60
        ) as ws:
            async with asyncio.timeout(60):
                async for frame in ws:
                    message = orjson.loads(frame)
                    if message["type"] == "deliver":
                        record: dict[str, object] = message["messages"][0]
                        return record
    except websockets.ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd else None
    return None


def test_a_subscribe_token_is_served_on_every_subscription_route_by_every_node(
    tmp_path: Path,
) -> None:
    tokens = _auth_file(tmp_path / "auth.toml")
    hook_port = free_port()
    cluster = HeraldCluster(
        tmp_path / "cluster",
        3,
        # The push endpoint is a closed loopback port (allowed here): deliveries just fail.
        extra_args=[*("--auth-file", str(tmp_path / "auth.toml")), *ALLOW_LOOPBACK],
        env={"HERALD_CLUSTER_TOKEN": tokens["admin"]},
    )
    cluster.http.headers["Authorization"] = f"Bearer {tokens['admin']}"
    with cluster:
        cluster.create_topic("orders", partitions=1)
        cluster.create_topic("payments", partitions=1)
        for name, topic, extra in (
            ("team-a.pull", "orders", {}),
            ("team-b.pull", "orders", {}),
            ("payments.pull", "payments", {}),
            (
                "hook",
                "orders",
                {"push": {"url": f"http://127.0.0.1:{hook_port}/", "secret": SECRET}},
            ),
        ):
            body = {"topic": topic, "start": "earliest", **extra}
            made = cluster.put("n1", f"/v1/subscriptions/{name}", body)
            assert made.status_code == 201, made.text
            wait_coordinated(cluster, name)
        cluster.wait_known_everywhere("/v1/subscriptions/hook")
        # PROTOCOL §7: 503 leader_unavailable (a leader change on a loaded machine) appended
        # nothing and is retried; the ids make a retry of anything else a no-op.
        batch = {"messages": [{"id": f"m{i}", "value": i} for i in range(3)]}
        cluster.wait_for(
            lambda: cluster.post("n1", "/v1/topics/orders/messages", batch).status_code == 200,
            60.0,
            "the records published",
        )

        with httpx.Client(timeout=60) as http:

            def call(url: str, who: str, verb: str, name: str) -> httpx.Response:
                if verb == "get":
                    return http.get(f"{url}/v1/subscriptions/{name}", headers=_bearer(tokens[who]))
                return http.post(
                    f"{url}/v1/subscriptions/{name}/{verb}",
                    json=VERBS[verb],
                    headers=_bearer(tokens[who]),
                )

            for node in cluster.nodes.values():
                url = node.url
                # Allowed: every route of its own subscription, at every node.
                consumed = asyncio.run(_first_delivery(url, "team-a.pull", tokens["team_a"]))
                assert isinstance(consumed, dict), (node.node_id, consumed)
                pulled = call(url, "team_a", "pull", "team-a.pull")
                assert pulled.status_code == 200, (node.node_id, pulled.text)
                messages = pulled.json()["messages"]
                assert messages, node.node_id  # 3 records; at most 1 was in flight
                acked = http.post(
                    f"{url}/v1/subscriptions/team-a.pull/ack",
                    json={"ids": [messages[0]["id"]]},
                    headers=_bearer(tokens["team_a"]),
                )
                assert acked.status_code == 200, (node.node_id, acked.text)
                assert acked.json()["ok"] == [messages[0]["id"]]
                for verb in ("nack", "seek", "get"):
                    answer = call(url, "team_a", verb, "team-a.pull")
                    assert answer.status_code in (200, 204), (node.node_id, verb, answer.text)
                # A token without name patterns, on any pull subscription of its topics.
                assert call(url, "reader", "get", "team-b.pull").status_code == 200
                assert call(url, "reader", "seek", "team-b.pull").status_code == 200
                # Refused, at every node alike.
                for verb in ("get", *VERBS):
                    for who, name in (
                        ("team_a", "team-b.pull"),  # its name patterns do not match
                        ("reader", "payments.pull"),  # not its topic
                        ("reader", "missing"),  # 403, not 404
                    ):
                        refused = call(url, who, verb, name)
                        assert refused.status_code == 403, (node.node_id, who, verb, name)
                    if verb != "get":  # a push subscription's state: readable, not operable
                        refused = call(url, "reader", verb, "hook")
                        assert refused.status_code == 403, (node.node_id, verb, refused.text)
                assert call(url, "reader", "get", "hook").status_code == 200
                for who, name in (
                    ("team_a", "team-b.pull"),
                    ("reader", "payments.pull"),
                    ("reader", "hook"),
                ):
                    closed = asyncio.run(_first_delivery(url, name, tokens[who]))
                    assert closed == 4403, (node.node_id, who, name, closed)


def test_each_node_shows_the_digest_of_its_credentials_and_a_mismatch_shows(
    tmp_path: Path,
) -> None:
    """Revocation and rate limits are per node (docs/security.md): GET /v1/cluster shows
    the digest of each node's credentials file, the same for the same tokens however the
    file is laid out, different while an edit has reached one node only."""
    files = {node: tmp_path / f"auth-{node}.toml" for node in ("n1", "n2")}
    tokens = _auth_file(files["n1"])
    text = files["n1"].read_text()
    # The same tokens, laid out differently: comments and blank lines do not count.
    files["n2"].write_text("# copied by hand\n\n" + text.replace("\n\n", "\n\n\n"))
    cluster = HeraldCluster(
        tmp_path / "cluster",
        2,
        node_args={node: ["--auth-file", str(path)] for node, path in files.items()},
        env={"HERALD_CLUSTER_TOKEN": tokens["admin"]},
    )
    cluster.http.headers["Authorization"] = f"Bearer {tokens['admin']}"

    def digests(node: str) -> dict[str, str | None]:
        return {n["id"]: n.get("credentials") for n in cluster.cluster_view(node)["nodes"]}

    with cluster:
        same = credentials_digest(text)
        assert len(same) == 16 and int(same, 16) >= 0
        cluster.wait_for(
            lambda: all(digests(node) == {"n1": same, "n2": same} for node in cluster.nodes),
            30.0,
            "both nodes report the same digest",
        )
        # An edit (a new token) that has reached n2 only: every node shows the mismatch.
        token_id, token = new_token()
        edited = files["n2"].read_text() + "\n" + toml_entry(token_id, token, ["admin"], [])
        files["n2"].write_text(edited)
        changed = credentials_digest(edited)
        assert changed != same
        cluster.wait_for(
            lambda: all(digests(node) == {"n1": same, "n2": changed} for node in cluster.nodes),
            30.0,
            "the mismatch shows on every node",
        )
        # Rolled out to n1 as well: the digests agree again.
        files["n1"].write_text(edited)
        cluster.wait_for(
            lambda: all(digests(node) == {"n1": changed, "n2": changed} for node in cluster.nodes),
            30.0,
            "the digests agree again",
        )
        # The route keeps its roles (metrics or admin): a subscribe token sees no digest.
        view = httpx.get(
            f"{cluster.nodes['n1'].url}/v1/cluster", headers=_bearer(tokens["reader"]), timeout=30
        )
        assert view.status_code == 403
