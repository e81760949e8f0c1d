"""The property and stateful suites check what a log, a queue and transactions say, never what
survives a power loss: fsync is a no-op here (``no_flush_to_disk``, tests/conftest.py). Two
thirds of a stateful run's time went to the disk's flushes before."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_flush(no_flush_to_disk):
    yield
