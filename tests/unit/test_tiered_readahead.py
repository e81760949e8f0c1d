"""logstore.tiered.manager.ReadAheadBuffers: what sequential remote readers keep between reads,
per partition, bounded in bytes (least recently used partitions dropped first)."""

from __future__ import annotations

import uuid

from logstore.tiered.manager import ReadAheadBuffers
from logstore.tiered.metadata import TopicIdPartition

TOPIC = uuid.uuid4()


def tp(n):
    return TopicIdPartition(TOPIC, "t", n)


def test_take_returns_what_was_put_once():
    buffers = ReadAheadBuffers(100)
    buffers.put(tp(0), "tail", "ahead", 30)
    assert buffers.size_in_bytes == 30
    assert buffers.take(tp(0)) == ("tail", "ahead")
    assert buffers.take(tp(0)) == (None, None) and buffers.size_in_bytes == 0


def test_the_least_recently_used_partitions_go_first_past_the_bound():
    buffers = ReadAheadBuffers(100)
    for n in range(3):
        buffers.put(tp(n), f"tail{n}", None, 40)
    assert buffers.size_in_bytes == 80  # partition 0 dropped
    assert buffers.take(tp(0)) == (None, None)
    assert buffers.take(tp(1)) == ("tail1", None) and buffers.take(tp(2)) == ("tail2", None)


def test_a_partition_over_the_bound_alone_keeps_nothing_and_a_replaced_entry_is_counted_once():
    buffers = ReadAheadBuffers(100)
    buffers.put(tp(0), "small", None, 10)
    buffers.put(tp(0), "smaller", None, 5)
    assert buffers.size_in_bytes == 5
    buffers.put(tp(1), "huge", None, 500)
    assert buffers.size_in_bytes == 0 and buffers.take(tp(1)) == (None, None)
