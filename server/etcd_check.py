"""Before a clustered start: is any of the etcd endpoints of `--cluster` answering?

A start with no etcd would otherwise fail deep in the lifespan (the node's lease) with a
traceback; here it fails first, in one line that names the URLs and what to check, like
a busy port or a data directory in use (server/cli.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from cluster.etcd import DEFAULT_TIMEOUT_S, EtcdClient

# etcd started a moment before the node (`etcd … &` then `herald serve`, as the README
# shows) may need a second or two to answer: keep asking that long.
WITHIN_S = 2 * DEFAULT_TIMEOUT_S
ATTEMPT_TIMEOUT_S = 1.0
RETRY_S = 0.25


def unreachable(endpoints: Sequence[str], within_s: float = WITHIN_S) -> str | None:
    """None once an endpoint serves a read; else the message to exit with."""
    if asyncio.run(_answers(endpoints, within_s)):
        return None
    urls = ", ".join(endpoints)
    return (
        f"no etcd answered at {urls} within {within_s:g} s: check that etcd is running "
        "there and that --cluster (HERALD_CLUSTER) names its client URL (etcd's "
        "--advertise-client-urls)"
    )


async def _answers(endpoints: Sequence[str], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    async with EtcdClient(endpoints, attempt_timeout=ATTEMPT_TIMEOUT_S) as etcd:
        while True:
            for endpoint in endpoints:
                if await etcd.probe(endpoint):
                    return True
            if time.monotonic() + RETRY_S > deadline:
                return False
            await asyncio.sleep(RETRY_S)
