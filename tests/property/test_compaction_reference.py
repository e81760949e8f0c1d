"""Compaction passes against a reference compaction written here in Python: random logs of
several segments (every codec, tombstones, headers, transactions committed, aborted and left
open, offset maps small enough that one pass cleans only part of the dirty section), read back
record by record after each pass and compared with the dict of each key's last offset.

Also checked: a batch below the cleaned end whose records all survive (and that gains no delete
horizon) is copied as it was, byte for byte, CRC included, as Kafka's cleaner copies it.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import Log
from logstore._native import lib
from logstore.records import compression
from logstore.records.batch import batch_headers

KEYS = [b"k%d" % i for i in range(8)]
PIDS = (7, 8)
CODECS = sorted(compression.codec_name(c) for c in compression.available_codecs())
NOW = 1_000_000
FAR_FUTURE = 2**62

record = st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=1, max_size=30)),
                   st.lists(st.tuples(st.sampled_from(["h", "trace"]), st.one_of(st.none(), st.binary(max_size=4))),
                            max_size=2))
op = st.one_of(
    st.tuples(st.just("batch"), st.sampled_from(CODECS), st.lists(record, min_size=1, max_size=6)),
    st.tuples(st.just("txn"), st.sampled_from(PIDS), st.sampled_from(CODECS), st.lists(record, min_size=1, max_size=3)),
    st.tuples(st.just("end"), st.sampled_from(PIDS), st.booleans()),
    st.tuples(st.just("roll")),
)


def apply(log, ops):
    """Append ``ops``; returns {offset: "commit" | "abort" | "open"} for transactional records."""
    fate, pending, sequences = {}, {p: [] for p in PIDS}, dict.fromkeys(PIDS, 0)
    for o in ops:
        if o[0] == "batch":
            _, codec, rows = o
            log.append_batch([v for _, v, _ in rows], [k for k, _, _ in rows], headers=[h for _, _, h in rows],
                             compression=codec)
        elif o[0] == "txn":
            _, pid, codec, rows = o
            first = log.append_batch([v for _, v, _ in rows], [k for k, _, _ in rows], headers=[h for _, _, h in rows],
                                     compression=codec, producer_id=pid, producer_epoch=0,
                                     base_sequence=sequences[pid], transactional=True)
            sequences[pid] += len(rows)
            pending[pid].extend(range(first, first + len(rows)))
        elif o[0] == "end":
            _, pid, commit = o
            log.append_txn_marker(pid, 0, commit)
            fate.update(dict.fromkeys(pending[pid], "commit" if commit else "abort"))
            pending[pid] = []
        else:
            log.roll()
    for offsets in pending.values():
        fate.update(dict.fromkeys(offsets, "open"))
    return fate


def reference(records, fate, end):
    """The reference compaction of ``records`` (read before any pass) cleaned up to ``end``: below
    it, aborted transactions' records go and a record stays iff it is the last of its key."""
    last = {}
    for r in records:
        if r.offset < end and fate.get(r.offset) != "abort":
            last[r.key] = r.offset
    return [r for r in records if r.offset >= end or last.get(r.key) == r.offset]


def rows(records):
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records]


def data_batches(log):
    """(first offset, last offset, bytes, record count) of every data batch in the log's segment
    files (read from disk, up to each segment's size: the active one is preallocated)."""
    out = []
    for info in log.segments:
        with open(os.path.join(log.path, "%020d.log" % info.base_offset), "rb") as f:
            buf = f.read(info.size)
        for position, header in batch_headers(buf):
            if not header.attributes & lib.LS_ATTR_CONTROL:
                out.append((header.base_offset, header.last_offset, buf[position:position + header.size],
                            header.records_count))
    return out


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=40), segment_bytes=st.integers(300, 3000),
       map_slots=st.sampled_from([4, 8, 30, 10_000]))
def test_passes_match_a_reference_compaction(tmp_path_factory, ops, segment_bytes, map_slots):
    path = tmp_path_factory.mktemp("cr") / "t-0"
    config = dict(cleanup_policy="compact", segment_bytes=segment_bytes, delete_retention_ms=1000,
                  cleaner_dedupe_buffer_size=20 * map_slots)
    with Log.open(path, **config) as log:
        fate = apply(log, ops)
        log.roll()
        original = list(log.iter())
        batches_before = data_batches(log)
        end = 0
        for _ in range(len(original) + 2):  # passes until one cleans nothing new
            report = log.compact(now_ms=NOW)
            if report.cleaned_up_to <= end:
                break
            end = report.cleaned_up_to
            assert rows(log.iter()) == rows(reference(original, fate, end))
        expected = reference(original, fate, end)
        assert rows(log.iter()) == rows(expected)
        # Untouched batches are copied as they are: every batch below `end` whose records all
        # survive and that holds no tombstone (which would gain a delete horizon).
        survivors = {r.offset for r in expected}
        by_value = {r.offset: r.value for r in original}
        after = {raw for _, _, raw, _ in data_batches(log)}
        for first, last, raw, count in batches_before:
            offsets = [o for o in by_value if first <= o <= last]
            if (first < end and len(offsets) == count and all(o in survivors for o in offsets)
                    and all(by_value[o] is not None for o in offsets)):
                assert raw in after
        # Far past every delete horizon: the tombstones below the cleaned end go too.
        final = log.compact(now_ms=FAR_FUTURE)
        end2 = max(end, final.cleaned_up_to)
        expected = [r for r in reference(original, fate, end2) if not (r.value is None and r.offset < end2)]
        assert rows(log.iter()) == rows(expected)
    with Log.open(path, **config) as log:  # what a reopened log reads agrees
        assert rows(log.iter()) == rows(expected)
