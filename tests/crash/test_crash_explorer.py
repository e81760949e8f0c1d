"""Crash-state exploration (explorer.py): every crash point of small workloads, many disk states each.

Each workload runs once under the recorder; then every disk state a power loss could leave at
each of its sync points (and after its last step) is rebuilt and reopened with the plain
FileOps, and checked against what the workload had been told was durable at that point:

* every record acknowledged as durable is present with its key and value, the log is a prefix
  of history (no gap, no duplicate, nothing invented) between the acknowledged and the
  attempted log start;
* the recovered log is internally consistent: ``logstore.tools.verify`` (every batch CRC,
  every offset-index entry on a batch boundary, every time-index entry the maximum timestamp
  so far, the checkpoint files parse) reports nothing, random reads through the offset index
  return the right record, and the next append gets the next offset;
* compacted logs: every key reads its latest acknowledged value or a later attempted one, and
  nothing appears that was never written;
* stores: acknowledged consumer-group commits are there (or a later attempted one), topics
  whose creation returned exist with all their partitions, topics whose deletion returned do
  not;
* transactions (the coordinator's two-phase commit fsynced): once the reopened store's
  coordinator finished what was prepared, every transaction is visible whole or not at all,
  an acknowledged outcome holds with its group offsets, and nothing is left open.

The figures (crash points, states, violations) are printed at the end of the run; the target
is at least 10,000 states per ``make test`` (the per-workload minimums add up to 10,600). ``make soak`` explores the same workloads with
more random states per crash point.
"""

from __future__ import annotations

import os
import random
import uuid

import pytest

from logstore import Log, LogStore, _fileio
from logstore import tools
from logstore.client.consumer import offset_store
from logstore.groups.offsets import OFFSETS_TOPIC, OFFSETS_TOPIC_CONFIG
from logstore.store.layout import read_topic_entry
from logstore.store.topicids import read_partition_metadata, write_partition_metadata

from crashcheck import CONFIG, Writer, check_log, key_for, value_for
from explorer import REPORTS, Recorder, Report, dir_variants, explore, file_variants

#: make test explores every crash point with a bounded number of states; make soak (marker
#: "slow") with many more. Per-workload caps keep make test near 10,000 states in ~30 s.
DEPTHS = [pytest.param("ci", id="ci"), pytest.param("soak", id="soak", marks=pytest.mark.slow)]
SOAK = dict(random_states=16, max_states_per_point=128)

#: 1 KiB segments roll every ~10 records; 4 KiB indexes with an entry every 256 bytes.
SMALL = dict(CONFIG, segment_bytes=1024, index_interval_bytes=256)


def _run(mem_path, name: str, workload, oracle, check, depth: str, minimum_states: int,
         max_states_per_point: int = 64, random_states: int = 4) -> Report:
    """Record ``workload()`` under ``mem_path/work`` (the tree there now is durable), explore
    every crash point and assert no violation and at least ``minimum_states`` states."""
    recorder = Recorder(mem_path / "work", oracle)
    with _fileio.install(recorder):
        workload()
        recorder.mark("the end of the workload")
    # make test samples each crash point more thinly (a third of the states); make soak explores them all
    limits = SOAK if depth == "soak" else dict(random_states=max(1, random_states // 2),
                                               max_states_per_point=max(4, max_states_per_point // 3))
    if depth != "soak":
        minimum_states //= 3
    report = explore(recorder.points, str(mem_path / "scratch"), check, **limits)
    REPORTS.append((f"{name} [{depth}]", report))
    assert not report.violations, (f"{report.summary(name)}:\n" + "\n".join(report.violations))
    assert report.states >= minimum_states, report.summary(name)
    return report


def _verify_clean(path: str) -> None:
    problems = tools.verify(path).problems
    assert not problems, "verify after recovery: " + "; ".join(str(p) for p in problems[:5])


# ---------------------------------------------------------------------------- the explorer itself
def test_dir_variants_are_prefixes_and_reorderings_that_respect_dependencies():
    names = {"a": 1}
    ops = [("create", "t.tmp", 2), ("rename", "t.tmp", "t", 2), ("unlink", "a")]
    variants = dir_variants(names, ops)
    got = {label: ns for label, ns in variants}
    assert variants[0] == ("durable", {"a": 1}) and variants[1] == ("all", {"t": 2})
    states = [ns for _, ns in variants]
    assert {"a": 1, "t.tmp": 2} in states                  # a prefix
    assert {"a": 1, "t": 2} in states                      # the unlink lost, the rename kept
    assert {} in states and got["only unlink a"] == {}     # the unlink alone, reordered first
    assert {"a": 1, "t.tmp": 2} in states
    # a rename whose create was lost is impossible, so never offered: "t" only with "t.tmp" gone
    assert all(("t" in ns) <= ("t.tmp" not in ns) for ns in states)
    assert "only rename t.tmp->t" not in got
    assert len({tuple(sorted(ns.items())) for ns in states}) == len(states)


def test_file_variants_tear_appends_in_sector_and_page_pieces():
    rng = random.Random(0)
    old = bytes(range(256)) * 4          # 1 KiB durable
    new = old + b"\xab" * 9000            # 9000 bytes appended since
    variants = dict(file_variants(old, new, rng))
    assert variants["old"] == old and variants["new"] == new
    cuts = {label for label in variants if label.startswith("append cut")}
    assert any("(512 B" in c for c in cuts) and any("(4096 B" in c for c in cuts)
    for label, data in variants.items():
        assert data[:len(old)] == old, f"{label}: damaged bytes that were never rewritten"
        if label.startswith("new up to"):
            cut = int(label.split()[3].rstrip(","))
            assert data[:cut] == new[:cut] and len(data) == len(new)
            if "garbage" not in label:
                assert data[cut:] == bytes(len(new) - cut)  # the zero-filled tail
    assert len(set(variants.values())) == len(variants)
    mixed = variants["512 B pieces reordered"]
    pieces = [mixed[i:i + 512] == new[i:i + 512] for i in range(1024, len(new), 512)]
    assert any(pieces) and not all(pieces)  # some later pieces arrived before earlier ones


def test_the_explorer_finds_a_rename_that_persists_before_the_data(mem_path):
    """A write-then-rename without an fsync of the data (the classic ALICE finding) must be
    reported: the state where the rename reached the disk and the data did not breaks it."""
    def workload():
        ops = _fileio.ops
        fd = ops.open(str(mem_path / "work" / "f.tmp"), os.O_RDWR | os.O_CREAT)
        ops.pwrite(fd, b"precious", 0)
        ops.close(fd)  # no fsync of the data: the bug
        ops.rename(str(mem_path / "work" / "f.tmp"), str(mem_path / "work" / "f"))
        ops.fsync_dir(str(mem_path / "work"))

    def check(path, oracle, rng):
        target = os.path.join(path, "f")
        if os.path.exists(target):
            with open(target, "rb") as f:
                assert f.read() == b"precious", "renamed file lost its data"

    recorder = Recorder(mem_path / "work", lambda: None)
    with _fileio.install(recorder):
        workload()
        recorder.mark("end")
    report = explore(recorder.points, str(mem_path / "scratch"), check, workers=1)
    assert report.violations and "renamed file lost its data" in report.violations[0]
    assert "[<root>/: all]" in report.violations[0]


# ---------------------------------------------------------------------------- one log
#: Every kind of sync a log's lifetime makes ("fsync *.log": file class of the path).
EXPECTED_KINDS = {
    "fsync *.log", "fdatasync *.log", "fsync *.index", "fsync *.timeindex",   # appends, seals, close
    "fsync_dir orders-0",                                                     # new segment, retention
    "fsync recovery-point-offset-checkpoint.tmp", "fsync log-start-offset-checkpoint.tmp",
    "fsync_dir .",                                                            # checkpoint renames
    "fsync orders-0/.kafka_cleanshutdown",
}
def _log_workload(w: Writer):
    def run():
        w.open()
        w.run(40)
        w.close()
        w.open()
        w.run(8)
        w.abandon()
        w.open()  # recovery of a process crash
        w.run(8)
        w.close()
    return run


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("policy", ["flush_messages=1", "flush()_every_5"])
def test_every_crash_state_of_a_log_lifetime_keeps_acknowledged_records(mem_path, policy, depth):
    flush_every = None if policy == "flush_messages=1" else 5
    config = dict(SMALL, flush_messages=1 if flush_every is None else None, retention_bytes=6000)
    for seed in ([3] if depth == "ci" else [3, 4, 5, 6, 7, 8]):  # soak: more lifetimes
        _explore_lifetime(mem_path / f"seed{seed}", config, flush_every, seed, policy, depth)


def _explore_lifetime(mem_path, config: dict, flush_every: int | None, seed: int, policy: str, depth: str) -> None:
    mem_path.mkdir()
    w = Writer(str(mem_path / "work" / "orders-0"), config, random.Random(seed), flush_every, retention=True)

    def check(path, oracle, rng):
        durable, lo, hi = oracle
        partition = os.path.join(path, "orders-0")
        if durable == 0 and not os.path.isdir(partition):
            return  # the log's creation never became durable; nothing was acknowledged
        log = Log.open(partition, **config)
        try:
            end = check_log(log, w.history, (lo, hi), durable, rng)
            assert log.append(value_for(end, "after"), key=key_for(end)) == end
        finally:
            log.close()
        _verify_clean(partition)

    report = _run(mem_path, f"log lifetime, {policy}, seed {seed}", _log_workload(w), lambda: (w.durable, w.start, w.start_hi),
                  check, depth, minimum_states=3200 if seed == 3 else 2500)
    missing = EXPECTED_KINDS - report.kinds
    assert not missing, f"kinds of sync never a crash point: {sorted(missing)}"


# ---------------------------------------------------------------------------- a compacted log
COMPACTED = dict(cleanup_policy="compact", segment_bytes=700, segment_index_bytes=4096, index_interval_bytes=128,
                 flush_messages=1, min_cleanable_dirty_ratio=0.0)


@pytest.mark.parametrize("depth", DEPTHS)
def test_every_crash_state_of_a_compacted_log_keeps_each_keys_latest_value(mem_path, depth):
    path = str(mem_path / "work" / "table-0")
    history: list[tuple[int, bytes, bytes | None]] = []
    state = {"durable": 0}
    rng = random.Random(5)

    def workload():
        log = Log.open(path, **COMPACTED)
        for life in range(3):
            for i in range(40):
                key = b"k%d" % rng.randrange(10)
                value = None if rng.random() < 0.1 else b"v%d.%d" % (life, i)
                offset = log.log_end_offset
                history.append((offset, key, value))
                assert log.append(value, key=key) == offset
                state["durable"] = offset + 1
                if i % 15 == 14:
                    log.roll()
                if i % 20 == 19:
                    log.compact()
            if life == 1:
                log._abandon()  # a process crash: the page cache keeps everything
            else:
                log.close()
            log = Log.open(path, **COMPACTED)
        log.close()

    def check(root, oracle, rng):
        durable = oracle["durable"]
        partition = os.path.join(root, "table-0")
        if durable == 0 and not os.path.isdir(partition):
            return
        with Log.open(partition, **COMPACTED) as log:
            assert log.log_end_offset >= durable, f"log ends at {log.log_end_offset}, {durable} acknowledged"
            got = [(r.offset, r.key, r.value) for r in log.iter()]
        _verify_clean(partition)
        offsets = [o for o, _, _ in got]
        assert offsets == sorted(set(offsets)), "offsets repeat or go back"
        invented = set(got) - set(history)
        assert not invented, f"records that were never written: {sorted(invented)[:3]}"
        acked = {key: offset for offset, key, _ in history[:durable]}
        found = {key: offset for offset, key, _ in got}
        for key, offset in acked.items():
            assert found.get(key, -1) >= offset, f"key {key!r} lost its value of offset {offset}"

    _run(mem_path, "compacted log", workload, lambda: dict(state), check, depth, minimum_states=3000,
         max_states_per_point=8)


# ---------------------------------------------------------------------------- a store
STORE = dict(segment_bytes=1024, segment_index_bytes=4096, index_interval_bytes=256, flush_messages=1)


@pytest.mark.parametrize("depth", DEPTHS)
def test_every_crash_state_of_a_store_keeps_topics_records_and_committed_offsets(mem_path, depth):
    root = mem_path / "work" / "store"
    parts = [("events", 0), ("events", 1)]
    history: dict[tuple[str, int], list[bytes]] = {tp: [] for tp in parts}
    model = {"durable": {tp: 0 for tp in parts}, "committed": None, "attempted": None,
             "topics": set(), "deleted": set(), "created": False}
    rng = random.Random(9)

    def ids(name):  # the workload's topic ids, known to the check (its own creations get random ones)
        return uuid.uuid5(uuid.NAMESPACE_URL, f"logstore-crash/{name}")

    def produce(store, n, tag):
        for _ in range(n):
            tp = rng.choice(parts)
            log = store.partition(*tp)
            offset = log.log_end_offset
            history[tp].append(value_for(offset, tag))
            assert log.append(history[tp][-1], key=key_for(offset)) == offset
            model["durable"][tp] = offset + 1

    def commit(store):
        positions = {tp: rng.randint(0, len(history[tp])) for tp in parts}
        model["attempted"] = positions
        offset_store(store).commit("g", positions)
        model["committed"] = positions

    def workload():
        store = LogStore(root, maintenance=False, topic_ids=ids, **STORE)
        model["created"] = True
        # Small segments for the offsets topic too (its own default is 100 MiB, preallocated in
        # 8 MiB steps: real allocations on tmpfs, at every one of thousands of reopenings).
        store.create_topic(OFFSETS_TOPIC, 1, internal=True, **dict(OFFSETS_TOPIC_CONFIG, segment_bytes=2048))
        store.create_topic("events", 2)
        model["topics"].add("events")
        produce(store, 12, "a")
        commit(store)
        store.create_topic("audit", 1)
        model["topics"].add("audit")
        store.partition("audit", 0).append(b"x")
        produce(store, 10, "a")
        commit(store)
        model["topics"].discard("audit")
        store.delete_topic("audit")
        model["deleted"].add("audit")
        produce(store, 6, "a")
        store.close()
        store = LogStore(root, maintenance=False, topic_ids=ids, **STORE)
        produce(store, 6, "b")
        commit(store)
        store.close()

    def check(path, oracle, rng):
        where = os.path.join(path, "store")
        if not oracle["created"]:
            return
        with LogStore(where, maintenance=False, **STORE) as store:
            list(store.logs())  # every partition recovers, __consumer_offsets too
            topics = set(store.topics())
            assert oracle["topics"] <= topics, f"topics {sorted(oracle['topics'] - topics)} were created, now gone"
            assert not oracle["deleted"] & topics, f"topics {sorted(oracle['deleted'] & topics)} came back"
            for name in topics - {OFFSETS_TOPIC}:  # a topic keeps the id it was created with
                assert store.topic_id(name) == ids(name), f"topic {name}: id {store.topic_id(name)}, not {ids(name)}"
            if "events" in topics:
                for tp in parts:
                    check_log(store.partition(*tp), history[tp], 0, oracle["durable"][tp], rng, f"{tp}")
            recreated = "audit" not in topics
            if recreated:
                # Deleted, perhaps in a crash half-way, or not created yet: it can be created
                # again, empty, with a new id (no directory of the old one refuses it or lends
                # it records).
                store.create_topic("audit", 1)
                log = store.partition("audit", 0)
                assert log.log_end_offset == 0, f"topic audit created again holds {log.log_end_offset} old records"
                assert store.topic_id("audit") != ids("audit")
            if oracle["committed"] is not None:
                for tp in parts:
                    got = offset_store(store).committed("g", *tp)
                    allowed = {oracle["committed"][tp], oracle["attempted"][tp]}
                    assert got in allowed, f"group g at {tp}: committed {got}, expected one of {allowed}"
            assert not [n for n in os.listdir(where) if n.endswith("-delete")], "a deleted topic's directory is left"
        _verify_clean(where)
        if recreated:
            with LogStore(where, maintenance=False, **STORE) as store:  # and it stays so when opened again
                assert "audit" in store.topics()
                assert store.partition("audit", 0).log_end_offset == 0

    _run(mem_path, "store: topics, appends, commits", workload, lambda: dict(model, topics=set(model["topics"]),
         deleted=set(model["deleted"])), check, depth, minimum_states=1200, max_states_per_point=8)


@pytest.mark.parametrize("depth", DEPTHS)
def test_every_crash_state_of_a_growing_topic_keeps_the_old_count_or_the_new_and_its_config(mem_path, depth):
    """create_partitions, alter_topic_config and alter_defaults: a crash leaves the count, the
    overrides and the dynamic defaults of the last acknowledged change or of the one attempted, every partition below the count
    opens (a new one empty, or with its acknowledged records), and no partition directory lies
    past the count."""
    root = mem_path / "work" / "store"
    model = {"created": False, "counts": (0, 0), "overrides": ({}, {}), "durable": {}, "defaults": ({}, {})}

    def append(store, partition, n):
        log = store.partition("grow", partition)
        for _ in range(n):
            offset = log.log_end_offset
            assert log.append(value_for(offset, "g"), key=key_for(offset)) == offset
            model["durable"][partition] = offset + 1

    def change(store, count=None, overrides=None):
        old_count, old_overrides = model["counts"][1], model["overrides"][1]
        model["counts"] = (old_count, count or old_count)
        model["overrides"] = (old_overrides, overrides if overrides is not None else old_overrides)
        if count is not None:
            store.create_partitions("grow", count)
        if overrides is not None:
            store.alter_topic_config("grow", lambda current: overrides)
        model["counts"] = (model["counts"][1],) * 2
        model["overrides"] = (model["overrides"][1],) * 2

    def workload():
        store = LogStore(root, maintenance=False, **STORE)
        model["created"] = True
        model["counts"] = (0, 1)
        store.create_topic("grow", 1)
        model["counts"] = (1, 1)
        append(store, 0, 5)
        change(store, count=3)
        append(store, 2, 4)
        change(store, overrides={"retention.ms": "123456"})
        change(store, count=5)
        append(store, 4, 3)
        change(store, overrides={"cleanup.policy": "compact", "retention.ms": "654321"})
        model["defaults"] = ({}, {"segment.ms": "777777"})
        store.alter_defaults(lambda current: {"segment.ms": "777777"})
        model["defaults"] = ({"segment.ms": "777777"},) * 2
        store.close()

    def check(path, oracle, rng):
        where = os.path.join(path, "store")
        if not oracle["created"]:
            return
        with LogStore(where, maintenance=False, **STORE) as store:
            if "grow" not in store.topics():
                assert oracle["counts"][0] == 0, "the topic's creation was acknowledged, now it is gone"
                return
            count = store.partitions_for("grow")
            assert count in oracle["counts"], f"{count} partitions, expected one of {oracle['counts']}"
            assert store.dynamic_defaults in oracle["defaults"], f"dynamic defaults {store.dynamic_defaults}"
            overrides = store.describe("grow").overrides
            assert overrides in oracle["overrides"], f"overrides {overrides}, expected one of {oracle['overrides']}"
            for p in range(count):
                log = store.partition("grow", p)
                durable = oracle["durable"].get(p, 0)
                assert log.log_end_offset >= durable, f"partition {p} ends at {log.log_end_offset}, {durable} acked"
                assert log.config == store.describe("grow").config
            stray = [n for n in os.listdir(where) if n.startswith("grow-") and int(n.rsplit("-", 1)[1]) >= count]
            assert not stray, f"partition directories past the count {count}: {stray}"
        _verify_clean(where)

    _run(mem_path, "store: a topic grown and reconfigured", workload,
         lambda: {"created": model["created"], "counts": model["counts"], "overrides": model["overrides"],
                  "durable": dict(model["durable"]), "defaults": model["defaults"]}, check, depth, minimum_states=600, max_states_per_point=8)



@pytest.mark.parametrize("depth", DEPTHS)
def test_every_crash_state_of_giving_a_store_written_before_topic_ids_its_ids_keeps_them_stable(mem_path, depth):
    """A store written before topic ids (no ``topic.id`` in its topic files; ``partition.metadata``
    in no directory, or, for an adopted Kafka topic, in some) is opened: ``_assign_topic_ids``
    writes each topic's id. A crash anywhere in it leaves every topic usable: its partitions
    open (no copy of an id disagrees with the topic file), the records stay, an id found in a
    ``partition.metadata`` is kept, and an id once in a topic file durably is the one kept."""
    root = mem_path / "work" / "store"
    kafka_id = uuid.UUID("5b6e9a4c-1f0e-4b7a-9d1e-2f3a4b5c6d7e")
    with LogStore(root, maintenance=False, **STORE) as store:  # made durably before the recording
        store.create_topic("plain", 2)
        store.create_topic("adopted", 2)
        for topic in ("plain", "adopted"):
            for p in range(2):
                for i in range(3):
                    store.partition(topic, p).append(value_for(i, topic), key=key_for(i))
    for topic in ("plain", "adopted"):
        path = os.path.join(root, ".topics", topic)
        with open(path) as f:
            lines = [line for line in f if not line.startswith("topic.id=")]
        with open(path, "w") as f:
            f.writelines(lines)
        for p in range(2):
            os.unlink(os.path.join(root, f"{topic}-{p}", "partition.metadata"))
    write_partition_metadata(os.path.join(root, "adopted-1"), kafka_id)  # as Kafka wrote it, in one partition

    def ids(name):
        return uuid.uuid5(uuid.NAMESPACE_URL, f"logstore-migration/{name}")

    def workload():
        LogStore(root, maintenance=False, topic_ids=ids, **STORE).close()

    def check(path, oracle, rng):
        where = os.path.join(path, "store")
        before = {t: read_topic_entry(os.path.join(where, ".topics", t)).topic_id for t in ("plain", "adopted")}
        with LogStore(where, maintenance=False, **STORE) as store:
            assert store.topic_id("adopted") == kafka_id, "the id of the adopted topic's partition.metadata is lost"
            for topic in ("plain", "adopted"):
                topic_id = store.topic_id(topic)
                if before[topic] is not None:
                    assert topic_id == before[topic], f"topic {topic}: id {topic_id}, its file said {before[topic]}"
                for p in range(2):
                    log = store.partition(topic, p)
                    assert [r.value for r in log.read(0)] == [value_for(i, topic) for i in range(3)]
                    assert read_partition_metadata(log.path) == topic_id
        with LogStore(where, maintenance=False, **STORE) as store:  # the ids are durable now
            assert {t: store.topic_id(t) for t in ("plain", "adopted")} == \
                {t: read_topic_entry(os.path.join(where, ".topics", t)).topic_id for t in ("plain", "adopted")}
        _verify_clean(where)

    # (a short workload: 13 crash points with 38 states in all, every one of them explored at
    # soak depth)
    _run(mem_path, "store: topic ids given to a store written before them", workload,
         dict, check, depth, minimum_states=36, max_states_per_point=16)

TXN_STORE = dict(segment_bytes=2048, segment_index_bytes=4096, index_interval_bytes=256, flush_messages=1)


@pytest.mark.parametrize("depth", DEPTHS)
def test_every_crash_state_of_a_transaction_stream_leaves_each_transaction_whole(mem_path, depth):
    """A library transactional producer's commits and aborts over two partitions, with a
    consumer group's offsets, the coordinator fsyncing its two-phase commit (TxnConfig.fsync).
    After every crash state, once the coordinator's load finished what was prepared and a new
    producer fenced the old one: each transaction is visible whole or not at all, an
    acknowledged commit is visible with its offsets and an acknowledged abort is not, nothing
    is left open, and the store verifies."""
    from logstore.txn.coordinator import TxnConfig
    from logstore.txn.local import store_coordinator
    from logstore.txn.metadata import TRANSACTION_STATE_TOPIC, TRANSACTION_STATE_TOPIC_CONFIG

    root = mem_path / "work" / "store"
    parts = [("events", 0), ("events", 1)]
    model = {"created": False, "acked": {}, "offsets": None}
    durable = TxnConfig(fsync=True)

    def values(i: int) -> dict[tuple[str, int], list[bytes]]:
        return {tp: [b"t%d-p%d-%d" % (i, tp[1], j) for j in range(2)] for tp in parts}

    def open_store():
        store = LogStore(root, maintenance=False, **TXN_STORE)
        # Small segments for the internal topics (their own are 100 MiB, preallocated in steps).
        store.create_topic(OFFSETS_TOPIC, 1, exist_ok=True, internal=True,
                           **dict(OFFSETS_TOPIC_CONFIG, segment_bytes=2048))
        store.create_topic(TRANSACTION_STATE_TOPIC, 1, exist_ok=True, internal=True,
                           **dict(TRANSACTION_STATE_TOPIC_CONFIG, segment_bytes=2048))
        store_coordinator(store, durable)
        return store

    def workload():
        store = open_store()
        store.create_topic("events", 2, exist_ok=True)
        model["created"] = True
        producer = store.producer(transactional_id="tx")
        for i in range(6):
            producer.begin_transaction()
            for tp, vs in values(i).items():
                for v in vs:
                    producer.send(tp[0], v, partition=tp[1])
            offsets = {tp: 10 * (i + 1) for tp in parts}
            producer.send_offsets_to_transaction(offsets, "g")
            if i % 3 == 1:
                producer.abort_transaction()
                model["acked"] = {**model["acked"], i: False}
            else:
                producer.commit_transaction()
                model["acked"] = {**model["acked"], i: True}
                model["offsets"] = offsets
        producer.close()
        store.close()

    def check(path, oracle, rng):
        where = os.path.join(path, "store")
        if not oracle["created"]:
            return
        with LogStore(where, maintenance=False, **TXN_STORE) as store:
            if "events" not in store.topics():
                assert not oracle["acked"], "acknowledged transactions, but the topic is gone"
                return
            coordinator = store_coordinator(store, durable)
            assert coordinator.drain(20), "the transactions found prepared were not completed"
            store.producer(transactional_id="tx").close()  # fences the old one, aborting what it left open
            assert coordinator.drain(20)
            visible = set()
            for tp in parts:
                log = store.partition(*tp)
                assert log.last_stable_offset == log.log_end_offset, f"{tp}: a transaction is left open"
                visible |= {r.value for r in log.iter(isolation_level="read_committed")}
            for i in range(6):
                mine = {v for vs in values(i).values() for v in vs}
                seen = mine & visible
                assert not seen or seen == mine, f"transaction {i} is partly visible: {sorted(seen)}"
                if i in oracle["acked"]:
                    assert bool(seen) == oracle["acked"][i], f"acknowledged transaction {i} lost its outcome"
            if oracle["offsets"] is not None:
                got = {tp: offset_store(store).committed("g", *tp) for tp in parts}
                later = [{tp: 10 * (i + 1) for tp in parts} for i in range(6)]
                assert got == oracle["offsets"] or got in later, f"group g committed {got}, acknowledged {oracle['offsets']}"
        _verify_clean(where)

    _run(mem_path, "store: transactions", workload, lambda: dict(model, acked=dict(model["acked"])), check, depth,
         minimum_states=300, max_states_per_point=6, random_states=2)


# ---------------------------------------------------------------------------- findings
def _explore_call(mem_path, name: str, setup, action, check, cap: int = 24, minimum_states: int = 50) -> Report:
    """Run ``setup(root)`` with the plain FileOps, then explore every crash point of
    ``action(root)`` (oracle: None) as _run does."""
    root = mem_path / "work"
    root.mkdir()
    setup(root)
    return _run(mem_path, name, lambda: action(root), lambda: None, check, "ci", minimum_states,
                max_states_per_point=cap, random_states=8)


@pytest.mark.regression(reason=("fixed: retention renamed the doomed segments .deleted and fsynced the directory "
    "once, then wrote the new log start; a file system that persisted a later rename and not an "
    "earlier one left a hole in the log (offsets 32..41 gone, 21..31 readable)"))
@pytest.mark.parametrize("how", ["enforce_retention", "delete_records_before"])
def test_retention_leaves_no_hole_whatever_order_its_renames_reach_the_disk(mem_path, how):
    config = dict(SMALL, flush_messages=1, retention_bytes=2500)
    history: list[bytes] = []

    def setup(root):
        with Log.open(str(root / "t-0"), **config) as log:
            while len(log.segments) < 7:
                history.append(value_for(len(history), "r"))
                log.append(history[-1], key=key_for(len(history) - 1))

    def action(root):
        with Log.open(str(root / "t-0"), **config) as log:
            if how == "enforce_retention":
                assert log.enforce_retention() >= 3
            else:
                log.delete_records_before(log.segments[4].base_offset + 1)

    def check(path, oracle, rng):
        with Log.open(os.path.join(path, "t-0"), **config) as log:
            check_log(log, history, (0, len(history)), len(history), rng)

    _explore_call(mem_path, f"retention: {how}", setup, action, check)


@pytest.mark.regression(reason=("fixed: a compaction swap renamed the old segments .deleted and the .swap live with "
    "one directory fsync after both; a file system that persisted the .swap rename and not an old "
    "segment's left the cleaned segment next to one it replaced (offsets going backwards)"))
def test_a_compaction_swap_is_atomic_whatever_order_its_renames_reach_the_disk(mem_path):
    config = dict(COMPACTED)
    history: list[tuple[int, bytes, bytes | None]] = []

    def setup(root):
        # A first pass leaves small cleaned segments; the next pass merges several into one
        # (a swap that replaces more than one old segment).
        rng = random.Random(2)
        with Log.open(str(root / "table-0"), **config) as log:
            for round in range(2):
                for i in range(60):
                    key, value = b"k%d" % rng.randrange(6), b"v%d.%d" % (round, i)
                    history.append((log.append(value, key=key), key, value))
                log.roll()
                if round == 0:
                    log.compact()

    def action(root):
        with Log.open(str(root / "table-0"), **config) as log:
            assert log.compact().segments_cleaned >= 2

    def check(path, oracle, rng):
        partition = os.path.join(path, "table-0")
        with Log.open(partition, **config) as log:
            got = [(r.offset, r.key, r.value) for r in log.iter()]
        _verify_clean(partition)
        offsets = [o for o, _, _ in got]
        assert offsets == sorted(set(offsets)), "offsets repeat or go back"
        assert set(got) <= set(history)
        assert {k: o for o, k, _ in got} == {k: o for o, k, _ in history}, "a key lost its latest value"

    _explore_call(mem_path, "a compaction swap", setup, action, check)


def test_a_compaction_pass_carrying_txnindex_entries_keeps_aborted_records_hidden_after_any_power_loss(mem_path):
    """The power-loss states of a pass that carries an aborted transaction's ``.txnindex`` entry
    into its cleaned segment (the swap's order: ``.log.swap`` renamed live is the commit point,
    the new ``.txnindex`` follows once that is durable): after any of them read_committed shows
    no aborted record and every key's latest committed value, and so does a next pass (which
    must not take the aborted record for its key's latest). The forked-child sweep in
    test_compaction_crash.py stops the same pass at every file operation."""
    from crashcheck import TXN_COMPACTED, build_transactional_compacted, check_transactional_compacted

    history: list[tuple[int, bytes, bytes]] = []

    def setup(root):
        history.extend(build_transactional_compacted(str(root / "t-0")))

    def action(root):
        with Log.open(str(root / "t-0"), **TXN_COMPACTED) as log:
            report = log.compact()
            assert (report.segments_cleaned, report.cleaned_up_to) == (1, 40)

    def check(path, oracle, rng):
        check_transactional_compacted(os.path.join(path, "t-0"), history, "after a power loss")

    report = _explore_call(mem_path, "a compaction pass carrying .txnindex entries", setup, action, check, cap=8)
    assert {"fsync_dir t-0"} <= report.kinds


@pytest.mark.regression(reason=("fixed: a new store's root directory (and a new log's directory) were created without "
    "fsyncing the parent, so a power loss could take a whole store away after create_topic and "
    "appends had returned as durable"))
def test_a_new_store_and_a_new_log_survive_a_power_loss_once_their_first_write_is_acknowledged(mem_path):
    def action(root):
        with LogStore(str(root / "a" / "store"), maintenance=False, **STORE) as store:
            store.create_topic("t", 1)
            store.partition("t", 0).append(b"acknowledged")
        with Log.open(str(root / "b" / "log-0"), flush_messages=1, segment_index_bytes=4096) as log:
            log.append(b"acknowledged")

    root = mem_path / "work"
    root.mkdir()
    recorder = Recorder(root, lambda: None)
    with _fileio.install(recorder):
        action(root)
    durable = recorder.durable_names(str(root))
    assert {"a", "b"} <= durable
    assert "store" in recorder.durable_names(str(root / "a")) and "log-0" in recorder.durable_names(str(root / "b"))
    assert recorder.durable_names(str(root / "a" / "store" / ".topics")) == {"t"}
