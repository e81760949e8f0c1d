"""Operator tools over a store's files: dump, verify (a full scrub), stats, progress bars.

Read-only: nothing here changes a store's files, so every tool may run beside a live store.
"""

from .inspect import PartitionStats, Problem, VerifyReport, dump_file, partition_key, stats, verify

__all__ = ["dump_file", "verify", "stats", "partition_key", "Problem", "VerifyReport", "PartitionStats"]
