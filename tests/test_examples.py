"""The examples run as documented (each in its own interpreter, as `make demo` runs them)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", ["producer_consumer.py", "worker_pool.py", "replicated_cluster.py", "kafka_clients.py",
                                  pytest.param("spark_batch.py", marks=pytest.mark.slow)])  # (JVM start: make demo runs it)
def test_example_runs(name):
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
