"""The examples in docstrings run (doctest)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["logstore", "logstore.store.store", "logstore.log.config", "logstore.store.kafkadirs", "logstore.kafka.credentials",
           "logstore.errorcodes", "logstore.records.control", "logstore.index", "logstore.txn.metadata",
           "logstore.log.producerstate", "logstore.tiered.objectstore", "logstore.tiered.storage"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no doctest examples"
    assert result.failed == 0
