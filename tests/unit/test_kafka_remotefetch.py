"""logstore.kafka.remotefetch: remote reads of a Kafka fetch run on the reader's own threads,
whole batches below the visible offset; a fetch waiting for them is answered when they finish or
after remote.fetch.max.wait.ms (unfinished ones leave their records empty), a failed one with
UNKNOWN_SERVER_ERROR, a later partition's first batch over its limit not at all (KIP-74)."""

from __future__ import annotations

import threading

import pytest

from logstore.errors import LogstoreError, RemoteStorageError
from logstore.index import AbortedTxn
from logstore.kafka.remotefetch import RemoteFetch, RemoteRead, RemoteReader, remote_batches
from logstore.net.purgatory import Purgatory
from logstore.records.batch import BatchBuilder


def batches(*groups):
    """Batches of ``groups`` (lists of values) at consecutive offsets, as stored."""
    out, offset, builder = b"", 0, BatchBuilder()
    for values in groups:
        out += bytes(builder.build(values, timestamps=[1_000] * len(values), base_offset=offset))
        offset += len(values)
    return out


class FakeLog:
    """A log whose remote part answers read_raw with ``raw`` (or blocks on ``gate``, or raises)."""

    def __init__(self, raw=b"", gate=None, error=None, aborted=()):
        self.raw, self.gate, self.error, self.aborted = raw, gate, error, list(aborted)
        self.threads = []

    def read_raw(self, offset, max_bytes):
        self.threads.append(threading.current_thread().name)
        if self.gate is not None:
            self.gate.wait(10)
        if self.error is not None:
            raise self.error
        return self.raw

    def aborted_transactions(self, start, upper):
        return [t for t in self.aborted if t.first_offset < upper]


def entry():
    return {"partition_index": 0, "error_code": 0, "high_watermark": 10, "last_stable_offset": 10,
            "log_start_offset": 0, "aborted_transactions": [], "records": b""}


@pytest.fixture
def reader():
    r = RemoteReader("test-remote-reader", threads=2)
    yield r
    r.close()


@pytest.fixture
def purgatory():
    p = Purgatory("test")
    yield p
    p.close()


def test_remote_batches_stop_at_the_visible_offset_on_a_batch_boundary():
    raw = batches([b"a", b"b"], [b"c"], [b"d", b"e"])
    data, after = remote_batches(raw, 3)
    assert after == 3 and data == batches([b"a", b"b"], [b"c"])
    assert remote_batches(raw, 0) == (None, -1)


def test_a_read_runs_on_the_readers_threads_and_fills_its_entry(reader, purgatory):
    raw = batches([b"a", b"b"], [b"c"])
    log = FakeLog(raw, aborted=[AbortedTxn(producer_id=7, first_offset=1, last_offset=2, last_stable_offset=3)])
    read = RemoteRead(entry(), "t-0 at 0", 1 << 20, True, reader.read(log, 0, 1 << 20, 10, True))
    answer = RemoteFetch({"responses": [read.entry]}, [read]).watch(purgatory, 10_000).result(10)
    assert log.threads and all(name.startswith("test-remote-reader") for name in log.threads)
    assert answer["responses"][0]["records"] == raw
    assert answer["responses"][0]["aborted_transactions"] == [{"producer_id": 7, "first_offset": 1}]


def test_a_read_slower_than_the_wait_leaves_its_records_empty_and_the_others_go_out(reader, purgatory):
    gate = threading.Event()
    slow = RemoteRead(entry(), "t-0 at 0", 1 << 20, True, reader.read(FakeLog(batches([b"a"]), gate), 0, 1 << 20,
                                                                         10, False))
    other = entry()
    other["records"] = b"local records"
    answer = RemoteFetch({"responses": [slow.entry, other]}, [slow]).watch(purgatory, 50).result(10)
    gate.set()
    assert answer["responses"][0]["records"] == b"" and answer["responses"][0]["error_code"] == 0
    assert answer["responses"][1]["records"] == b"local records"


def test_a_failed_read_answers_unknown_server_error_for_its_partition(reader, purgatory):
    failing = FakeLog(error=RemoteStorageError("remote segment t-0 [0..9] id x: the object store is down"))
    read = RemoteRead(entry(), "t-0 at 0", 1 << 20, True, reader.read(failing, 0, 1 << 20, 10, False))
    answer = RemoteFetch({"responses": [read.entry]}, [read]).watch(purgatory, 10_000).result(10)
    assert answer["responses"][0]["error_code"] == -1 and answer["responses"][0]["high_watermark"] == -1


def test_a_later_partitions_first_batch_over_its_limit_is_left_out_the_first_is_not(reader, purgatory):
    raw = batches([b"x" * 200])
    first = RemoteRead(entry(), "t-0 at 0", 10, True, reader.read(FakeLog(raw), 0, 10, 10, False))
    later = RemoteRead(entry(), "t-1 at 0", 10, False, reader.read(FakeLog(raw), 0, 10, 10, False))
    answer = RemoteFetch({"responses": [first.entry, later.entry]}, [first, later]).watch(purgatory, 10_000).result(10)
    assert answer["responses"][0]["records"] == raw
    assert answer["responses"][1]["records"] == b""


def test_a_closed_reader_refuses_new_reads():
    r = RemoteReader("closed")
    r.close()
    with pytest.raises(LogstoreError):
        r.read(FakeLog(), 0, 1, 1, False)
