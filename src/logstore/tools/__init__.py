"""Operator tools over a store's files: dump, verify (a full scrub), stats, progress bars.

Read-only: nothing here changes a store's files, so every tool may run beside a live store.
:mod:`~logstore.tools.dump` describes one file, :mod:`~logstore.tools.verify` scrubs a store,
:mod:`~logstore.tools.stats` sums it up per partition, :mod:`~logstore.tools.progress` draws the
progress bars. The functions ``verify`` and ``stats`` are re-exported under their modules' names,
so ``logstore.tools.verify`` is the function; import a module's other names with
``from logstore.tools.verify import ...``.
"""

from .dump import dump_file
from .stats import PartitionStats, partition_key, stats
from .verify import Problem, VerifyReport, verify

__all__ = ["dump_file", "verify", "stats", "partition_key", "Problem", "VerifyReport", "PartitionStats"]
