"""The unit suites check what each module says and does, never what survives a power loss (the
crash suites' job): fsync is a no-op here (``no_flush_to_disk``, tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_flush(no_flush_to_disk):
    yield
