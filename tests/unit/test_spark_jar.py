"""logstore.spark.jar: the path of the Spark JVM reader's jar, or an error naming the build."""

from __future__ import annotations

import os
import zipfile

import pytest

import logstore.spark.jar as jar
from logstore import LogstoreError
from logstore.spark import JarNotBuiltError, jar_path


def test_the_built_jar_registers_the_logstore_format():
    """make test builds the jar first (when a Java JDK is there); it holds the provider and its
    service registration."""
    try:
        path = jar_path()
    except JarNotBuiltError as exc:
        pytest.skip(f"the Spark JVM reader is not built: {exc}")
    assert os.path.isabs(path) and path.endswith(os.path.join("logstore", "spark", "logstore-spark.jar"))
    with zipfile.ZipFile(path) as z:
        services = z.read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister").decode()
        assert services.strip() == "logstore.spark.jvm.LogstoreProvider"
        assert "logstore/spark/jvm/LogstoreProvider.class" in z.namelist()


def test_a_missing_jar_raises_an_error_that_names_make(monkeypatch):
    monkeypatch.setattr(jar.os.path, "isfile", lambda path: False)
    with pytest.raises(JarNotBuiltError, match="make jar") as caught:
        jar_path()
    assert isinstance(caught.value, LogstoreError)
