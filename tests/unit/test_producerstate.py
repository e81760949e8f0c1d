"""ProducerStateTable: each producer's last batch, learnt from batch headers, forgotten on
truncation, rebuilt from a log."""

from __future__ import annotations

import ast
import doctest
import pathlib

from logstore import Log, producerstate
from logstore.producerstate import ProducerBatch, ProducerStateTable
from logstore.records import BatchBuilder


def batch(values, producer_id=-1, base_sequence=-1):
    return bytes(BatchBuilder().build(values, producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                      base_sequence=base_sequence))


def test_docstring_examples():
    result = doctest.testmod(producerstate)
    assert result.attempted > 0 and result.failed == 0


def test_a_retry_is_recognised_by_producer_id_and_base_sequence_only():
    table = ProducerStateTable()
    table.record(5, 0, 10, 11)
    assert table.duplicate_of(5, 0) == ProducerBatch(0, 10, 11)
    assert table.duplicate_of(5, 2) is None     # the next batch of the producer
    assert table.duplicate_of(6, 0) is None     # another producer
    table.record(5, 2, 12, 12)
    assert table.duplicate_of(5, 0) is None     # only the last batch is kept
    assert table.last_batch(5) == ProducerBatch(2, 12, 12)


def test_batches_without_a_producer_id_or_sequence_are_not_tracked():
    table = ProducerStateTable()
    table.record(-1, 0, 0, 0)
    table.record(3, -1, 0, 0)
    assert len(table) == 0 and table.duplicate_of(-1, -1) is None


def test_truncation_forgets_producers_whose_last_batch_reaches_the_new_end():
    table = ProducerStateTable()
    table.record(1, 0, 0, 4)
    table.record(2, 0, 5, 9)
    table.forget_from(9)
    assert list(table) == [1]
    table.forget_from(0)
    assert len(table) == 0


def test_rebuilt_from_a_logs_batch_headers(tmp_path):
    log = Log.open(str(tmp_path / "p-0"))
    try:
        first = log.append_encoded(batch([b"a", b"b"], producer_id=7, base_sequence=0))
        log.append_encoded(batch([b"plain"]))
        second = log.append_encoded(batch([b"c"], producer_id=7, base_sequence=2))
        other = log.append_encoded(batch([b"d"], producer_id=8, base_sequence=0))
        table = ProducerStateTable.rebuild(log, chunk_bytes=100)   # several reads
        assert {pid: table.last_batch(pid) for pid in table} == {
            7: ProducerBatch(2, second, second), 8: ProducerBatch(0, other, other)}
        assert first == 0
        # What a follower copies is learnt the same way.
        copied = ProducerStateTable()
        copied.record_batches(log.read_raw(0, 1 << 20))
        assert {pid: copied.last_batch(pid) for pid in copied} == {pid: table.last_batch(pid) for pid in table}
    finally:
        log.close()


def test_producerstate_imports_nothing_above_the_log_layer():
    tree = ast.parse(pathlib.Path(producerstate.__file__).read_text())
    ours = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level > 0}
    assert ours <= {"records", "errors"}
