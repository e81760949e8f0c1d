"""One local SparkSession (local[2], Java 17) for the Spark source tests, with the JVM reader's jar
on ``spark.jars`` when it is built (``make test`` builds it when a JDK is there):
``format("logstore")`` is then the JVM provider, which reads batches itself and hands writes,
streams and what it cannot read to the Python source (``reader=python`` asks for the Python
source's batch reader); without it, the Python source (test_spark_jvm.py skips)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    from logstore.spark import JarNotBuiltError, jar_path

    # Python workers must run this interpreter (with logstore installed), and every socket stays
    # on the loopback interface.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    try:
        builder = builder.config("spark.jars", jar_path())
    except JarNotBuiltError:
        pass  # (no JDK at build time: the Python source reads)
    session = (builder.master("local[2]").appName("logstore-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.python.filterPushdown.enabled", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
