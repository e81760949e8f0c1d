"""Which Python interpreter Spark's workers run, and whether it can import logstore.

Spark runs the "logstore" data source in Python worker processes that it starts itself, with
the interpreter named by ``PYSPARK_PYTHON`` (``spark.pyspark.python``), else ``python3`` from
``PATH`` — not necessarily the interpreter of the script that created the SparkSession. A
script run as ``.venv/bin/python job.py`` without activating the virtual environment therefore
gets workers that fail deep inside Spark with "No module named 'logstore'" (or, when the source
is found by name, Spark's "Failed to find the data source: logstore").

:func:`worker_python_problem` finds this out on the driver, for local masters (where the
workers run on this machine), before Spark does; :class:`logstore.spark.source.LogstoreDataSource`
calls it (:func:`check_driver`) when it is registered (``spark.dataSource.register``). Set ``PYSPARK_PYTHON`` to
``sys.executable`` before the SparkSession starts, as ``examples/spark_batch.py`` does.

Thread-safety: the result per interpreter is cached under a lock; call from any thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

from ..errors import LogstoreError

__all__ = ["worker_python_problem", "check_driver"]

_cache: dict[str, str | None] = {}
_cache_lock = threading.Lock()


def worker_python_problem(python: str) -> str | None:
    """Why Spark workers running ``python`` (an interpreter path or a name on ``PATH``) could
    not import logstore, or None when they can. Runs the interpreter once (cached) unless it is
    this process's own interpreter."""
    found = shutil.which(python) or python
    if os.path.realpath(found) == os.path.realpath(sys.executable):
        return None
    with _cache_lock:
        if found in _cache:
            return _cache[found]
    fix = (f"set PYSPARK_PYTHON={sys.executable} (the interpreter that has logstore) before the SparkSession "
           "starts, or activate that environment")
    setting = os.environ.get("PYSPARK_PYTHON")
    source = f"PYSPARK_PYTHON={setting}" if setting else "PYSPARK_PYTHON is not set"
    if not os.path.exists(found):
        problem: str | None = f"Spark's Python workers would run {python!r} ({source}), which is not found; {fix}"
    else:
        try:
            r = subprocess.run([found, "-c", "import logstore"], capture_output=True, text=True, timeout=120)
            error = (r.stderr.strip().splitlines() or ["exit status %d" % r.returncode])[-1]
            problem = None if r.returncode == 0 else (
                f"Spark's Python workers would run {found} ({source}), which cannot import logstore ({error}); {fix}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = f"Spark's Python workers would run {found} ({source}), which did not start: {exc}; {fix}"
    with _cache_lock:
        _cache[found] = problem
    return problem


def check_driver() -> None:
    """On a driver with an active local SparkSession, raise :class:`LogstoreError` when the
    interpreter its Python workers run cannot import logstore (see the module docstring).
    Does nothing in Spark's workers (no session), in a Spark Connect client (no SparkContext
    here) or with a cluster master, whose executors' interpreter lives on other machines."""
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    try:
        sc = SparkSession.active().sparkContext
    except PySparkException:  # no active or default session, or Spark Connect's (no context)
        return
    if not str(sc.master).startswith("local"):
        return
    problem = worker_python_problem(sc.pythonExec)
    if problem is not None:
        raise LogstoreError(problem)
