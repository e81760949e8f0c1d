"""Registers logstore's PySpark data source by name: Spark imports top-level ``pyspark_*``
modules and registers their ``DefaultSource``, so ``spark.read.format("logstore")`` works
without ``spark.dataSource.register``. With the JVM reader's jar on ``spark.jars`` the name is the
JVM provider's, which still hands writes and streaming reads to this source (see
:mod:`logstore.spark.source`)."""

from logstore.spark.source import LogstoreDataSource as DefaultSource

__all__ = ["DefaultSource"]
