"""Fixtures shared by the replication suites."""

from .test_divergence import make_cluster  # noqa: F401 - the fixture, for test_review_regressions.py
