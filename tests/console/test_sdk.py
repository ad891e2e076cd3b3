"""The browser SDK (web_console/static/sdk/herald.js) in a real headless Chromium against a
real server: a page of another origin (a page server on localhost)
imports /sdk/herald.js, tails a topic across a server restart, and reconnects with a
fresh browser token from getToken when its token expires (close 4401)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.auth import new_signing_key_line
from tests.conftest import HeraldProcess, free_port
from tests.security.conftest import write_auth_file

# The page's origin: a small real HTTP server on localhost, another origin than the
# Herald server's 127.0.0.1 (so CORS is exercised), and on loopback too (Chromium's
# private network rules refuse a public page loading from loopback). Set by app_origin,
# which binds a port of the kernel's choosing (a port picked earlier and bound later
# could be taken meanwhile).
APP = ""


class _PageHandler(http.server.BaseHTTPRequestHandler):
    html = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.html)))
        self.end_headers()
        self.wfile.write(self.html)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module", autouse=True)
def app_origin() -> Iterator[str]:
    """The page's origin (also as APP, which this module's tests read)."""
    global APP
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PageHandler)
    APP = f"http://localhost:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield APP
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


PAGE = """<!doctype html><meta charset="utf-8"><title>tail</title>
<ul id="records"></ul><p id="state"></p>
<script type="module">
  import { Herald } from "%(server)s/sdk/herald.js";
  window.seen = []; window.gaps = []; window.tokens = 0; window.states = [];
  const getToken = %(get_token)s;
  const herald = new Herald({ urls: ["%(server)s"], getToken, minBackoffMs: 100, maxBackoffMs: 500 });
  window.view = herald.tail("%(topic)s", {
    from: "earliest",
    credit: 20,
    onMessage: (r) => {
      window.seen.push([r.partition, r.offset, r.value]);
      const li = document.createElement("li");
      li.textContent = `${r.partition}-${r.offset}`;
      document.getElementById("records").append(li);
    },
    onGap: (g) => window.gaps.push(g),
    onState: (s) => { window.states.push(s); document.getElementById("state").textContent = s; },
    onError: () => {},
  });
</script>"""


def open_page(page: Any, server: HeraldProcess, topic: str, get_token: str = "null") -> None:
    _PageHandler.html = (
        PAGE % {"server": server.url, "topic": topic, "get_token": get_token}
    ).encode()
    page.goto(f"{APP}/index.html")


def wait_for(page: Any, expression: str, what: str, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = page.evaluate(expression)
        if value:
            return value
        page.wait_for_timeout(100)
    states = page.evaluate("window.states")
    raise AssertionError(f"timed out waiting for {what}: {states} {page.console_errors}")


def page_errors(page: Any) -> list[str]:
    """The page's errors, less the browser's own notes of a refused connection (the server
    was down: that is the test)."""
    return [
        e
        for e in page.console_errors
        if "ERR_CONNECTION_REFUSED" not in e and "WebSocket connection to" not in e
    ]


def publish(url: str, topic: str, values: range, headers: dict[str, str] | None = None) -> None:
    for start in range(values.start, values.stop, 10):
        batch = [
            {"key": f"k{v % 3}", "value": v} for v in range(start, min(start + 10, values.stop))
        ]
        r = httpx.post(
            f"{url}/v1/topics/{topic}/messages",
            json={"messages": batch},
            headers=headers or {},
            timeout=10,
        )
        assert r.status_code == 200, r.text


def assert_exactly_once_in_order(seen: list[list[Any]], count: int) -> None:
    values = sorted(v for _, _, v in seen)
    assert values == list(range(count)), "every record exactly once"
    by_partition: dict[int, list[int]] = {}
    for partition, offset, _ in seen:
        by_partition.setdefault(partition, []).append(offset)
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets))), "in order, no gap, per partition"


def test_the_sdk_is_served_to_any_origin(herald_server: HeraldProcess) -> None:
    js = httpx.get(f"{herald_server.url}/sdk/herald.js", headers={"Origin": APP})
    assert js.status_code == 200
    assert js.headers["content-type"].startswith("text/javascript")
    assert js.headers["access-control-allow-origin"] == "*"
    assert "export class Herald" in js.text
    dts = httpx.get(f"{herald_server.url}/sdk/herald.d.ts")
    assert dts.status_code == 200 and "export declare class Herald" in dts.text
    assert httpx.get(f"{herald_server.url}/sdk/../auth.toml").status_code == 404


def test_a_tail_sees_every_record_once_across_a_server_restart(
    page: Any, herald_factory: Callable[..., HeraldProcess]
) -> None:
    server = herald_factory("--cors-origin", APP)
    made = httpx.put(f"{server.url}/v1/topics/live", json={"partitions": 3}, timeout=10)
    assert made.status_code == 201, made.text
    publish(server.url, "live", range(0, 60))
    open_page(page, server, "live")
    wait_for(page, "(window.seen || []).length >= 60", "the first 60 records")

    server.terminate()  # mid-stream: the page is connected and waiting for more
    wait_for(page, "(window.states || []).includes('reconnecting')", "the page to notice")
    server.restart()
    publish(server.url, "live", range(60, 120))  # possibly before the page is back
    wait_for(page, "(window.seen || []).length >= 120", "all 120 records")
    page.wait_for_timeout(500)  # nothing more may arrive (a duplicate would)
    assert_exactly_once_in_order(page.evaluate("window.seen"), 120)
    assert page.evaluate("window.gaps") == []
    assert page.locator("#records li").count() == 120
    assert page_errors(page) == []


def test_an_expired_token_reconnects_with_a_fresh_one(
    page: Any, herald_factory: Callable[..., HeraldProcess], tmp_path: Path
) -> None:
    auth_file = tmp_path / "auth.toml"
    tokens = write_auth_file(
        auth_file, {"admin": (["admin"], []), "backend": (["subscribe"], ["feed.*"])}
    )
    with auth_file.open("a") as f:
        f.write("\n" + new_signing_key_line())
    server = herald_factory("--auth-file", str(auth_file), "--cors-origin", APP)
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    made = httpx.put(f"{server.url}/v1/topics/feed.a", json={"partitions": 1}, headers=admin)
    assert made.status_code == 201, made.text
    publish(server.url, "feed.a", range(0, 10), admin)

    # The page's "backend": the test mints a 2-second token each time the page asks.
    def mint(_: object = None) -> str:
        r = httpx.post(
            f"{server.url}/v1/tokens",
            json={"ttl_ms": 2_000, "subscribe": ["feed.a"]},
            headers={"Authorization": f"Bearer {tokens['backend']}"},
            timeout=10,
        )
        assert r.status_code == 201, r.text
        return str(r.json()["token"])

    page.expose_function("mintToken", mint)
    open_page(
        page,
        server,
        "feed.a",
        "async () => { window.tokens += 1; return await window.mintToken(); }",
    )
    wait_for(page, "(window.seen || []).length >= 10", "the first records")
    # The 2 s token expires: the server closes 4401, the SDK asks for a fresh one.
    wait_for(page, "window.tokens >= 3", "two fresh tokens after expiries", timeout_s=30)
    publish(server.url, "feed.a", range(10, 20), admin)
    wait_for(page, "(window.seen || []).length >= 20", "records after the new token")
    page.wait_for_timeout(300)
    assert_exactly_once_in_order(page.evaluate("window.seen"), 20)
    assert page_errors(page) == []


def test_the_example_page_of_docs_browser_md_works(
    page: Any, herald_factory: Callable[..., HeraldProcess]
) -> None:
    """docs/browser.md's complete page, as printed there (its server URL swapped for the
    test's): it shows records published after it opened, across a server restart."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "browser.md").read_text()
    html = doc.split("```html\n", 1)[1].split("```", 1)[0]
    server = herald_factory("--cors-origin", APP)
    made = httpx.put(f"{server.url}/v1/topics/orders", json={"partitions": 3}, timeout=10)
    assert made.status_code == 201, made.text
    publish(server.url, "orders", range(0, 5))  # before the page: "latest" skips them
    _PageHandler.html = html.replace("http://localhost:8080", server.url).encode()
    page.goto(f"{APP}/index.html")
    expect_state = "document.getElementById('state').textContent === 'open'"
    wait_for(page, expect_state, "the page to connect")
    publish(server.url, "orders", range(5, 15))
    wait_for(page, "document.querySelectorAll('#orders li').length >= 10", "10 records")
    server.restart()
    publish(server.url, "orders", range(15, 25))
    wait_for(page, "document.querySelectorAll('#orders li').length >= 20", "20 records")
    page.wait_for_timeout(300)
    items = page.locator("#orders li").all_text_contents()
    values = sorted(int(item.split(": ", 1)[1]) for item in items)
    assert values == list(range(5, 25))
    assert page_errors(page) == []


def _aged_topic(
    herald_factory: Callable[..., HeraldProcess], until: Callable[[int], bool]
) -> HeraldProcess:
    """A server whose topic `aging` (one partition) held offsets 0..29 until retention
    (1 s) deleted its oldest segments, until ``until(start_offset)``; then the server is
    restarted on the same data with retention passes an hour apart, so the log holds
    still while the page looks at it."""
    flags = ("--cors-origin", APP, "--segment-bytes", "65536")
    server = herald_factory(*flags, "--retention-interval", "0.2")
    config = {"partitions": 1, "retention_ms": 1000}
    made = httpx.put(f"{server.url}/v1/topics/aging", json=config, timeout=10)
    assert made.status_code == 201, made.text
    blob = "x" * 8000
    for n in range(30):  # ~240 kB: several 64 kB segments
        r = httpx.post(
            f"{server.url}/v1/topics/aging/messages",
            json={"messages": [{"value": {"n": n, "pad": blob}}]},
            timeout=10,
        )
        assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    while not until(_start_offset(server)):
        assert time.monotonic() < deadline, "retention never deleted the segments"
        time.sleep(0.2)
    server.terminate()
    return herald_factory(*flags, "--retention-interval", "3600", data_dir=server.data_dir)


def _start_offset(server: HeraldProcess) -> int:
    body = httpx.get(f"{server.url}/v1/topics/aging", timeout=10).json()
    return int(body["partitions"][0]["start_offset"])


def _resuming_page(server: HeraldProcess) -> bytes:
    """The page, having seen offsets 0..2 of partition 0 before (its stored position is 3)."""
    html = PAGE % {"server": server.url, "topic": "aging", "get_token": "null"}
    return (
        html.replace(
            'from: "earliest",',
            'from: "earliest", storage: true,',
        )
        .replace(
            '<script type="module">',
            "<script>sessionStorage.setItem('herald.tail.aging', JSON.stringify({'0': 3}));</script>"
            '<script type="module">',
        )
        .encode()
    )


def test_a_tail_resumed_past_retention_gets_a_gap(
    page: Any, herald_factory: Callable[..., HeraldProcess]
) -> None:
    """A resume position (kept in sessionStorage) that retention has deleted since: the page
    is told the first and last offsets it missed, then sees the rest from the log's start."""
    server = _aged_topic(herald_factory, lambda start: start >= 10)
    start = _start_offset(server)
    _PageHandler.html = _resuming_page(server)
    page.goto(f"{APP}/index.html")
    wait_for(page, "(window.gaps || []).length >= 1", "the gap")
    last = (
        "(window.seen || []).some(([p, o]) => o === 29)"
        " || (window.gaps || []).some((g) => g.last === 29)"
    )
    wait_for(page, last, "every offset up to 29 delivered or reported")
    gaps = page.evaluate("window.gaps")
    assert gaps == [{"topic": "aging", "partition": 0, "first": 3, "last": start - 1}]
    seen = [offset for _, offset, _ in page.evaluate("window.seen")]
    assert seen == list(range(start, 30))


def test_a_tail_is_told_of_what_retention_took_after_its_lookup(
    page: Any, herald_factory: Callable[..., HeraldProcess]
) -> None:
    """The SDK looks the topic up, then opens the tail: records retention deletes in
    between are reported by the tail's `ready` frame (`?positions=true`, docs/protocol.md
    §3), not lost without a word when no later record comes to show the gap."""
    server = _aged_topic(herald_factory, lambda start: start == 30)  # every record gone

    def as_before_retention(route: Any) -> None:
        # The lookup's answer as it was before retention ran: offsets 0..29 all there.
        response = route.fetch()
        body = response.json()
        body["partitions"][0]["start_offset"] = 0
        route.fulfill(response=response, json=body)

    page.route(f"{server.url}/v1/topics/aging", as_before_retention)
    _PageHandler.html = _resuming_page(server)
    page.goto(f"{APP}/index.html")
    wait_for(page, "(window.gaps || []).length >= 1", "the gap")
    assert page.evaluate("window.gaps") == [
        {"topic": "aging", "partition": 0, "first": 3, "last": 29}
    ]
    # The tail goes on from there.
    r = httpx.post(
        f"{server.url}/v1/topics/aging/messages", json={"messages": [{"value": "new"}]}, timeout=10
    )
    assert r.status_code == 200, r.text
    wait_for(page, "(window.seen || []).length >= 1", "the new record")
    assert page.evaluate("window.seen") == [[0, 30, "new"]]
    assert len(page.evaluate("window.gaps")) == 1


SUB_PAGE = """<!doctype html><meta charset="utf-8"><title>work</title>
<script type="module">
  import { Herald } from "%(server)s/sdk/herald.js";
  window.seen = [];
  const ackAll = location.search.includes("ack=all");
  const herald = new Herald({ urls: ["%(server)s"], minBackoffMs: 100, maxBackoffMs: 500 });
  herald.subscribe("work", {
    credit: 3,
    async onMessage(m) {
      window.seen.push([m.value, m.attempt]);
      if (ackAll || m.value < 5) m.ack();  // the first page leaves 5..9 unacked
    },
  });
</script>"""


def test_a_durable_consumer_page_reloads_without_loss_or_redelivery(
    page: Any, herald_factory: Callable[..., HeraldProcess]
) -> None:
    server = herald_factory("--cors-origin", APP)
    made = httpx.put(f"{server.url}/v1/topics/jobs", json={"partitions": 2}, timeout=10)
    assert made.status_code == 201, made.text
    body = {"topic": "jobs", "ack_deadline_ms": 600_000}
    made = httpx.put(f"{server.url}/v1/subscriptions/work", json=body, timeout=10)
    assert made.status_code == 201, made.text
    publish(server.url, "jobs", range(0, 10))
    _PageHandler.html = (SUB_PAGE % {"server": server.url}).encode()
    page.goto(f"{APP}/index.html")
    wait_for(page, "(window.seen || []).length >= 10", "all 10 records (credit given back)")

    def in_flight() -> int:
        stats = httpx.get(f"{server.url}/v1/subscriptions/work", timeout=10).json()["stats"]
        return int(stats["in_flight"])

    deadline = time.monotonic() + 20
    while in_flight() != 5:  # the five acks reached the server
        assert time.monotonic() < deadline, "the acks never landed"
        time.sleep(0.1)
    first = page.evaluate("window.seen")
    assert sorted(v for v, _ in first) == list(range(10))

    page.goto(f"{APP}/index.html?ack=all")  # a reload: the old socket goes, records come back
    wait_for(page, "(window.seen || []).length >= 5", "the unacked records again")
    page.wait_for_timeout(500)
    again = page.evaluate("window.seen")
    assert sorted(v for v, _ in again) == [5, 6, 7, 8, 9]  # nothing acked comes back
    assert all(attempt >= 2 for _, attempt in again)
    deadline = time.monotonic() + 20
    while in_flight() != 0:
        assert time.monotonic() < deadline, "the second page's acks never landed"
        time.sleep(0.1)
    assert page_errors(page) == []


DELAY_PAGE = """<!doctype html><meta charset="utf-8"><title>delay</title>
<script type="module">
  import { Herald } from "%(server)s/sdk/herald.js";
  window.seen = [];
  const herald = new Herald({ urls: ["%(server)s"], minBackoffMs: 100, maxBackoffMs: 500 });
  herald.subscribe("reminders", {
    credit: 5,
    onMessage(m) {
      window.seen.push({ value: m.value, deliver_at: m.deliver_at ?? null, at: Date.now() });
      m.ack();
    },
  });
  herald.publish("remind", [{ value: "later", delay_ms: 1500 }, { value: "now" }])
    .then((r) => { window.published = r; });
</script>"""


def test_a_page_publishes_with_delay_ms_and_gets_deliver_at_on_its_messages(
    page: Any, herald_factory: Callable[..., HeraldProcess]
) -> None:
    """PROTOCOL §8 delayed delivery through herald.js: publish takes delay_ms, the message
    carries deliver_at and arrives no earlier than it, by the browser's (the host's) clock."""
    server = herald_factory("--cors-origin", APP)
    body = {"topic": "remind", "start": "earliest"}
    made = httpx.put(f"{server.url}/v1/subscriptions/reminders", json=body, timeout=10)
    assert made.status_code == 201, made.text
    _PageHandler.html = (DELAY_PAGE % {"server": server.url}).encode()
    page.goto(f"{APP}/index.html")
    wait_for(page, "(window.seen || []).length >= 2", "both records")
    seen = {s["value"]: s for s in page.evaluate("window.seen")}
    assert seen["now"]["deliver_at"] is None
    later = seen["later"]
    assert later["deliver_at"] is not None and later["at"] >= later["deliver_at"]
    assert page_errors(page) == []


NODES_PAGE = """<!doctype html><meta charset="utf-8"><title>nodes</title>
<script type="module">
  import { Herald } from "%(server)s/sdk/herald.js";
  window.tailed = []; window.worked = []; window.states = [];
  // A cluster's node list with a dead node first (PROTOCOL §7: any node serves all).
  const herald = new Herald({ urls: ["%(dead)s", "%(server)s"], minBackoffMs: 100, maxBackoffMs: 500 });
  window.published = await herald.publish("nodes", [{ value: 0 }, { value: 1 }]);
  herald.tail("nodes", {
    from: "earliest",
    onMessage: (r) => window.tailed.push(r.value),
    onState: (s) => window.states.push(s),
    onError: () => {},
  });
  herald.subscribe("nodes-work", {
    credit: 5,
    onMessage: (m) => { window.worked.push([m.value, m.attempt]); m.ack(); },
    onError: () => {},
  });
</script>"""


TAIL_FIRST_PAGE = """<!doctype html><meta charset="utf-8"><title>nodes</title>
<script type="module">
  import { Herald } from "%(server)s/sdk/herald.js";
  window.tailed = [];
  // The tail is the first thing to reach for a node, and the dead one is first.
  const herald = new Herald({ urls: ["%(dead)s", "%(server)s"], minBackoffMs: 100, maxBackoffMs: 500 });
  herald.tail("first", { from: "earliest", onMessage: (r) => window.tailed.push(r.value), onError: () => {} });
</script>"""


def test_a_tail_whose_topic_lookup_moved_past_a_dead_node_opens_its_socket_there_too(
    page: Any, herald_factory: Callable[..., HeraldProcess]
) -> None:
    # A tail looks its topic up over HTTP, then opens its socket. The lookup moves on from
    # a dead node to the next one; the socket once went to the node current before the
    # lookup, the dead one, and from there each retry repeated the same two steps forever.
    server = herald_factory("--cors-origin", APP)
    publish(server.url, "first", range(0, 3))
    dead = f"http://127.0.0.1:{free_port()}"
    _PageHandler.html = (TAIL_FIRST_PAGE % {"server": server.url, "dead": dead}).encode()
    page.goto(f"{APP}/index.html")
    wait_for(page, "window.tailed.length >= 3", "the tail over the live node")
    assert page.evaluate("window.tailed") == [0, 1, 2]
    assert page_errors(page) == []


def test_a_page_given_a_dead_and_a_live_node_publishes_tails_and_consumes(
    page: Any, herald_factory: Callable[..., HeraldProcess]
) -> None:
    server = herald_factory("--cors-origin", APP)
    body = {"topic": "nodes", "start": "earliest"}
    made = httpx.put(f"{server.url}/v1/subscriptions/nodes-work", json=body, timeout=10)
    assert made.status_code == 201, made.text
    dead = f"http://127.0.0.1:{free_port()}"
    _PageHandler.html = (NODES_PAGE % {"server": server.url, "dead": dead}).encode()
    page.goto(f"{APP}/index.html")
    wait_for(page, "(window.tailed || []).length >= 2", "the tail over the live node")
    wait_for(page, "(window.worked || []).length >= 2", "the subscription over the live node")
    published = page.evaluate("window.published")
    assert [r["offset"] for r in published["results"]] == [0, 1]

    def stats() -> dict[str, Any]:
        got: dict[str, Any] = httpx.get(
            f"{server.url}/v1/subscriptions/nodes-work", timeout=10
        ).json()["stats"]
        return got

    deadline = time.monotonic() + 20
    while stats()["acked_total"] != 2:  # the acks landed: SIGTERM persists them
        assert time.monotonic() < deadline, "the acks never landed"
        time.sleep(0.1)
    server.terminate()  # its sockets close with 1001; the page goes round its list
    wait_for(page, "window.states.includes('reconnecting')", "the page to notice")
    server.restart()
    publish(server.url, "nodes", range(2, 12))
    wait_for(page, "window.tailed.length >= 12", "every record tailed")
    wait_for(page, "window.worked.length >= 12", "every record worked")
    page.wait_for_timeout(500)  # nothing more may arrive (a duplicate would)
    assert page.evaluate("window.tailed") == list(range(12))
    assert sorted(v for v, _ in page.evaluate("window.worked")) == list(range(12))
    deadline = time.monotonic() + 20
    while stats()["backlog"] != 0:
        assert time.monotonic() < deadline, "the page's acks never landed"
        time.sleep(0.1)
    assert page_errors(page) == []
