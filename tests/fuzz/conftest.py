"""Figures of the fuzz smoke run."""

from __future__ import annotations

import sys


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print how many inputs each C fuzz target ran in this session (test_fuzz_smoke.py)."""
    smoke = sys.modules.get("test_fuzz_smoke")
    if smoke is None or not smoke.EXECUTIONS:
        return
    terminalreporter.section("C fuzz targets (gcc, ASan/UBSan)")
    counts = ", ".join(f"{target} {n}" for target, n in sorted(smoke.EXECUTIONS.items()))
    terminalreporter.write_line(f"executions in {smoke.SECONDS:g} s per target: {counts}")
