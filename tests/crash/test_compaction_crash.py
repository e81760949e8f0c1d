"""Power loss at every sync point of a compaction pass: the log reads as before or after it.

The pass goes .cleaned -> .swap -> old segments .deleted -> .swap renamed live; a power cut at
any of its syncs (file and directory fsyncs, both checkpoint files) must leave, after the next
open, every key with its latest value, no offset twice, and nothing but records of the log
before the pass.
"""

from __future__ import annotations

import random
import shutil

import pytest

from logstore import Log, _fileio
from powerloss import PowerLoss, PowerLossFileOps

CONFIG = dict(cleanup_policy="compact", segment_bytes=600, index_interval_bytes=64)


def _template(root):
    path = root / "template"
    history = []
    with Log.open(str(path / "t-0"), **CONFIG) as log:
        rng = random.Random(11)
        for i in range(120):
            key = b"k%d" % rng.randrange(12)
            value = None if rng.random() < 0.1 else b"v%d" % i
            history.append((log.append(value, key=key), key, value))
        log.roll()
    return path, history


@pytest.mark.parametrize("mode,seed", [("durable", 0), ("torn", 1), ("torn", 2)])
def test_power_loss_at_every_sync_of_a_compaction_pass(mem_path, mode, seed):
    template, history = _template(mem_path)
    latest = {}
    for offset, key, value in history:
        latest[key] = (offset, value)
    before = {(o, k, v) for o, k, v in history}
    k = 0
    cut_points = 0
    while True:
        k += 1
        work = mem_path / f"k{k}"
        shutil.copytree(template, work)
        ops = PowerLossFileOps(work)
        finished = False
        with _fileio.install(ops):
            log = Log.open(str(work / "t-0"), **CONFIG)
            ops.schedule(k)
            try:
                log.compact()
                finished = True
            except PowerLoss:
                cut_points += 1
            log._abandon()
            ops.crash(mode, random.Random(seed * 1000 + k))
        with Log.open(str(work / "t-0"), **CONFIG) as log:
            got = [(r.offset, r.key, r.value) for r in log.iter()]
        offsets = [o for o, _, _ in got]
        assert offsets == sorted(set(offsets)), f"cut {k}: offsets repeat or go back"
        assert set(got) <= before, f"cut {k}: records that were never written"
        seen = {key: (offset, value) for offset, key, value in got}
        assert seen == latest, f"cut {k}: a key lost its latest value"
        shutil.rmtree(work)
        if finished:
            break
    assert cut_points >= 5  # the pass has at least the .cleaned, .swap, rename and checkpoint syncs
