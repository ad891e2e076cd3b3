"""The Spark schema of a Herald record: the rows the source yields and the sink takes.

Its own module because both the package's data source (`HeraldDataSource.schema`) and
the Arrow codec (`arrow.py`) read it; living in `__init__`, it made the codec import the
package that imports the codec's reader.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("id", StringType(), False),
        StructField("timestamp", TimestampType(), False),
        StructField("key", StringType(), True),
        StructField("headers", MapType(StringType(), StringType(), False), False),
        StructField("value", StringType(), True),
        StructField("value_bytes", BinaryType(), False),
    ]
)
