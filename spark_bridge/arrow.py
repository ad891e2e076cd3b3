"""Records as Arrow, in the two forms a batch takes: the form shipped to executors
inside an InputPartition, and the form of the source schema that `read` yields.

Both are built column by column in bulk, never row by row. The shipped form leaves
out `value`: for a JSON record it is the text of `value_bytes`, so each record's
value travels once (planning worker → JVM → executor) instead of twice, and the
executor rebuilds the column from `value_bytes` without copying it.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from client.consumer import Message
from spark_bridge import SCHEMA

# The Arrow form of spark_bridge.SCHEMA, exactly as Spark checks what `read` returns.
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
_HEADERS = ARROW_SCHEMA.field("headers").type
_TIMESTAMP = ARROW_SCHEMA.field("timestamp").type

# The schema's columns but `value`, and whether each record's value is JSON.
SHIPPED_SCHEMA = pa.schema(
    [f for f in ARROW_SCHEMA if f.name != "value"]
    + [pa.field("value_is_json", pa.bool_(), nullable=False)]
)


def shipped_batch(records: Sequence[Message]) -> pa.RecordBatch:
    """`records` (delivered or read) in the shipped form."""
    value_bytes = [bytes(r.value) if r.is_bytes else orjson.dumps(r.value) for r in records]
    offsets = [0]
    keys: list[str] = []
    items: list[str] = []
    for r in records:
        if r.headers:
            keys.extend(r.headers)
            items.extend(r.headers.values())
        offsets.append(len(keys))
    headers = pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.array(keys, pa.string()),
        pa.array(items, pa.string()),
        type=_HEADERS,
    )
    columns = [
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.id for r in records], pa.string()),
        pa.array([r.timestamp * 1000 for r in records], _TIMESTAMP),  # ms → µs
        pa.array([r.key for r in records], pa.string()),
        headers,
        pa.array(value_bytes, pa.binary()),
        pa.array([not r.is_bytes for r in records], pa.bool_()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SHIPPED_SCHEMA)


def schema_batch(shipped: pa.RecordBatch) -> pa.RecordBatch:
    """A shipped batch in the source schema: `value` is `value_bytes` read as text,
    null where the record is bytes. It shares `value_bytes`' buffers: no copy."""
    value_bytes = _at_offset_zero(shipped.column("value_bytes"))
    is_json = _at_offset_zero(shipped.column("value_is_json"))
    # A boolean array's values are a bitmap, which is exactly a validity bitmap.
    validity = None if is_json.false_count == 0 else is_json.buffers()[1]
    _, value_offsets, value_data = value_bytes.buffers()
    value = pa.Array.from_buffers(
        pa.string(), len(value_bytes), [validity, value_offsets, value_data]
    )
    columns = [value if f.name == "value" else shipped.column(f.name) for f in ARROW_SCHEMA]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _at_offset_zero(array: pa.Array) -> pa.Array:
    # Buffers are shared only between arrays that start at the same offset.
    return array if array.offset == 0 else pa.concat_arrays([array])
