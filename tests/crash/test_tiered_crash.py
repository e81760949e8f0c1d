"""Tiered storage's crash safety (KIP-405, issue 30): power loss and kills at every step of a copy
and a deletion.

The workload tiers a topic into a local object store (``file://`` outside the data directory):
appends, rolls, copies (``RemoteLogManager.copy_segments``), local retention dropping the copied
segments, remote segments expired by total retention and by DeleteRecords, and a tiered topic
deleted. Its crash points are every sync of the data directory (the ``__remote_log_metadata``
log's appends and flushes, the checkpoints, the segment deletions) and every step between the
manager's calls to the object store (before and after each put and delete:
:class:`tieredcheck.StepObjectStore`). The object store is durable on acknowledgement, so each
crash point also records its objects; every state the explorer rebuilds gets the objects of its
point.

After each state (:func:`tieredcheck.check_tiered_store`): the store opens with the same object
store, one maintenance round runs, every acknowledged record reads back the same from the log
start (moved only by retention or DeleteRecords), nothing twice or out of order, and no orphan
is left: every object belongs to a COPY_SEGMENT_FINISHED segment of a live partition, every
finished segment has all its objects, nothing is left half copied or half deleted.

The same workload is also cut at every step N of the object store by an injected failure
(the step raises, the library goes on) and by a kill (a forked child that exits at step N,
leaving the page cache as it was).
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import struct
import subprocess
import sys

import pytest

from logstore import _fileio

from explorer import REPORTS, Recorder, explore
from tieredcheck import STORE, StepFault, Workload, check_tiered_store, snapshot_objects, write_objects

DEPTHS = [pytest.param("ci", id="ci"), pytest.param("soak", id="soak", marks=pytest.mark.slow)]


# ---------------------------------------------------------------------------- power loss
def _explore(mem_path, depth: str, seed: int) -> None:
    root = mem_path / "work"
    root.mkdir(parents=True)
    objects = str(mem_path / "objects")
    blobs: dict[bytes, bytes] = {}
    holder: dict = {}

    def oracle():
        return dict(holder["w"].oracle(), objects=snapshot_objects(objects, blobs))

    recorder = Recorder(root, oracle)
    holder["w"] = w = Workload(str(root / "store"), objects, recorder.mark, seed)
    with _fileio.install(recorder):
        w.run()
        recorder.mark("the end of the workload")
    steps = sum(1 for p in recorder.points if p.label.startswith(("before ", "after ")))
    assert steps >= 60, f"only {steps} object store steps were crash points"

    def check(path, point_oracle, rng):
        there = path + "-objects"
        write_objects(there, point_oracle["objects"], blobs)
        store_root = os.path.join(path, "store")
        if point_oracle["topics"].get("t", {}).get("state") in (None, "creating") and not os.path.isdir(store_root):
            return  # nothing acknowledged yet
        check_tiered_store(store_root, there, point_oracle, rng, STORE)

    limits = dict(random_states=8, max_states_per_point=24) if depth == "soak" else \
        dict(random_states=1, max_states_per_point=3)
    # (one process: obstore's runtime does not survive the explorer's fork)
    report = explore(recorder.points, str(mem_path / "scratch"), check, seed=seed, workers=1, **limits)
    REPORTS.append((f"tiered storage, seed {seed} [{depth}]", report))
    assert not report.violations, f"{report.summary('tiered storage')}:\n" + "\n".join(report.violations)
    assert report.points >= 150 and report.states >= report.points, report.summary("tiered storage")


@pytest.mark.parametrize("depth", DEPTHS)
def test_every_crash_state_of_tiering_loses_no_record_and_leaves_no_orphan(mem_path, depth):
    for seed in ([1] if depth == "ci" else [1, 2, 3]):
        _explore(mem_path / f"seed{seed}", depth, seed)


# ---------------------------------------------------------------------------- a failure or a kill at step N
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiered_worker.py")


def _count_steps(tmp) -> int:
    counter = {"n": 0}

    def hook(label):
        counter["n"] += 1

    Workload(str(tmp / "count" / "store"), str(tmp / "count" / "objects"), hook).run()
    return counter["n"]


def _raise_at(n: int):
    counter = {"n": 0}

    def hook(label):
        counter["n"] += 1
        if counter["n"] == n:
            raise StepFault(f"injected at step {n} ({label})")
    return hook


def _last_model(path: str) -> dict | None:
    """The last whole model a killed worker wrote (4-byte length, pickle)."""
    with open(path, "rb") as f:
        data = f.read()
    model, position = None, 0
    while position + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, position)
        if position + 4 + size > len(data):
            break
        model = pickle.loads(data[position + 4:position + 4 + size])
        position += 4 + size
    return model


def _run_cut(tmp, n: int, fault: str) -> None:
    """The workload cut at object store step ``n`` by ``fault``, then the check. A failure
    (``raise``) runs in this process, the library goes on; a kill runs the workload in a
    worker process (obstore's runtime does not survive a fork) that SIGKILLs itself at step n."""
    where = tmp / f"{fault}-{n}"
    root, objects = str(where / "store"), str(where / "objects")
    if fault == "raise":
        w = Workload(root, objects, _raise_at(n))
        try:
            w.run()
        except StepFault:
            pass  # surfaced by a direct call (copy_segments); the rounds log it and go on
        oracle = w.oracle()
    else:
        model = str(where / "model")
        where.mkdir(parents=True)
        done = subprocess.run([sys.executable, WORKER, "step", root, objects, str(n), model],
                              cwd=os.path.dirname(WORKER), stderr=subprocess.PIPE, timeout=120)
        assert done.returncode == -signal.SIGKILL, f"the worker of step {n} was not killed: {done.stderr[-2000:]!r}"
        oracle = _last_model(model)
        assert oracle is not None, f"the worker killed at step {n} wrote no model"
    check_tiered_store(root, objects, oracle, random.Random(n), STORE)


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_a_failure_or_a_kill_at_any_object_store_step_loses_nothing_and_leaves_no_orphan(tmp_path, fault, depth):
    total = _count_steps(tmp_path)
    assert total >= 60
    sample = 16 if fault == "raise" else 6
    steps = range(1, total + 1) if depth == "soak" else sorted(random.Random(5).sample(range(1, total + 1), sample))
    problems = []
    for n in steps:
        try:
            _run_cut(tmp_path, n, fault)
        except AssertionError as exc:
            problems.append(f"step {n}: {exc}")
    CUTS.append((fault, depth, len(steps), total, len(problems)))
    assert not problems, f"{len(problems)} of {len(steps)} steps:\n" + "\n".join(problems[:10])


#: (fault, depth, steps cut, steps in the workload, violations) of each run, for the summary
CUTS: list[tuple[str, str, int, int, int]] = []
