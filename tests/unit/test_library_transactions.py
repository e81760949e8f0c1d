"""The library's own transactional producer (``store.producer(transactional_id=...)``): commit
and abort, a consume-transform-produce loop with ``send_offsets_to_transaction`` that is exactly
once, misuse, and fencing and takeover across processes sharing the store."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from logstore import InvalidTxnStateError, LogStore, ProducerFencedError
from logstore.groups.offsets import offset_store
from logstore.txn.coordinator import TxnConfig
from logstore.txn.local import store_coordinator

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def committed(store, topic):
    return [r.value for p in range(store.partitions_for(topic))
            for r in store.partition(topic, p).iter(isolation_level="read_committed")]


def test_commit_and_abort(tmp_path):
    with LogStore(tmp_path / "s") as store:
        store.create_topic("t", 2)
        with store.producer(transactional_id="tx") as p:
            p.begin_transaction()
            for i in range(10):
                p.send("t", b"kept %d" % i, partition=i % 2)
            p.commit_transaction()
            p.begin_transaction()
            p.send("t", b"dropped", partition=0)
            p.abort_transaction()
            p.begin_transaction()
            p.send("t", b"open at close", partition=1)
        assert sorted(committed(store, "t")) == sorted(b"kept %d" % i for i in range(10))
        for part in range(2):  # closing inside the transaction aborted it: nothing is left open
            log = store.partition("t", part)
            assert log.last_stable_offset == log.log_end_offset and log.producer_transactions() == {}
        assert len(store.partition("t", 0).aborted_transactions(0, 100)) == 1


def test_consume_transform_produce_is_exactly_once(tmp_path):
    with LogStore(tmp_path / "s") as store:
        store.create_topic("in", 3)
        store.create_topic("out", 3)
        for i in range(300):
            store.partition("in", i % 3).append(b"%d" % i)
        producer = store.producer(transactional_id="eos")
        consumer = store.consumer("g", "in", isolation_level="read_committed", enable_auto_commit=False)
        done, rounds = 0, 0
        while done < 300:
            records = consumer.poll(1.0, max_records=40)
            if not records:
                continue
            rounds += 1
            producer.begin_transaction()
            for r in records:
                producer.send("out", b"%d" % (10 * int(r.value)), partition=r.partition)
            producer.send_offsets_to_transaction(consumer)
            if rounds % 3 == 0:  # abort every third: its output never shows, its input is read again
                producer.abort_transaction()
                for topic, part in consumer.assignment():
                    consumer.seek(topic, part, offset_store(store).committed("g", topic, part) or 0)
                continue
            producer.commit_transaction()
            done += len(records)
        assert sorted(int(v) for v in committed(store, "out")) == [10 * i for i in range(300)]
        assert [offset_store(store).committed("g", "in", p) for p in range(3)] == [100, 100, 100]
        producer.close()
        consumer.close()


def test_misuse_is_refused_with_a_clear_error(tmp_path):
    with LogStore(tmp_path / "s") as store:
        store.create_topic("t", 1)
        plain = store.producer()
        with pytest.raises(InvalidTxnStateError, match="not a transactional producer"):
            plain.begin_transaction()
        p = store.producer(transactional_id="tx")
        with pytest.raises(InvalidTxnStateError, match="no transaction is open"):
            p.send("t", b"outside")
        with pytest.raises(InvalidTxnStateError, match="no transaction is open"):
            p.commit_transaction()
        p.begin_transaction()
        with pytest.raises(InvalidTxnStateError, match="open already"):
            p.begin_transaction()
        with pytest.raises(ValueError):
            p.send_offsets_to_transaction({("t", 0): 1})  # offsets need a group
        p.abort_transaction()  # nothing was sent: ended without the coordinator, nothing written
        assert store.partition("t", 0).log_end_offset == 0
        with pytest.raises(Exception, match="non-empty str"):
            store.producer(transactional_id="")


def test_a_second_producer_fences_the_first(tmp_path):
    with LogStore(tmp_path / "s") as store:
        store.create_topic("t", 1)
        first = store.producer(transactional_id="shared")
        first.begin_transaction()
        first.send("t", b"zombie").result()  # written, in the open transaction
        second = store.producer(transactional_id="shared")  # aborts the first one's transaction
        second.begin_transaction()
        second.send("t", b"fresh")
        second.commit_transaction()
        with pytest.raises(ProducerFencedError):
            first.send("t", b"late")
            first.commit_transaction()
        assert committed(store, "t") == [b"fresh"]


def _child(root: str, body: str) -> subprocess.Popen:
    script = textwrap.dedent("""
        import os, sys, time
        from logstore import LogStore
        root = sys.argv[1]
    """) + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(SRC))
    return subprocess.Popen([sys.executable, "-c", script, root], env=env, stdout=subprocess.PIPE, text=True)


def test_a_producer_in_another_process_fences_this_one(tmp_path):
    root = str(tmp_path / "s")
    with LogStore(root) as store:
        store.create_topic("t", 1)
        zombie = store.producer(transactional_id="worker")
        zombie.begin_transaction()
        zombie.send("t", b"from the zombie").result()
        child = _child(root, """
            with LogStore(root) as store:
                p = store.producer(transactional_id="worker")
                p.begin_transaction()
                p.send("t", b"from the other process")
                p.commit_transaction()
            print("committed", flush=True)
        """)
        assert child.stdout.readline().strip() == "committed"
        assert child.wait(60) == 0
        with pytest.raises(ProducerFencedError):
            zombie.send("t", b"late")
            zombie.commit_transaction()
        assert committed(store, "t") == [b"from the other process"]


def test_a_transaction_prepared_by_a_process_that_died_is_completed_by_another(tmp_path):
    """The writer dies after its PrepareCommit record, before any marker: another process's
    coordinator completes the commit once it has stayed prepared past takeover_ms."""
    root = str(tmp_path / "s")
    with LogStore(root) as store:
        store.create_topic("t", 2)
    child = _child(root, """
        from logstore.txn.local import LocalMarkers
        LocalMarkers.__call__ = lambda *args: os._exit(9)  # dies where the markers would be written
        store = LogStore(root)
        p = store.producer(transactional_id="dies")
        p.begin_transaction()
        p.send("t", b"a", partition=0)
        p.send("t", b"b", partition=1)
        p.commit_transaction()
    """)
    assert child.wait(60) == 9
    with LogStore(root) as store:
        coordinator = store_coordinator(store, TxnConfig(takeover_ms=200))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and coordinator.describe(["dies"])[0].state != "CompleteCommit":
            time.sleep(0.05)
        assert coordinator.describe(["dies"])[0].state == "CompleteCommit"
        assert sorted(committed(store, "t")) == [b"a", b"b"]
        for part in range(2):
            log = store.partition("t", part)
            assert log.last_stable_offset == log.log_end_offset


def test_no_send_once_the_commit_began_and_a_failed_commit_can_be_aborted(tmp_path):
    with LogStore(tmp_path / "s") as store:
        store.create_topic("t", 1)
        p = store.producer(transactional_id="tx")
        p.begin_transaction()
        p.send("t", b"a")
        p._txn.start_ending()  # (as commit_transaction does before it flushes)
        with pytest.raises(InvalidTxnStateError, match="being committed or aborted"):
            p.send("t", b"too late")
        p.abort_transaction()  # ending may be tried again
        assert committed(store, "t") == [] and store.partition("t", 0).last_stable_offset == 2
        p.begin_transaction()
        p.send("t", b"b")
        p.commit_transaction()
        assert committed(store, "t") == [b"b"]


def test_transaction_fsync_makes_the_coordinator_fsync(tmp_path):
    with LogStore(tmp_path / "s", transaction_fsync=True) as store:
        store.create_topic("t", 1)
        p = store.producer(transactional_id="tx")
        assert store_coordinator(store).config.fsync
        p.begin_transaction()
        p.send("t", b"x")
        p.commit_transaction()
        assert committed(store, "t") == [b"x"]
    with LogStore(tmp_path / "plain") as store:
        assert not store_coordinator(store).config.fsync
