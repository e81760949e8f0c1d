"""kill -9 soak: a service-like process on a mixed workload, killed every few seconds, checked each time.

Each cycle starts ``soak_worker.py`` (a separate interpreter) on the same store, lets it run for
a random 0.3..2.5 s -- or kills it at once, inside its open and recovery -- with SIGKILL, then
reopens the store in this process (which recovers it) and checks it against the expected-values
log every life wrote (see soak_worker.py for the workload and the log's lines):

* ``events`` and ``durable``: offsets contiguous from the log start, every record exactly the
  value its writer wrote at that offset, every acknowledged record at or above the log start
  present (records lost: acknowledged offsets past the log end), the log start never below a
  delete_records_before that returned (``durable`` keeps everything from 0);
* ``table`` (compacted while written): every record one that was written at that offset, and
  every key's latest acknowledged write still the latest or followed by a later write (a key
  whose latest write was a tombstone may be gone);
* group ``g``: the committed positions are the last acknowledged commit or the one in flight.

A SIGKILL loses nothing that reached the page cache, so every append that returned counts as
acknowledged whatever the flush policy. ``make test`` runs a few seconds of it; ``make soak``
runs ``LOGSTORE_SOAK_SECONDS`` (default 300).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from logstore.client.consumer import offset_store

from soak_worker import event_value, open_store

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "soak_worker.py")


@dataclass
class SoakFigures:
    """What a soak run did (printed at the end of the run, see conftest.py)."""

    seconds: float = 0.0
    cycles: int = 0
    killed_while_opening: int = 0
    records_acknowledged: int = 0
    records_checked: int = 0
    records_lost: int = 0
    corrupt_records: int = 0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"kill -9 soak: {self.cycles} cycles in {self.seconds:.0f} s ({self.killed_while_opening} killed "
                f"while opening), {self.records_acknowledged} records acknowledged, {self.records_checked} "
                f"checked after the kills, {self.records_lost} lost, {self.corrupt_records} corrupt")


#: Figures of every soak run in this session.
FIGURES: list[SoakFigures] = []


@dataclass
class _Expected:
    acked: dict[tuple[str, int], list[tuple[int, int, str]]] = field(default_factory=dict)  # (first, last, tag)
    table: dict[bytes, tuple[int, bytes | None]] = field(default_factory=dict)              # key -> latest acked
    committed: list[int] | None = None
    attempted: list[int] | None = None
    start: dict[int, int] = field(default_factory=dict)                                   # delete_records_before
    opened: int = 0


def _parse(paths: list[tuple[str, str]]) -> _Expected:
    """The expected values from every life's log, oldest first; a torn last line is ignored."""
    exp = _Expected()
    for path, tag in paths:
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        for raw in data.split(b"\n")[:-1]:
            fields = raw.decode().split(" ")
            kind = fields[0]
            if kind == "R":
                exp.opened += 1
            elif kind == "A":
                exp.acked.setdefault((fields[1], int(fields[2])), []).append((int(fields[3]), int(fields[4]), tag))
            elif kind == "T":
                value = None if fields[3] == "-" else fields[3].encode()
                exp.table[fields[1].encode()] = (int(fields[2]), value)
            elif kind == "c":
                exp.attempted = [int(x) for x in fields[1:]]
            elif kind == "C":
                exp.committed = exp.attempted = [int(x) for x in fields[1:]]
            elif kind == "D":
                p = int(fields[1])
                exp.start[p] = max(exp.start.get(p, 0), int(fields[2]))
    return exp


def _check(root: str, exp: _Expected, figures: SoakFigures, cycle: int) -> None:
    """Reopen (recover) the store and compare it with the expected values; count and record problems."""
    problems: list[str] = []
    store = open_store(root, maintenance=False)
    try:
        for (topic, p), ranges in sorted(exp.acked.items()):
            log = store.partition(topic, p)
            start, end = log.log_start_offset, log.log_end_offset
            acked_end = max(last for _, last, _ in ranges) + 1
            if end < acked_end:
                figures.records_lost += acked_end - end
                problems.append(f"{topic}-{p}: log ends at {end}, records up to {acked_end - 1} were acknowledged")
            if topic == "durable" and start != 0:
                problems.append(f"{topic}-{p}: log start {start}, nothing ever deleted it")
            if topic == "events" and start < exp.start.get(p, 0):
                problems.append(f"{topic}-{p}: log start {start} is below a returned delete_records_before "
                                f"({exp.start[p]})")
            tags = {}
            for first, last, tag in ranges:
                for offset in range(max(first, start), last + 1):
                    tags[offset] = tag
            expected_offset = start
            for r in log.iter(start):
                figures.records_checked += 1
                if r.offset != expected_offset:
                    problems.append(f"{topic}-{p}: offset {r.offset} after {expected_offset - 1} (gap or repeat)")
                    figures.corrupt_records += 1
                expected_offset = r.offset + 1
                fields = (r.value or b"").split(b"|", 3)
                tag = fields[2].decode(errors="replace") if len(fields) > 2 else "?"
                want_tag = tags.get(r.offset, tag)
                if r.value != event_value(topic, r.offset, want_tag) or r.key != b"k%d" % (r.offset % 17):
                    figures.corrupt_records += 1
                    problems.append(f"{topic}-{p}: record at {r.offset} holds {r.value[:40]!r} key {r.key!r}, "
                                    f"expected the one writer {want_tag} wrote there")
            if expected_offset != end:
                problems.append(f"{topic}-{p}: reads end at {expected_offset}, the log end is {end}")
        table = store.partition("table", 0)
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        previous = -1
        for r in table.iter(table.log_start_offset):
            figures.records_checked += 1
            if r.offset <= previous:
                figures.corrupt_records += 1
                problems.append(f"table: offset {r.offset} after {previous}")
            previous = r.offset
            if r.key is None or (r.value is not None and r.value.split(b"|")[:2] != [b"table", b"%d" % r.offset]) \
                    or (r.value is not None and not r.value.endswith(b"|" + r.key)):
                figures.corrupt_records += 1
                problems.append(f"table: record at {r.offset} holds {r.value!r} key {r.key!r}")
                continue
            latest[r.key] = (r.offset, r.value)
        for key, (offset, value) in exp.table.items():
            found = latest.get(key)
            if found is None and value is None:
                continue  # a tombstone, removed after delete_retention_ms
            if found is None or found[0] < offset:
                figures.records_lost += 1
                problems.append(f"table: key {key!r} reads {found}, its write at {offset} was acknowledged")
            elif found[0] == offset and found[1] != value:
                figures.corrupt_records += 1
                problems.append(f"table: key {key!r} at {offset} holds {found[1]!r}, {value!r} was written")
        if table.log_end_offset <= max((o for o, _ in exp.table.values()), default=-1):
            problems.append(f"table: log ends at {table.log_end_offset}, before acknowledged writes")
        offsets = offset_store(store)
        got = [offsets.committed("g", "events", p) for p in range(3)]
        allowed = [exp.committed, exp.attempted] if exp.committed is not None else [None, exp.attempted]
        if not any(got == (a if a is not None else [None] * 3) for a in allowed):
            problems.append(f"group g: committed {got}, expected the acknowledged {exp.committed} "
                            f"or the attempted {exp.attempted}")
    finally:
        store.close()
    figures.problems += [f"after kill {cycle}: {p}" for p in problems[:20]]


def _wait_for_open(path: str, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(path):
            with open(path, "rb") as f:
                if b"R\n" in f.read(64):
                    return True
        time.sleep(0.02)
    return False


def run_soak(tmp_path, seconds: float, min_cycles: int, seed: int, report: bool = True) -> SoakFigures:
    rng = random.Random(seed)
    root = str(tmp_path / "store")
    figures = SoakFigures()
    if report:
        FIGURES.append(figures)
    lives: list[tuple[str, str]] = []
    started = time.monotonic()
    while time.monotonic() - started < seconds or figures.cycles < min_cycles:
        cycle = figures.cycles + 1
        expected, tag = str(tmp_path / f"expected-{cycle}.log"), f"w{cycle}"
        lives.append((expected, tag))
        with open(tmp_path / f"worker-{cycle}.err", "wb") as err:
            proc = subprocess.Popen([sys.executable, WORKER, root, expected, tag, str(seed * 100_000 + cycle)],
                                    stderr=err, cwd=os.path.dirname(WORKER))
            if rng.random() < 0.15:
                time.sleep(rng.uniform(0.0, 0.4))  # usually inside imports, open or recovery
                opened = os.path.exists(expected)
            else:
                opened = _wait_for_open(expected, proc, timeout=30.0)
                time.sleep(rng.uniform(0.3, 2.5))
            if proc.poll() is not None:
                err.flush()
                pytest.fail(f"the worker of cycle {cycle} exited by itself ({proc.returncode}):\n"
                            + (tmp_path / f"worker-{cycle}.err").read_text()[-3000:])
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        figures.cycles = cycle
        figures.killed_while_opening += not opened
        exp = _parse(lives)
        figures.records_acknowledged = sum(last - first + 1 for r in exp.acked.values() for first, last, _ in r) + \
            len(exp.table)
        _check(root, exp, figures, cycle)
        if figures.problems:
            break
    figures.seconds = time.monotonic() - started
    return figures


def test_sigkill_soak_short(tmp_path):
    """A few cycles in make test: the harness works and nothing acknowledged is lost."""
    figures = run_soak(tmp_path, seconds=6.0, min_cycles=3, seed=1)
    assert not figures.problems, figures.summary() + "\n" + "\n".join(figures.problems)
    assert figures.records_lost == 0 and figures.corrupt_records == 0
    assert figures.records_checked > 0 and figures.records_acknowledged > 0


def test_the_soak_checker_reports_lost_and_corrupt_records(tmp_path):
    """The check can fail: acknowledgements the store cannot have are reported."""
    figures = run_soak(tmp_path, seconds=0.0, min_cycles=1, seed=2, report=False)
    assert not figures.problems
    fake = tmp_path / "fake.log"
    store = open_store(str(tmp_path / "store"), maintenance=False)
    end = store.partition("durable", 0).log_end_offset
    store.close()
    fake.write_text(f"A durable 0 {end + 3} {end + 4}\nT key1 999999 table|999999|x|key1\nC 5 5 5\n")
    lives = [(str(tmp_path / "expected-1.log"), "w1"), (str(fake), "fake")]
    checked = SoakFigures()
    _check(str(tmp_path / "store"), _parse(lives), checked, 2)
    text = "\n".join(checked.problems)
    assert checked.records_lost >= 3
    assert f"records up to {end + 4} were acknowledged" in text
    assert "key b'key1'" in text and "group g: committed" in text


@pytest.mark.slow
def test_sigkill_soak(tmp_path):
    """make soak: LOGSTORE_SOAK_SECONDS (default 300) of kill -9 cycles."""
    seconds = float(os.environ.get("LOGSTORE_SOAK_SECONDS", "300"))
    figures = run_soak(tmp_path, seconds=seconds, min_cycles=10, seed=int(os.environ.get("LOGSTORE_SOAK_SEED", "7")))
    assert not figures.problems, figures.summary() + "\n" + "\n".join(figures.problems)
    assert figures.records_lost == 0 and figures.corrupt_records == 0
    assert figures.cycles >= 10
