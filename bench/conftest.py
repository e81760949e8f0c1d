"""pytest-benchmark suite of logstore: run explicitly with ``pytest bench --benchmark-only``.

Collection: benchmark modules are named ``bench_*.py`` so that pytest's default ``test_*.py``
pattern never picks them up, and the hook below collects them only when ``bench/`` (or a file in
it) is named on the command line. ``pytest`` / ``pytest tests`` (testpaths = ["tests"]) and even
``pytest .`` therefore never run them.

Layout: bench_append.py (append_batch and append, with and without fsync, storage overhead),
bench_read.py (sequential reads), bench_recovery.py (crash recovery scan), bench_primitives.py
(crc32c, batch encode/decode per codec, the disk's fsync floor). compare.py runs the same
workloads against sqlite3, lmdb and persist-queue; _workload.py makes the data (exact-size JSON
values, 16-byte keys) for both.

Reporting: every benchmark calls ``_report.report`` (or ``report_value``), which puts records/s
(and MB/s or GB/s) computed from the benchmark's mean round time, and from its fastest round,
into ``benchmark.extra_info`` (so ``--benchmark-json`` carries them) and adds a row to the table
printed at the end of the run, next to the issue's target and whether it was met. The table
starts with the machine, the commit measured and the load average, since the figures mean
little without them.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

import _report  # noqa: E402
import _workload  # noqa: E402


# ---------------------------------------------------------------------- collection
def _bench_named_explicitly(config: pytest.Config) -> bool:
    for arg in config.args:
        path = pathlib.Path(str(arg).split("::", 1)[0])
        if not path.is_absolute():
            path = pathlib.Path(config.invocation_params.dir) / path
        try:
            path.resolve().relative_to(_HERE)
            return True
        except ValueError:
            continue
    return False


def pytest_collect_file(file_path: pathlib.Path, parent: pytest.Collector):
    # A file named on the command line is collected by pytest's python plugin whatever its name.
    if (file_path.suffix == ".py" and file_path.name.startswith("bench_")
            and not parent.session.isinitpath(file_path) and _bench_named_explicitly(parent.config)):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


# ---------------------------------------------------------------------- data
_POOL = 4000  # distinct values per payload size; batches are slices of the pool


@pytest.fixture(scope="session")
def pool():
    """``pool(size)`` -> (values, keys): _POOL distinct JSON values of ``size`` bytes, 16-byte keys."""
    cache: dict[int, tuple[list[bytes], list[bytes]]] = {}
    keys = _workload.make_keys(_POOL)

    def get(size: int) -> tuple[list[bytes], list[bytes]]:
        if size not in cache:
            cache[size] = (_workload.make_values(_POOL, size), keys)
        return cache[size]

    return get


@pytest.fixture
def scratch():
    """A fresh directory on the benchmark filesystem, removed afterwards."""
    with _workload.scratch_dir() as path:
        yield path


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _report.ROWS:
        terminalreporter.section("logstore throughput (records/s from each benchmark's mean and fastest round)")
        for line in _report.summary_lines():
            terminalreporter.write_line(line)
