"""Throughput bookkeeping for the benchmark suite (see conftest.py); one instance per run.

Every figure is derived from the benchmark's *mean* round time (the headline, compared with the
issue's target) and also from its *fastest* round ("best"), which on a shared or noisy machine is
the better estimate of what the code can do; both go into ``benchmark.extra_info``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import _workload

_UNITS = {"records/s": "records_per_s", "MB/s": "MB_per_s", "GB/s": "GB_per_s"}


@dataclass
class Row:
    group: str
    name: str
    value: float
    best: float | None
    unit: str
    target: float | None
    higher_is_better: bool = True
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value >= self.target if self.higher_is_better else self.value <= self.target


ROWS: list[Row] = []
LOAD_AT_START = os.getloadavg()


def report(benchmark, *, records: int | None = None, nbytes: int | None = None,
           target: float | None = None, unit: str = "records/s", note: str = "") -> float:
    """Derive throughput from the benchmark's round times; store it and return the mean-based one.

    ``records`` / ``nbytes`` are the amounts one round (one call of the timed function) moves.
    ``unit`` picks the headline figure compared with ``target``: "records/s", "MB/s" or "GB/s".
    """
    stats = benchmark.stats.stats
    info = benchmark.extra_info
    info["mean_s"] = stats.mean
    info["min_s"] = stats.min
    for t, suffix in ((stats.mean, ""), (stats.min, "_best")):
        if records is not None:
            info["records_per_round"] = records
            info["records_per_s" + suffix] = records / t
        if nbytes is not None:
            info["bytes_per_round"] = nbytes
            info["MB_per_s" + suffix] = nbytes / t / 1e6
            info["GB_per_s" + suffix] = nbytes / t / 1e9
    key = _UNITS[unit]
    if key not in info:
        raise ValueError(f"report() needs the amount behind {unit}")
    row = Row(benchmark.group or "", benchmark.name, info[key], info[key + "_best"], unit, target, note=note)
    if target is not None:
        info["target"] = f">= {target:g} {unit}"
        info["target_met"] = row.met
    ROWS.append(row)
    return row.value


def report_value(benchmark, name: str, value: float, unit: str, *, at_most: float | None = None,
                 note: str = "") -> None:
    """A measured quantity that is not a rate (e.g. bytes per record); lower is better."""
    benchmark.extra_info[name] = value
    row = Row(benchmark.group or "", benchmark.name, value, None, unit, at_most, higher_is_better=False, note=note)
    if at_most is not None:
        benchmark.extra_info["target"] = f"<= {at_most:g} {unit}"
        benchmark.extra_info["target_met"] = row.met
    ROWS.append(row)


def fmt(value: float, unit: str) -> str:
    if unit == "records/s":
        return f"{_workload.fmt_rate(value)} rec/s"
    if unit == "MB/s":
        return f"{value:,.0f} MB/s"
    if unit == "GB/s":
        return f"{value:.2f} GB/s"
    return f"{value:.2f} {unit}"


def summary_lines() -> list[str]:
    lines = list(_workload.machine_lines())
    lines.append(f"{'load avg':>9}: {LOAD_AT_START[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end "
                 "(anything above ~0.1 on top of this run means the figures are disturbed)")
    lines.append("")
    lines.append(f"  {'benchmark':<50} {'mean-based':>16} {'best round':>16}   target")
    groups: dict[str, list[Row]] = {}
    for row in ROWS:
        groups.setdefault(row.group, []).append(row)
    for group, rows in groups.items():
        lines.append(f"[{group}]")
        for row in rows:
            verdict = ""
            if row.target is not None:
                cmp = ">=" if row.higher_is_better else "<="
                verdict = f"{cmp} {fmt(row.target, row.unit)}: {'met' if row.met else 'MISSED'}"
            best = fmt(row.best, row.unit) if row.best is not None else ""
            note = f"  ({row.note})" if row.note else ""
            lines.append(f"  {row.name:<50} {fmt(row.value, row.unit):>16} {best:>16}   {verdict}{note}")
    missed = [r for r in ROWS if r.met is False]
    lines.append("")
    lines.append(f"targets: {sum(1 for r in ROWS if r.met)} met, {len(missed)} missed"
                 + (": " + ", ".join(r.name for r in missed) if missed else ""))
    return lines
