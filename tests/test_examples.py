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


def test_the_tiered_storage_example_reads_every_record_back():
    done = subprocess.run([sys.executable, str(EXAMPLES / "tiered_storage.py")], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    assert "iterating the whole log: 20000 records" in done.stdout
    assert "local log start 0" not in done.stdout  # the copied segments left the local disk
    from logstore.seaweedfs import weed_binary

    if weed_binary() is not None:  # (the test extra installs it: then the S3 part runs too)
        assert "S3: local log start 15000;" in done.stdout and "20000 records in all" in done.stdout
