import pytest

from delivery.backoff import backoff_ms, jittered_backoff_ms


def test_backoff_doubles_from_min_per_redelivery():
    assert [backoff_ms(n, 100, 60_000) for n in (1, 2, 3, 4)] == [100, 200, 400, 800]


def test_backoff_is_capped_at_max():
    assert backoff_ms(20, 100, 60_000) == 60_000
    assert backoff_ms(10_000, 1, 3_600_000) == 3_600_000


def test_backoff_of_redelivery_zero_is_treated_as_first():
    assert backoff_ms(0, 100, 60_000) == 100


@pytest.mark.parametrize("rand", [0.0, 0.25, 0.5, 0.999999, 1.0])
def test_jitter_stays_within_eighty_percent_and_full_delay(rand):
    delay = jittered_backoff_ms(3, 100, 60_000, lambda: rand)
    assert 320 <= delay <= 400


def test_jitter_spans_the_whole_window():
    assert jittered_backoff_ms(1, 1000, 1000, lambda: 0.0) == pytest.approx(800)
    assert jittered_backoff_ms(1, 1000, 1000, lambda: 1.0) == pytest.approx(1000)
