"""Descriptors per topic: a real ``herald serve`` gets publishes to N new topics (each
auto-created, one partition) and this prints the server's open descriptors as it goes.

    python bench/open_files.py [--topics 10000] [--nofile 20000] [--step 1000]

The server runs under ``prlimit --nofile=N:N``; half of N bounds the partitions' open
files (PROTOCOL §6), so the count levels off there however many topics exist. Prints
topics, open descriptors, descriptors per topic and creations per second; then reads
every topic once. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--nofile", type=int, default=20_000)
    parser.add_argument("--step", type=int, default=1000)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        command = [
            "prlimit", f"--nofile={args.nofile}:{args.nofile}", "--",
            sys.executable, "-m", "server.cli", "serve", "--port", str(port),
            "--data-dir", data, "--max-topics", str(args.topics), "--log-level", "warning",
        ]  # fmt: skip
        server = subprocess.Popen(command, cwd=ROOT)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    if httpx.get(f"{url}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            base = descriptors(server.pid)
            print(f"limit {args.nofile}; at start {base} descriptors")
            print(f"{'topics':>8} {'open fds':>9} {'fds/topic':>10} {'topics/s':>9}")
            started = time.monotonic()
            with httpx.Client(base_url=url, timeout=120) as client:
                for i in range(args.topics):
                    response = client.post(
                        f"/v1/topics/b{i}/messages", json={"messages": [{"value": i}]}
                    )
                    if response.status_code != 200:
                        print(f"topic {i}: {response.status_code} {response.text}")
                        break
                    if (i + 1) % args.step == 0:
                        fds = descriptors(server.pid)
                        rate = (i + 1) / (time.monotonic() - started)
                        print(f"{i + 1:>8} {fds:>9} {(fds - base) / (i + 1):>10.3f} {rate:>9.1f}")
                started = time.monotonic()
                wrong = 0
                for i in range(args.topics):
                    read = client.get(
                        f"/v1/topics/b{i}/partitions/0/messages", params={"offset": 0}
                    )
                    wrong += [m["value"] for m in read.json()["messages"]] != [i]
                took = time.monotonic() - started
                print(
                    f"read every topic: {took:.1f} s, {wrong} wrong; "
                    f"open fds now {descriptors(server.pid)}"
                )
        finally:
            server.terminate()
            server.wait(60)


if __name__ == "__main__":
    main()
