"""logstore.Consumer: positions, commits, seeks, long-poll, in-process groups, asyncio, SIGKILL."""

from __future__ import annotations

import asyncio
import mmap
import os
import random
import signal
import struct
import threading
import time

import pytest

from logstore import (
    ConsumerRecord,
    InvalidConfigError,
    LogClosedError,
    LogStore,
    PartitionNotAssignedError,
    TimestampType,
    TopicPartition,
    UnknownTopicOrPartitionError,
)
from logstore.groups.metadata import decode_group_key
from logstore.groups.offsets import OFFSETS_TOPIC, decode_offset_key, decode_offset_value


# ---------------------------------------------------------------------------- helpers
@pytest.fixture
def store(tmp_path):
    s = LogStore(tmp_path / "store", maintenance=False)
    yield s
    s.close()


def value(partition: int, i: int) -> bytes:
    return f"p{partition}-{i}".encode()


def fill(store: LogStore, topic: str, partitions: int, per_partition: int, create: bool = True) -> None:
    """Create ``topic`` and append ``per_partition`` records (values p<partition>-<i>) to each."""
    if create:
        store.create_topic(topic, partitions)
    for p in range(partitions):
        store.partition(topic, p).append_batch([value(p, i) for i in range(per_partition)])


def parts(consumer, topic: str | None = None) -> list[int]:
    return sorted(tp.partition for tp in consumer.assignment() if topic is None or tp.topic == topic)


def drain(consumer, max_polls: int = 1000) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    for _ in range(max_polls):
        got = consumer.poll(0)
        if not got:
            return out
        out.extend(got)
    raise AssertionError("consumer never ran dry")


def where(records) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in records]


# ---------------------------------------------------------------------------- construction
def test_bad_configuration_is_refused(store):
    store.create_topic("t")
    with pytest.raises(InvalidConfigError):
        store.consumer("", "t")
    with pytest.raises(InvalidConfigError):
        store.consumer("g", "t", auto_offset_reset="middle")
    with pytest.raises(InvalidConfigError):
        store.consumer("g", "t", max_poll_records=0)
    with pytest.raises(InvalidConfigError):
        store.consumer("g", [])
    with pytest.raises(UnknownTopicOrPartitionError):
        store.consumer("g", "missing")
    with pytest.raises(UnknownTopicOrPartitionError):
        store.consumer("g", ["t", "missing"])


# ---------------------------------------------------------------------------- poll basics
def test_earliest_reset_reads_everything_with_full_records(store):
    store.create_topic("t")
    log = store.partition("t", 0)
    log.append(b"v0", key=b"k0", headers=[("h", b"x"), ("n", None)], timestamp=1_700_000_000_000)
    log.append(None, key=b"k1", timestamp=1_700_000_000_001)
    with store.consumer("g", "t") as c:
        records = c.poll(0)
    assert records == [
        ConsumerRecord("t", 0, 0, 1_700_000_000_000, TimestampType.CREATE_TIME, b"k0", b"v0",
                       [("h", b"x"), ("n", None)]),
        ConsumerRecord("t", 0, 1, 1_700_000_000_001, TimestampType.CREATE_TIME, b"k1", None, []),
    ]
    r = records[0]
    assert isinstance(r, ConsumerRecord)
    assert (r.topic, r.partition, r.offset, r.key, r.value) == ("t", 0, 0, b"k0", b"v0")
    assert r.timestamp_type is TimestampType.CREATE_TIME
    assert r._fields == ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers")


@pytest.mark.regression(reason="fixed: polls of more than 4,096 records skipped the rest of the batch that "
                               "filled the decoder's rows (905 of every 5,000 records with batches of 1,000)")
def test_large_polls_return_every_record(store):
    store.create_topic("t")
    log = store.partition("t", 0)
    for b in range(30):
        log.append_batch([b"%d" % (b * 1000 + i) for i in range(1000)])
    seen = []
    with store.consumer("g", "t", max_poll_records=10_000, fetch_max_bytes=4 << 20) as c:
        while len(seen) < 30_000:
            records = c.poll(1.0)
            assert records, f"stopped after {len(seen)} records"
            seen += [int(r.value) for r in records]
    assert seen == list(range(30_000))


def test_latest_reset_skips_existing_records(store):
    fill(store, "t", 2, 5)
    with store.consumer("g", "t", auto_offset_reset="latest") as c:
        assert c.poll(0) == []
        assert c.position("t", 0) == 5 and c.position("t", 1) == 5
        store.partition("t", 1).append(b"new")
        got = c.poll(0)
        assert where(got) == [(1, 5)] and got[0].value == b"new"
        assert c.position("t", 1) == 6


def test_max_records_and_positions_advance(store):
    fill(store, "t", 1, 25)
    with store.consumer("g", "t", max_poll_records=10) as c:
        assert c.position("t", 0) == 0
        first = c.poll(0)
        assert [r.offset for r in first] == list(range(10))
        assert c.position("t", 0) == 10
        second = c.poll(0, max_records=3)
        assert [r.offset for r in second] == [10, 11, 12]
        assert c.position("t", 0) == 13
        rest = c.poll(0, max_records=100)
        assert [r.offset for r in rest] == list(range(13, 25))
        assert [r.value for r in first + second + rest] == [value(0, i) for i in range(25)]
        assert c.position("t", 0) == 25
        assert c.poll(0) == []


def test_max_records_counts_across_partitions(store):
    fill(store, "t", 3, 10)
    with store.consumer("g", "t") as c:
        seen = []
        while True:
            got = c.poll(0, max_records=4)
            if not got:
                break
            assert 1 <= len(got) <= 4
            seen.extend(got)
        assert sorted(where(seen)) == [(p, i) for p in range(3) for i in range(10)]
        # per partition, offsets come in order
        for p in range(3):
            assert [r.offset for r in seen if r.partition == p] == list(range(10))


def test_multiple_topics_per_consumer(store):
    fill(store, "a", 2, 3)
    fill(store, "b", 1, 4)
    with store.consumer("g", ["a", "b"]) as c:
        assert c.assignment() == {TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)}
        got = drain(c)
        assert sorted((r.topic, r.partition, r.offset) for r in got) == (
            [("a", p, i) for p in range(2) for i in range(3)] + [("b", 0, i) for i in range(4)])
        c.commit()
        assert c.committed("a", 1) == 3 and c.committed("b", 0) == 4


def test_iteration_in_a_thread_ends_when_closed(store):
    fill(store, "t", 2, 3)
    c = store.consumer("g", "t")
    seen: list[ConsumerRecord] = []
    errors: list[BaseException] = []

    def run():
        try:
            for r in c:
                seen.append(r)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 3
    while len(seen) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    store.partition("t", 0).append(b"late")
    while len(seen) < 7 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(where(seen)) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]
    assert t.is_alive()
    c.close()
    t.join(2.5)  # the iterator polls with a 1 s timeout
    assert not t.is_alive()
    assert errors == []
    assert c.closed


def test_closed_consumer_refuses_use(store):
    fill(store, "t", 1, 1)
    c = store.consumer("g", "t")
    c.close()
    c.close()  # idempotent
    with pytest.raises(LogClosedError):
        c.poll(0)
    with pytest.raises(LogClosedError):
        c.position("t", 0)
    assert list(c) == []


# ---------------------------------------------------------------------------- commits
def test_commit_and_restart_resumes_at_committed(store):
    fill(store, "t", 2, 10)
    c = store.consumer("g", "t", enable_auto_commit=False, max_poll_records=6)
    got = c.poll(0)
    assert len(got) == 6
    assert c.committed("t", 0) is None and c.committed("t", 1) is None
    c.commit()
    positions = {p: c.position("t", p) for p in (0, 1)}
    assert {p: c.committed("t", p) for p in (0, 1)} == positions
    c.close()
    with store.consumer("g", "t") as again:
        assert {p: again.position("t", p) for p in (0, 1)} == positions
        rest = drain(again)
    assert sorted(where(got + rest)) == [(p, i) for p in range(2) for i in range(10)]


def test_auto_commit_on_close(store):
    fill(store, "t", 1, 30)
    c = store.consumer("g", "t", max_poll_records=10)
    assert [r.offset for r in c.poll(0)] == list(range(10))
    assert c.committed("t", 0) is None  # auto-commit interval (5 s) not reached
    c.close()
    with store.consumer("g", "t") as again:
        assert again.committed("t", 0) == 10
        assert again.position("t", 0) == 10
        assert again.poll(0)[0].offset == 10


def test_no_commit_on_close_without_auto_commit(store):
    fill(store, "t", 1, 30)
    c = store.consumer("g", "t", max_poll_records=10, enable_auto_commit=False)
    assert len(c.poll(0)) == 10
    c.close()
    with store.consumer("g", "t") as again:
        assert again.committed("t", 0) is None
        assert again.position("t", 0) == 0


def test_auto_commit_interval_commits_during_poll(store):
    fill(store, "t", 1, 30)
    with store.consumer("g", "t", max_poll_records=10, auto_commit_interval_ms=1) as c:
        c.poll(0)
        time.sleep(0.01)
        c.poll(0)  # commits the positions of the previous poll before fetching
        assert c.committed("t", 0) in (10, 20)
        assert c.committed("t", 0) >= 10


def test_explicit_commit_of_given_offsets(store):
    fill(store, "t", 3, 10)
    with store.consumer("g", "t", enable_auto_commit=False) as c:
        c.commit({("t", 0): 4, ("t", 2): 7})
        assert c.committed("t", 0) == 4
        assert c.committed("t", 1) is None
        assert c.committed("t", 2) == 7
        assert c.position("t", 0) == 0  # committing does not move positions
    with store.consumer("g", "t") as again:
        assert [again.position("t", p) for p in range(3)] == [4, 0, 7]
    # another group is unaffected
    with store.consumer("other", "t") as other:
        assert other.committed("t", 0) is None
        assert [other.position("t", p) for p in range(3)] == [0, 0, 0]


def test_commit_is_kept_in_consumer_offsets_topic(store):
    fill(store, "t", 1, 5)
    with store.consumer("g", "t", enable_auto_commit=False) as c:
        c.poll(0)
        c.commit()
    assert OFFSETS_TOPIC in store.topics(internal=True)
    assert OFFSETS_TOPIC not in store.topics()
    records = store.partition(OFFSETS_TOPIC, 0).read(0)
    commits = [r for r in records if decode_offset_key(r.key) is not None]
    assert [decode_offset_key(r.key) for r in commits] == [("g", "t", 0)]
    assert decode_offset_value(commits[0].value)[:2] == (5, "")
    # the rest is the group's membership (a stable generation, then empty): Kafka's group records
    assert {decode_group_key(r.key) for r in records if r not in commits} == {"g"}


def test_commits_survive_store_reopen(tmp_path):
    root = tmp_path / "s"
    with LogStore(root, maintenance=False) as s:
        fill(s, "t", 2, 10)
        with s.consumer("g", "t", max_poll_records=7, enable_auto_commit=False) as c:
            c.poll(0)
            c.commit({("t", 0): 3, ("t", 1): 9})
    with LogStore(root, maintenance=False) as s:
        with s.consumer("g", "t", enable_auto_commit=False) as c:
            assert c.committed("t", 0) == 3 and c.committed("t", 1) == 9
            assert [c.position("t", p) for p in (0, 1)] == [3, 9]


# ---------------------------------------------------------------------------- seeking
def test_seek_and_position(store):
    fill(store, "t", 2, 10)
    with store.consumer("g", "t") as c:
        c.seek("t", 1, 7)
        assert c.position("t", 1) == 7
        got = c.poll(0, max_records=100)
        assert sorted(where(got)) == [(0, i) for i in range(10)] + [(1, 7), (1, 8), (1, 9)]
        c.seek("t", 0, 2)
        assert where(c.poll(0, max_records=2)) == [(0, 2), (0, 3)]
        with pytest.raises(ValueError):
            c.seek("t", 0, -1)
        with pytest.raises(ValueError):
            c.seek("t", 0, True)


def test_seek_to_beginning_and_end(store):
    fill(store, "t", 2, 10)
    with store.consumer("g", "t") as c:
        c.seek_to_end()
        assert [c.position("t", p) for p in (0, 1)] == [10, 10]
        assert c.poll(0) == []
        c.seek_to_beginning(("t", 1))
        assert [c.position("t", p) for p in (0, 1)] == [10, 0]
        assert sorted(where(c.poll(0))) == [(1, i) for i in range(10)]
        c.seek_to_beginning()
        assert [c.position("t", p) for p in (0, 1)] == [0, 0]
        store.partition("t", 0).delete_records_before(4)
        c.seek_to_beginning()
        assert [c.position("t", p) for p in (0, 1)] == [4, 0]
        c.seek_to_end(("t", 0))
        assert [c.position("t", p) for p in (0, 1)] == [10, 0]


def test_seek_to_timestamp(store):
    store.create_topic("t", 2)
    base = int(time.time() * 1000) - 60_000
    log0, log1 = store.partition("t", 0), store.partition("t", 1)
    for i in range(5):
        log0.append(value(0, i), timestamp=base + 1000 * i)
        log1.append(value(1, i), timestamp=base + 500 + 1000 * i)
    with store.consumer("g", "t") as c:
        moved = c.seek_to_timestamp(base + 2000)
        assert moved == {TopicPartition("t", 0): 2, TopicPartition("t", 1): 2}
        assert isinstance(next(iter(moved)), TopicPartition)
        moved = c.seek_to_timestamp(base + 2001)
        assert moved == {TopicPartition("t", 0): 3, TopicPartition("t", 1): 2}
        got = drain(c)
        assert sorted(where(got)) == [(0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]
        assert all(r.timestamp >= base + 2001 for r in got)
        # only the partitions named move; later than every record: the log end
        c.seek("t", 1, 0)
        assert c.seek_to_timestamp(base + 10**6, ("t", 0)) == {TopicPartition("t", 0): 5}
        assert c.position("t", 1) == 0
        assert c.seek_to_timestamp(0) == {TopicPartition("t", 0): 0, TopicPartition("t", 1): 0}


def test_lag(store):
    fill(store, "t", 2, 10)
    with store.consumer("g", "t") as c:
        assert c.lag() == {TopicPartition("t", 0): 10, TopicPartition("t", 1): 10}
        c.poll(0, max_records=3)
        lag = c.lag()
        assert sum(lag.values()) == 17
        store.partition("t", 1).append(b"more")
        assert sum(c.lag().values()) == 18
        drain(c)
        assert c.lag() == {TopicPartition("t", 0): 0, TopicPartition("t", 1): 0}
        c.seek("t", 0, 100)  # past the end: no negative lag
        assert c.lag()[TopicPartition("t", 0)] == 0


def test_unassigned_partition_raises(store):
    fill(store, "t", 4, 1)
    a = store.consumer("g", "t")
    b = store.consumer("g", "t")
    try:
        assert parts(a) == [0, 1] and parts(b) == [2, 3]
        for call in (lambda: a.position("t", 2), lambda: a.seek("t", 3, 0),
                     lambda: a.seek_to_beginning(("t", 2)), lambda: a.seek_to_end(("t", 3)),
                     lambda: a.seek_to_timestamp(0, ("t", 2)), lambda: a.position("t", 9),
                     lambda: a.position("other", 0)):
            with pytest.raises(PartitionNotAssignedError) as info:
                call()
            assert isinstance(info.value, ValueError)
        assert a.position("t", 1) == 0
        # committed() works for any partition, assigned or not
        b.commit({("t", 2): 1})
        assert a.committed("t", 2) == 1
    finally:
        a.close()
        b.close()


def test_out_of_range_position_resets_to_earliest(store):
    fill(store, "t", 1, 10)
    log = store.partition("t", 0)
    with store.consumer("g", "t", max_poll_records=2) as c:
        assert [r.offset for r in c.poll(0)] == [0, 1]
        log.delete_records_before(6)
        assert [r.offset for r in c.poll(0)] == [6, 7]
        c.seek("t", 0, 50)  # past the end
        assert [r.offset for r in c.poll(0)] == [6, 7]


def test_out_of_range_position_resets_to_latest(store):
    fill(store, "t", 1, 10)
    log = store.partition("t", 0)
    with store.consumer("g", "t", auto_offset_reset="latest", max_poll_records=2) as c:
        c.seek("t", 0, 0)
        assert [r.offset for r in c.poll(0)] == [0, 1]
        log.delete_records_before(6)
        assert c.poll(0) == []
        assert c.position("t", 0) == 10
        log.append(b"x")
        assert [r.offset for r in c.poll(0)] == [10]


def test_committed_offset_out_of_range_is_reset(store):
    fill(store, "t", 1, 10)
    with store.consumer("g", "t", enable_auto_commit=False) as c:
        c.commit({("t", 0): 2})
    store.partition("t", 0).delete_records_before(5)
    with store.consumer("g", "t", enable_auto_commit=False) as c:
        assert c.position("t", 0) == 5
        assert c.poll(0)[0].offset == 5
    with store.consumer("g", "t", enable_auto_commit=False) as c:
        c.commit({("t", 0): 99})  # beyond the log end
    with store.consumer("g", "t", enable_auto_commit=False, auto_offset_reset="latest") as c:
        assert c.position("t", 0) == 10


# ---------------------------------------------------------------------------- long-poll
def test_long_poll_wakes_on_append_from_another_thread(store):
    store.create_topic("t", 3)
    with store.consumer("g", "t") as c:
        result: dict = {}

        def waiter():
            started = time.monotonic()
            result["records"] = c.poll(timeout=5)
            result["returned"] = time.monotonic()
            result["waited"] = result["returned"] - started

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.2)
        assert t.is_alive()  # still waiting: nothing to read
        store.partition("t", 2).append(b"wake")
        appended = time.monotonic()
        t.join(5)
        assert not t.is_alive()
        assert where(result["records"]) == [(2, 0)]
        assert result["returned"] - appended < 0.3
        assert 0.15 < result["waited"] < 1.0


def test_poll_timeout_without_data(store):
    store.create_topic("t")
    with store.consumer("g", "t") as c:
        started = time.monotonic()
        assert c.poll(timeout=0.2) == []
        elapsed = time.monotonic() - started
        assert 0.19 <= elapsed < 0.45
        started = time.monotonic()
        assert c.poll(0) == []
        assert time.monotonic() - started < 0.05


def test_poll_returns_at_once_with_data(store):
    fill(store, "t", 1, 3)
    with store.consumer("g", "t") as c:
        started = time.monotonic()
        got = c.poll(0)
        assert time.monotonic() - started < 0.05
        assert len(got) == 3
        store.partition("t", 0).append(b"x")
        started = time.monotonic()
        assert len(c.poll(timeout=5)) == 1
        assert time.monotonic() - started < 0.05


def test_long_poll_ignores_appends_to_other_topics(store):
    store.create_topic("t")
    store.create_topic("other")
    with store.consumer("g", "t") as c:
        def poke():
            for _ in range(5):
                time.sleep(0.03)
                store.partition("other", 0).append(b"noise")
        t = threading.Thread(target=poke)
        t.start()
        started = time.monotonic()
        assert c.poll(timeout=0.3) == []
        elapsed = time.monotonic() - started
        t.join()
        assert 0.29 <= elapsed < 0.6


# ---------------------------------------------------------------------------- groups
def test_range_assignment(store):
    store.create_topic("t", 5)
    a = store.consumer("g", "t")
    assert parts(a) == [0, 1, 2, 3, 4]
    b = store.consumer("g", "t")
    assert (parts(a), parts(b)) == ([0, 1, 2], [3, 4])
    c = store.consumer("g", "t")
    assert (parts(a), parts(b), parts(c)) == ([0, 1], [2, 3], [4])
    c.close()
    assert (parts(a), parts(b)) == ([0, 1, 2], [3, 4])
    a.close()
    assert parts(b) == [0, 1, 2, 3, 4]
    b.close()


def test_range_assignment_more_members_than_partitions(store):
    store.create_topic("t", 2)
    members = [store.consumer("g", "t") for _ in range(3)]
    try:
        assert [parts(m) for m in members] == [[0], [1], []]
        assert members[2].poll(0) == []
    finally:
        for m in members:
            m.close()


def test_range_assignment_is_per_topic(store):
    store.create_topic("x", 3)
    store.create_topic("y", 3)
    store.create_topic("z", 2)
    a = store.consumer("g", ["x", "y"])
    b = store.consumer("g", ["x", "y", "z"])
    try:
        assert (parts(a, "x"), parts(b, "x")) == ([0, 1], [2])
        assert (parts(a, "y"), parts(b, "y")) == ([0, 1], [2])
        assert (parts(a, "z"), parts(b, "z")) == ([], [0, 1])  # a does not subscribe to z
    finally:
        a.close()
        b.close()


def test_rebalance_on_join_and_close_keeps_positions(store):
    fill(store, "t", 5, 10)
    a = store.consumer("g", "t", max_poll_records=100)
    first = a.poll(0, max_records=100)
    assert len(first) == 50  # one poll reads across partitions up to max_records
    assert a.poll(0) == []
    assert sorted(where(first)) == [(p, i) for p in range(5) for i in range(10)]
    for p in range(5):
        store.partition("t", p).append(value(p, 10))
    b = store.consumer("g", "t")
    # a's positions for the partitions it lost were committed when they were revoked
    assert a.committed("t", 3) == 10 and a.committed("t", 4) == 10
    assert parts(a) == [0, 1, 2] and parts(b) == [3, 4]
    assert sorted(where(drain(b))) == [(3, 10), (4, 10)]
    assert sorted(where(drain(a))) == [(0, 10), (1, 10), (2, 10)]
    for p in range(5):
        store.partition("t", p).append(value(p, 11))
    b.close()
    assert parts(a) == [0, 1, 2, 3, 4]
    assert sorted(where(drain(a))) == [(p, 11) for p in range(5)]
    a.close()


def test_no_gaps_no_duplicates_across_rebalances(store):
    partitions, per = 4, 60
    fill(store, "t", partitions, per)
    seen: list[tuple[int, int]] = []
    a = store.consumer("g", "t", max_poll_records=7)
    seen += where(a.poll(0))
    seen += where(a.poll(0))
    b = store.consumer("g", "t", max_poll_records=5)
    for _ in range(3):
        seen += where(a.poll(0))
        seen += where(b.poll(0))
    c = store.consumer("g", "t", max_poll_records=3)
    for _ in range(3):
        for m in (a, b, c):
            seen += where(m.poll(0))
    a.close()
    for _ in range(3):
        for m in (b, c):
            seen += where(m.poll(0))
    d = store.consumer("g", "t", max_poll_records=4)
    for _ in range(2):
        for m in (b, c, d):
            seen += where(m.poll(0))
    b.close()
    c.close()
    seen += where(drain(d))
    d.close()
    assert len(seen) == len(set(seen)), "duplicates"
    assert sorted(seen) == [(p, i) for p in range(partitions) for i in range(per)], "gaps"


def test_different_groups_each_get_everything(store):
    fill(store, "t", 3, 8)
    g1a = store.consumer("g1", "t")
    g1b = store.consumer("g1", "t")
    g2 = store.consumer("g2", "t")
    try:
        assert parts(g2) == [0, 1, 2]
        assert len(parts(g1a)) + len(parts(g1b)) == 3
        everything = [(p, i) for p in range(3) for i in range(8)]
        assert sorted(where(drain(g1a) + drain(g1b))) == everything
        assert sorted(where(drain(g2))) == everything
    finally:
        for c in (g1a, g1b, g2):
            c.close()


def _race_setup(store, stale: bool):
    """Members a and x of group g on a 6-partition topic; a has read from each of its
    partitions. With ``stale``, a's last sync is a generation older than the group's state."""
    fill(store, "t", 6, 10)
    seen: list[tuple[int, int]] = []
    if stale:
        a = store.consumer("g", "t", max_poll_records=1)
        for _ in range(6):
            seen += where(a.poll(0))  # a owns 0..5 and has positions for all
        x = store.consumer("g", "t", max_poll_records=1)  # a keeps 0,1,2 but does not sync
    else:
        a = store.consumer("g", "t", max_poll_records=1)
        x = store.consumer("g", "t", max_poll_records=1)
        for _ in range(3):
            seen += where(a.poll(0))
    for _ in range(3):
        seen += where(x.poll(0))
    return a, x, seen


@pytest.mark.regression
@pytest.mark.parametrize("stale", [False, True], ids=["synced", "stale-generation"])
def test_poll_during_a_rebalance_is_consistent(store, stale):
    a, x, seen = _race_setup(store, stale)
    if not stale:  # (assignment() would sync a stale member)
        assert parts(a) == [0, 1, 2] and a.position("t", 2) == 1
    # Other members' revocations each commit (an fsync); a polls while x's is in progress.
    # The window is widened deterministically by holding x's revocation until a has polled.
    in_window, proceed = threading.Event(), threading.Event()
    revoke = x._revoke

    def slow_revoke(partitions):
        revoke(partitions)
        in_window.set()
        proceed.wait(5)

    x._revoke = slow_revoke
    errors: list[BaseException] = []
    during: list[tuple[int, int]] = []
    holder: dict = {}
    joiner = threading.Thread(target=lambda: holder.setdefault("c", store.consumer("g", "t", max_poll_records=1)))
    joiner.start()
    assert in_window.wait(5)

    def poll_a():
        try:
            for _ in range(4):
                during.extend(where(a.poll(0)))
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    poller = threading.Thread(target=poll_a)
    poller.start()
    poller.join(1.0)  # a fix may make a wait for the rebalance to finish
    proceed.set()
    poller.join(5)
    joiner.join(5)
    c = holder["c"]
    try:
        assert parts(a) == [0, 1] and parts(x) == [2, 3] and parts(c) == [4, 5]
        seen += during
        for m in (a, x, c):
            seen += where(drain(m))
        assert errors == []
        assert len(seen) == len(set(seen)), "duplicates"
        assert sorted(seen) == [(p, i) for p in range(6) for i in range(10)]
    finally:
        for m in (a, x, c):
            m.close()


# ---------------------------------------------------------------------------- asyncio
def test_apoll_waits_without_blocking_the_loop(store):
    store.create_topic("t", 2)
    c = store.consumer("g", "t")

    async def main():
        ticks = 0
        stop = False

        async def ticker():
            nonlocal ticks
            while not stop:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        timer = threading.Timer(0.25, lambda: store.partition("t", 1).append(b"later"))
        timer.start()
        started = time.monotonic()
        records = await c.apoll(5)
        elapsed = time.monotonic() - started
        stop = True
        await task
        timer.join()
        return records, ticks, elapsed

    try:
        records, ticks, elapsed = asyncio.run(main())
    finally:
        c.close()
    assert where(records) == [(1, 0)] and records[0].value == b"later"
    assert ticks > 5  # the loop ran other tasks while apoll waited
    assert 0.2 < elapsed < 1.5


def test_apoll_timeout_returns_empty(store):
    store.create_topic("t")
    c = store.consumer("g", "t")

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        started = time.monotonic()
        records = await c.apoll(0.3)
        elapsed = time.monotonic() - started
        task.cancel()
        return records, ticks, elapsed

    try:
        records, ticks, elapsed = asyncio.run(main())
    finally:
        c.close()
    assert records == []
    assert ticks > 0
    assert 0.28 <= elapsed < 1.0


def test_apoll_returns_available_records_at_once(store):
    fill(store, "t", 1, 4)
    with store.consumer("g", "t") as c:
        started = time.monotonic()
        records = asyncio.run(c.apoll(5, max_records=3))
        assert time.monotonic() - started < 0.5
        assert [r.offset for r in records] == [0, 1, 2]


def test_cancelled_apoll_loses_nothing(store):
    store.create_topic("t")
    c = store.consumer("g", "t")

    async def main():
        task = asyncio.create_task(c.apoll(5))
        await asyncio.sleep(0.1)
        assert not task.done()
        # append and cancel before the task runs again: its wait ends, but it never fetches
        store.partition("t", 0).append_batch([b"a", b"b", b"c"])
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    try:
        asyncio.run(main())
        assert c.position("t", 0) == 0
        assert [r.value for r in c.poll(0)] == [b"a", b"b", b"c"]
    finally:
        c.close()


# ---------------------------------------------------------------------------- SIGKILL mid-commit
def _committer(root: str, start: int, slot: mmap.mmap) -> None:
    """Child: commit start, start+1, ... forever; after each commit returns, store its value."""
    store = LogStore(root, maintenance=False)
    consumer = store.consumer("g", "t", enable_auto_commit=False)
    i = start
    while True:
        consumer.commit({("t", 0): i})
        struct.pack_into("<q", slot, 0, i)
        i += 1


def test_sigkill_during_commits_leaves_a_committed_offset(tmp_path):
    root = str(tmp_path / "s")
    with LogStore(root, maintenance=False) as s:
        s.create_topic("t")
        s.partition("t", 0).append(b"x")
    rng = random.Random(20240611)
    previous: int | None = None
    progressed = 0
    began = time.monotonic()
    for round_ in range(10):
        start = 0 if previous is None else previous + 1
        slot = mmap.mmap(-1, 8)
        struct.pack_into("<q", slot, 0, -1)
        pid = os.fork()
        if pid == 0:  # child
            try:
                _committer(root, start, slot)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.02, 0.3) if round_ else 0.3)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        (done,) = struct.unpack_from("<q", slot, 0)
        slot.close()

        store = LogStore(root, maintenance=False)  # opens cleanly after the kill
        try:
            with store.consumer("g", "t", enable_auto_commit=False) as c:
                observed = c.committed("t", 0)
            # every record of the offsets topic is a whole, valid commit of increasing offsets
            commits = []
            for r in store.partition(OFFSETS_TOPIC, 0).iter():
                if decode_group_key(r.key) is not None:
                    continue  # the group's membership records
                assert decode_offset_key(r.key) == ("g", "t", 0)
                commits.append(decode_offset_value(r.value)[0])
            assert commits == sorted(set(commits))
        finally:
            store.close()
        if done < 0:  # killed before its first commit returned
            assert observed in (previous, start)
        else:
            assert done >= start
            assert observed in (done, done + 1), (observed, done)
            progressed += 1
        assert observed is None or commits[-1] == observed
        if previous is not None:
            assert observed is not None and observed >= previous
        previous = observed
    assert progressed >= 1
    assert previous is not None and previous > 0
    assert time.monotonic() - began < 15


def test_long_poll_wakes_on_an_append_through_another_store_object(tmp_path):
    # Two LogStore objects on one root map .notify separately and lock through separate file
    # descriptions, exactly as two processes do.
    root = str(tmp_path / "shared")
    a = LogStore(root, maintenance=False)
    b = LogStore(root, maintenance=False)
    try:
        a.create_topic("t", 2)
        consumer = b.consumer("g", "t", auto_offset_reset="latest")
        assert consumer.poll(0) == []
        got = []

        def wait():
            t0 = time.monotonic()
            got.append((consumer.poll(timeout=5), time.monotonic() - t0))

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        a.partition("t", 1).append(b"across")
        thread.join()
        records, elapsed = got[0]
        assert [r.value for r in records] == [b"across"]
        assert elapsed < 0.2 + 0.3
    finally:
        b.close()
        a.close()


def test_position_moves_past_trailing_control_batches(store):
    from logstore.records.control import leader_change_record

    store.create_topic("ctl", 1)
    log = store.partition("ctl", 0)
    key, value = leader_change_record(0, [0], [0])
    log.append_batch([b"a", b"b"])
    log.append_batch([value], [key], control=True)
    consumer = store.consumer("g", ["ctl"])
    try:
        assert [r.value for r in drain(consumer)] == [b"a", b"b"]
        # The control batch at offset 2 returns nothing, but the position passes it, so a
        # long-poll waits for new data instead of finding the same "new" offset again.
        assert consumer.position("ctl", 0) == 3
        assert consumer.poll(0.05) == []
        log.append(b"c")
        assert [(r.offset, r.value) for r in consumer.poll(1.0)] == [(3, b"c")]
    finally:
        consumer.close()


# ---------------------------------------------------------------------------- a topic that grows
@pytest.mark.parametrize("shared", [False, True])
def test_a_consumer_takes_up_partitions_added_to_its_topic(tmp_path, shared):
    """As a Kafka consumer on its metadata refresh: once a topic grows (CreatePartitions), the
    group rebalances and the new partitions are read (a shared group's leader notices in its
    heartbeats)."""
    with LogStore(tmp_path, maintenance=False, shared=shared) as store:
        store.create_topic("grows", 1)
        store.partition("grows", 0).append(b"first")
        with store.consumer("g", "grows", heartbeat_interval_ms=100, session_timeout_ms=5_000) as consumer:
            assert [r.value for r in consumer.poll(5.0)] == [b"first"]
            store.create_partitions("grows", 3)
            store.partition("grows", 2).append(b"in a new partition")
            got = []
            deadline = time.monotonic() + 20
            while not got and time.monotonic() < deadline:
                got = [(r.partition, r.value) for r in consumer.poll(0.5)]
            assert got == [(2, b"in a new partition")]
            assert {(tp.topic, tp.partition) for tp in consumer.assignment()} == {("grows", p) for p in range(3)}
