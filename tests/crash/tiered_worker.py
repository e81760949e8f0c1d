"""The processes test_tiered_crash.py kills with SIGKILL: a store tiering into a local object store.

Usage:

* ``python tiered_worker.py step ROOT OBJECTS N MODEL``: tieredcheck's Workload, killing itself
  (SIGKILL) at object store step N; before each step it appends the model of what was
  acknowledged so far to MODEL (a 4-byte length, then the pickle).
* ``python tiered_worker.py loop ROOT OBJECTS EXPECTED TAG SEED``: a service-like process that
  tiers in a loop until it is killed: the store's maintenance thread and remote log manager
  thread on (``remote_log_manager_task_interval_ms`` 20 ms, 1 KiB segments), so copies, local
  retention, remote retention (``retention.bytes``) and expirations run on their own while it
  appends to the tiered topic ``tiered`` (2 partitions), calls DeleteRecords on it now and then,
  and creates, fills and deletes short-lived tiered topics ``side<N>``. After each call
  *returns*, one line goes to EXPECTED (O_APPEND, one ``write`` each)::

      R                                             the store is open
      A <topic> <partition> <first> <last>          appended (flush_messages=1)
      D <partition> <new log start>                 delete_records_before returned
      S <topic>                                     a side topic is about to be created
      C <topic>                                     ... its creation returned
      X <topic>                                     ... its deletion is about to begin
      Y <topic>                                     ... its deletion returned
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import struct
import sys

from logstore import LogStore

#: the loop's store: the remote log manager every 20 ms; 256 KiB segments for
#: ``__remote_log_metadata`` (it keeps every record: 1 KiB ones would run a long soak out of
#: file descriptors)
LOOP_STORE = dict(segment_bytes=256 * 1024, segment_index_bytes=4096, index_interval_bytes=256,
                  retention_check_interval_ms=30, remote_log_manager_task_interval_ms=20)
#: the loop's tiered topics: 1 KiB segments, every append flushed, copied segments leave the disk at once, the
#: remote tier keeps about 6 KiB per partition
LOOP_TOPIC = dict(remote_storage_enable=True, segment_bytes=1024, flush_messages=1, local_retention_bytes=0, local_retention_ms=-1,
                  retention_ms=-1, retention_bytes=6000)


def loop_value(topic: str, offset: int, tag: str) -> bytes:
    """The value the loop writes at ``offset`` of ``topic`` in the life ``tag``."""
    pad = (offset * 7919) % 53
    return b"%s|%d|%s|" % (topic.encode(), offset, tag.encode()) + bytes((offset + i) % 251 for i in range(pad))


def open_loop_store(root: str, objects: str, maintenance: bool) -> LogStore:
    store = LogStore(root, maintenance=maintenance, remote_storage=f"file://{objects}", **LOOP_STORE)
    store.create_topic("tiered", 2, exist_ok=True, **LOOP_TOPIC)
    return store


def loop(root: str, objects: str, expected: str, tag: str, seed: int) -> None:
    rng = random.Random(seed)
    fd = os.open(expected, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    store = open_loop_store(root, objects, maintenance=True)
    note("R")
    side = 0
    while True:
        r = rng.random()
        if r < 0.9:
            p = rng.randrange(2)
            log = store.partition("tiered", p)
            first = log.log_end_offset
            n = rng.randint(1, 8)
            values = [loop_value("tiered", first + i, tag) for i in range(n)]
            keys = [b"k%d" % ((first + i) % 13) for i in range(n)]
            assert log.append_batch(values, keys=keys) == first
            note(f"A tiered {p} {first} {first + n - 1}")
        elif r < 0.93:
            p = rng.randrange(2)
            log = store.partition("tiered", p)
            target = rng.randint(log.log_start_offset, (log.log_start_offset + log.log_end_offset) // 2)
            note(f"D {p} {log.delete_records_before(target)}")
        else:
            side += 1
            name = f"side{tag}x{side}"
            note(f"S {name}")
            store.create_topic(name, 1, **dict(LOOP_TOPIC, segment_bytes=512))
            note(f"C {name}")
            log = store.partition(name, 0)
            for i in range(rng.randint(10, 40)):
                log.append(loop_value(name, i, tag), key=b"k")
            store.remote_log_manager.copy_segments(log)
            note(f"X {name}")
            store.delete_topic(name)
            note(f"Y {name}")


def step(root: str, objects: str, n: int, model: str) -> None:
    from tieredcheck import Workload

    fd = os.open(model, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    holder: dict = {}
    count = {"n": 0}

    def hook(label: str) -> None:
        blob = pickle.dumps(holder["w"].oracle())
        os.write(fd, struct.pack("<I", len(blob)) + blob)
        count["n"] += 1
        if count["n"] == n:
            os.kill(os.getpid(), signal.SIGKILL)

    holder["w"] = w = Workload(root, objects, hook)
    w.run()
    blob = pickle.dumps(w.oracle())
    os.write(fd, struct.pack("<I", len(blob)) + blob)


if __name__ == "__main__":
    if sys.argv[1] == "step":
        step(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        loop(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
