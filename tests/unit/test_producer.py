"""Producer: Kafka's partitioning (murmur2, sticky, round robin), futures, batching, codecs,
durability, validation at send, closing and concurrent use."""

from __future__ import annotations

import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_murmur2

from logstore import (
    InvalidConfigError,
    InvalidRecordError,
    LogClosedError,
    LogStore,
    Producer,
    RecordMetadata,
    RecordTooLargeError,
    SendFuture,
    UnknownTopicOrPartitionError,
)
from logstore.records import compression
from logstore.client.producer import default_partition, murmur2
from logstore.records.batch import parse_header

PARTITIONS = 4


@pytest.fixture
def store(tmp_path):
    s = LogStore(str(tmp_path / "store"), maintenance=False)
    s.create_topic("t", PARTITIONS)
    yield s
    s.close()


@pytest.fixture
def producers(store):
    """Factory for producers that are closed after the test."""
    made = []

    def make(**options):
        p = store.producer(**options)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close(timeout=10)


def values_of(store, topic, partition):
    return [r.value for r in store.partition(topic, partition).iter()]


def batch_headers(log):
    """Every RecordBatch header in the log's segments, in order (parsed from the .log files)."""
    headers = []
    for seg in log.segments:
        with open(os.path.join(log.path, f"{seg.base_offset:020d}.log"), "rb") as f:
            data = f.read()[: seg.size]
        pos = 0
        while pos < len(data):
            h = parse_header(data, pos)
            headers.append(h)
            pos += h.size
    return headers


# ---------------------------------------------------------------------- murmur2

KAFKA_VECTORS = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


@pytest.mark.parametrize("text, expected", sorted(KAFKA_VECTORS.items()))
def test_murmur2_matches_kafka_utils_test_vectors(text, expected):
    assert murmur2(text.encode()) == expected


def test_murmur2_empty_and_signed_range():
    # Utils.murmur2(new byte[0]) in Java: seed ^ 0, then the final mix
    assert murmur2(b"") % 2**32 == kafka_murmur2(b"")
    assert -(2**31) <= murmur2(b"") < 2**31


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_murmur2_matches_kafka_python(data):
    ours = murmur2(data)
    assert -(2**31) <= ours < 2**31  # signed, as Java's int
    assert ours % 2**32 == kafka_murmur2(data) % 2**32


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_default_partition_is_positive_murmur2_mod_n(key, n):
    p = default_partition(key, n)
    assert p == (murmur2(key) & 0x7FFFFFFF) % n
    assert p == (kafka_murmur2(key) & 0x7FFFFFFF) % n
    assert 0 <= p < n


# ---------------------------------------------------------------------- partitioning

def test_keyed_sends_land_on_default_partition(store, producers):
    p = producers(linger_ms=10_000)
    keys = [b"key-%d" % i for i in range(60)]
    futures = [p.send("t", b"v-" + k, key=k) for k in keys]
    p.flush()
    seen = set()
    for k, f in zip(keys, futures):
        md = f.result(timeout=5)
        assert md.partition == default_partition(k, PARTITIONS)
        seen.add(md.partition)
        rec = store.partition("t", md.partition).read(md.offset, max_records=1)[0]
        assert (rec.offset, rec.key, rec.value) == (md.offset, k, b"v-" + k)
    assert len(seen) > 1  # 60 keys do not all hash to one partition
    # the same key always goes to the same partition
    again = p.send("t", b"x", key=keys[0])
    p.flush()
    assert again.result(5).partition == futures[0].result().partition


def test_explicit_partition_is_respected(store, producers):
    p = producers(linger_ms=0)
    for part in range(PARTITIONS):
        f = p.send("t", b"to-%d" % part, key=b"same-key", partition=part)
        assert f.result(timeout=5) == RecordMetadata(part, 0)
    for part in range(PARTITIONS):
        assert values_of(store, "t", part) == [b"to-%d" % part]


@pytest.mark.parametrize("partition", [PARTITIONS, -1, 100, True, 1.0, "1"])
def test_bad_partition_raises_at_send_and_queues_nothing(store, producers, partition):
    p = producers(linger_ms=10_000)
    with pytest.raises(UnknownTopicOrPartitionError):
        p.send("t", b"x", partition=partition)
    p.flush()
    assert all(store.partition("t", n).log_end_offset == 0 for n in range(PARTITIONS))


def test_unknown_topic_raises_at_send(store, producers):
    p = producers()
    with pytest.raises(UnknownTopicOrPartitionError):
        p.send("nope", b"x")
    with pytest.raises(UnknownTopicOrPartitionError):
        p.send("nope", b"x", key=b"k")


def test_null_key_sends_stick_to_one_partition_per_batch(store, producers):
    # 100-byte values count about 116 bytes each: the third record fills a 300-byte batch
    p = producers(linger_ms=10_000, batch_size=300)
    futures = [p.send("t", bytes([i]) * 100) for i in range(9)]
    parts = [f.result(timeout=5).partition for f in futures]  # full batches are written at once
    assert parts[0] == parts[1] == parts[2]
    assert parts[3] == parts[4] == parts[5]
    assert parts[6] == parts[7] == parts[8]
    assert parts[0] != parts[3] and parts[3] != parts[6]
    for f in futures:
        md = f.result()
        rec = store.partition("t", md.partition).read(md.offset, max_records=1)[0]
        assert rec.value == bytes([futures.index(f)]) * 100


def test_sticky_partition_moves_after_a_linger_flush(store, producers):
    p = producers(linger_ms=10_000)
    first = [p.send("t", b"a"), p.send("t", b"b")]
    p.flush()
    assert first[0].result().partition == first[1].result().partition
    after = p.send("t", b"c")
    p.flush()
    assert after.result().partition != first[0].result().partition


def test_single_partition_topic_sticky(store, producers):
    store.create_topic("one", 1)
    p = producers(linger_ms=0, batch_size=1)
    assert [p.send("one", b"%d" % i).result(5) for i in range(5)] == [RecordMetadata(0, i) for i in range(5)]


def test_round_robin_partitioner(store, producers):
    p = producers(partitioner="round_robin", linger_ms=10_000)
    futures = [p.send("t", b"%d" % i, key=b"same") for i in range(2 * PARTITIONS + 1)]
    p.flush()
    assert [f.result().partition for f in futures] == [i % PARTITIONS for i in range(2 * PARTITIONS + 1)]
    assert values_of(store, "t", 0) == [b"0", b"4", b"8"]


def test_callable_partitioner(store, producers):
    calls = []

    def pick_last(key, partitions, topic):
        calls.append((key, partitions, topic))
        return partitions - 1

    p = producers(partitioner=pick_last, linger_ms=10_000)
    futures = [p.send("t", b"v", key=b"k1"), p.send("t", b"w")]
    p.flush()
    assert calls == [(b"k1", PARTITIONS, "t"), (None, PARTITIONS, "t")]
    assert [f.result() for f in futures] == [RecordMetadata(PARTITIONS - 1, 0), RecordMetadata(PARTITIONS - 1, 1)]
    # explicit partitions bypass the partitioner
    explicit = p.send("t", b"x", partition=0)
    p.flush()
    assert explicit.get(timeout=5) == RecordMetadata(0, 0)
    assert len(calls) == 2


def test_callable_partitioner_out_of_range(store, producers):
    p = producers(partitioner=lambda key, n, topic: n, linger_ms=10_000)
    with pytest.raises(UnknownTopicOrPartitionError):
        p.send("t", b"x")
    p.flush()
    assert all(store.partition("t", n).log_end_offset == 0 for n in range(PARTITIONS))


# ---------------------------------------------------------------------- futures

def test_futures_give_dense_offsets_matching_the_log(store, producers):
    p = producers(linger_ms=1, batch_size=200)
    futures = [p.send("t", b"value-%03d" % i, partition=i % 2) for i in range(50)]
    p.flush()
    by_partition: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    for i, f in enumerate(futures):
        assert f.done()
        assert f.exception() is None
        md = f.result()
        assert isinstance(md, RecordMetadata) and isinstance(f, SendFuture)
        by_partition[md.partition].append((md.offset, b"value-%03d" % i))
    for part, pairs in by_partition.items():
        assert [o for o, _ in pairs] == list(range(25))  # dense, in send order
        records = list(store.partition("t", part).iter())
        assert [(r.offset, r.value) for r in records] == pairs


def test_future_timeout_then_flush_resolves(store, producers):
    p = producers(linger_ms=10_000)
    f = p.send("t", b"waiting", partition=2)
    assert not f.done()
    assert "pending" in repr(f)
    with pytest.raises(TimeoutError):
        f.result(timeout=0.05)
    with pytest.raises(TimeoutError):
        f.exception(timeout=0.01)
    assert store.partition("t", 2).log_end_offset == 0
    p.flush()
    assert f.done()
    assert f.result(timeout=0) == RecordMetadata(2, 0)
    assert f.get() == RecordMetadata(2, 0)
    assert "done" in repr(f)


def test_zero_linger_sender_writes_without_flush(store, producers):
    p = producers(linger_ms=0)
    futures = [p.send("t", b"now-%d" % i, partition=1) for i in range(3)]
    assert [f.result(timeout=10) for f in futures] == [RecordMetadata(1, i) for i in range(3)]
    assert values_of(store, "t", 1) == [b"now-0", b"now-1", b"now-2"]


@pytest.mark.regression
@pytest.mark.parametrize("linger_ms", [20, None])
def test_linger_alone_writes_the_batch(store, producers, linger_ms):
    p = producers() if linger_ms is None else producers(linger_ms=linger_ms)  # None: the default (5 ms)
    f = p.send("t", b"soon", partition=1)
    assert f.result(timeout=1) == RecordMetadata(1, 0)  # the sender thread wrote it, no flush
    assert values_of(store, "t", 1) == [b"soon"]


def test_done_callbacks(store, producers):
    p = producers(linger_ms=10_000)
    f = p.send("t", b"x", partition=0)
    called = []
    f.add_done_callback(lambda fut: called.append(("cb1", fut, fut.done())))
    f.add_done_callback(lambda fut: 1 / 0)  # a raising callback must not break the others
    f.add_done_callback(lambda fut: called.append(("cb3", fut, fut.done())))
    assert called == []
    p.flush()
    assert called == [("cb1", f, True), ("cb3", f, True)]
    f.add_done_callback(lambda fut: called.append(("late", fut, fut.result())))
    assert called[-1] == ("late", f, RecordMetadata(0, 0))  # already done: called at once
    assert len(called) == 3


def test_failed_write_is_delivered_through_the_future(store, producers):
    store.create_topic("compacted", 1, cleanup_policy="compact")
    p = producers(linger_ms=10_000)
    f = p.send("compacted", b"no key")
    errors = []
    f.add_done_callback(lambda fut: errors.append(fut.exception()))
    p.flush()
    assert f.done()
    assert isinstance(f.exception(), InvalidRecordError)
    with pytest.raises(InvalidRecordError):
        f.result()
    assert errors == [f.exception()]
    assert "error" in repr(f)
    assert store.partition("compacted", 0).log_end_offset == 0
    ok = p.send("compacted", b"with key", key=b"k")
    p.flush()
    assert ok.result() == RecordMetadata(0, 0)


# ---------------------------------------------------------------------- batching

def test_linger_holds_records_until_flush_as_one_batch(store, producers):
    p = producers(linger_ms=10_000)
    futures = [p.send("t", b"r%d" % i, partition=3) for i in range(20)]
    log = store.partition("t", 3)
    assert log.log_end_offset == 0
    assert not any(f.done() for f in futures)
    p.flush()
    assert log.log_end_offset == 20
    assert values_of(store, "t", 3) == [b"r%d" % i for i in range(20)]
    headers = batch_headers(log)
    assert [(h.base_offset, h.records_count) for h in headers] == [(0, 20)]


def test_batch_size_writes_full_batches_at_once(store, producers):
    # 100-byte values count about 116 bytes: 5 records fill a 500-byte batch
    p = producers(linger_ms=10_000, batch_size=500)
    futures = [p.send("t", bytes([65 + i]) * 100, partition=0) for i in range(22)]
    log = store.partition("t", 0)
    assert log.log_end_offset == 20  # four full batches written by send(), two records waiting
    assert [f.done() for f in futures] == [True] * 20 + [False] * 2
    p.flush()
    assert [(h.base_offset, h.records_count) for h in batch_headers(log)] == [
        (0, 5), (5, 5), (10, 5), (15, 5), (20, 2)]
    assert [r.value for r in log.iter()] == [bytes([65 + i]) * 100 for i in range(22)]


# ---------------------------------------------------------------------- compression

@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd", "none", None])
def test_compression_round_trip(store, producers, codec):
    p = producers(compression=codec, linger_ms=10_000)
    payloads = [(b"payload %d " % i) * 20 for i in range(40)]
    futures = [p.send("t", v, key=b"k%d" % i, partition=1) for i, v in enumerate(payloads)]
    p.flush()
    assert [f.result().offset for f in futures] == list(range(40))
    log = store.partition("t", 1)
    records = list(log.iter())
    assert [r.value for r in records] == payloads
    assert [r.key for r in records] == [b"k%d" % i for i in range(40)]
    headers = batch_headers(log)
    assert len(headers) == 1
    assert headers[0].compression == compression.codec_from_name(codec)
    if codec not in (None, "none"):
        assert log.size_in_bytes < sum(map(len, payloads)) // 2


# ---------------------------------------------------------------------- durability

def test_fsynced_durability_advances_recovery_point(store, producers):
    p = producers(durability="fsynced", linger_ms=0)
    futures = [p.send("t", b"d%d" % i, partition=0) for i in range(5)]
    for f in futures:
        md = f.result(timeout=10)
        assert store.partition("t", 0).recovery_point >= md.offset + 1


def test_written_durability_does_not_fsync(store, producers):
    p = producers(linger_ms=0)
    assert p.durability == "written"
    md = p.send("t", b"x", partition=0).result(timeout=10)
    assert md == RecordMetadata(0, 0)
    log = store.partition("t", 0)
    assert log.log_end_offset == 1
    assert log.recovery_point == 0
    # one send may ask for more
    md = p.send("t", b"y", partition=0, durability="fsynced").result(timeout=10)
    assert log.recovery_point >= md.offset + 1 == 2


@pytest.mark.parametrize("options", [
    dict(durability="sync"),
    dict(durability=None),
    dict(linger_ms=-1),
    dict(linger_ms="5"),
    dict(linger_ms=True),
    dict(batch_size=0),
    dict(batch_size=1.5),
    dict(batch_size=True),
    dict(partitioner="hash"),
    dict(partitioner=None),
])
def test_bad_producer_options(store, options):
    with pytest.raises(InvalidConfigError):
        store.producer(**options)


def test_unknown_codec_is_rejected(store):
    # compression names go through compression.codec_from_name, which raises ValueError
    # (InvalidConfigError is a ValueError too; the codec check raises the plain kind)
    with pytest.raises(ValueError):
        store.producer(compression="brotli")


def test_bad_durability_per_send_queues_nothing(store, producers):
    p = producers(linger_ms=10_000)
    with pytest.raises(InvalidConfigError):
        p.send("t", b"x", partition=0, durability="eventually")
    p.flush()
    assert store.partition("t", 0).log_end_offset == 0


# ---------------------------------------------------------------------- records

def test_headers_and_timestamps_round_trip(store, producers):
    p = producers(linger_ms=10_000)
    before = int(time.time() * 1000)
    plain = p.send("t", b"plain", partition=2)
    stamped = p.send("t", b"stamped", key=b"k", partition=2, timestamp=1_600_000_000_123,
                     headers=[("h1", b"v1"), ("h2", None), ("h1", b"")])
    tomb = p.send("t", None, key=b"k", partition=2, headers=iter([("only", b"x")]))
    p.flush()
    after = int(time.time() * 1000)
    assert [plain.result().offset, stamped.result().offset, tomb.result().offset] == [0, 1, 2]
    r0, r1, r2 = store.partition("t", 2).read(0)
    assert r0.value == b"plain" and r0.key is None and list(r0.headers) == []
    assert before <= r0.timestamp <= after
    assert r1.timestamp == 1_600_000_000_123
    assert list(r1.headers) == [("h1", b"v1"), ("h2", None), ("h1", b"")]
    assert (r1.key, r1.value) == (b"k", b"stamped")
    assert r2.value is None and list(r2.headers) == [("only", b"x")]
    assert before <= r2.timestamp <= after


def test_bytes_like_values_are_accepted(store, producers):
    p = producers(linger_ms=10_000)
    p.send("t", bytearray(b"ba"), key=memoryview(b"mv"), partition=0)
    p.flush()
    (r,) = store.partition("t", 0).read(0)
    assert (r.key, r.value) == (b"mv", b"ba")


@pytest.mark.parametrize("kwargs", [
    dict(value="text"),
    dict(value=123),
    dict(value=b"ok", key="text"),
    dict(value=[1, 2]),
])
def test_type_errors_at_send_queue_nothing(store, producers, kwargs):
    p = producers(linger_ms=10_000)
    with pytest.raises(TypeError):
        p.send("t", partition=0, **kwargs)
    p.flush()
    assert store.partition("t", 0).log_end_offset == 0


@pytest.mark.regression
def test_bad_timestamp_raises_at_send_without_poisoning_the_batch(store, producers):
    p = producers(linger_ms=10_000)
    good1 = p.send("t", b"a", partition=0)
    with pytest.raises(TypeError):
        p.send("t", b"b", partition=0, timestamp="yesterday")
    good2 = p.send("t", b"c", partition=0)
    p.flush()
    assert good1.exception() is None and good2.exception() is None
    assert values_of(store, "t", 0) == [b"a", b"c"]


@pytest.mark.regression
def test_bad_header_does_not_poison_other_records(store, producers):
    p = producers(linger_ms=10_000)
    good = p.send("t", b"good", partition=0)
    try:
        bad = p.send("t", b"bad", partition=0, headers=[("h", "not bytes")])
    except TypeError:
        bad = None
    p.flush()
    if bad is not None:
        assert isinstance(bad.exception(), TypeError)
    assert good.exception() is None
    assert values_of(store, "t", 0) == [b"good"]


def test_record_too_large_raises_at_send(store, producers):
    store.create_topic("small", 1, max_message_bytes=1000)
    p = producers(linger_ms=10_000)
    ok = p.send("small", b"x" * 100)
    with pytest.raises(RecordTooLargeError) as info:
        p.send("small", b"x" * 2000)
    assert info.value.limit == 1000 and info.value.size > 2000
    with pytest.raises(RecordTooLargeError):
        p.send("small", b"x", key=b"k" * 2000)
    p.flush()
    assert ok.result() == RecordMetadata(0, 0)
    assert values_of(store, "small", 0) == [b"x" * 100]


def test_many_records_over_max_message_bytes_are_split_by_the_log(store, producers):
    store.create_topic("small", 1, max_message_bytes=1000)
    p = producers(linger_ms=10_000, batch_size=1 << 20)
    futures = [p.send("small", bytes([i]) * 200) for i in range(20)]  # ~4 KB: several batches
    p.flush()
    assert [f.result().offset for f in futures] == list(range(20))
    assert values_of(store, "small", 0) == [bytes([i]) * 200 for i in range(20)]
    assert len(batch_headers(store.partition("small", 0))) > 1


# ---------------------------------------------------------------------- closing

def test_close_flushes_pending_records_and_refuses_sends(store):
    p = store.producer(linger_ms=10_000)
    futures = [p.send("t", b"p%d" % i, partition=1) for i in range(5)]
    assert store.partition("t", 1).log_end_offset == 0
    p.close()
    assert all(f.done() for f in futures)
    assert [f.result().offset for f in futures] == list(range(5))
    assert values_of(store, "t", 1) == [b"p%d" % i for i in range(5)]
    with pytest.raises(LogClosedError):
        p.send("t", b"late", partition=1)
    p.close()  # idempotent
    assert store.partition("t", 1).log_end_offset == 5


def test_context_manager_closes(store):
    with store.producer(linger_ms=10_000) as p:
        assert isinstance(p, Producer)
        f = p.send("t", b"ctx", partition=0)
    assert f.result(timeout=0) == RecordMetadata(0, 0)
    with pytest.raises(LogClosedError):
        p.send("t", b"x")


# ---------------------------------------------------------------------- threads

def test_concurrent_sends_from_eight_threads(store, producers):
    p = producers(linger_ms=1, batch_size=2048)
    per_thread = 250
    results: dict[int, list[tuple[bytes, object]]] = {}
    errors = []
    start = threading.Barrier(8)

    def worker(tid):
        try:
            start.wait()
            mine = []
            for i in range(per_thread):
                value = b"%d-%d" % (tid, i)
                key = value if i % 3 else None  # mixed keyed and sticky sends
                mine.append((value, p.send("t", value, key=key)))
            results[tid] = mine
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    p.flush(timeout=30)
    by_partition: dict[int, dict[int, bytes]] = {n: {} for n in range(PARTITIONS)}
    for tid, sent in results.items():
        for value, f in sent:
            md = f.result(timeout=10)
            assert md.offset not in by_partition[md.partition], "offset handed out twice"
            by_partition[md.partition][md.offset] = value
    assert sum(len(v) for v in by_partition.values()) == 8 * per_thread
    for part, offsets in by_partition.items():
        assert sorted(offsets) == list(range(len(offsets)))  # dense
        log = store.partition("t", part)
        assert log.log_end_offset == len(offsets)
        assert {r.offset: r.value for r in log.iter()} == offsets


@pytest.mark.regression
def test_one_threads_records_keep_their_order_when_batches_race(store, producers, monkeypatch):
    p = producers(linger_ms=10_000, batch_size=300)  # 100-byte values: 3 records fill a batch
    log = store.partition("t", 0)
    real_append_batch = log.append_batch
    entered, release = threading.Event(), threading.Event()
    calls = []

    def stalling_append_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # the first batch's writer is descheduled for a while
            entered.set()
            release.wait(5)
        return real_append_batch(*args, **kwargs)

    monkeypatch.setattr(log, "append_batch", stalling_append_batch)
    mine = [p.send("t", b"A0" * 50, partition=0), p.send("t", b"A1" * 50, partition=0)]
    other = threading.Thread(target=lambda: p.send("t", b"X0" * 50, partition=0))  # fills batch 1
    other.start()
    assert entered.wait(5)
    timer = threading.Timer(0.3, release.set)  # a correct producer may wait for batch 1 meanwhile
    timer.start()
    try:
        mine += [p.send("t", b"A%d" % i * 50, partition=0) for i in range(2, 5)]  # fills batch 2
        other.join(5)
        p.flush(timeout=5)
    finally:
        release.set()
        timer.cancel()
    offsets = [f.result(timeout=5).offset for f in mine]
    assert offsets == sorted(offsets), f"records sent in order by one thread got offsets {offsets}"
