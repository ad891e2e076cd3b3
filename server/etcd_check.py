"""Before a clustered start: is any of the etcd endpoints of `--cluster` answering, and
does it accept this node (its client certificate, its user and password)?

A start with no etcd would otherwise fail deep in the lifespan (the node's lease) with a
traceback; here it fails first, in one line that names the URLs and what to check, like
a busy port or a data directory in use (server/cli.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from cluster.etcd import DEFAULT_TIMEOUT_S, EtcdAccess, EtcdAuthFailed, EtcdClient

# etcd started a moment before the node (`etcd … &` then `herald serve`, as the README
# shows) may need a second or two to answer: keep asking that long.
WITHIN_S = 2 * DEFAULT_TIMEOUT_S
WITH_USER_WITHIN_S = 30.0  # etcd's bcrypt may take seconds on a loaded host
ATTEMPT_TIMEOUT_S = 1.0
RETRY_S = 0.25
_TLS_HINTS = ("SSL", "certificate", "TLS", "tls")


def unreachable(
    endpoints: Sequence[str], access: EtcdAccess | None = None, within_s: float | None = None
) -> str | None:
    """None once an endpoint serves a read; else the message to exit with."""
    access = access or EtcdAccess()
    if within_s is None:
        within_s = WITH_USER_WITHIN_S if access.user else WITHIN_S
    try:
        last = asyncio.run(_answers(endpoints, access, within_s))
    except EtcdAuthFailed as exc:
        return f"{exc}: check --etcd-user and HERALD_ETCD_PASSWORD"
    if last is None:
        return None
    urls = ", ".join(endpoints)
    # A TLS refusal shows as a handshake error or, once the handshake seemed done (TLS
    # 1.3 checks the client certificate after it), as a connection closed on first read.
    https = any(url.startswith("https://") for url in endpoints)
    if any(hint in last for hint in _TLS_HINTS) or (https and "ReadError" in last):
        return (
            f"no etcd at {urls} accepted a TLS connection within {within_s:g} s ({last}): "
            "check --etcd-ca-file, --etcd-cert-file and --etcd-key-file"
        )
    if "permission denied" in last or "user name is empty" in last:
        return f"etcd at {urls} refused this node ({last}): check --etcd-user and its roles"
    return (
        f"no etcd answered at {urls} within {within_s:g} s ({last}): check that etcd is running "
        "there and that --cluster (HERALD_CLUSTER) names its client URL (etcd's "
        "--advertise-client-urls)"
    )


async def _answers(endpoints: Sequence[str], access: EtcdAccess, within_s: float) -> str | None:
    """None once an endpoint answers; else the last endpoint's reason."""
    deadline = time.monotonic() + within_s
    last: str | None = "no endpoint"
    async with EtcdClient(endpoints, attempt_timeout=ATTEMPT_TIMEOUT_S, access=access) as etcd:
        while True:
            for endpoint in endpoints:
                last = await etcd.probe_error(endpoint)
                if last is None:
                    return None
            if time.monotonic() + RETRY_S > deadline:
                return last
            await asyncio.sleep(RETRY_S)
