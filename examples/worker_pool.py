"""A multi-process worker pool on logstore.Queue (the gunicorn/celery pattern).

Two producer processes put jobs; four worker processes get, "process" and ack them; one job is
a poison message that always fails and ends up in the dead-letter topic after three deliveries.
Every process opens the same store directory itself. Run: ``python examples/worker_pool.py``.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time

import logstore

JOBS_PER_PRODUCER = 500


def producer(root: str, n: int) -> None:
    with logstore.Queue(root, "jobs") as q:
        for i in range(JOBS_PER_PRODUCER):
            q.put(f"job-{n}-{i}".encode())
        if n == 0:
            q.put(b"poison")


def worker(root: str, done: "multiprocessing.Queue[int]") -> None:
    handled = 0
    with logstore.Queue(root, "jobs", visibility_timeout=5, max_deliveries=3) as q:
        idle = time.monotonic()
        while time.monotonic() - idle < 1.5:
            msg = q.get(timeout=0.2)
            if msg is None:
                continue
            idle = time.monotonic()
            if msg.value == b"poison":
                q.nack(msg)  # fails every time: dead-lettered after 3 deliveries
                continue
            q.ack(msg)
            handled += 1
    done.put(handled)


def main() -> None:
    root = tempfile.mkdtemp(prefix="logstore-pool-")
    with logstore.Queue(root, "jobs", partitions=2, max_deliveries=3):
        pass  # create the topics once
    ctx = multiprocessing.get_context("spawn" if os.name != "posix" else "fork")
    done = ctx.Queue()
    procs = [ctx.Process(target=producer, args=(root, n)) for n in range(2)]
    procs += [ctx.Process(target=worker, args=(root, done)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    counts = [done.get() for _ in range(4)]
    print(f"workers handled {counts} = {sum(counts)} jobs")
    with logstore.Queue(root, "jobs") as q:
        dead = q.store.partition("jobs.dlq", 0).read(0)
        print(f"left in the queue: {q.qsize()}; dead letters: {[r.value for r in dead]}")
        assert sum(counts) == 2 * JOBS_PER_PRODUCER and q.qsize() == 0 and len(dead) == 1


if __name__ == "__main__":
    main()
