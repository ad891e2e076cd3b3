"""The Cluster page (PROTOCOL §7) on a single node: a cluster of one, which is the
leader and the whole ISR of every partition, refreshed live without rebuilding its
rows, and silent while the tab is hidden."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect

from server.auth import new_token, toml_entry
from tests.conftest import HeraldProcess
from tests.console.conftest import screenshot
from tests.console.test_console import publish


def poll_starts(page: Any) -> list[float]:
    """When the page's finished /v1/cluster requests started (ms, the page's clock), as
    the browser recorded them (Resource Timing): not when this process heard of them,
    which a loaded host delivers in bursts."""
    starts: list[float] = page.evaluate(
        """() => performance.getEntriesByType("resource")
            .filter((e) => e.name.includes("/v1/cluster"))
            .map((e) => e.startTime)
            .sort((a, b) => a - b)"""
    )
    return starts


def page_now(page: Any) -> float:
    now: float = page.evaluate("performance.now()")
    return now


def test_a_single_node_shows_itself_leading_every_partition(herald_url: str, page: Any) -> None:
    with httpx.Client(base_url=herald_url) as http:
        assert http.put("/v1/topics/orders", json={"partitions": 2}).status_code == 201
        created = http.put("/v1/subscriptions/billing", json={"topic": "orders"})
        assert created.status_code == 201
    publish(herald_url, "orders", [{"partition": 1, "value": i} for i in range(3)])
    page.goto(f"{herald_url}/console/#/cluster")
    expect(page.locator("#nav a.active")).to_have_text("Cluster")

    node = page.locator("#nodes-table tr[data-node=local]")
    expect(node).to_contain_text("this node")
    expect(node.locator("[data-live]")).to_have_text("live")
    expect(node.locator("[data-col=leads]")).to_have_text("2")
    expect(node.locator("[data-col=replicas]")).to_have_text("2")
    expect(node.locator("[data-col=out-of-sync]")).to_have_text("0")
    expect(node.locator("[data-col=max-lag]")).to_have_text("—")
    expect(page.locator("#nodes-table th", has_text="ISR shrinks")).to_have_count(0)
    expect(node.locator("a")).to_have_attribute("href", f"{herald_url}/console/#/cluster")
    expect(page.locator("#cluster-name")).to_have_text("single node")
    expect(page.locator("#cluster-live")).to_have_text("1 / 1")
    expect(page.locator("#cluster-under-replicated")).to_have_text("0")
    expect(page.locator("#cluster-leaderless")).to_have_text("0")

    row = page.locator("#partitions-table tr[data-key='orders/1']")
    expect(row.locator("[data-col=leader]")).to_have_text("local")
    expect(row.locator("[data-col=epoch]")).to_have_text("0")
    expect(row.locator("[data-col=replicas]")).to_have_text("local")
    expect(row.locator("[data-col=isr]")).to_have_text("local")
    expect(row.locator("[data-col=hwm]")).to_have_text("3")
    expect(row.locator("[data-col=log-end]")).to_have_text("3")
    expect(row.locator("[data-col=lag]")).to_have_text("no followers")
    expect(page.locator("#partitions-table tr[data-key='orders/0'] [data-col=hwm]")).to_have_text(
        "0"
    )
    # Which node runs each subscription: on a single node, the node itself.
    coordinator = page.locator("#coordinators-table tr[data-subscription=billing]")
    expect(coordinator.locator("[data-col=coordinator]")).to_have_text("local")
    # A single node has no cluster name: no cluster indicator in the header.
    expect(page.locator("#cluster-info")).to_be_hidden()
    screenshot(page, "cluster-single-node")
    # The topic links to its page.
    row.locator("a").click()
    expect(page.locator("#topic-detail h2").first).to_have_text("Partitions of orders")
    assert page.console_errors == []


def test_refreshes_patch_the_rows_in_place(herald_url: str, page: Any) -> None:
    publish(herald_url, "ticks", [{"value": 0}])
    page.goto(f"{herald_url}/console/#/cluster")
    row = page.locator("#partitions-table tr[data-key='ticks/0']")
    expect(row.locator("[data-col=hwm]")).to_have_text("1")
    # Mark the DOM nodes on screen: a rebuilt table (a flicker) would lose the marks.
    row.evaluate("el => { el.marked = true; el.querySelector('[data-col=hwm]').marked = true; }")
    page.locator("#nodes-table tr[data-node=local]").evaluate("el => { el.marked = true; }")
    publish(herald_url, "ticks", [{"value": i} for i in range(4)])
    expect(row.locator("[data-col=hwm]")).to_have_text("5")
    assert row.evaluate("el => el.marked === true && el.querySelector('[data-col=hwm]').marked")
    assert page.locator("#nodes-table tr[data-node=local]").evaluate("el => el.marked === true")
    # The topic filter narrows the table; a name nothing matches says so.
    publish(herald_url, "other", [{"value": 1}])
    expect(page.locator("#partitions-table tr[data-key='other/0']")).to_have_count(1)
    page.fill("#cluster-filter", "tic")
    expect(page.locator("#partitions-table tr[data-key='other/0']")).to_have_count(0)
    expect(page.locator("#cluster-shown")).to_have_text("1 partition")
    page.fill("#cluster-filter", "nothing-like-it")
    expect(page.locator("#partitions-empty")).to_have_text("No partition matches.")
    page.fill("#cluster-filter", "")
    page.check("#cluster-problems")  # nothing is under-replicated on a single node
    expect(page.locator("#partitions-empty")).to_have_text("No partition matches.")
    assert page.console_errors == []


def test_polls_every_second_or_two_and_not_while_hidden(herald_url: str, page: Any) -> None:
    page.goto(f"{herald_url}/console/#/cluster")
    page.evaluate("performance.setResourceTimingBufferSize(10000)")
    expect(page.locator("#cluster-live")).to_have_text("1 / 1")
    deadline = time.monotonic() + 30
    while len(poll_starts(page)) < 4 and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    seen = poll_starts(page)
    assert len(seen) >= 4, seen
    gaps = [b - a for a, b in itertools.pairwise(seen[1:])]
    assert all(gap >= 1000 for gap in gaps), gaps  # a poll at a time, not a burst

    # Hidden (a background tab): no request at all. Shown again: one at once.
    page.evaluate(
        """() => {
        Object.defineProperty(document, "hidden", { value: true, configurable: true });
        Object.defineProperty(document, "visibilityState", { value: "hidden", configurable: true });
        document.dispatchEvent(new Event("visibilitychange"));
    }"""
    )
    hidden_from = page_now(page)
    page.wait_for_timeout(6000)  # longer than both refresh periods
    hidden_to = page_now(page)
    page.evaluate(
        """() => {
        Object.defineProperty(document, "hidden", { value: false, configurable: true });
        Object.defineProperty(document, "visibilityState", { value: "visible", configurable: true });
        document.dispatchEvent(new Event("visibilitychange"));
    }"""
    )
    deadline = time.monotonic() + 15
    while not [t for t in poll_starts(page) if t > hidden_to] and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    starts = poll_starts(page)
    assert [t for t in starts if t > hidden_to], "did not refresh when shown again"
    # Started while hidden: none (one started just before hiding may finish then).
    assert [t for t in starts if hidden_from < t <= hidden_to] == [], "polled while hidden"

    # Another page polls only for the header's indicator: slower.
    page.goto(f"{herald_url}/console/#/overview")
    page.wait_for_timeout(500)
    window_from = page_now(page)
    page.wait_for_timeout(4000)
    window_to = page_now(page)
    page.wait_for_timeout(2000)  # what started in the window has finished by now
    assert len([t for t in poll_starts(page) if window_from < t <= window_to]) <= 1
    assert page.console_errors == []


def test_a_node_that_stops_answering_leaves_its_last_answer_marked_stale(
    herald_server: HeraldProcess, page: Any
) -> None:
    page.goto(f"{herald_server.url}/console/#/cluster")
    expect(page.locator("#cluster-state")).to_have_text("refreshed every 1.5 s")
    expect(page.locator("#nodes-table tr[data-node=local] [data-live]")).to_have_text("live")
    herald_server.terminate()
    expect(page.locator("#cluster-state")).to_contain_text(
        "server unreachable: showing what it said"
    )
    expect(page.locator("#cluster-state")).to_have_class("error")
    expect(page.locator("#nodes-table tr[data-node=local]")).to_have_count(1)


def test_a_token_without_the_metrics_right_is_told_so(
    herald_factory: Callable[..., HeraldProcess], tmp_path: Path, page: Any
) -> None:
    reader_id, reader = new_token()
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text(toml_entry(reader_id, reader, ["subscribe"], ["*"]))
    server = herald_factory("--auth-file", str(auth_file))
    page.goto(f"{server.url}/console/#/cluster")
    page.wait_for_selector("#token-dialog[open]")
    page.fill("#token-input", reader)
    page.click("#token-dialog button")
    expect(page.locator("#cluster-state")).to_have_text(
        "this token may not read the cluster (needs metrics or admin)"
    )
    expect(page.locator("#nodes-table")).to_have_count(0)
    expect(page.locator("#cluster-info")).to_be_hidden()
