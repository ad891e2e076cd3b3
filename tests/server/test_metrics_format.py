"""Prometheus text exposition written by hand (server/metrics.py), without a network."""

from __future__ import annotations

from types import SimpleNamespace

from server.metrics import Histogram, render


def test_histogram_buckets_are_cumulative() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 5.0):
        histogram.observe(value)
    assert list(histogram.lines("d")) == [
        'd_bucket{le="0.1"} 2',
        'd_bucket{le="1.0"} 3',
        'd_bucket{le="+Inf"} 4',
        "d_sum 5.65",
        "d_count 4",
    ]


def test_render_has_every_family_with_labels_escaped() -> None:
    partition = SimpleNamespace(partition=0, end_offset=7, size_bytes=100)
    topic = SimpleNamespace(name='we"ird', messages_total=7, bytes_total=70, partitions=[partition])
    stats = {
        "s": {"delivered_total": 3, "acked_total": 2, "backlog": 5, "in_flight": 1, "consumers": 1}
    }
    text = render([topic], stats, Histogram())
    assert text.endswith("\n")
    assert 'herald_published_records_total{topic="we\\"ird"} 7' in text
    assert 'herald_published_bytes_total{topic="we\\"ird"} 70' in text
    assert 'herald_delivered_records_total{subscription="s"} 3' in text
    assert 'herald_redelivered_records_total{subscription="s"} 0' in text
    for family in (
        "herald_acked_records_total",
        "herald_dead_lettered_records_total",
        "herald_backlog_records",
        "herald_in_flight_records",
        "herald_consumers",
    ):
        assert f"# TYPE {family} " in text
    assert "# TYPE herald_publish_duration_seconds histogram" in text
    assert 'herald_publish_duration_seconds_bucket{le="+Inf"} 0' in text
    # each family is declared once
    types = [line for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))
