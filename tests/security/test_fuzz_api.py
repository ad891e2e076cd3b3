"""schemathesis against /openapi.json: no input makes the server answer 500 (bounded examples)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.conftest import HeraldProcess

EXAMPLES_PER_OPERATION = 12


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeraldProcess]:
    server = HeraldProcess(tmp_path_factory.mktemp("fuzz") / "data").start()
    try:
        yield server
    finally:
        server.terminate()


def test_no_generated_request_makes_a_500(fuzzed_server: HeraldProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzzed_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations
    for operation in operations:

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        @given(case=operation.as_strategy())
        def no_500(case: schemathesis.Case) -> None:
            response = case.call(base_url=fuzzed_server.url, timeout=10)
            assert response.status_code < 500, (case.method, case.path, response.text)

        no_500()
    assert fuzzed_server.is_running()
