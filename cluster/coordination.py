"""Subscriptions over a cluster (PROTOCOL §7 "Subscriptions"): each one's delivery runs on
one node at a time, its *coordinator* (Kafka's group coordinator), chosen through etcd.

In etcd, under ``/herald/<cluster>/``:

- ``subscriptions/<name>``: the subscription's config (JSON, as meta.db keeps it);
- ``coordinators/<name>``: the node running it, a key under that node's lease — it
  disappears with the node, and another takes the subscription over;
- ``cursors/<name>``: its cursor (ack floors, acked ranges above them, attempt counts),
  written by the coordinator at most every ``CURSOR_EVERY_S`` while it changes, each
  write guarded by "the coordinator key is mine, under my lease" (a deposed coordinator
  cannot overwrite its successor's cursor).

Why etcd and not a replicated internal topic (Kafka's ``__consumer_offsets``): a cursor
is small (a floor and a few ranges per partition), written a few times a second per
active subscription, and read only when a coordinator takes over; etcd already holds
the configs and the coordinator's lease, so the fencing is one compare in the same
transaction, and there is nothing to compact. The cost is bounded: at most
1/CURSOR_EVERY_S writes per subscription, ~1 KiB each.

The node that should coordinate a subscription is the live node ranking highest for it
by rendezvous hashing (so subscriptions spread, and move as little as possible when a
node joins or leaves); it claims the key with a transaction (the key absent, its own
node key present). Any other live node claims a subscription left unclaimed for
``CLAIM_PAUSE_S``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

CURSOR_EVERY_S = 0.3  # a coordinator's death redelivers at most ~this much acked work
CLAIM_PAUSE_S = 1.5
# A coordinator that cannot run a subscription here this long (its disk fails: full, or a
# directory it cannot read) gives it up, and claims it again only after SHUN_S, unless no
# other node is live: a disk that stays broken must not hold a subscription for good.
GIVE_UP_AFTER_S = 10.0
SHUN_S = 60.0


def subscriptions_prefix(cluster: str) -> str:
    return f"/herald/{cluster}/subscriptions/"


def coordinators_prefix(cluster: str) -> str:
    return f"/herald/{cluster}/coordinators/"


def cursors_prefix(cluster: str) -> str:
    return f"/herald/{cluster}/cursors/"


def preferred_coordinator(name: str, nodes: Iterable[str]) -> str | None:
    """Rendezvous hashing: the node with the highest hash of (subscription, node)."""
    best: tuple[int, str] | None = None
    for node in nodes:
        score = zlib.crc32(f"{name}\0{node}".encode())
        if best is None or (score, node) > best:
            best = (score, node)
    return best[1] if best is not None else None


@dataclass(frozen=True, slots=True)
class Coordinator:
    node: str
    lease: int
    mod_revision: int
