"""Spark reads a store's segment files directly: spark.read.format("logstore").

A producer writes JSON page views to a 4-partition topic; a local Spark session (2 cores) then
reads the topic through the "logstore" data source (its JVM reader when ``make jar`` built it,
else the Python source registered automatically by the ``pyspark_logstore`` module), parses the
JSON and counts views per page, reads an offset range the way Spark's Kafka source would, and
appends the per-page counts to another topic with ``df.write.format("logstore")`` (the Python
source's writer, also with the jar). Needs the ``spark`` extra (pyspark, pyarrow) and Java 17.
Run: ``python examples/spark_batch.py`` (``make demo`` runs it).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import logstore


def main() -> None:
    root = tempfile.mkdtemp(prefix="logstore-spark-")
    with logstore.LogStore(root) as store:
        store.create_topic("views", partitions=4, compression_type="zstd")
        store.create_topic("per-page", partitions=1)
        with store.producer(linger_ms=5) as producer:
            for i in range(20_000):
                page = f"/page/{i % 7}"
                producer.send("views", json.dumps({"page": page, "user": i % 301}).encode(), key=page.encode())
            producer.flush()

    # Spark's Python workers must run this interpreter (it has logstore installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession, functions as F

    # The JVM reader (built by `make jar`): Spark then reads the batches in its own JVM, building
    # only the columns a query uses; writes still go through the Python source.
    from logstore.spark import JarNotBuiltError, jar_path

    builder = SparkSession.builder
    try:
        builder = builder.config("spark.jars", jar_path())
    except JarNotBuiltError as exc:
        print(f"{exc}; reading with the Python source")
    spark = (builder.master("local[2]").appName("logstore-example")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        views = spark.read.format("logstore").option("path", root).option("subscribe", "views").load()
        views.printSchema()
        parsed = views.select(F.get_json_object(F.col("value").cast("string"), "$.page").alias("page"), "partition")
        counts = parsed.groupBy("page").count().orderBy("page")
        counts.show()

        # An offset range, as with Spark's Kafka source: the first 100 records of partition 0.
        first = (spark.read.format("logstore").option("path", root).option("subscribe", "views")
                 .option("startingOffsets", json.dumps({"views": {"0": -2}}))
                 .option("endingOffsets", json.dumps({"views": {"0": 100, "1": 0, "2": 0, "3": 0}})).load())
        print("records in the range:", first.count())

        # Append the counts to another topic, keyed by page.
        (counts.select(F.col("page").cast("binary").alias("key"), F.to_json(F.struct("page", "count")).cast("binary").alias("value"))
         .write.format("logstore").option("path", root).option("topic", "per-page").mode("append").save())
    finally:
        spark.stop()

    with logstore.LogStore(root) as store:
        for record in store.partition("per-page", 0).read(0):
            print(record.key.decode(), record.value.decode())


if __name__ == "__main__":
    main()
