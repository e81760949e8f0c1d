"""logstore.Queue: ack, nack, visibility timeout, dead letters, restarts, asyncio, processes."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time

import pytest

from logstore import InvalidConfigError, LogOfflineError, LogStore, Queue
from logstore.client import queue as workqueue


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "store")


def drain(q, timeout=0.05):
    out = []
    while (m := q.get(timeout)) is not None:
        out.append(m)
    return out


def test_put_get_ack_in_order_and_qsize(root):
    with Queue(root, "jobs") as q:
        for i in range(10):
            assert q.put(f"j{i}".encode()).offset == i
        assert q.qsize() == 10
        msgs = drain(q)
        assert [m.value for m in msgs] == [f"j{i}".encode() for i in range(10)]
        assert all(m.delivery_count == 1 for m in msgs)
        assert q.qsize() == 10 and q.in_flight() == 10
        for m in msgs:
            assert q.ack(m) is True
        assert q.ack(msgs[0]) is False  # twice
        assert q.qsize() == 0 and q.in_flight() == 0
        assert q.get(0) is None


def test_nack_redelivers_after_delay_with_count(root):
    with Queue(root, "jobs") as q:
        q.put(b"a")
        m = q.get(0)
        assert q.nack(m, delay=0.2) is True
        assert q.get(0) is None  # not yet
        t0 = time.monotonic()
        again = q.get(2.0)
        assert 0.15 <= time.monotonic() - t0 < 1.5
        assert (again.value, again.delivery_count) == (b"a", 2)
        assert q.nack(m) is False  # the old delivery is stale
        again.ack()
        assert q.qsize() == 0


def test_visibility_timeout_redelivers_unacked(root):
    with Queue(root, "jobs", visibility_timeout=0.2) as q:
        q.put(b"a")
        q.put(b"b")
        first = q.get(0)
        second = q.get(0)
        second.ack()
        t0 = time.monotonic()
        again = q.get(3.0)
        assert time.monotonic() - t0 >= 0.1
        assert (again.offset, again.delivery_count) == (first.offset, 2)
        assert q.ack(first) is True  # a late ack of the earlier delivery still finishes it
        assert q.get(0.3) is None


def test_dead_letter_after_max_deliveries(root):
    with Queue(root, "jobs", max_deliveries=3) as q:
        q.put(b"poison", key=b"k", headers=[("h", b"1")])
        q.put(b"fine")
        for expected in (1, 2, 3):
            m = q.get(0)
            assert (m.value, m.delivery_count) == (b"poison", expected)
            q.nack(m)
        m = q.get(0)
        assert m.value == b"fine"
        m.ack()
        assert q.get(0) is None
        assert q.qsize() == 0
        dead = q.store.partition("jobs.dlq", 0).read(0)
        assert [(r.key, r.value) for r in dead] == [(b"k", b"poison")]
        headers = dict(dead[0].headers)
        assert headers["h"] == b"1"
        assert headers["logstore.deliveries"] == b"3"
        assert headers["logstore.offset"] == b"0"


def test_restart_keeps_acks_and_redelivers_the_rest(root):
    with Queue(root, "jobs", visibility_timeout=0.1) as q:
        for i in range(6):
            q.put(bytes([i]))
        msgs = drain(q)
        for m in msgs[::2]:
            m.ack()
    time.sleep(0.15)
    with Queue(root, "jobs", visibility_timeout=30) as q:
        assert q.qsize() == 3
        again = drain(q, timeout=0.3)
        assert sorted(m.value for m in again) == [bytes([1]), bytes([3]), bytes([5])]
        assert all(m.delivery_count == 2 for m in again)


def test_snapshots_keep_the_state_log_short(root, monkeypatch):
    monkeypatch.setattr(workqueue, "_SNAPSHOT_EVERY", 50)
    with Queue(root, "jobs", segment_bytes=16 << 10, file_delete_delay_ms=0) as q:
        q.put_many([b"x" * 100] * 500)
        held = []
        for i in range(500):
            m = q.get(0)
            if i % 97 == 96:
                held.append(m)  # a few stay unacked across snapshots
            else:
                m.ack()
        state_log = q.store.partition("__queue.jobs", 0)
        assert state_log.log_start_offset > 0
        assert state_log.log_end_offset - state_log.log_start_offset < 200
        assert q.store.partition("jobs", 0).log_start_offset > 0  # acked data reclaimed
        assert q.qsize() == len(held)
    with Queue(root, "jobs") as q:  # a fresh replay starts from a snapshot
        assert q.qsize() == len(held)
        assert q.in_flight() == len(held)


def test_two_queue_objects_never_lease_the_same_message(root):
    # Two stores on one root contend through flock exactly as two processes do.
    a = Queue(root, "jobs")
    b = Queue(LogStore(root), "jobs")
    try:
        a.put_many([str(i).encode() for i in range(200)])
        got = []
        lock = threading.Lock()

        def work(q):
            while (m := q.get(0.1)) is not None:
                with lock:
                    got.append(m.value)
                q.ack(m)

        threads = [threading.Thread(target=work, args=(q,)) for q in (a, b, a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got, key=int) == [str(i).encode() for i in range(200)]
        assert a.qsize() == b.qsize() == 0
    finally:
        a.close()
        b.close()
        b.store.close()


def test_aget_does_not_block_the_event_loop(root):
    with Queue(root, "jobs") as q:
        async def main():
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            t = asyncio.create_task(ticker())
            threading.Timer(0.2, q.put, args=(b"later",)).start()
            msg = await q.aget(timeout=5)
            t.cancel()
            return msg, ticks

        msg, ticks = asyncio.run(main())
        assert msg.value == b"later"
        assert ticks >= 5
        assert asyncio.run(q.aget(timeout=0.05)) is None


def test_bad_settings_are_rejected(root):
    for kw in (dict(visibility_timeout=0), dict(max_deliveries=0), dict(durability="maybe"), dict(ack_durability="x")):
        with pytest.raises(InvalidConfigError):
            Queue(root, "jobs", **kw)


def test_corrupt_state_operation_is_reported(root):
    with Queue(root, "jobs") as q:
        q._state_log.append(b"?garbage")
        with pytest.raises(workqueue.CorruptRecordError):
            q.get(0)


# ---------------------------------------------------------------------- processes
def _producer(root, pid, n):
    with Queue(root, "work") as q:
        for i in range(0, n, 10):
            if i % 20 == 0:
                q.put_many([f"{pid}:{j}".encode() for j in range(i, i + 10)])
            else:
                for j in range(i, i + 10):
                    q.put(f"{pid}:{j}".encode())


def _consumer(root, out_path, stop_after):
    with Queue(root, "work", visibility_timeout=5) as q, open(out_path, "a") as out:
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < stop_after:
            m = q.get(0.2)
            if m is None:
                continue
            idle_since = time.monotonic()
            out.write(f"{m.value.decode()} {m.partition} {m.offset}\n")
            out.flush()
            q.ack(m)


def test_four_producer_and_four_consumer_processes(tmp_path):
    root = str(tmp_path / "store")
    with Queue(root, "work", partitions=2):
        pass
    ctx = multiprocessing.get_context("fork")
    n = 500
    outs = [str(tmp_path / f"c{i}.txt") for i in range(4)]
    consumers = [ctx.Process(target=_consumer, args=(root, outs[i], 2.0)) for i in range(4)]
    producers = [ctx.Process(target=_producer, args=(root, p, n)) for p in range(4)]
    for proc in consumers + producers:
        proc.start()
    for proc in producers + consumers:
        proc.join(120)
        assert proc.exitcode == 0
    lines = [line.split() for path in outs for line in open(path)]
    values = sorted(v for v, _, _ in lines)
    expected = sorted(f"{p}:{j}" for p in range(4) for j in range(n))
    assert values == expected  # every message delivered once, none lost, none twice
    by_partition: dict[int, list[int]] = {}
    for _, p, off in lines:
        by_partition.setdefault(int(p), []).append(int(off))
    for offsets in by_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))  # dense offsets
    with Queue(root, "work") as q:
        assert q.qsize() == 0


def _crashing_worker(root, out_path):
    with Queue(root, "work", visibility_timeout=0.5) as q, open(out_path, "a") as out:
        while True:
            m = q.get(1.0)
            if m is None:
                continue
            q.ack(m)
            out.write(f"{m.value.decode()}\n")
            out.flush()


def test_acked_messages_are_not_redelivered_after_a_worker_is_killed(tmp_path):
    root = str(tmp_path / "store")
    n = 300
    with Queue(root, "work") as q:
        q.put_many([str(i).encode() for i in range(n)])
    ctx = multiprocessing.get_context("fork")
    out = str(tmp_path / "acked.txt")
    for delay in (0.3, 0.5, 0.4):
        proc = ctx.Process(target=_crashing_worker, args=(root, out))
        proc.start()
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    acked_before = [line.strip() for line in open(out)]
    with Queue(root, "work", visibility_timeout=0.5) as q:
        rest = []
        while (m := q.get(1.0)) is not None:
            rest.append(m.value.decode())
            q.ack(m)
    # The worker logs after acking, so a kill between the two can only hide an ack, never fake one.
    assert not set(acked_before) & set(rest)
    assert set(acked_before) | set(rest) == {str(i) for i in range(n)}


def test_aput_shares_fsyncs_between_coroutines(root, monkeypatch):
    from logstore import _fileio
    calls = []
    real = _fileio.FileOps.fdatasync

    def counting(self, fd):
        calls.append(fd)
        return real(self, fd)

    monkeypatch.setattr(_fileio.FileOps, "fdatasync", counting)
    with Queue(root, "jobs") as q:
        async def main():
            return await asyncio.gather(*[q.aput(str(i).encode()) for i in range(50)])

        metas = asyncio.run(main())
        assert sorted(m.offset for m in metas) == list(range(50))
        assert q.store.partition("jobs", 0).recovery_point == 50  # all fsynced on return
        assert 1 <= len(calls) < 10  # one fsync served many coroutines
        assert [m.value for m in drain(q)] == [str(i).encode() for i in range(50)]


def test_get_many_and_ack_many(root):
    with Queue(root, "jobs", partitions=2) as q:
        q.put_many([bytes([i]) for i in range(10)], keys=[bytes([i % 3]) for i in range(10)])
        msgs = q.get_many(7, timeout=0)
        assert len(msgs) == 7 and len({(m.partition, m.offset) for m in msgs}) == 7
        rest = q.get_many(7, timeout=0)
        assert len(rest) == 3
        assert q.get_many(3, timeout=0.05) == []
        assert q.ack_many(msgs + rest) == 10
        assert q.ack_many(msgs) == 0
        assert q.qsize() == 0
        with pytest.raises(ValueError):
            q.get_many(0)


def test_state_operation_of_a_wrong_length_is_reported(root):
    with Queue(root, "jobs") as q:
        q._state_log.append(b"A" + b"\0" * 5)  # an ack is 13 bytes
        with pytest.raises(workqueue.CorruptRecordError, match="bad length"):
            q.get(0)


def test_expiry_heap_stays_proportional_to_the_messages_in_flight():
    state = workqueue._State(1)
    for off in range(20_000):
        state.lease(off, 0, off, 1, 1_000 + off)
        state.done(0, off)
    assert len(state.due) <= 4096 + 1
    assert state.partitions[0].floor == 20_000
    # Live leases survive the pruning and still expire in deadline order.
    for off in range(20_000, 20_010):
        state.lease(off, 0, off, 1, 50 - off % 7)
    for off in range(20_010, 25_000):
        state.lease(off, 0, off, 1, 10**9)
        state.done(0, off)
    expired = [state.next_due(100) for _ in range(10)]
    assert sorted(e[1] for e in expired) == list(range(20_000, 20_010))
    assert [50 - off % 7 for _, off, _ in expired] == sorted(50 - off % 7 for _, off, _ in expired)
    assert state.next_due(100) is None


def test_aput_fsync_error_reaches_every_waiting_coroutine(root, monkeypatch):
    from logstore import _fileio
    with Queue(root, "jobs") as q:
        def failing(self, fd):
            raise OSError(5, "injected EIO")

        monkeypatch.setattr(_fileio.FileOps, "fdatasync", failing)

        async def main():
            return await asyncio.gather(*[q.aput(b"v") for _ in range(20)], return_exceptions=True)

        results = asyncio.run(main())
        # The coroutines the failed fsync covered get its error; later ones find the log offline.
        assert len(results) == 20 and isinstance(results[0], OSError)
        assert all(isinstance(r, (OSError, LogOfflineError)) for r in results)


def test_cancelling_one_aput_leaves_the_others_fsynced(root):
    with Queue(root, "jobs") as q:
        async def main():
            tasks = [asyncio.ensure_future(q.aput(str(i).encode())) for i in range(20)]
            await asyncio.sleep(0)
            tasks[3].cancel()
            return await asyncio.gather(*tasks, return_exceptions=True)

        results = asyncio.run(main())
        assert isinstance(results[3], asyncio.CancelledError)
        assert sorted(r.offset for i, r in enumerate(results) if i != 3) == [i for i in range(20) if i != 3]
        assert q.store.partition("jobs", 0).recovery_point == 20


@pytest.mark.regression
def test_state_operation_naming_a_partition_the_queue_lacks_is_corruption(root):
    """Found by tests/fuzz/test_python_parsers.py: an ack for partition 2 of a one-partition queue
    raised IndexError (and a negative partition silently meant another one)."""
    import struct

    with Queue(root, "jobs") as q:
        q._state_log.append(struct.pack(">ciq", b"A", 2, 0))
        with pytest.raises(workqueue.CorruptRecordError, match="outside the queue"):
            q.get(0)
    with Queue(root, "other") as q:
        q._state_log.append(struct.pack(">ciq", b"A", -1, 0))
        with pytest.raises(workqueue.CorruptRecordError, match="outside the queue"):
            q.get(0)
