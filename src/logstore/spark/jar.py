"""Where the Spark JVM reader's jar is: :func:`jar_path` for ``spark.jars``.

The jar (``logstore-spark.jar`` beside this module) holds the "logstore" format as a Spark
DataSource V2 in Java (sources in ``jvm/``): with it on ``spark.jars``, ``spark.read.format("logstore")``
reads a store's segment files in the executors' JVMs, with column pruning, filter pushdown and
columnar batches, while writes and streaming reads go on through the Python source
(:mod:`logstore.spark.source`). ``make`` builds it (``make jar``, and before ``make test`` and
``make demo``) with a Java 17 JDK against the jars pyspark ships; it is not committed.

Thread-safety: pure functions.
"""

from __future__ import annotations

import os

from ..errors import LogstoreError

__all__ = ["JAR_NAME", "JarNotBuiltError", "jar_path"]

#: the jar's file name, inside this package
JAR_NAME = "logstore-spark.jar"


class JarNotBuiltError(LogstoreError):
    """The Spark JVM reader's jar has not been built (run ``make jar`` in a source checkout)."""


def jar_path() -> str:
    """The absolute path of the Spark JVM reader's jar, for ``spark.jars``::

        spark = (SparkSession.builder.config("spark.jars", logstore.spark.jar_path()).getOrCreate())

    Raises:
        JarNotBuiltError: the jar is not there (it is built by ``make``, needing a Java 17 JDK).
    """
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), JAR_NAME)
    if not os.path.isfile(path):
        raise JarNotBuiltError(f"the Spark JVM reader's jar {path} has not been built: run `make jar` (or `make test`, "
                               "`make demo`) in the source checkout; it needs a Java 17 JDK (javac)")
    return path
