"""Prometheus text exposition (format 0.0.4), written by hand (PROTOCOL §5).

Counters and gauges are not kept here: they are read at scrape time from the
owners of the numbers (Topic counters, DeliveryEngine.stats), so there is one
source of truth and nothing to keep in sync. Only the publish latency
histogram is observed here, once per publish request.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Publish latencies run from ~100 µs (acks=1, small batch) to seconds (fsync on a busy disk).
PUBLISH_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class Histogram:
    """Cumulative-bucket histogram; ``observe`` is O(log buckets) and allocation-free."""

    def __init__(self, buckets: Sequence[float] = PUBLISH_BUCKETS) -> None:
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # last slot: +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> Iterable[str]:
        cumulative = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            cumulative += count
            yield f'{name}_bucket{{le="{_number(bound)}"}} {cumulative}'
        yield f'{name}_bucket{{le="+Inf"}} {self.count}'
        yield f"{name}_sum {_number(self.sum)}"
        yield f"{name}_count {self.count}"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


class Exposition:
    """Builds one scrape's text: families in order, HELP and TYPE once each."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(
        self,
        name: str,
        kind: str,
        help_text: str,
        samples: Iterable[tuple[Mapping[str, str], float]],
    ) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            if labels:
                rendered = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
                self._lines.append(f"{name}{{{rendered}}} {_number(value)}")
            else:
                self._lines.append(f"{name} {_number(value)}")

    def histogram(self, name: str, help_text: str, histogram: Histogram) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} histogram")
        self._lines.extend(histogram.lines(name))

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


# (family, stats key, kind, help) for the per-subscription numbers of PROTOCOL §5.
_SUBSCRIPTION_FAMILIES = (
    ("herald_delivered_records_total", "delivered_total", "counter", "Records sent to consumers, redeliveries included."),
    ("herald_acked_records_total", "acked_total", "counter", "Records acknowledged (at-most-once sends count as acked)."),
    ("herald_redelivered_records_total", "redelivered_total", "counter", "Sends with attempt > 1."),
    ("herald_dead_lettered_records_total", "dead_lettered_total", "counter", "Records dead-lettered after max_deliveries."),
    ("herald_expired_records_total", "expired_total", "counter", "Records skipped because retention deleted them first."),
    ("herald_filtered_records_total", "filtered_total", "counter", "Records acked unsent: not matching the subscription's filter."),
    ("herald_backlog_records", "backlog", "gauge", "Records not yet acked, in-flight included."),
    ("herald_in_flight_records", "in_flight", "gauge", "Records sent and not yet acked."),
    ("herald_delayed_records", "delayed", "gauge", "Records read and waiting for their deliver_at (delay_ms)."),
    ("herald_consumers", "consumers", "gauge", "Consumers attached to the subscription."),
    # Push subscriptions only (docs/protocol.md "Webhook push").
    ("herald_webhook_requests_total", "endpoint_requests_total", "counter", "Webhook POSTs answered, failed or timed out."),
    ("herald_webhook_failures_total", "endpoint_failures_total", "counter", "Webhook POSTs that did not get a 2xx."),
    ("herald_webhook_breaker_opened_total", "breaker_opened_total", "counter", "Times the endpoint's circuit breaker opened."),
    ("herald_webhook_concurrency_limit", "endpoint_concurrency", "gauge", "The endpoint's current adaptive limit of concurrent POSTs."),
    ("herald_webhook_requests_in_flight", "endpoint_in_flight", "gauge", "Webhook POSTs waiting for an answer."),
)  # fmt: skip
_BREAKER_STATES = ("closed", "open", "half_open")


def render(
    topics: Sequence[Any],
    subscription_stats: Mapping[str, Mapping[str, Any]],
    publish_duration: Histogram,
    cluster: Any = None,
) -> str:
    """The whole scrape. ``topics`` are storage Topics; stats as DeliveryEngine.stats gives them."""
    out = Exposition()
    out.family(
        "herald_published_records_total",
        "counter",
        "Records appended by publishes since the server started (duplicates excluded).",
        (({"topic": t.name}, t.messages_total) for t in topics),
    )
    out.family(
        "herald_published_bytes_total",
        "counter",
        "Value bytes appended by publishes since the server started.",
        (({"topic": t.name}, t.bytes_total) for t in topics),
    )
    out.family(
        "herald_topic_partitions",
        "gauge",
        "Partitions of the topic.",
        (({"topic": t.name}, len(t.partitions)) for t in topics),
    )
    out.family(
        "herald_partition_end_offset",
        "gauge",
        "Next offset to be written in the partition.",
        (
            ({"topic": t.name, "partition": str(p.partition)}, p.end_offset)
            for t in topics
            for p in t.partitions
        ),
    )
    out.family(
        "herald_partition_bytes",
        "gauge",
        "Bytes of the partition's log on disk.",
        (
            ({"topic": t.name, "partition": str(p.partition)}, p.size_bytes)
            for t in topics
            for p in t.partitions
        ),
    )
    for family, key, kind, help_text in _SUBSCRIPTION_FAMILIES:
        out.family(
            family,
            kind,
            help_text,
            (
                ({"subscription": name}, stats.get(key, 0))
                for name, stats in subscription_stats.items()
                if key in stats or not key.startswith(("endpoint_", "breaker_"))
            ),
        )
    out.family(
        "herald_webhook_endpoint_state",
        "gauge",
        "1 for the push endpoint's breaker state (closed, open, half_open), else 0.",
        (
            ({"subscription": name, "state": state}, int(stats["endpoint_state"] == state))
            for name, stats in subscription_stats.items()
            if "endpoint_state" in stats
            for state in _BREAKER_STATES
        ),
    )
    out.histogram(
        "herald_publish_duration_seconds",
        "Time from a publish request's arrival to its answer.",
        publish_duration,
    )
    if cluster is not None:
        _cluster_families(out, cluster)
    return out.text()


def _cluster_families(out: Exposition, cluster: Any) -> None:
    """PROTOCOL §7, per node: replication lag, ISR changes, leader changes."""
    reports = cluster.replication_report()
    out.family(
        "herald_replication_lag_records",
        "gauge",
        "Records a follower is behind this node (its leader) in the partition.",
        (
            (
                {"topic": r["topic"], "partition": str(r["partition"]), "follower": follower},
                lag,
            )
            for r in reports
            for follower, lag in r["lag"].items()
            if lag is not None
        ),
    )
    out.family(
        "herald_partition_high_watermark",
        "gauge",
        "The partition's high watermark (readable end), for partitions this node leads.",
        (
            ({"topic": r["topic"], "partition": str(r["partition"])}, r["high_watermark"])
            for r in reports
        ),
    )
    out.family(
        "herald_partition_isr_size",
        "gauge",
        "In-sync replicas of a partition this node leads.",
        (({"topic": r["topic"], "partition": str(r["partition"])}, len(r["isr"])) for r in reports),
    )
    out.family(
        "herald_leader_partitions",
        "gauge",
        "Partitions this node leads.",
        [({}, len(reports))],
    )
    counters = cluster.counters
    for name, value, help_text in (
        ("herald_isr_shrinks_total", counters.isr_shrinks, "ISR shrinks this node wrote."),
        ("herald_isr_expands_total", counters.isr_expands, "ISR expansions this node wrote."),
        (
            "herald_leader_changes_total",
            counters.leader_changes,
            "Times this node became the leader of a partition.",
        ),
        (
            "herald_lease_refusals_total",
            counters.lease_refusals,
            "Writes refused because this node's etcd lease could have expired.",
        ),
        (
            "herald_forwarded_records_total",
            counters.forwarded_records,
            "Records published to this node that it forwarded to their partition's leader.",
        ),
    ):
        out.family(name, "counter", help_text, [({}, value)])
