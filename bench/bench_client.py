"""The client layer: Producer throughput and Queue round trips, with other queues in the same run.

Producer: 8 threads each send() 200-byte values without keys to a 4-partition topic of a store
opened in multi-process mode (the default), linger_ms=5, batch_size=256 KiB; a round ends after
flush(). Durability "written" (page cache) and "fsynced" (group commit).

Queue: a round trip is put (fsynced, durability="fsynced") + get + ack of one message. Measured
single-process with the per-message API from 1 and 8 threads, and with the batch API
(put_many / get_many / ack_many of 100). The same round trips with persist-queue's
SQLiteAckQueue (put, get, ack) and litequeue (put, pop, done), each as its library configures
SQLite by default and with ``PRAGMA synchronous=FULL`` (an fsync per commit, as our fsynced put).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading

import pytest

import _report
from logstore import LogStore, Queue

VALUE = b"x" * 200
PRODUCER_THREADS = 8
PRODUCER_RECORDS = 400_000
QUEUE_MESSAGES = 4_000
RESULTS: dict[str, float] = {}


@pytest.fixture
def scratch():
    path = tempfile.mkdtemp(prefix="bench-client-", dir=os.environ.get("LOGSTORE_BENCH_DIR"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _fresh(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


# ---------------------------------------------------------------------- producer
@pytest.mark.parametrize("durability", ["written", "fsynced"])
def test_producer_8_threads(benchmark, scratch, durability):
    benchmark.group = "producer"
    per_thread = PRODUCER_RECORDS // PRODUCER_THREADS

    def setup():
        store = LogStore(_fresh(os.path.join(scratch, "p")), maintenance=False)
        store.create_topic("t", 4)
        producer = store.producer(linger_ms=5, batch_size=256 << 10, durability=durability)
        return (store, producer), {}

    def run(store, producer):
        def work():
            send = producer.send
            for _ in range(per_thread):
                send("t", VALUE)

        threads = [threading.Thread(target=work) for _ in range(PRODUCER_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        producer.flush()

    def teardown(store, producer):
        producer.close()
        store.close()

    benchmark.pedantic(run, setup=setup, teardown=teardown, rounds=3, iterations=1)
    rate = _report.report(benchmark, records=PRODUCER_RECORDS, target=1_500_000 if durability == "written" else None)
    RESULTS[f"producer-{durability}"] = rate
    if durability == "fsynced" and "producer-written" in RESULTS:
        ratio = rate / RESULTS["producer-written"]
        _report.report_value(benchmark, "fsynced/written", ratio, "x", note="target >= 0.5")


# ---------------------------------------------------------------------- queue: logstore
def _queue_round_trips(q: Queue, n: int, threads: int) -> None:
    def work(count):
        for _ in range(count):
            q.put(VALUE)
            m = q.get(5)
            q.ack(m)

    if threads == 1:
        work(n)
        return
    ts = [threading.Thread(target=work, args=(n // threads,)) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


@pytest.mark.parametrize("threads", [1, 8])
@pytest.mark.parametrize("shared", [True, False], ids=["multiprocess-store", "exclusive-store"])
def test_queue_round_trips(benchmark, scratch, threads, shared):
    benchmark.group = "queue"

    def setup():
        store = LogStore(_fresh(os.path.join(scratch, "q")), shared=shared, maintenance=False)
        return (store, Queue(store, "jobs")), {}

    def run(store, q):
        _queue_round_trips(q, QUEUE_MESSAGES, threads)
        assert q.qsize() == 0
        store.close()

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    rate = _report.report(benchmark, records=QUEUE_MESSAGES, target=50_000,
                          note=f"per-message API, {threads} thread(s), fsynced puts")
    RESULTS[f"logstore-{threads}-{shared}"] = rate


@pytest.mark.parametrize("shared", [True, False], ids=["multiprocess-store", "exclusive-store"])
def test_queue_round_trips_asyncio(benchmark, scratch, shared):
    """64 coroutines on one event loop: await aput (fsync shared by every coroutine waiting),
    await aget, ack."""
    benchmark.group = "queue"
    n = QUEUE_MESSAGES * 4
    coroutines = 64

    def setup():
        store = LogStore(_fresh(os.path.join(scratch, "qa")), shared=shared, maintenance=False)
        return (store, Queue(store, "jobs")), {}

    def run(store, q):
        async def worker(count):
            for _ in range(count):
                await q.aput(VALUE)
                m = await q.aget(5)
                q.ack(m)

        async def main():
            await asyncio.gather(*[worker(n // coroutines) for _ in range(coroutines)])

        asyncio.run(main())
        assert q.qsize() == 0
        store.close()

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    rate = _report.report(benchmark, records=n // coroutines * coroutines, target=50_000,
                          note="asyncio, 64 coroutines, per-message API, fsynced puts")
    RESULTS[f"logstore-async-{shared}"] = rate


@pytest.mark.parametrize("shared", [True, False], ids=["multiprocess-store", "exclusive-store"])
def test_queue_round_trips_batched(benchmark, scratch, shared):
    benchmark.group = "queue"
    batch = 100
    n = QUEUE_MESSAGES * 5

    def setup():
        store = LogStore(_fresh(os.path.join(scratch, "qb")), shared=shared, maintenance=False)
        return (store, Queue(store, "jobs")), {}

    def run(store, q):
        for _ in range(n // batch):
            q.put_many([VALUE] * batch)
            msgs = q.get_many(batch, timeout=5)
            q.ack_many(msgs)
        assert q.qsize() == 0
        store.close()

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    rate = _report.report(benchmark, records=n, target=50_000, note="put_many/get_many/ack_many of 100, fsynced")
    RESULTS[f"logstore-batched-{shared}"] = rate


# ---------------------------------------------------------------------- queue: competitors
def _sqlite_full(conn) -> None:
    conn.execute("PRAGMA synchronous=FULL")


@pytest.mark.parametrize("sync", ["default", "FULL"])
def test_persist_queue_sqlite_ack_queue(benchmark, scratch, sync):
    persistqueue = pytest.importorskip("persistqueue")
    benchmark.group = "queue"

    def setup():
        q = persistqueue.SQLiteAckQueue(_fresh(os.path.join(scratch, "pq")), auto_commit=True,
                                        multithreading=True)
        if sync == "FULL":
            _sqlite_full(q._putter)
            _sqlite_full(q._getter)
        return (q,), {}

    def run(q):
        for _ in range(QUEUE_MESSAGES):
            q.put(VALUE)
            item = q.get(block=False)
            q.ack(item)

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    rate = _report.report(benchmark, records=QUEUE_MESSAGES, note=f"synchronous={sync}")
    RESULTS[f"persist-queue-{sync}"] = rate
    _ratio(benchmark, rate)


@pytest.mark.parametrize("sync", ["default", "FULL"])
def test_litequeue(benchmark, scratch, sync):
    litequeue = pytest.importorskip("litequeue")
    benchmark.group = "queue"
    text = VALUE.decode()

    def setup():
        q = litequeue.LiteQueue(os.path.join(_fresh(os.path.join(scratch, "lq")), "q.db"))
        if sync == "FULL":
            _sqlite_full(q.conn)
        return (q,), {}

    def run(q):
        for _ in range(QUEUE_MESSAGES):
            q.put(text)
            m = q.pop()
            q.done(m.message_id)
        q.close()

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    rate = _report.report(benchmark, records=QUEUE_MESSAGES, note=f"synchronous={sync}")
    RESULTS[f"litequeue-{sync}"] = rate
    _ratio(benchmark, rate)


def _ratio(benchmark, rate: float) -> None:
    ours = RESULTS.get("logstore-1-True")
    if ours:
        _report.report_value(benchmark, "logstore (1 thread, multiprocess store) / this", ours / rate, "x",
                             note="higher is better for logstore")
