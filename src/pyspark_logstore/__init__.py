"""Registers logstore's PySpark data source by name: Spark imports top-level ``pyspark_*``
modules and registers their ``DefaultSource``, so ``spark.read.format("logstore")`` works
without ``spark.dataSource.register``. See :mod:`logstore.spark.source`."""

from logstore.spark.source import LogstoreDataSource as DefaultSource

__all__ = ["DefaultSource"]
