"""Dead-letter records (PROTOCOL §2 `dead_letter_topic`): the source record's value, key
and headers, plus herald-source-* headers (decimal strings) saying where it came from.
The names live here for both sides: the runtime writes them, redrive reads them."""

from __future__ import annotations

from delivery.events import DeadLetter
from storage.record import NewRecord

SOURCE_HEADER_PREFIX = "herald-source-"
SOURCE_TOPIC = "herald-source-topic"
SOURCE_PARTITION = "herald-source-partition"
SOURCE_OFFSET = "herald-source-offset"
SOURCE_DELIVERIES = "herald-source-deliveries"
SOURCE_REASON = "herald-source-reason"


def dead_letter_record(dead: DeadLetter, source_topic: str) -> NewRecord:
    record = dead.record
    headers = dict(record.headers)
    headers[SOURCE_TOPIC] = source_topic
    headers[SOURCE_PARTITION] = str(record.partition)
    headers[SOURCE_OFFSET] = str(record.offset)
    headers[SOURCE_DELIVERIES] = str(dead.deliveries)
    headers[SOURCE_REASON] = dead.reason.value
    return NewRecord(record.value, record.kind, record.key, headers)
