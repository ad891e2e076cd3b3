"""schemathesis against a live server's /openapi.json (issue 20 §2, §4): no generated
request makes the server answer 5xx, and the server does what its OpenAPI document
says, with every check schemathesis has (status codes, content types, response
schemas, schema-valid requests accepted, schema-violating ones refused).

Bounded: a few examples per operation and generation mode, derandomized, so the run
takes a minute or two and fails the same way every time. The only disagreements
allowed are the rules JSON Schema cannot state, listed in ALLOWED with why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from schemathesis import engine
from schemathesis.engine import events
from schemathesis.generation import GenerationMode

from tests.conftest import HeraldProcess

EXAMPLES_PER_OPERATION = 25


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeraldProcess]:
    server = HeraldProcess(tmp_path_factory.mktemp("fuzz") / "data").start()
    try:
        yield server
    finally:
        server.terminate()


def _problem(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _problem_code(response: Any) -> str | None:
    code = _problem(response).get("code")
    return code if isinstance(code, str) else None


def _both_offset_and_timestamp(case: schemathesis.Case, response: Any) -> bool:
    # PROTOCOL §2 read: `offset` and `timestamp` each valid, both together bad_request.
    query = case.query or {}
    return "offset" in query and "timestamp" in query and _problem_code(response) == "bad_request"


def _integer(value: Any) -> int | None:
    # PROTOCOL §2: an integral float is the integer it is (JSON Schema's "integer" takes
    # 5000.0 too, and schemathesis sends it); true is no integer.
    if type(value) is int or (type(value) is float and value.is_integer()):
        return int(value)
    return None


def _min_above_max(case: schemathesis.Case, response: Any) -> bool:
    # retry_backoff.min_ms <= max_ms and push.breaker.open_ms <= max_open_ms: a
    # relation between two fields, which JSON Schema cannot state.
    body = case.body if isinstance(case.body, dict) else {}
    backoff = body.get("retry_backoff") or {}
    breaker = (
        (body.get("push") or {}).get("breaker") or {} if isinstance(body.get("push"), dict) else {}
    )
    pairs = (
        (backoff.get("min_ms"), backoff.get("max_ms")),
        (breaker.get("open_ms"), breaker.get("max_open_ms")),
    )
    numbers = [(_integer(low), _integer(high)) for low, high in pairs]
    inverted = any(low is not None and high is not None and low > high for low, high in numbers)
    # An absent bound is its default: min_ms 2000000 alone is above max_ms's 60000.
    unbalanced = any((low is None) != (high is None) for low, high in pairs)
    return (inverted or unbalanced) and _problem_code(response) == "validation_error"


def _past_the_end(case: schemathesis.Case, response: Any) -> bool:
    # A read at an offset past the partition's end: the end is state, not shape.
    return _problem_code(response) == "offset_out_of_range"


def _partition_the_topic_lacks(case: schemathesis.Case, response: Any) -> bool:
    # A published message naming a partition (0..1023 in the schema) that this topic,
    # auto-created with one partition, does not have: state, like a read past the end.
    if _problem_code(response) != "validation_error" or not isinstance(case.body, dict):
        return False
    messages = case.body.get("messages") or []
    return any(isinstance(m, dict) and m.get("partition") for m in messages) and (
        "does not exist" in str(_problem(response).get("detail"))
    )


def _malformed_filter(case: schemathesis.Case, response: Any) -> bool:
    # PROTOCOL §8 `filter` is a grammar (herald/protocol/filter.py), which JSON Schema cannot
    # state: a string outside it is bad_request, its detail naming the fault's position.
    body = case.body if isinstance(case.body, dict) else {}
    detail = str(_problem(response).get("detail"))
    return (
        isinstance(body.get("filter"), str)
        and _problem_code(response) == "bad_request"
        and detail.startswith("filter:")
        and "at position" in detail
    )


def _raw_batch(case: schemathesis.Case, response: Any) -> bool:
    # PROTOCOL §8: push.payload "raw" only with push.batch.max_records 1, a relation
    # between two fields, which the document states in words.
    body = case.body if isinstance(case.body, dict) else {}
    push = body.get("push") if isinstance(body.get("push"), dict) else {}
    batch = push.get("batch") if isinstance(push.get("batch"), dict) else {}
    max_records = batch.get("max_records")
    return (
        push.get("payload") == "raw"
        and isinstance(max_records, int)
        and max_records > 1
        and _problem_code(response) == "validation_error"
    )


def _one_history_name(case: schemathesis.Case, response: Any) -> bool:
    # GET /v1/stats/history names one topic or one subscription: "exactly one of two
    # optional parameters" is a rule OpenAPI's parameters cannot state.
    query = case.query or {}
    return (
        case.path == "/v1/stats/history"
        and ("topic" in query) == ("subscription" in query)
        and _problem_code(response) == "validation_error"
    )


def _push_added_without_its_secret(case: schemathesis.Case, response: Any) -> bool:
    # PATCH may leave push.secret out to keep the current one (PROTOCOL §8 change in
    # place); a subscription without push has none to keep: state, not shape.
    body = case.body if isinstance(case.body, dict) else {}
    push = body.get("push") if isinstance(body.get("push"), dict) else {}
    return (
        case.method == "PATCH"
        and "secret" not in push
        and _problem_code(response) == "bad_request"
        and "has none to keep" in str(_problem(response).get("detail"))
    )


ALLOWED: tuple[Callable[[schemathesis.Case, Any], bool], ...] = (
    _push_added_without_its_secret,
    _one_history_name,
    _both_offset_and_timestamp,
    _malformed_filter,
    _min_above_max,
    _raw_batch,
    _past_the_end,
    _partition_the_topic_lacks,
)


def test_the_server_does_what_its_openapi_document_says(fuzzed_server: HeraldProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzzed_server.url}/openapi.json")
    schema.config.update(base_url=fuzzed_server.url)
    schema.config.phases.update(phases=["examples", "coverage", "fuzzing"])
    schema.config.generation.update(
        modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
        max_examples=EXAMPLES_PER_OPERATION,
        deterministic=True,
        database="none",
    )

    @schema.hook
    def filter_failure(context: Any, failure: Any, case: schemathesis.Case, response: Any) -> bool:
        if response is not None and response.status_code >= 500:
            return True  # a 5xx is never allowed
        return not any(allowed(case, response) for allowed in ALLOWED)

    failures: list[str] = []
    errors: list[str] = []
    operations = 0
    for event in engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            operations += 1
            for nodes in event.recorder.checks.values():
                for node in nodes:
                    if node.failure_info is not None:
                        failure = node.failure_info.failure
                        failures.append(
                            f"{event.recorder.label}: {failure.title}\n{failure.message}\n"
                            f"{node.failure_info.code_sample}"
                        )
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            errors.append(repr(event))
    assert not errors, "\n".join(errors)
    assert operations >= 17
    assert not failures, f"{len(failures)} disagreement(s):\n\n" + "\n\n".join(
        sorted(set(failures))
    )
    assert fuzzed_server.is_running()
