"""Herald ↔ Spark Structured Streaming: a Python Data Source named `herald`.

    import herald.spark
    herald.spark.register(spark)
    df = (spark.readStream.format("herald")
          .option("url", "http://127.0.0.1:8080")  # or a cluster's nodes: "http://n1,http://n2"
          .option("topic", "orders")
          .option("subscription", "orders-spark").load())
    df.writeStream.format("herald").option("topic", "out").option("checkpointLocation", …)

See docs/spark.md for the schema, the options and the delivery guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter
from pyspark.sql.types import StructType

from .schema import SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class HeraldDataSource(DataSource):
    """`spark.readStream.format("herald")` and `df.writeStream.format("herald")`."""

    @classmethod
    def name(cls) -> str:
        return "herald"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .source import HeraldStreamReader

        return HeraldStreamReader(dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import HeraldStreamWriter

        return HeraldStreamWriter(dict(self.options))


def register(spark: SparkSession) -> None:
    """Register the `herald` data source with this session."""
    spark.dataSource.register(HeraldDataSource)


__all__ = ["SCHEMA", "HeraldDataSource", "register"]
