"""kafkaproducerids.ProducerIds: InitProducerId's ids never repeat across restarts, across processes
sharing a store, or with the producers of an adopted Kafka log directory."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from logstore.errors import LogstoreError
from logstore.txn.producerids import PRODUCER_IDS_FILE, ProducerIds
from logstore.log.producerstate import ProducerStateTable


def test_blocks_are_durable_and_restarts_never_repeat_an_id(tmp_path):
    first = ProducerIds(str(tmp_path))
    ids = [first.next_id() for _ in range(3)]
    assert ids == [0, 1, 2]
    assert (tmp_path / PRODUCER_IDS_FILE).read_text() == "1000\n"  # the block's end, before its first id
    again = ProducerIds(str(tmp_path))  # a restart skips the rest of the block
    assert again.next_id() == 1000
    assert (tmp_path / PRODUCER_IDS_FILE).read_text() == "2000\n"


def test_a_damaged_block_file_is_an_error_naming_it(tmp_path):
    (tmp_path / PRODUCER_IDS_FILE).write_text("12x\n")
    with pytest.raises(LogstoreError, match=PRODUCER_IDS_FILE):
        ProducerIds(str(tmp_path)).next_id()


def _take(root, n, queue):
    ids = ProducerIds(root)
    queue.put([ids.next_id() for _ in range(n)])


def test_processes_sharing_a_store_never_take_the_same_block(tmp_path):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_take, args=(str(tmp_path), 2500, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    flat = [i for ids in got for i in ids]
    assert len(flat) == len(set(flat)) == 10_000
    assert int((tmp_path / PRODUCER_IDS_FILE).read_text()) == 12_000  # 4 processes x 3 blocks


def test_the_first_block_starts_above_the_producers_of_adopted_snapshots(tmp_path):
    # Kafka-format snapshots as a broker leaves them: the newest one of each partition counts.
    for partition, (old, new) in enumerate([(70_000, 4_242), (9, 17)]):
        directory = tmp_path / f"orders-{partition}"
        directory.mkdir()
        for offset, pid in ((10, old), (20, new)):
            table = ProducerStateTable()
            table.record(pid, 0, 0, 4, offset - 5, offset - 1)
            (directory / f"{offset:020d}.snapshot").write_bytes(table.to_snapshot())
    (tmp_path / "broken-0").mkdir()
    (tmp_path / "broken-0" / f"{5:020d}.snapshot").write_bytes(b"not a snapshot")
    assert ProducerIds(str(tmp_path)).next_id() == 4_243  # 70,000 is in an older snapshot
    assert ProducerIds(str(tmp_path)).next_id() == 5_243  # then the file rules
    assert os.path.exists(tmp_path / ".lock-kafka-producer-ids")


def test_a_store_without_the_file_starts_at_the_floor_it_is_given(tmp_path):
    """A replica set's node gives the clock as the floor: wiped and restarted, it never hands
    out again an id it gave before (the set's other nodes keep those producers' sequences)."""
    clock = iter([5_000, 7_000])
    before = ProducerIds(str(tmp_path / "node"), first_at_least=lambda: next(clock))
    (tmp_path / "node").mkdir()
    given = [before.next_id() for _ in range(1500)]  # two blocks
    assert given[0] == 5_000 and given[-1] == 6_499
    wiped = tmp_path / "node"
    for name in os.listdir(wiped):
        os.unlink(wiped / name)
    after = ProducerIds(str(wiped), first_at_least=lambda: next(clock))
    assert after.next_id() == 7_000
    again = ProducerIds(str(wiped), first_at_least=lambda: 0)  # the file wins over the floor
    assert again.next_id() == 8_000
