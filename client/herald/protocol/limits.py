"""The limits of PROTOCOL §2-§8 and docs/protocol.md, in one place: the server validates
with them, server/openapi.py publishes them, and the SDK checks its arguments against
them before a request is sent."""

from __future__ import annotations

from dataclasses import dataclass

MAX_INT64 = 2**63 - 1

MAX_PARTITIONS = 1024
MAX_BATCH = 10_000  # messages in one publish
MAX_ID_CHARS = 128  # a message `id` (deduplication)
DEFAULT_READ_LIMIT = 100
MAX_CREDIT = 1_000_000  # a consumer's credit; a larger one is capped (PROTOCOL §3)
# PROTOCOL §1: `value` is any JSON value, stored as the compact JSON text the server
# writes of it. orjson, which writes it, goes no deeper than 254 levels of arrays and
# objects and holds integers within 64 bits (signed or unsigned).
MAX_VALUE_DEPTH = 254
MIN_VALUE_INT = -(2**63)
MAX_VALUE_INT = 2**64 - 1
MAX_DELAY_MS = 2_592_000_000  # PROTOCOL §8: delay_ms is 0..30 days (fits a u32 on disk)
MAX_NACK_DELAY_MS = 600_000  # a nack frame's `delay_ms`
MAX_NACK_REASON = 256  # characters of a nack `reason` (PROTOCOL §8)
MAX_FILTER_CHARS = 1024  # PROTOCOL §8: a longer well-formed filter is validation_error
MAX_PREVIOUS_SECRETS = 5  # docs/protocol.md `push.previous_secrets`
MAX_URL_CHARS = 2048  # a push URL
REDRIVE_DEFAULT_RATE = 500  # records/s
REDRIVE_MAX_RATE = 10_000
REDRIVE_DEFAULT_MAX_RECORDS = 10_000
REDRIVE_MAX_RECORDS_LIMIT = 1_000_000
REDRIVE_MAX_REASON = (
    4096  # characters of a `reason` to redrive (longer than any a dead letter says)
)


@dataclass(frozen=True, slots=True)
class IntRange:
    """The integers a field accepts (inclusive); server/openapi.py publishes the same."""

    low: int
    high: int = MAX_INT64


# Every integer range of PROTOCOL §2-§4 and docs/protocol.md.
PARTITIONS = IntRange(1, MAX_PARTITIONS)
PARTITION = IntRange(0, MAX_PARTITIONS - 1)  # one named in a published message
DELAY_MS = IntRange(0, MAX_DELAY_MS)  # PROTOCOL §8 delayed delivery, 30 days
DEDUP_WINDOW_MS = IntRange(1000, 604_800_000)
REPLICATION_FACTOR = IntRange(1, 16)  # PROTOCOL §7; also at most the live nodes
MIN_INSYNC_REPLICAS = IntRange(1, 16)  # at most replication_factor
RETENTION_MS = IntRange(1000)
RETENTION_BYTES = IntRange(1_048_576)
TIMESTAMP = IntRange(0)  # ms since the epoch
OFFSET = IntRange(0)
READ_LIMIT = IntRange(1, 10_000)
WAIT_MS = IntRange(0, 30_000)
PULL_MAX_MESSAGES = IntRange(1, 1000)  # PROTOCOL §8 pull
ACK_DEADLINE_MS = IntRange(100, 600_000)
MAX_IN_FLIGHT = IntRange(1, 100_000)
MAX_DELIVERIES = IntRange(0, 1000)
BACKOFF_MS = IntRange(1, 3_600_000)  # retry_backoff.min_ms / max_ms
PUSH_MAX_IN_FLIGHT = IntRange(1, 1000)
PUSH_TIMEOUT_MS = IntRange(100, 60_000)
BATCH_MAX_RECORDS = IntRange(1, 1000)  # PROTOCOL §8 push.batch
BATCH_MAX_WAIT_MS = IntRange(0, 10_000)
BREAKER_FAILURES = IntRange(1, 1000)
BREAKER_OPEN_MS = IntRange(100, 3_600_000)  # breaker.open_ms / max_open_ms
# The defaults of the two (low, high) pairs a request may give one side of (PROTOCOL §2):
# retry_backoff (min_ms, max_ms) and push.breaker (open_ms, max_open_ms).
DEFAULT_BACKOFF_MS = (100, 60_000)
DEFAULT_BREAKER_OPEN_MS = (1_000, 60_000)
PREVIOUS_TTL_MS = IntRange(0, 30 * 86_400_000)  # rotate-secret, 30 days
REDRIVE_RATE = IntRange(1, REDRIVE_MAX_RATE)
REDRIVE_MAX_RECORDS = IntRange(1, REDRIVE_MAX_RECORDS_LIMIT)
NACK_DELAY_MS = IntRange(0, MAX_NACK_DELAY_MS)  # a nack's delay_ms (PROTOCOL §3)
EXTEND_MS = IntRange(100, 600_000)  # an extend frame's `ms` (PROTOCOL §3)
TOKEN_TTL_MS = IntRange(1_000, 86_400_000)  # a browser token's lifetime (PROTOCOL §8)
MAX_TOKEN_PATTERNS = 64  # topic patterns a browser token holds for one role
MAX_TOKEN_PATTERN_CHARS = 255
