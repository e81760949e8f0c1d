"""Fixtures shared by the replication suites.

The in-process replica sets here check what the nodes agree on and say, never what survives a
power loss (nodes killed as processes keep the page cache; power loss is the crash suites' job):
fsync is a no-op in this process (``no_flush_to_disk``, tests/conftest.py). Nodes run as
processes still fsync."""

import pytest

from .test_divergence import make_cluster  # noqa: F401 - the fixture, for test_review_regressions.py


@pytest.fixture(autouse=True)
def _no_flush(no_flush_to_disk):
    yield
