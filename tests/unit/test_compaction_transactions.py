"""Compaction with transactions, checked against a model of Kafka's cleaner: records of aborted
transactions go, markers stay while their transaction left records and go after a delete
horizon once none are left, an open transaction's records are never cleaned, and what a
read_committed reader sees is the compaction of what it saw before."""

from __future__ import annotations

import pathlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import Log

KEYS = [b"k%d" % i for i in range(6)]
PIDS = (0, 1, 2)
FAR_FUTURE = 2**62

op = st.one_of(
    st.tuples(st.just("plain"), st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=1, max_size=8))),
    st.tuples(st.just("txn"), st.sampled_from(PIDS), st.sampled_from(KEYS), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("end"), st.sampled_from(PIDS), st.booleans()),
    st.tuples(st.just("roll")),
)


def run(log, ops):
    """Apply ``ops``; return the history [(offset, kind, pid, key, value)] and open transactions."""
    history = []
    sequences = dict.fromkeys(PIDS, 0)
    for o in ops:
        if o[0] == "plain":
            history.append((log.append(o[2], key=o[1]), "plain", -1, o[1], o[2]))
        elif o[0] == "txn":
            _, pid, key, value = o
            offset = log.append_batch([value], [key], producer_id=pid, producer_epoch=0,
                                      base_sequence=sequences[pid], transactional=True)
            sequences[pid] += 1
            history.append((offset, "txn", pid, key, value))
        elif o[0] == "end":
            _, pid, commit = o
            history.append((log.append_txn_marker(pid, 0, commit), "commit" if commit else "abort", pid, None, None))
        else:
            log.roll()
    return history


def fates(history):
    """Offset of each transactional record -> "commit", "abort" or "open"."""
    out, pending = {}, {p: [] for p in PIDS}
    for offset, kind, pid, _, _ in history:
        if kind == "txn":
            pending[pid].append(offset)
        elif kind in ("commit", "abort"):
            for o in pending[pid]:
                out[o] = kind
            pending[pid] = []
    for offsets in pending.values():
        for o in offsets:
            out[o] = "open"
    return out


def committed_view(log):
    return [(r.offset, r.key, r.value) for r in log.iter(isolation_level="read_committed")]


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=80), segment_bytes=st.integers(300, 1500))
def test_compaction_with_transactions_matches_kafkas_cleaner(tmp_path_factory, ops, segment_bytes):
    path = tmp_path_factory.mktemp("ct") / "t-0"
    config = dict(cleanup_policy="compact", segment_bytes=segment_bytes, delete_retention_ms=1000)
    with Log.open(path, **config) as log:
        history = run(log, ops)
        fate = fates(history)
        lso = log.last_stable_offset
        opens = log.producer_transactions()
        before = committed_view(log)
        report = log.compact(now_ms=1_000_000)
        end = report.cleaned_up_to
        assert end <= lso  # an open transaction's records are never cleaned
        # Below the cleaned end: the latest committed-or-plain record per key survives; aborted
        # records are gone. At or past it nothing changed.
        visible = [(o, k, v) for o, kind, _, k, v in history
                   if kind == "plain" or (kind == "txn" and fate[o] == "commit")]
        latest = {k: o for o, k, _ in visible if o < end}
        expected = [(o, k, v) for o, k, v in visible if (o >= end or latest[k] == o) and o < lso]
        assert committed_view(log) == expected
        everything = [(r.offset, r.value) for r in log.iter()]
        assert not [o for o, _ in everything if o < end and fate.get(o) == "abort"]
        assert log.last_stable_offset == lso and log.producer_transactions() == opens
        # A pass far past every horizon: tombstones and markers of finished transactions go,
        # and nothing else a read_committed reader sees.
        report2 = log.compact(now_ms=FAR_FUTURE)
        end2 = max(end, report2.cleaned_up_to)
        after = [(o, k, v) for o, k, v in expected if not (v is None and o < end2)]
        assert committed_view(log) == after
        assert log.last_stable_offset == lso and log.producer_transactions() == opens
        assert [(o, k, v) for o, k, v in before if o >= end2] == [e for e in after if e[0] >= end2]
    with Log.open(path, **config) as log:  # what a reopened log rebuilds agrees
        assert committed_view(log) == after
        assert log.last_stable_offset == lso and log.producer_transactions() == opens


def test_markers_stay_until_their_transaction_left_nothing_then_a_horizon_passes(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t-0"
    with Log.open(path, cleanup_policy="compact", segment_bytes=400, delete_retention_ms=1000) as log:
        def txn(pid: int, seq: int, key: bytes, value: bytes) -> None:
            log.append_batch([value], [key], producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=True)

        txn(1, 0, b"k", b"a1")                                 # 0: aborted below
        abort = log.append_txn_marker(1, 0, commit=False)      # 1
        txn(2, 0, b"k", b"c1")                                 # 2: committed, then obsolete
        commit2 = log.append_txn_marker(2, 0, commit=True)     # 3
        txn(1, 1, b"q", b"x")                                  # 4: producer 1's last batch
        commit1 = log.append_txn_marker(1, 0, commit=True)     # 5
        log.append(b"plain", key=b"k")                         # 6: makes c1 obsolete
        log.roll()
        log.append(b"tail", key=b"z")

        log.compact(now_ms=10_000)  # the aborted record and c1 go; every marker stays
        assert [(r.offset, r.value) for r in log.iter()] == [(4, b"x"), (6, b"plain"), (7, b"tail")]
        assert _control_offsets(log) == [abort, commit2, commit1]
        # The pass met the aborted transaction's record: its marker and index entry stay.
        assert [t.last_offset for t in log.aborted_transactions(0, 8)] == [abort]
        log.append(b"tail2", key=b"z")  # something dirty, for a second full pass
        log.roll()
        log.compact(now_ms=20_000)  # nothing of the aborted transaction is left: its marker gets a horizon
        assert _control_offsets(log) == [abort, commit2, commit1]
        assert log.aborted_transactions(0, 9) == []
        log.compact(now_ms=10**12)  # past the horizon: gone. The commits stay: producer 2's emptied last
        # batch (kept, as Kafka keeps it, for its producer state) and producer 1's record are theirs.
        assert _control_offsets(log) == [commit2, commit1]
        assert log.last_stable_offset == log.log_end_offset and log.producer_transactions() == {}
        assert [(r.offset, r.value) for r in log.iter(isolation_level="read_committed")] == \
            [(4, b"x"), (6, b"plain"), (8, b"tail2")]


def _control_offsets(log):
    from logstore.records.batch import batch_headers
    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        raw = log.read_raw(offset, 1 << 20)
        if not raw:
            break
        for _, header in batch_headers(raw):
            if header.attributes & 32:
                out.append(header.base_offset)
            offset = header.last_offset + 1
    return out


def test_an_aborted_transaction_past_the_cleaned_end_stays_aborted_in_the_rewritten_segment(tmp_path) -> None:
    """A pass that ends inside a segment (here at the last stable offset: producer 1's open
    transaction) rewrites the whole segment: the aborted transaction after the end keeps its
    .txnindex entry, so its records stay invisible to read_committed and the next pass drops them."""
    path = tmp_path / "t-0"
    with Log.open(path, cleanup_policy="compact", segment_bytes=10_000) as log:
        log.append(b"old", key=b"k")                                                      # 0
        log.append_batch([b"open"], [b"o"], producer_id=1, producer_epoch=0, base_sequence=0,
                         transactional=True)                                              # 1: stays open
        log.append_batch([b"aborted"], [b"k"], producer_id=2, producer_epoch=0, base_sequence=0,
                         transactional=True)                                              # 2
        log.append_txn_marker(2, 0, commit=False)                                         # 3
        log.roll()
        report = log.compact(now_ms=10_000)
        assert report.cleaned_up_to == 1  # the last stable offset
        assert [t.last_offset for t in log.aborted_transactions(0, 4)] == [3]
        assert committed_view(log) == [(0, b"k", b"old")]
        log.append_txn_marker(1, 0, commit=True)                                          # 4
        log.roll()
        log.compact(now_ms=20_000)
        assert committed_view(log) == [(0, b"k", b"old"), (1, b"o", b"open")]
        assert [(r.offset, r.value) for r in log.iter()] == [(0, b"old"), (1, b"open")]
    with Log.open(path, cleanup_policy="compact", segment_bytes=10_000) as log:
        assert committed_view(log) == [(0, b"k", b"old"), (1, b"o", b"open")]
