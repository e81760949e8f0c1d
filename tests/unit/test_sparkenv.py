"""sparkenv: the interpreter Spark's workers would run must be able to import logstore."""

from __future__ import annotations

import os
import sys

from logstore.spark.env import worker_python_problem


def _fake_python(tmp_path, name, exit_status, stderr=""):
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' \"{stderr}\" >&2\nexit {exit_status}\n")
    os.chmod(path, 0o755)
    return str(path)


def test_this_interpreter_is_fine():
    assert worker_python_problem(sys.executable) is None


def test_an_interpreter_without_logstore_is_named_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    bare = _fake_python(tmp_path, "python3", 1, "ModuleNotFoundError: No module named 'logstore'")
    problem = worker_python_problem(bare)
    assert problem is not None
    assert bare in problem and "PYSPARK_PYTHON is not set" in problem
    assert "No module named 'logstore'" in problem and f"PYSPARK_PYTHON={sys.executable}" in problem


def test_an_interpreter_that_imports_logstore_is_fine(tmp_path):
    assert worker_python_problem(_fake_python(tmp_path, "py-ok", 0)) is None


def test_a_missing_interpreter_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", str(tmp_path / "nope"))
    problem = worker_python_problem(str(tmp_path / "nope"))
    assert problem is not None and "not found" in problem and f"PYSPARK_PYTHON={tmp_path / 'nope'}" in problem
