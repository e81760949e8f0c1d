"""Shared model and checks of the tiered-storage crash tests (test_tiered_crash.py and the
kill -9 worker tiered_worker.py).

A store tiers over a local object store (``file://`` outside the data directory). Every put
and delete of the object store is durable when it returns (``ObjectStore`` fsyncs them), and
the object store lies outside the data directory, so a power loss of the data directory leaves
it as it was at that moment: the model is "durable on acknowledgement".

:class:`StepObjectStore` is the object store with a hook before and after each put and delete
(a *step*): the crash-state explorer marks a crash point there, the fault tests raise or kill
the process at step N.

:func:`check_tiered_store` is the invariant after a crash (see its docstring): the store opens
with the same object store, one maintenance round runs, every acknowledged record reads back the
same from the log start (which moved only by retention or DeleteRecords), nothing read twice or
out of order, and no orphan: every object belongs to a COPY_SEGMENT_FINISHED segment of the
metadata, and every finished segment's objects are all there.
"""

from __future__ import annotations

import os
import random
from typing import Any, Callable

from logstore import LogStore
from logstore.errors import RemoteStorageError
from logstore.tiered.metadata import RemoteLogSegmentState
from logstore.tiered.objectstore import ObjectStore
from logstore.tiered.storage import SEGMENT_SUFFIXES, ObjectStoreStorageManager, object_key, partition_key_prefix

from crashcheck import check_log, key_for, value_for

__all__ = ["StepObjectStore", "StepFault", "Workload", "check_tiered_store", "check_no_orphans", "list_objects",
           "TIERED_TOPIC", "STORE", "snapshot_objects", "write_objects"]

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED

#: A tiered topic's config in these tests: 1 KiB segments (about ten records each), every
#: append flushed (acknowledged = durable), the copied segments leave the local disk at once.
TIERED_TOPIC = dict(remote_storage_enable=True, segment_bytes=1024, flush_messages=1, local_retention_bytes=0,
                    local_retention_ms=-1, retention_ms=-1, retention_bytes=-1)


class StepFault(RemoteStorageError):
    """The object store failure a test injected at a step."""


class StepObjectStore(ObjectStore):
    """An :class:`ObjectStore` that calls ``hook(label)`` before and after each put and delete
    (``"before put <key>"``, ``"after delete <key>"``, ...). The hook may raise (a failure of the
    object store at that step) or end the process (a kill between two steps)."""

    def __init__(self, url: str, hook: Callable[[str], None]) -> None:
        super().__init__(url)
        self.hook = hook

    def _step(self, op: str, key: str, fn: Callable[[], None]) -> None:
        self.hook(f"before {op} {key}")
        fn()
        self.hook(f"after {op} {key}")

    def put_file(self, key: str, path: str) -> None:
        self._step("put", key, lambda: super(StepObjectStore, self).put_file(key, path))

    def put_bytes(self, key: str, data: Any) -> None:
        self._step("put", key, lambda: super(StepObjectStore, self).put_bytes(key, data))

    def delete(self, key: str) -> None:
        self._step("delete", key, lambda: super(StepObjectStore, self).delete(key))


def list_objects(directory: str) -> dict[str, bytes]:
    """Every object of a local object store directory: {key: content}."""
    out = {}
    for dirpath, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory).replace(os.sep, "/")] = f.read()
    return out


def snapshot_objects(directory: str, blobs: dict[bytes, bytes]) -> dict[str, bytes]:
    """The objects now, as {key: digest}; their contents go to ``blobs`` (digest -> bytes), so
    that many crash points share one copy of each object."""
    import hashlib

    out = {}
    for key, data in list_objects(directory).items():
        digest = hashlib.blake2b(data, digest_size=16).digest()
        blobs.setdefault(digest, data)
        out[key] = digest
    return out


def write_objects(directory: str, objects: dict[str, bytes], blobs: dict[bytes, bytes]) -> None:
    """Make ``directory`` hold exactly ``objects`` ({key: digest}) and nothing else."""
    import shutil

    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    for key, digest in objects.items():
        path = os.path.join(directory, *key.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(blobs[digest])


#: the store's defaults: small segments and indexes for every topic (``__remote_log_metadata``
#: too: it rolls during the workload).
STORE = dict(segment_bytes=1024, segment_index_bytes=4096, index_interval_bytes=256, flush_messages=1)



class Workload:
    """The tiering workload and its model (what was acknowledged), driven through ``hook`` at each
    object store step."""

    def __init__(self, root: str, objects: str, hook, seed: int = 1) -> None:
        self.root = root
        self.objects = objects
        self.hook = hook
        self.rng = random.Random(seed)
        self.topics: dict[str, dict] = {}

    def model(self, topic: str) -> dict:
        return self.topics.setdefault(topic, {"state": "creating", "history": [], "durable": 0, "start": (0, 0)})

    def oracle(self) -> dict:
        return {"topics": {name: dict(m, history=list(m["history"])) for name, m in self.topics.items()}}

    def append(self, store: LogStore, topic: str, n: int) -> None:
        """``n`` records in appends of 1..8; each enters the history before its call (a crash
        inside may keep it) and is acknowledged when the call returns (flush_messages=1)."""
        m = self.topics[topic]
        log = store.partition(topic, 0)
        done = 0
        while done < n:
            end = log.log_end_offset
            k = min(n - done, self.rng.choice((1, 1, 3, 8)))
            values = [value_for(end + i, topic) for i in range(k)]
            m["history"].extend(values)
            assert log.append_batch(values, keys=[key_for(end + i) for i in range(k)]) == end
            m["durable"] = end + k
            done += k

    def moving_start(self, store: LogStore, topic: str, action) -> Any:
        """Run ``action()``, which may move ``topic``'s log start (retention, DeleteRecords)."""
        m = self.topics[topic]
        log = store.partition(topic, 0)
        m["start"] = (m["start"][0], log.log_end_offset)
        result = action()
        m["start"] = (log.log_start_offset, log.log_start_offset)
        return result

    def run(self) -> None:
        rsm = ObjectStoreStorageManager(StepObjectStore(f"file://{self.objects}", self.hook))
        store = LogStore(self.root, maintenance=False, remote_storage=rsm, **STORE)
        try:
            self.model("t")
            store.create_topic("t", 1, **TIERED_TOPIC)
            self.topics["t"]["state"] = "created"
            self.append(store, "t", 30)
            log = store.partition("t", 0)
            manager = store.remote_log_manager
            assert manager.copy_segments(log) >= 2
            assert log.enforce_retention() >= 2  # local retention: the copied segments leave the disk
            self.append(store, "t", 20)
            self.moving_start(store, "t", store.run_maintenance)  # copy, local retention, expiration
            remote = manager.rlmm.list_remote_log_segments(manager.partitions()[0])
            target = remote[1].start_offset + 2  # DeleteRecords into the second remote segment
            self.moving_start(store, "t", lambda: log.delete_records_before(target))
            self.moving_start(store, "t", store.run_maintenance)  # the first remote segment expires
            # total retention by size: the oldest remote segments go, the log start moves past them
            store.alter_topic_config("t", lambda c: {**c, "retention.bytes": "2500"})
            self.moving_start(store, "t", store.run_maintenance)
            # a tiered topic copied, then deleted: its remote segments go with it
            self.model("gone")
            store.create_topic("gone", 1, **TIERED_TOPIC)
            self.topics["gone"]["state"] = "created"
            self.append(store, "gone", 25)
            store.run_maintenance()
            self.topics["gone"]["state"] = "deleting"
            store.delete_topic("gone")
            self.topics["gone"]["state"] = "deleted"
            self.append(store, "t", 8)
        finally:
            store.close()


def _check_topic(store: LogStore, topic: str, model: dict, rng: random.Random | None, when: str,
                 retained_from: int | None = None) -> int:
    """check_log on the topic's partition; returns its log start. ``retained_from``: the log
    start before the check's own maintenance round, which may have moved it by the topic's total
    retention (then the bytes still held must be at least ``retention.bytes``)."""
    log = store.partition(topic, 0)
    start = model["start"]
    if retained_from is not None and log.log_start_offset > retained_from:
        config = log.config
        assert config.retention_bytes >= 0 or config.retention_ms >= 0, \
            f"{topic}-0 {when}: log start {retained_from} -> {log.log_start_offset}, but no retention applies"
        if config.retention_bytes >= 0 and config.retention_ms < 0:
            tier = log.remote_tier
            through = tier.copied_through() if tier is not None else -1
            held = (tier.size_in_bytes() if tier is not None else 0) + \
                sum(s.size for s in log.segments if s.base_offset > through)
            assert held >= config.retention_bytes, (f"{topic}-0 {when}: retention moved the log start "
                                                    f"{retained_from} -> {log.log_start_offset}, leaving {held} "
                                                    f"bytes, below retention.bytes {config.retention_bytes}")
        start = (retained_from, log.log_start_offset)
    check_log(log, model["history"], (start[0], start[1]), model["durable"], rng, what=f"{topic}-0 {when}")
    return log.log_start_offset


def check_tiered_store(root: str, objects_dir: str, oracle: dict, rng: random.Random | None = None,
                       store_config: dict | None = None) -> None:
    """Open the store at ``root`` with the object store in ``objects_dir``, run one maintenance
    round and assert the invariants; raise AssertionError naming the first violation.

    ``oracle``: {"topics": {name: {"state": "created" | "deleting" | "deleted" | "creating",
    "history": [value by offset], "durable": acknowledged end, "start": (lo, hi)}}}: what the
    workload had been told when the crash came. A topic "creating" may or may not exist; one
    "created" must, with every acknowledged record; one "deleting" may exist (then with its
    records) or not; one "deleted" must not.
    """
    url = f"file://{objects_dir}"
    with LogStore(root, maintenance=False, remote_storage=url, **(store_config or {})) as store:
        present = set(store.topics())
        starts = {}
        for topic, model in oracle["topics"].items():
            state = model["state"]
            if state == "created":
                assert topic in present, f"topic {topic}: its creation was acknowledged, now it is gone"
            elif state == "deleted":
                assert topic not in present, f"topic {topic}: its deletion was acknowledged, it is back"
            if topic in present:
                starts[topic] = _check_topic(store, topic, model, rng, "after the crash")
        done = store.run_maintenance()
        assert done.get("remote_errors", 0) == 0, f"the maintenance round after the crash had errors: {done}"
        for topic, model in oracle["topics"].items():
            if topic in present:
                _check_topic(store, topic, model, rng, "after a maintenance round", starts[topic])
        check_no_orphans(store, objects_dir)


def check_no_orphans(store: LogStore, objects_dir: str) -> None:
    """Every object belongs to a COPY_SEGMENT_FINISHED segment of a live topic's partition, every
    such segment has all its objects, and nothing is left half copied or half deleted."""
    manager = store.remote_log_manager
    objects = set(list_objects(objects_dir))
    if manager is None:
        assert not objects, f"objects but no remote log manager: {sorted(objects)[:5]}"
        return
    expected: set[str] = set()
    rlmm = manager.rlmm
    live = {name: store.topic_id(name) for name in store.topics(internal=True)}
    for tp in rlmm.partitions():
        segments = rlmm.list_remote_log_segments(tp)
        for m in segments:
            assert m.state == FINISHED, f"{m.describe()} is left {m.state.name} after a maintenance round"
            assert live.get(tp.topic) == tp.topic_id, \
                f"{m.describe()}: a remote segment of a deleted topic ({tp}) is left after a maintenance round"
            expected.update(object_key(m, suffix) for suffix in SEGMENT_SUFFIXES)
    missing = expected - objects
    assert not missing, f"finished remote segments lost objects: {sorted(missing)[:5]}"
    orphans = objects - expected
    if orphans:
        prefixes = {partition_key_prefix(tp) for tp in rlmm.partitions()}
        known = [k for k in orphans if any(k.startswith(p) for p in prefixes)]
        raise AssertionError(f"{len(orphans)} orphan objects after a maintenance round ({len(known)} under a "
                             f"partition the metadata knows): {sorted(orphans)[:4]}")
