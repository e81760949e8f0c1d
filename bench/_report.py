"""Throughput bookkeeping for the benchmark suite (see conftest.py); one instance per run."""

from __future__ import annotations

from dataclasses import dataclass, field

import _workload

@dataclass
class _Row:
    group: str
    name: str
    rate: float
    unit: str
    target: float | None
    higher_is_better: bool = True
    note: str = ""
    met: bool | None = field(default=None)


ROWS: list[_Row] = []


def report(benchmark, *, records: int | None = None, nbytes: int | None = None,
           target: float | None = None, unit: str = "records/s", note: str = "") -> float:
    """Derive throughput from the benchmark's mean round time; store and return it.

    ``records`` / ``nbytes`` are the amounts one round (one call of the timed function) moves.
    ``unit`` picks the headline figure compared with ``target``: "records/s", "MB/s" or "GB/s".
    """
    mean = benchmark.stats.stats.mean
    info = benchmark.extra_info
    info["mean_s"] = mean
    if records is not None:
        info["records_per_round"] = records
        info["records_per_s"] = records / mean
    if nbytes is not None:
        info["bytes_per_round"] = nbytes
        info["MB_per_s"] = nbytes / mean / 1e6
        info["GB_per_s"] = nbytes / mean / 1e9
    headline = {"records/s": info.get("records_per_s"), "MB/s": info.get("MB_per_s"),
                "GB/s": info.get("GB_per_s")}[unit]
    assert headline is not None, f"report() needs the amount behind {unit}"
    if target is not None:
        info["target"] = f">= {target:g} {unit}"
        info["target_met"] = headline >= target
    ROWS.append(_Row(benchmark.group or "", benchmark.name, headline, unit, target, note=note,
                      met=None if target is None else headline >= target))
    return headline


def report_value(benchmark, name: str, value: float, unit: str, *, at_most: float | None = None,
                 note: str = "") -> None:
    """A measured quantity that is not a rate (bytes per record): lower is better."""
    benchmark.extra_info[name] = value
    if at_most is not None:
        benchmark.extra_info["target"] = f"<= {at_most:g} {unit}"
        benchmark.extra_info["target_met"] = value <= at_most
    ROWS.append(_Row(benchmark.group or "", benchmark.name, value, unit, at_most, higher_is_better=False,
                      note=note, met=None if at_most is None else value <= at_most))


def fmt(value: float, unit: str) -> str:
    if unit == "records/s":
        return f"{_workload.fmt_rate(value)} rec/s"
    if unit in ("MB/s",):
        return f"{value:,.0f} MB/s"
    if unit == "GB/s":
        return f"{value:.2f} GB/s"
    return f"{value:.2f} {unit}"
