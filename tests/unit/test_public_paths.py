"""The public paths applications use stay where they were when the package was split into wings.

Every name of ``logstore.__all__``, the ``logstore`` command (``logstore.cli:main`` and
``python -m logstore``), the pytest plugin, the Spark source's registration module, replication's
``Client`` and ``ReplicaNode``, ``TLSConfig``, the Prometheus text, the tools and the mirror.
"""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

import logstore


@pytest.mark.parametrize("name", sorted(logstore.__all__))
def test_every_name_of_all_resolves(name: str) -> None:
    value = getattr(logstore, name)
    assert value is not None
    if inspect.isclass(value) or inspect.isfunction(value):
        # the object is its wing's own, not a copy: its module says where it lives
        assert value.__module__.startswith("logstore."), value.__module__


def test_dir_lists_the_lazy_names() -> None:
    assert set(logstore.__all__) <= set(dir(logstore))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(logstore, "no_such_name")


@pytest.mark.parametrize("path, name", [
    ("logstore.cli", "main"),
    ("logstore.replication", "Client"),
    ("logstore.replication", "ReplicaNode"),
    ("logstore.replication", "ReplicationError"),
    ("logstore.netprotocol", "TLSConfig"),
    ("logstore.metrics", "prometheus_text"),
    ("logstore.tools", "stats"),
    ("logstore.tools", "verify"),
    ("logstore.tools", "dump_file"),
    ("logstore.mirror", "Mirror"),
    ("logstore.testing", "kafka_server"),
])
def test_documented_module_paths(path: str, name: str) -> None:
    assert callable(getattr(importlib.import_module(path), name))


def test_tls_config_is_the_network_layers_own() -> None:
    from logstore.net.protocol import TLSConfig
    from logstore.netprotocol import TLSConfig as public

    assert public is TLSConfig


def test_the_spark_source_registers_by_name() -> None:
    pytest.importorskip("pyspark")
    import pyspark_logstore
    from logstore.spark.source import LogstoreDataSource

    assert pyspark_logstore.DefaultSource is LogstoreDataSource
    assert LogstoreDataSource.name() == "logstore"


def test_python_dash_m_logstore_is_the_command() -> None:
    done = subprocess.run([sys.executable, "-m", "logstore", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: logstore" in done.stdout


def test_replications_error_code_names_are_kafkas_codes() -> None:
    from logstore import replication

    assert [replication.OK, replication.OUT_OF_RANGE, replication.CORRUPT_BATCH, replication.UNKNOWN_PARTITION,
            replication.NOT_LEADER, replication.TIMEOUT, replication.RECORD_TOO_LARGE,
            replication.NOT_ENOUGH_REPLICAS, replication.INVALID, replication.FENCED_EPOCH,
            replication.INVALID_RECORD] == [0, 1, 2, 3, 6, 7, 10, 19, 42, 74, 87]
