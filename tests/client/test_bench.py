"""`python -m bench.herald_bench` as a user runs it: its own server, every table, the host line."""

from __future__ import annotations

import re
import subprocess
import sys

from bench.herald_bench import HostSample, host_line
from tests.conftest import PROJECT_ROOT

BENCH_ARGS = ["--records", "2000", "--runs", "1", "--rate", "500", "--seconds", "1", "--quiet"]


def test_bench_runs_end_to_end_and_prints_every_figure() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.herald_bench", *BENCH_ARGS],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for acks in ("1", "all"):
        # acks, e2e msg/s, e2e MB/s, publish msg/s, server CPU µs/msg (read from /proc)
        assert re.search(rf"^{acks} +[\d,]+ +[\d.]+ +[\d,]+ +\d+\.\d$", out, re.M), out
        # acks, samples (every record published at 500/s for 1 s), p50, p99, p999
        assert re.search(rf"^{acks} +500 +[\d.]+ +[\d.]+ +[\d.]+$", out, re.M), out
    assert re.search(
        r"^host during the bench: steal \d+\.\d%.* other processes \d+\.\d%", out, re.M
    )


def test_host_line_separates_steal_and_other_work_from_ours() -> None:
    start = HostSample(busy=10.0, steal=1.0, total=100.0, ours=5.0, server_counted=True)
    end = HostSample(busy=70.0, steal=11.0, total=300.0, ours=45.0, server_counted=True)
    # 200 s of CPU time passed: 10 stolen (5 %), 60 busy of which 40 ours -> 20 (10 %).
    assert "steal 5.0%" in host_line(start, end)
    assert "other processes 10.0%" in host_line(start, end)
    assert "unknown" in host_line(start, None)
    external = HostSample(busy=10.0, steal=1.0, total=100.0, ours=5.0, server_counted=False)
    assert "other processes (the server's too) 10.0%" in host_line(external, end)


def test_latency_trace_sees_every_record_at_every_stage() -> None:
    # bench/latency_trace.py wraps server functions by name: a renamed one stops the
    # traced server, one no longer on the path leaves its records out of the count.
    done = subprocess.run(
        [sys.executable, "-m", "bench.latency_trace", "--rate", "200", "--seconds", "1"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"p99  n=200$", done.stdout, re.M), done.stdout
    # A stage's figures can be below 0: the client may read a frame a few µs before the
    # server's "written" stamp is taken (two processes racing), not a missing stage.
    stages = re.findall(r"^\S.*? +-?\d+ +-?\d+ +-?\d+$", done.stdout, re.M)
    assert len(stages) == 15 and stages[-1].startswith("total"), done.stdout


def test_filter_bench_runs_end_to_end_and_prints_every_figure() -> None:
    """bench/filter.py: its own server, a pair of runs whose stats it checks, the medians."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.filter", "--records", "2000", "--runs", "2", "--on", "key"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "server capacity" in out and 'hasPrefix(key, "eu-")' in out, out
    # subscription, skip rate, delivered (every record / the 1 % matching), seconds, CPU
    assert re.search(r"^unfiltered +[\d,]+ +2,000 +[\d.]+ +\d+\.\d\d$", out, re.M), out
    assert re.search(r"^filtered +[\d,]+ +20 +[\d.]+ +\d+\.\d\d$", out, re.M), out
    assert re.search(r"^filtered / unfiltered skip rate, .*: \d+\.\d\d \(range ", out, re.M), out
    assert "host during the bench:" in out, out


def test_frame_codec_reads_back_what_each_encoding_wrote_and_prints_every_step() -> None:
    """bench/frame_codec.py checks that both encodings give the application the same
    values before it times them: a frame one encoding loses a record of fails here."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.frame_codec", "--records", "20", "--repeat", "1"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    for step in ("bytes record: server encodes", "bytes record: SDK reads"):
        assert re.search(rf"^{step} +\d+\.\d\d +\d+\.\d\d$", done.stdout, re.M), done.stdout
    for step in ("JSON record: server encodes", "JSON record: SDK reads"):
        assert re.search(rf"^{step} +\d+\.\d\d +\d+\.\d\d$", done.stdout, re.M), done.stdout
