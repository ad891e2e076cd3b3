"""One local Spark session (`local[2]`) for every Spark test, plus Herald helpers.

Spark needs Java 17: without it these tests fail with a message saying what to
install (they never skip silently).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import wait_until_sync

JAVA_HINT = "Spark tests need Java 17: apt-get install -y openjdk-17-jre-headless"

# pytest-timeout's budget for a Spark test, its fixtures' setup included. The first Spark
# test of a worker starts the JVM (150 s of setup seen on a loaded 2-core host, loop of
# 2026-11-27), and a query restarted after Spark's fixed 10 s Python connect-back
# (streams.ParquetQuery) starts its workers again. A test that outlives the budget is
# interrupted inside a py4j call, which leaves the session's gateway socket mid-answer
# and fails every later Spark test of that worker: the tests' own bounded waits
# (`wait_until`'s `within`) are what should say what was late, well inside it.
SPARK_TEST_TIMEOUT_S = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SPARK_TEST_TIMEOUT_S))


def _worker_python(directory: Path) -> str:
    """The interpreter Spark starts its Python workers with: this one, importing pyspark
    from site-packages (compiled once) rather than from the pyspark.zip Spark puts first
    on their path, which Python compiles from source at every start (1.1 s more CPU).
    Spark gives a streaming source's worker 10 s to connect back: on a busy 2-core host
    the zip alone used most of it and queries failed to start."""
    script = directory / "python"
    script.write_text(
        "#!/bin/sh\n"
        'PYTHONPATH=$(printf %s "$PYTHONPATH" | tr : "\\n" | grep -v "/pyspark.zip$" '
        "| paste -sd : -)\n"
        "export PYTHONPATH\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail(JAVA_HINT, pytrace=False)
    os.environ["PYSPARK_PYTHON"] = _worker_python(tmp_path_factory.mktemp("spark-python"))
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import herald.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("herald-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.pollingDelay", "50ms")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    herald.spark.register(session)
    yield session
    session.stop()


def publish(url: str, topic: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for i in range(0, len(messages), 5000):
        r = httpx.post(
            f"{url}/v1/topics/{topic}/messages", json={"messages": messages[i : i + 5000]}
        )
        r.raise_for_status()
        results.extend(r.json()["results"])
    return results


def read_all(url: str, topic: str, partition: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    offset = 0
    while True:
        r = httpx.get(
            f"{url}/v1/topics/{topic}/partitions/{partition}/messages",
            params={"offset": offset, "limit": 10000},
        )
        r.raise_for_status()
        page = r.json()
        out.extend(page["messages"])
        if not page["messages"]:
            return out
        offset = page["next_offset"]


def subscription_of(url: str, sub: str) -> dict[str, Any]:
    """GET /v1/subscriptions/{sub}: its ``config`` and ``stats``."""
    r = httpx.get(f"{url}/v1/subscriptions/{sub}")
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    return body


def wait_until(check: Callable[[], bool], timeout: float, what: str, query: Any = None) -> None:
    """Poll `check` for at most `timeout` s; a failed `query` fails the wait at once."""

    def done() -> bool:
        if query is not None and query.exception() is not None:
            raise AssertionError(f"the query failed while waiting for {what}: {query.exception()}")
        return check()

    wait_until_sync(done, timeout, what)
