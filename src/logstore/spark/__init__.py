"""The PySpark data source ``logstore``: options, driver planning, executors' Arrow decoding, the
writer; and :func:`jar_path`, the jar of its JVM reader (:mod:`logstore.spark.jar`)."""

from .jar import JarNotBuiltError, jar_path

__all__ = ["JarNotBuiltError", "jar_path"]
