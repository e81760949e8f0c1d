"""The process test_soak.py kills with SIGKILL: a mixed workload on one store, logging what returned.

Usage: ``python soak_worker.py ROOT EXPECTED TAG SEED``

It opens the store at ROOT (background maintenance on: retention, flushes and the cleaner run
on their own thread, as in a service) and loops until killed, choosing at random:

* a batch of 1..20 records appended to a partition of ``events`` (3 partitions, size
  retention, no fsync policy) or to ``durable`` (flush_messages=1);
* a write or tombstone of one of 40 keys in the compacted topic ``table``;
* a commit of group ``g``'s positions on ``events`` (never backwards);
* a roll, or a delete_records_before on ``events``.

Every value names the topic, the writer's TAG and its own offset, so the checker can tell a
record from an earlier life, a record at the wrong offset or a mix of writers apart from the one
history expects. After each call *returns*, one line goes to the EXPECTED file (O_APPEND, one
``write``: a SIGKILL loses at most the line in flight, never half of an earlier one):

    A <topic> <partition> <first offset> <last offset>   appended
    T <key> <offset> <value or ->                         table write (- for a tombstone)
    c <p0> <p1> <p2>                                      commit attempted (before the call)
    C <p0> <p1> <p2>                                      commit returned
    D <partition> <new log start>                         delete_records_before returned
    R                                                     the store is open (recovery done)
"""

from __future__ import annotations

import os
import random
import sys

from logstore import LogStore
from logstore.client.consumer import offset_store
from logstore.groups.offsets import OFFSETS_TOPIC, OFFSETS_TOPIC_CONFIG

STORE = dict(segment_bytes=16 * 1024, segment_index_bytes=8192, index_interval_bytes=1024)
TOPICS = {
    "events": dict(partitions=3, retention_bytes=96 * 1024),
    "durable": dict(partitions=1, flush_messages=1),
    "table": dict(partitions=1, cleanup_policy="compact", segment_bytes=8 * 1024, min_cleanable_dirty_ratio=0.1,
                  delete_retention_ms=2000),
}
KEYS = 40


def event_value(topic: str, offset: int, tag: str) -> bytes:
    """The value of ``topic``'s record at ``offset`` written by writer ``tag``."""
    pad = (offset * 7919) % 61
    return b"%s|%d|%s|" % (topic.encode(), offset, tag.encode()) + bytes((offset + i) % 251 for i in range(pad))


def table_value(key: bytes, offset: int, tag: str) -> bytes:
    return b"table|%d|%s|%s" % (offset, tag.encode(), key)


def open_store(root: str, maintenance: bool) -> LogStore:
    store = LogStore(root, maintenance=maintenance, retention_check_interval_ms=250, cleaner_backoff_ms=400, **STORE)
    store.create_topic(OFFSETS_TOPIC, 1, internal=True, exist_ok=True,
                       **dict(OFFSETS_TOPIC_CONFIG, segment_bytes=16 * 1024))
    for name, settings in TOPICS.items():
        settings = dict(settings)
        store.create_topic(name, settings.pop("partitions"), exist_ok=True, **settings)
    return store


def main(root: str, expected: str, tag: str, seed: int) -> None:
    rng = random.Random(seed)
    fd = os.open(expected, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    store = open_store(root, maintenance=True)
    offsets = offset_store(store)
    note("R")
    committed = [offsets.committed("g", "events", p) or 0 for p in range(3)]
    while True:
        r = rng.random()
        if r < 0.55:
            topic = "events" if r < 0.45 else "durable"
            p = rng.randrange(TOPICS[topic]["partitions"])
            log = store.partition(topic, p)
            first = log.log_end_offset
            n = rng.randint(1, 20)
            values = [event_value(topic, first + i, tag) for i in range(n)]
            keys = [b"k%d" % ((first + i) % 17) for i in range(n)]
            got = log.append_batch(values, keys=keys) if n > 1 else log.append(values[0], key=keys[0])
            assert got == first, f"append returned {got}, expected {first}"
            note(f"A {topic} {p} {first} {first + n - 1}")
        elif r < 0.85:
            log = store.partition("table", 0)
            key = b"key%d" % rng.randrange(KEYS)
            offset = log.log_end_offset
            value = None if rng.random() < 0.08 else table_value(key, offset, tag)
            got = log.append(value, key=key)
            assert got == offset, f"append returned {got}, expected {offset}"
            note(f"T {key.decode()} {offset} {'-' if value is None else value.decode()}")
        elif r < 0.95:
            for p in range(3):
                end = store.partition("events", p).log_end_offset
                committed[p] = rng.randint(committed[p], max(committed[p], end))
            note("c " + " ".join(map(str, committed)))
            offsets.commit("g", {("events", p): committed[p] for p in range(3)})
            note("C " + " ".join(map(str, committed)))
        elif r < 0.98:
            store.partition("events", rng.randrange(3)).roll()
        else:
            p = rng.randrange(3)
            log = store.partition("events", p)
            target = rng.randint(log.log_start_offset, log.log_end_offset)
            start = log.delete_records_before(target)
            note(f"D {p} {start}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
