#!/usr/bin/env python3
"""Kafka clients against ``logstore serve``, and against librdkafka's in-process mock cluster.

    .venv/bin/python bench/bench_kafka.py            # ~1-2 minutes
    .venv/bin/python bench/bench_kafka.py --quick    # fewer records

Figures (each the median of ``--repeat`` runs, same run, same machine; the systems compared
run in turn within each round, and a ratio is the median of the rounds' ratios):

  produce       confluent-kafka Producer, linger.ms=5, batch.size=1 MB, 200-byte values, acks=1,
                no compression, into (a) ``logstore serve`` in its own process and (b) librdkafka's
                mock cluster (``test.mock.num.brokers=1``, in the producer's process: a broker
                that keeps batches in memory and writes nothing). Records/s from the first
                produce() until flush() returns (every record acknowledged).
  produce, acks=all + fsync   the same into ``logstore serve --fsync-acks-all``.
  consume       the records just produced read back whole by a confluent-kafka Consumer
                (assign from offset 0, until the last) with librdkafka's defaults and with
                fetch.queue.backoff.ms=10 (see main()), by kafka-python and aiokafka (fewer
                records), and by the library itself, ``Log.iter`` over the same partition
                directory, in this process (written back and in the page cache for every reader).
  fetch loop    the server's own delivery rate, without a client library's per-record work:
                Fetch v4 requests of 10 MB written by hand on one socket, one at a time, each
                answer read whole and its batch headers walked for the next offset (records
                not decoded). A client reading slower than this is held up by itself.
  latency       produce-to-consume latency at 10,000 records/s for 5 s (confluent producer with
                linger.ms=5 and a confluent consumer long-polling, one poll() per record): p50
                and p99.
  one record per request   (``--per-request`` runs only these) an open load of one record per
                Produce request: a confluent-kafka producer with linger.ms=0 and acks=all sends at
                1,000, 5,000 and 20,000 records/s for 5 s each (records are due at fixed times,
                whatever the answers do), each value carrying its due time; a confluent-kafka
                consumer in the same process (long-polling, one poll() per record) takes each
                arrival's time. Latency p50/p99/p999 from the due time (so a producer or server
                that falls behind is charged for it), and the achieved rate: records received
                over the time from the first due time to the last arrival. Against
                ``logstore serve`` and librdkafka's mock cluster in turn, each round.
  transactions  (``--transactions`` runs only these) a confluent-kafka transactional producer,
                1,000 records per transaction (begin, 1,000 produce(), commit), against the same
                producer idempotent without transactions (enable.idempotence, acks=all), each into
                a fresh ``logstore serve`` in turn, and both into the mock cluster (the client's own
                limit: round trips it makes in turn); then the transactional data (a COMMIT marker
                every 1,000 records) read whole by a confluent-kafka Consumer with
                isolation.level=read_committed and with read_uncommitted (fetch.queue.backoff.ms=10
                for both), in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from logstore import LogStore

VALUE = b"v" * 200


def serve(root: str, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", root, "--listen", "127.0.0.1:0", *extra],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # "serving ROOT on HOST:PORT"
    return proc, line.rsplit(" ", 1)[1].strip()


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(30)


def produce(config: dict, n: int, topic: str = "bench") -> float:
    p = Producer({"linger.ms": 5, "batch.size": 1_000_000, "acks": 1, "queue.buffering.max.messages": 2_000_000,
                  "queue.buffering.max.kbytes": 2_000_000, **config})
    p.produce(topic, VALUE)  # connect and learn the partition leader before the clock starts
    p.flush(30)
    started = time.perf_counter()
    for _ in range(n):
        try:
            p.produce(topic, VALUE)
        except BufferError:
            p.poll(0.01)
            p.produce(topic, VALUE)
    remaining = p.flush(120)
    elapsed = time.perf_counter() - started
    assert remaining == 0, f"{remaining} records not acknowledged"
    return n / elapsed


def consume_confluent(bootstrap: str, n: int, topic: str = "bench", **extra: object) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                  "fetch.max.bytes": 50 << 20, "max.partition.fetch.bytes": 10 << 20, **extra})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    started = time.perf_counter()
    while got < n:
        for m in c.consume(10_000, 1.0):
            if m.error() is None:
                got += 1
    elapsed = time.perf_counter() - started
    c.close()
    return got / elapsed


def consume_kafka_python(bootstrap: str, n: int, topic: str = "bench") -> float:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as TP

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_bytes=50 << 20,
                      max_partition_fetch_bytes=10 << 20)
    tp = TP(topic, 0)
    c.assign([tp])
    c.seek(tp, 0)
    got = 0
    started = time.perf_counter()
    while got < n:
        got += sum(len(v) for v in c.poll(timeout_ms=1000, max_records=100_000).values())
    elapsed = time.perf_counter() - started
    c.close()
    return got / elapsed


def consume_aiokafka(bootstrap: str, n: int, topic: str = "bench") -> float:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as TP

    async def run() -> float:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_bytes=50 << 20,
                             max_partition_fetch_bytes=10 << 20)
        await c.start()
        tp = TP(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)
        got = 0
        started = time.perf_counter()
        while got < n:
            got += sum(len(v) for v in (await c.getmany(tp, timeout_ms=1000, max_records=100_000)).values())
        elapsed = time.perf_counter() - started
        await c.stop()
        return got / elapsed

    return asyncio.run(run())


def iter_library(root: str, n: int, topic: str = "bench") -> float:
    with LogStore(root, shared=True) as store:
        log = store.partition(topic, 0)
        started = time.perf_counter()
        got = sum(1 for _ in log.iter(end=n))
        elapsed = time.perf_counter() - started
    return got / elapsed


def fetch_loop(bootstrap: str, n: int, topic: str = "bench") -> float:
    """Records/s of back-to-back Fetch v4 requests (10 MB each) on a raw socket."""
    host, port = bootstrap.rsplit(":", 1)
    name = topic.encode()

    def request(correlation: int, offset: int) -> bytes:
        body = (struct.pack(">iiiib", -1, 500, 1, 50 << 20, 0) + struct.pack(">ih", 1, len(name)) + name
                + struct.pack(">iiqi", 1, 0, offset, 10 << 20))
        frame = struct.pack(">hhih", 1, 4, correlation, 5) + b"bench" + body
        return struct.pack(">i", len(frame)) + frame

    def read(sock: socket.socket, size: int) -> bytearray:
        buf, got = bytearray(size), 0
        view = memoryview(buf)
        while got < size:
            k = sock.recv_into(view[got:])
            if not k:
                raise ConnectionError("closed by the server")
            got += k
        return buf

    offset, correlation = 0, 0
    with socket.create_connection((host, int(port))) as sock:
        started = time.perf_counter()
        while offset < n:
            sock.sendall(request(correlation, offset))
            correlation += 1
            answer = read(sock, struct.unpack(">i", read(sock, 4))[0])
            # correlation, throttle, topic count, topic name, partition count, then the partition
            at = 14 + struct.unpack_from(">h", answer, 12)[0] + 4
            error, aborted = struct.unpack_from(">h", answer, at + 4)[0], struct.unpack_from(">i", answer, at + 22)[0]
            assert error == 0, f"fetch at {offset}: error {error}"
            at += 26 + max(aborted, 0) * 16
            size = struct.unpack_from(">i", answer, at)[0]
            records, at = answer[at + 4:at + 4 + size], 0
            while at + 61 <= len(records):  # batch: base offset, length, ..., record count at 57
                base, length = struct.unpack_from(">qi", records, at)
                if at + 12 + length > len(records):
                    break  # a partial batch at the end of the limit
                offset = base + struct.unpack_from(">i", records, at + 57)[0]
                at += 12 + length
        elapsed = time.perf_counter() - started
    return n / elapsed


def latency(bootstrap: str, rate: int = 10_000, seconds: float = 5.0) -> tuple[float, float]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "lat", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 500, "fetch.min.bytes": 1})
    c.assign([TopicPartition("latency", 0, 0)])
    samples: list[float] = []
    total = int(rate * seconds)
    done = threading.Event()

    def reader() -> None:
        while len(samples) < total and not done.is_set():
            # poll, not consume(n): consume(n, timeout) waits for n records or the timeout, which
            # at 10k records/s adds up to n / 10,000 s to every record's latency.
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                samples.append(time.time() - float(m.value()))

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1})
    p.produce("latency", b"%f" % time.time())
    p.flush(10)
    t = threading.Thread(target=reader)
    t.start()
    time.sleep(1.0)
    samples.clear()
    started = time.perf_counter()
    for i in range(total):
        target = started + i / rate
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        p.produce("latency", b"%f" % time.time())
        p.poll(0)
    p.flush(10)
    t.join(30)
    done.set()
    c.close()
    samples.sort()
    return samples[len(samples) // 2] * 1000, samples[int(len(samples) * 0.99)] * 1000


def open_loop(config: dict, rate: int, seconds: float = 5.0, topic: str = "onebyone") -> dict[str, float]:
    """One record per Produce request at ``rate`` records/s (see the module docstring): latency
    percentiles in ms and the achieved records/s. ``config`` names the cluster (its
    bootstrap.servers, or test.mock.num.brokers: the consumer then joins the producer's mock
    cluster)."""
    p = Producer({"linger.ms": 0, "acks": "all", "queue.buffering.max.messages": 2_000_000, **config})
    p.produce(topic, struct.pack(">d", time.time()), partition=0)  # connect and learn the leader before the clock starts
    p.flush(30)
    if "test.mock.num.brokers" in config:
        broker = next(iter(p.list_topics(timeout=10).brokers.values()))
        bootstrap = f"{broker.host}:{broker.port}"
    else:
        bootstrap = config["bootstrap.servers"]
    # The mock cluster answers a waiting fetch at its max wait only (an append does not wake it):
    # its consumer polls every millisecond instead, so that it shows the clients' own latency.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "onebyone", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 1 if "test.mock.num.brokers" in config else 500, "fetch.min.bytes": 1})
    c.assign([TopicPartition(topic, 0, 1)])  # (after the warm-up record)
    total = int(rate * seconds)
    arrivals: list[tuple[float, float]] = []
    done = threading.Event()

    def reader() -> None:
        while len(arrivals) < total and not done.is_set():
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                arrivals.append((time.time(), struct.unpack(">d", m.value())[0]))

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(1.0)  # the consumer's first fetch is waiting
    started = time.time()
    for i in range(total):
        due = started + i / rate
        delay = due - time.time()
        if delay > 0.0005:
            time.sleep(delay)
        while True:
            try:
                p.produce(topic, struct.pack(">d", due), partition=0)
                break
            except BufferError:
                p.poll(0.001)
        p.poll(0)
    p.flush(60)
    t.join(60)
    done.set()
    t.join()
    c.close()
    if not arrivals:
        return {"p50": float("nan"), "p99": float("nan"), "p999": float("nan"), "rate": 0.0}
    lat = sorted((got - due) * 1000 for got, due in arrivals)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(len(lat) * q))]

    return {"p50": pct(0.5), "p99": pct(0.99), "p999": pct(0.999),
            "rate": len(arrivals) / (max(got for got, _ in arrivals) - started)}


def per_request(repeat: int, fresh, rates=(1_000, 5_000, 20_000), seconds: float = 5.0,
                extra: tuple[str, ...] = ()) -> list[tuple[str, float, str]]:
    """The one-record-per-request figures (see the module docstring): each rate against a
    fresh ``logstore serve`` and against the mock cluster, in turn within each round."""
    def served(rate: int) -> dict[str, float]:
        root = fresh()
        proc, bootstrap = serve(root, *extra)
        try:
            return open_loop({"bootstrap.servers": bootstrap}, rate, seconds)
        finally:
            stop(proc)
            shutil.rmtree(root, ignore_errors=True)

    rows = []
    for rate in rates:
        got = rounds(repeat, ours=lambda: served(rate),
                     mock=lambda: open_loop({"test.mock.num.brokers": 1}, rate, seconds))
        for who, name in (("ours", "logstore serve"), ("mock", "mock cluster")):
            runs = got[who]
            for key, unit in (("p50", "ms"), ("p99", "ms"), ("p999", "ms"), ("rate", "records/s")):
                rows.append((f"one record per request at {rate:,}/s -> {name}: {key}",
                             statistics.median(r[key] for r in runs), unit))
    return rows


def produce_transactions(bootstrap: str, n: int, per_transaction: int = 1000, topic: str = "bench",
                         **extra: object) -> float:
    """Records/s of a transactional producer, ``per_transaction`` records per transaction."""
    p = Producer({"bootstrap.servers": bootstrap, **extra, "transactional.id": "bench-txn", "linger.ms": 5,
                  "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000,
                  "queue.buffering.max.kbytes": 2_000_000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, VALUE)  # connect, learn the leader, add the partition before the clock starts
    p.commit_transaction(30)
    started = time.perf_counter()
    for first in range(0, n, per_transaction):
        p.begin_transaction()
        for _ in range(min(per_transaction, n - first)):
            try:
                p.produce(topic, VALUE)
            except BufferError:
                p.poll(0.01)
                p.produce(topic, VALUE)
        p.commit_transaction(60)
    return n / (time.perf_counter() - started)


def transactions(n: int, repeat: int, fresh) -> list[tuple[str, float, str]]:
    """The transaction figures (see the module docstring)."""
    def served(produce_into) -> float:
        root = fresh()
        proc, bootstrap = serve(root)
        try:
            return produce_into(bootstrap)
        finally:
            stop(proc)
            shutil.rmtree(root, ignore_errors=True)

    idempotent = {"enable.idempotence": True, "acks": "all"}
    got = rounds(repeat, txn=lambda: served(lambda b: produce_transactions(b, n)),
                 idempotent=lambda: served(lambda b: produce({"bootstrap.servers": b, **idempotent}, n)),
                 # the client's own limit: the same two against librdkafka's in-process mock cluster
                 mock_txn=lambda: produce_transactions("", n, **{"test.mock.num.brokers": 1}),
                 mock_idempotent=lambda: produce({"test.mock.num.brokers": 1, **idempotent}, n))
    rows = [("produce: transactional, 1,000 records per transaction", statistics.median(got["txn"]), "records/s"),
            ("produce: idempotent, no transactions", statistics.median(got["idempotent"]), "records/s"),
            ("  transactional / idempotent", ratio(got["txn"], got["idempotent"]), "x"),
            ("mock cluster: transactional, 1,000 records per transaction", statistics.median(got["mock_txn"]),
             "records/s"),
            ("mock cluster: idempotent", statistics.median(got["mock_idempotent"]), "records/s"),
            ("  mock cluster transactional / idempotent (the client's limit)",
             ratio(got["mock_txn"], got["mock_idempotent"]), "x"),
            ("  transactional: logstore serve / mock cluster", ratio(got["txn"], got["mock_txn"]), "x")]
    root = fresh()
    proc, bootstrap = serve(root)
    try:
        produce_transactions(bootstrap, n)
        total = n + 1  # (and the warm-up record)
        os.sync()
        read = rounds(repeat, committed=lambda: consume_confluent(bootstrap, total, **{
                          "isolation.level": "read_committed", "fetch.queue.backoff.ms": 10}),
                      uncommitted=lambda: consume_confluent(bootstrap, total, **{
                          "isolation.level": "read_uncommitted", "fetch.queue.backoff.ms": 10}))
    finally:
        stop(proc)
        shutil.rmtree(root, ignore_errors=True)
    rows += [("consume transactional data: read_committed", statistics.median(read["committed"]), "records/s"),
             ("consume transactional data: read_uncommitted", statistics.median(read["uncommitted"]), "records/s"),
             ("  read_committed / read_uncommitted", ratio(read["committed"], read["uncommitted"]), "x")]
    return rows


def median(fn, repeat: int) -> float:
    return statistics.median(fn() for _ in range(repeat))


def rounds(repeat: int, **fns) -> dict[str, list[float]]:
    """Each function once per round, in turn, so that systems compared share the machine's
    state of the moment (this VM's speed drifts by tens of percent from one minute to the
    next); ratios are then taken round by round."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            out[name].append(fn())
    return out


def ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--transactions", action="store_true", help="only the transaction figures")
    parser.add_argument("--per-request", action="store_true", help="only the one-record-per-request figures")
    parser.add_argument("--rates", default="1000,5000,20000", help="the --per-request rates (records/s)")
    args = parser.parse_args()
    n = 200_000 if args.quick else 1_000_000
    small = n // 5
    repeat = 1 if args.quick else args.repeat
    base = os.environ.get("LOGSTORE_BENCH_DIR", tempfile.gettempdir())
    rows = []

    def fresh() -> str:
        return tempfile.mkdtemp(prefix="kafka-bench-", dir=base)

    if args.transactions:
        show(n, small, repeat, transactions(n, repeat, fresh))
        return
    rates = tuple(int(r) for r in args.rates.split(","))
    if args.per_request:
        show(n, small, repeat, per_request(repeat, fresh, rates))
        return

    def served(extra=(), records=n) -> float:
        root = fresh()
        proc, bootstrap = serve(root, *extra)
        try:
            return produce({"bootstrap.servers": bootstrap}, records)
        finally:
            stop(proc)
            shutil.rmtree(root, ignore_errors=True)

    got = rounds(repeat, mock=lambda: produce({"test.mock.num.brokers": 1}, n), ours=served)
    rows.append(("produce, acks=1: confluent-kafka -> logstore serve", statistics.median(got["ours"]), "records/s"))
    rows.append(("produce, acks=1: confluent-kafka -> librdkafka mock cluster", statistics.median(got["mock"]),
                 "records/s"))
    rows.append(("  logstore serve / mock cluster", ratio(got["ours"], got["mock"]), "x"))
    fsynced = median(lambda: served(("--fsync-acks-all",), small), repeat)
    rows.append(("produce, acks=all, fsync before the answer (--fsync-acks-all)", fsynced, "records/s"))

    root = fresh()
    proc, bootstrap = serve(root)
    try:
        produce({"bootstrap.servers": bootstrap}, n)
        os.sync()  # no reader competes with the write-back of what was just produced
        # Once queued.min.messages (100,000) records wait in its local queue, librdkafka postpones
        # the partition's next fetch by fetch.queue.backoff.ms (1,000 ms by default, librdkafka
        # >= 2.2) and does not fetch again before that time even if the application has emptied
        # the queue: with its defaults a consumer faster than 100,000 records/s idles for most of
        # every second, against any broker. A short backoff is the client's knob for throughput.
        read = rounds(repeat, library=lambda: iter_library(root, n), confluent=lambda: consume_confluent(bootstrap, n),
                      tuned=lambda: consume_confluent(bootstrap, n, **{"fetch.queue.backoff.ms": 10}),
                      raw=lambda: fetch_loop(bootstrap, n))
        kafka_python = median(lambda: consume_kafka_python(bootstrap, small), repeat)
        aiokafka = median(lambda: consume_aiokafka(bootstrap, small), repeat)
        p50, p99 = latency(bootstrap)
    finally:
        stop(proc)
        shutil.rmtree(root, ignore_errors=True)
    library = read["library"]
    rows.append(("consume: confluent-kafka <- logstore serve, librdkafka defaults", statistics.median(read["confluent"]),
                 "records/s"))
    rows.append(("consume: the library, Log.iter, same partition", statistics.median(library), "records/s"))
    rows.append(("  confluent-kafka / Log.iter", ratio(read["confluent"], library), "x"))
    rows.append(("consume: confluent-kafka, fetch.queue.backoff.ms=10", statistics.median(read["tuned"]), "records/s"))
    rows.append(("  confluent-kafka (fetch.queue.backoff.ms=10) / Log.iter", ratio(read["tuned"], library), "x"))
    rows.append(("fetch loop on a raw socket (the server's delivery rate)", statistics.median(read["raw"]),
                 "records/s"))
    rows.append(("  fetch loop / Log.iter", ratio(read["raw"], library), "x"))
    rows.append(("consume: kafka-python <- logstore serve", kafka_python, "records/s"))
    rows.append(("consume: aiokafka <- logstore serve", aiokafka, "records/s"))
    rows.append(("produce-to-consume latency at 10k records/s, p50", p50, "ms"))
    rows.append(("produce-to-consume latency at 10k records/s, p99", p99, "ms"))
    rows += per_request(repeat, fresh, rates)
    rows += transactions(n, repeat, fresh)
    show(n, small, repeat, rows)


def show(n: int, small: int, repeat: int, rows: list[tuple[str, float, str]]) -> None:
    print(f"{n:,} records of {len(VALUE)} bytes ({small:,} for kafka-python, aiokafka and fsync), "
          f"median of {repeat}")
    for name, value, unit in rows:
        shown = f"{value:,.2f}" if unit in ("x", "ms") else f"{value:,.0f}"
        print(f"{name:<66} {shown:>14} {unit}")


if __name__ == "__main__":
    main()
