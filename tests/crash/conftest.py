"""Fixtures of the crash tests."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import pytest


@pytest.fixture
def mem_path(tmp_path) -> pathlib.Path:
    """A fresh directory on tmpfs (``/dev/shm``) when there is one, else ``tmp_path``.

    For tests whose durability is simulated (no real fsync matters: SIGKILL with a no-op sync,
    the power-loss simulator): they create and delete thousands of files, which a disk-backed
    file system makes slow for no benefit.
    """
    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    path = pathlib.Path(tempfile.mkdtemp(prefix="logstore-crash-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the figures of the crash suites that ran: crash states explored
    (test_crash_explorer.py, test_tiered_crash.py), tiered storage's cuts and kills, and the library call sites where injected I/O errors surfaced
    (test_io_errors.py)."""
    import sys

    explorer = sys.modules.get("explorer")
    if explorer is not None and explorer.REPORTS:
        terminalreporter.section("crash-state exploration")
        points = states = violations = 0
        for name, report in explorer.REPORTS:
            terminalreporter.write_line(report.summary(name))
            points += report.points
            states += report.states
            violations += len(report.violations)
        terminalreporter.write_line(f"total: {states} crash states at {points} crash points, {violations} violations")
    soak = sys.modules.get("test_soak")
    if soak is not None and soak.FIGURES:
        terminalreporter.section("kill -9 soak")
        for figures in soak.FIGURES:
            terminalreporter.write_line(figures.summary())
    tiered = sys.modules.get("test_tiered_crash")
    if tiered is not None and (tiered.SOAK_FIGURES or tiered.CUTS):
        terminalreporter.section("tiered storage: failures and kills")
        for fault, depth, cut, total, violations in tiered.CUTS:
            terminalreporter.write_line(f"{fault} at object store steps [{depth}]: {cut} of {total} steps cut, "
                                        f"{violations} violations")
        for figures in tiered.SOAK_FIGURES:
            terminalreporter.write_line(figures.summary())
    io_errors = sys.modules.get("test_io_errors")
    if io_errors is not None and io_errors.CALL_SITES:
        sites = io_errors.CALL_SITES
        terminalreporter.section("I/O fault injection")
        ops = sorted({site.rsplit(" -> ", 1)[1] for site in sites})
        files = sorted({site.split(":", 1)[0] for site in sites})
        lines = {site.rsplit(" -> ", 1)[0] for site in sites}
        terminalreporter.write_line(f"EIO/ENOSPC injected at {len(lines)} library call sites ({len(sites)} site and "
                                    f"operation pairs; {len(ops)} file operations: {', '.join(ops)}; in "
                                    f"{', '.join(files)})")
        if config.getoption("verbose") > 0:
            for site in sorted(sites):
                terminalreporter.write_line(f"  {site}")
