"""Browsers as subscribers (issue 17): one headless Chromium page holding many tails.

One page (Playwright driving Debian's /usr/bin/chromium, as tests/console/conftest.py
launches it) imports the browser SDK from the server (``/sdk/herald.js``) and opens
``--tails`` tails (100) of one topic, each through its own WebSocket. This process then
publishes ``--rate`` records a second (1,000) for ``--seconds`` (10), in batches of
``--batch`` records every batch/rate seconds, each record's value stamped with its
publish time (wall clock, ms, taken just before the POST). The page renders as a live
view should: once an animation frame (requestAnimationFrame), each tail's list gets its
newest records (a DOM element each, the list kept at 20 elements), and each record of
that frame notes its render time (``performance.timeOrigin + performance.now()``, right
after the DOM update). The bench reads the publish-to-render times back and prints their
percentiles, with the server's and the browser's CPU time over the run.

Server RSS per browser connection: the server's VmRSS (/proc/PID/status) with the page
loaded and no tail open, then with the tails open (every one ``open``, then 1 s to
settle), divided by the number of tails. Also the RSS at the end of the traffic.

``--memory PAGES`` measures only that, idle, and over ``PAGES`` pages, each in a Chromium
of its own (as many browsers, not one with many tabs): first a warm-up page opens 50 tails and keeps them (what a first
connection allocates once is not counted, and no memory they let go is reused by the
measured ones), then the pages open ``--tails`` tails between them; nothing is published.

Run: ``python -m bench.browser [--tails 100] [--rate 1000] [--seconds 10]``. The page
and the server share the host: the figures include the browser's own work (100 tails
times 1,000 records/s = 100,000 renders a second) competing with the server for the CPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import sync_playwright

from bench.common import cpu_seconds, herald_server, percentile, vm_rss_kib

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [  # as tests/console/conftest.py
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOPIC = "browser.bench"

# Runs in the page (same origin as the server: no CORS, the SDK by its absolute path).
OPEN_TAILS = """async ([topic, tails, keep, render]) => {
  const { Herald } = await import("/sdk/herald.js");
  const herald = new Herald({ urls: [location.origin] });
  window.latencies = [];
  window.states = new Array(tails).fill("new");
  window.views = [];
  const lists = [], pending = [], shownRecords = [];
  // Render as a live view should: once an animation frame, each tail's list replaced by
  // its newest `keep` records; a record's render time is when its frame updated the DOM.
  const frame = () => {
    for (let i = 0; i < tails; i++) {
      const records = pending[i];
      if (!records.length) continue;
      pending[i] = [];
      if (render) {
        // The newest `keep` records, newest first: one text update per list and frame.
        const shown = shownRecords[i];
        for (const r of records) shown.push(`${r.partition}-${r.offset} ${r.value.n}`);
        if (shown.length > keep) shown.splice(0, shown.length - keep);
        lists[i].textContent = shown.slice().reverse().join("\\n");
      }
      const now = performance.timeOrigin + performance.now();
      for (const r of records) window.latencies[i].push(now - r.value.t);
    }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
  for (let i = 0; i < tails; i++) {
    const list = document.createElement("pre");
    list.style.cssText = "contain: strict; width: 14em; height: 24em; overflow: hidden; " +
      "display: inline-block; margin: 0 4px; font: 12px monospace";
    lists.push(document.body.appendChild(list));
    shownRecords.push([]);
    pending.push([]);
    window.latencies.push([]);
    window.views.push(herald.tail(topic, {
      from: "latest",
      onMessage: (r) => { pending[i].push(r); },
      onState: (s) => { window.states[i] = s; },
      onError: () => {},
    }));
  }
}"""


@dataclass(frozen=True, slots=True)
class Figures:
    tails: int
    published: int
    rendered: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    rss_before_kib: int
    rss_open_kib: int
    rss_end_kib: int
    publish_s: float
    drain_s: float
    server_cpu_s: float
    browser_cpu_s: float


def browser_cpu_seconds(server_pid: int) -> float:
    """CPU time of this process's descendants but the server: Chromium and Playwright's driver."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(stat[1])
    mine, changed = {os.getpid()}, True
    while changed:
        grown = {pid for pid, parent in parents.items() if parent in mine} - {server_pid}
        changed = not grown <= mine
        mine |= grown
    total = 0.0
    for pid in mine - {os.getpid()}:
        with contextlib.suppress(OSError, IndexError):
            total += cpu_seconds(pid) or 0.0
    return total


def wait_page(page: object, expression: str, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def on_cpus(cpus: set[int] | None) -> Iterator[None]:
    """This process (and what it starts meanwhile) on ``cpus``; None: unchanged."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def run(
    tails: int, rate: int, seconds: float, batch: int, render: bool = True, split: bool = True
) -> Figures:
    # Split: the server and the publisher (this process) on CPU 0, Chromium on the others,
    # as a browser runs on its user's machine, not on the server's; shared, the page's
    # rendering starves the publisher and the asked rate is not kept.
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus = {cpus[0]} if split and len(cpus) > 1 else None
    browser_cpus = set(cpus[1:]) if server_cpus is not None else None
    with on_cpus(server_cpus), herald_server(prefix="herald-browser-bench-") as (url, pid):
        with on_cpus(browser_cpus):
            p = sync_playwright().start()
        try:
            return _measure(p, url, pid, tails, rate, seconds, batch, render)
        finally:
            p.stop()


def _measure(
    p: Any, url: str, pid: int, tails: int, rate: int, seconds: float, batch: int, render: bool
) -> Figures:
    made = httpx.put(f"{url}/v1/topics/{TOPIC}", json={}, timeout=10)
    assert made.status_code in (200, 201), made.text
    browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
    try:
        page = browser.new_page()
        page.goto(f"{url}/healthz")  # an origin to run in: the server's own
        time.sleep(1)
        rss_before = vm_rss_kib(pid)
        page.evaluate(OPEN_TAILS, [TOPIC, tails, 20, render])
        wait_page(page, "window.states.every((s) => s === 'open')", f"{tails} tails open")
        time.sleep(1)
        rss_open = vm_rss_kib(pid)

        published = 0
        interval = batch / rate
        cpu_start = cpu_seconds(pid) or 0.0
        browser_start = browser_cpu_seconds(pid)
        with httpx.Client(base_url=url, timeout=10) as http:
            start = time.monotonic()
            for tick in range(int(seconds * rate / batch)):
                delay = start + tick * interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                now_ms = time.time() * 1000
                messages = [{"value": {"n": published + i, "t": now_ms}} for i in range(batch)]
                response = http.post(f"/v1/topics/{TOPIC}/messages", json={"messages": messages})
                assert response.status_code == 200, response.text
                published += batch
        published_at = time.monotonic()
        wait_page(
            page,
            f"window.latencies.every((l) => l.length >= {published})",
            "every record rendered by every tail",
            timeout_s=120,
        )
        drained_at = time.monotonic()
        server_cpu = (cpu_seconds(pid) or 0.0) - cpu_start
        browser_cpu = browser_cpu_seconds(pid) - browser_start
        rss_end = vm_rss_kib(pid)
        per_tail: list[list[float]] = page.evaluate("window.latencies")
        page.evaluate("window.views.forEach((v) => v.close())")
    finally:
        browser.close()
    latencies = sorted(x for one in per_tail for x in one)
    return Figures(
        tails=tails,
        published=published,
        rendered=len(latencies),
        p50_ms=statistics.median(latencies),
        p90_ms=percentile(latencies, 0.90),
        p99_ms=percentile(latencies, 0.99),
        max_ms=latencies[-1],
        rss_before_kib=rss_before,
        rss_open_kib=rss_open,
        rss_end_kib=rss_end,
        publish_s=published_at - start,
        drain_s=drained_at - published_at,
        server_cpu_s=server_cpu,
        browser_cpu_s=browser_cpu,
    )


def memory(tails: int, pages: int) -> tuple[int, int, int]:
    """Server VmRSS (KiB) before and with ``tails`` idle browser tails over ``pages``
    pages, and the tails open."""
    # Every tail comes from 127.0.0.1: the per-address cap (256) out of the way.
    env = {**os.environ, "HERALD_MAX_REQUESTS_PER_CLIENT": "1000000"}
    with herald_server(env=env, prefix="herald-browser-bench-") as (url, pid):
        made = httpx.put(f"{url}/v1/topics/{TOPIC}", json={}, timeout=10)
        assert made.status_code in (200, 201), made.text
        p = sync_playwright().start()
        try:
            browsers = [
                p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
                for _ in range(pages + 1)
            ]
            warm = browsers[pages].new_page()
            warm.goto(f"{url}/healthz")
            warm.evaluate(OPEN_TAILS, [TOPIC, 50, 20, False])
            wait_page(warm, "window.states.every((s) => s === 'open')", "50 warm-up tails open")
            time.sleep(2)
            before = vm_rss_kib(pid)
            opened = []
            for i in range(pages):
                page = browsers[i].new_page()
                page.goto(f"{url}/healthz")
                share = tails // pages + (1 if i < tails % pages else 0)
                page.evaluate(OPEN_TAILS, [TOPIC, share, 20, False])
                opened.append(page)
            for page in opened:
                wait_page(page, "window.states.every((s) => s === 'open')", "tails open", 300)
            time.sleep(2)
            after = vm_rss_kib(pid)
            for browser in browsers:
                browser.close()
        finally:
            p.stop()
    return before, after, tails


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tails", type=int, default=100)
    parser.add_argument("--rate", type=int, default=1000, help="records published a second")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--batch", type=int, default=10, help="records per publish request")
    parser.add_argument(
        "--no-render",
        action="store_true",
        help="stamp each record once an animation frame without touching the DOM (the "
        "browser's cost of the tails themselves: WebSocket messages, the SDK, JSON)",
    )
    parser.add_argument(
        "--shared-cpus",
        action="store_true",
        help="let the page, the server and the publisher share every CPU (by default the "
        "server and the publisher have CPU 0 and Chromium the others)",
    )
    parser.add_argument(
        "--memory",
        type=int,
        metavar="PAGES",
        help="only the server's memory per idle browser tail, the tails over PAGES pages",
    )
    args = parser.parse_args()
    if args.memory:
        before, after, tails = memory(args.tails, args.memory)
        print(
            f"{tails} idle browser tails over {args.memory} pages: server RSS "
            f"{before / 1024:.1f} -> {after / 1024:.1f} MiB, {(after - before) / tails:.1f} KiB "
            f"per browser tail (load average {os.getloadavg()[0]:.2f})"
        )
        return
    f = run(
        args.tails,
        args.rate,
        args.seconds,
        args.batch,
        render=not args.no_render,
        split=not args.shared_cpus,
    )
    print(f"{f.tails} tails in one Chromium page, {f.published} records at {args.rate}/s")
    print(f"rendered {f.rendered} (expected {f.tails * f.published})")
    print(
        f"publish-to-render: p50 {f.p50_ms:.1f} ms, p90 {f.p90_ms:.1f} ms, "
        f"p99 {f.p99_ms:.1f} ms, max {f.max_ms:.1f} ms"
    )
    busy = f.server_cpu_s / (f.publish_s + f.drain_s)
    print(
        f"published in {f.publish_s:.1f} s, all rendered {f.drain_s:.1f} s later (polled every "
        f"0.1 s); server CPU {f.server_cpu_s:.1f} s ({busy:.0%} of one core over that time), "
        f"browser CPU {f.browser_cpu_s:.1f} s "
        f"({f.browser_cpu_s / (f.publish_s + f.drain_s):.0%} of one core)"
    )
    per = (f.rss_open_kib - f.rss_before_kib) / f.tails
    print(
        f"server RSS: {f.rss_before_kib / 1024:.1f} MiB before, {f.rss_open_kib / 1024:.1f} MiB "
        f"with {f.tails} tails open ({per:.0f} KiB per browser connection), "
        f"{f.rss_end_kib / 1024:.1f} MiB after the traffic"
    )


if __name__ == "__main__":
    main()
