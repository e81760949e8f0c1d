"""A log with tiered storage (remote.storage.enable), driven with an in-memory remote tier: local
retention deletes only copied segments and keeps the log start; every reader (read, point reads,
iter, read_raw, read_arrow, read_committed, offset_for_timestamp) reads the same records across
the boundary between remote and local segments; read_region refuses remote offsets; a reopened
log keeps its start below the local segments and reads them once a tier is attached again."""

from __future__ import annotations

import os

import pytest

from logstore import Log, LogConfig, OffsetMovedToTieredStorageError, OffsetOutOfRangeError
from logstore.errors import InvalidConfigError
from logstore.index import AbortedTxn
from logstore.log.remote import RemoteTier
from logstore.records.batch import batch_headers, validate_batch


class MemoryTier(RemoteTier):
    """The copied segments' bytes, kept in memory (the test's stand-in for the object store)."""

    def __init__(self):
        self.segments: list[tuple[int, int, bytes]] = []  # (base, last offset, the .log bytes)
        self.aborted: list[AbortedTxn] = []
        self.reads = 0

    def copy(self, path, base, last):
        with open(path, "rb") as f:
            data = f.read()
        end = 0
        for position, header in batch_headers(data):
            end = position + header.size
        self.segments.append((base, last, data[:end]))

    def start_offset(self):
        return self.segments[0][0] if self.segments else None

    def copied_through(self):
        return self.segments[-1][1] if self.segments else -1

    def read_raw(self, offset, max_bytes):
        self.reads += 1
        for base, last, data in self.segments:
            if base <= offset <= last:
                out_start = out_end = None
                for position, header in batch_headers(data):
                    if header.last_offset < offset:
                        continue
                    validate_batch(data, position)
                    if out_start is None:
                        out_start = position
                    elif position - out_start >= max_bytes:
                        break
                    out_end = position + header.size
                return data[out_start:out_end] if out_start is not None else b""
        return b""

    def offset_for_timestamp(self, timestamp, start_offset):
        for _, _, data in self.segments:
            for _, header in batch_headers(data):
                if header.max_timestamp >= timestamp:
                    from logstore.records.batch import RecordDecoder
                    records, _ = RecordDecoder().decode(data, 0, len(data), header.base_offset, header.last_offset + 1,
                                                        None, "mem")
                    for r in records:
                        if r.timestamp >= timestamp and r.offset >= start_offset:
                            return r.offset
        return None

    def aborted_transactions(self, start, upper):
        return [t for t in self.aborted if t.last_offset >= start and t.first_offset < upper]

    def size_in_bytes(self):
        return sum(len(d) for _, _, d in self.segments)

    def max_timestamp(self):
        return max((h.max_timestamp for _, _, d in self.segments for _, h in batch_headers(d)), default=-1)


CONFIG = dict(segment_bytes=4096, remote_storage_enable=True, local_retention_bytes=0, retention_bytes=-1,
              retention_ms=-1, local_retention_ms=-1)


def copy_sealed(log, tier):
    for info in log.segments[:-1]:
        if info.base_offset > tier.copied_through():
            nxt = [s.base_offset for s in log.segments if s.base_offset > info.base_offset][0]
            tier.copy(os.path.join(log.path, f"{info.base_offset:020d}.log"), info.base_offset, nxt - 1)


def filled(tmp_path, n=400):
    log = Log.open(tmp_path / "t-0", LogConfig(**CONFIG))
    for i in range(n):
        log.append(f"value-{i:05d}".encode() * 3, key=f"k{i}".encode(), timestamp=1_000_000 + i)
    return log


def tiered(tmp_path):
    """A filled log whose sealed segments were copied to a MemoryTier and left the local disk."""
    log = filled(tmp_path)
    tier = MemoryTier()
    log.attach_remote(tier)
    copy_sealed(log, tier)
    log.enforce_retention()
    return log, tier


def test_settings_follow_kafkas_rules():
    with pytest.raises(InvalidConfigError, match="compact"):
        LogConfig(remote_storage_enable=True, cleanup_policy="compact")
    with pytest.raises(InvalidConfigError, match="local_retention_ms"):
        LogConfig(retention_ms=1000, local_retention_ms=2000)
    with pytest.raises(InvalidConfigError, match="local_retention_bytes"):
        LogConfig(retention_bytes=1000, local_retention_bytes=-1)
    assert LogConfig(retention_ms=5000).local_retention_ms_effective == 5000
    assert LogConfig.from_kafka({"remote.storage.enable": "true", "local.retention.ms": "10"}).remote_storage_enable


def test_local_retention_deletes_only_copied_segments_and_keeps_the_log_start(tmp_path):
    log = filled(tmp_path)
    tier = MemoryTier()
    log.attach_remote(tier)
    assert len(log.segments) > 4
    before = [(r.offset, r.key, r.value, r.timestamp) for r in log.iter()]
    assert log.enforce_retention() == 0  # nothing copied: nothing may go
    sealed = len(log.segments) - 1
    # copy all but the last two sealed segments
    infos = log.segments
    for info, nxt in zip(infos[:sealed - 2], infos[1:sealed - 1]):
        tier.copy(os.path.join(log.path, f"{info.base_offset:020d}.log"), info.base_offset, nxt.base_offset - 1)
    assert log.enforce_retention() == sealed - 2
    assert log.log_start_offset == 0
    assert log.local_log_start_offset == tier.copied_through() + 1 > 0
    after = [(r.offset, r.key, r.value, r.timestamp) for r in log.iter()]
    assert after == before
    log.close()


def test_every_reader_crosses_the_boundary(tmp_path):
    pa = pytest.importorskip("pyarrow")
    log, tier = tiered(tmp_path)
    local = log.local_log_start_offset
    assert local > 50 and len(log.segments) == 1
    # point reads on both sides, and the general read
    for offset in (0, 1, local - 1, local, 399):
        (r,) = log.read(offset, max_records=1)
        assert r.offset == offset and r.value == f"value-{offset:05d}".encode() * 3
    records = log.read(local - 3, max_bytes=1 << 20)
    assert records[0].offset == local - 3 and len(records) >= 3
    # iteration, read_committed, raw reads
    assert [r.offset for r in log.iter()] == list(range(400))
    assert [r.offset for r in log.iter(isolation_level="read_committed")] == list(range(400))
    raw = log.read_raw(5)
    assert next(batch_headers(raw))[1].base_offset <= 5
    with pytest.raises(OffsetMovedToTieredStorageError) as err:
        log.read_region(5)
    assert err.value.local_log_start_offset == local
    region = log.read_region(local)
    region.close()
    # Arrow, from the remote tier into the local segments
    table = log.read_arrow()
    assert table.num_rows == 400 and table.column("offset").to_pylist() == list(range(400))
    assert table.column("value").to_pylist()[7] == b"value-00007" * 3
    assert log.read_arrow(local - 5, local + 5).num_rows == 10
    assert isinstance(table, pa.Table)
    # timestamps: found in the remote tier first
    assert log.offset_for_timestamp(1_000_000 + 3) == 3
    assert log.offset_for_timestamp(1_000_000 + local + 1) == local + 1
    assert tier.reads > 0
    log.close()


def test_a_reopened_log_keeps_its_start_below_the_local_segments(tmp_path):
    log, tier = tiered(tmp_path)
    local = log.local_log_start_offset
    log.close()
    log = Log.open(tmp_path / "t-0", LogConfig(**CONFIG))
    try:
        assert log.log_start_offset == 0 and log.local_log_start_offset == local
        with pytest.raises(OffsetMovedToTieredStorageError, match="no remote tier attached"):
            log.read(3)
        with pytest.raises(OffsetMovedToTieredStorageError):
            log.read(3, max_records=1)  # the point read's short path declines, the general one reports
        assert log.read(local, max_records=1)[0].offset == local
        log.attach_remote(tier)
        assert log.read(3, max_records=1)[0].offset == 3
        # DeleteRecords still moves the start, and below it nothing is read
        log.delete_records_before(10)
        with pytest.raises(OffsetOutOfRangeError):
            log.read(9)
        assert log.read(10, max_records=1)[0].offset == 10
    finally:
        log.close()


def test_an_empty_remote_tier_moves_the_start_up_to_the_local_segments(tmp_path):
    log, tier = tiered(tmp_path)
    local = log.local_log_start_offset
    log.close()
    log = Log.open(tmp_path / "t-0", LogConfig(**CONFIG))
    try:
        log.attach_remote(MemoryTier())  # the remote segments are gone (e.g. lost with their store)
        assert log.log_start_offset == local
    finally:
        log.close()


def test_a_log_without_remote_storage_refuses_a_tier(tmp_path):
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=4096))
    try:
        with pytest.raises(ValueError, match="remote.storage.enable"):
            log.attach_remote(MemoryTier())
    finally:
        log.close()


def test_aborted_transactions_of_remote_segments_are_listed(tmp_path):
    log, tier = tiered(tmp_path)
    tier.aborted.append(AbortedTxn(7, 3, 9, 3))
    assert log.aborted_transactions(0, 20) == [AbortedTxn(7, 3, 9, 3)]
    assert log.aborted_transactions(10, 20) == []
    log.close()


def test_segments_to_copy_stop_at_the_high_watermark_and_name_their_files(tmp_path):
    log = filled(tmp_path)
    try:
        log.assign_leader_epoch(3)
        log.append(b"x")
        sealed = log.segments[:-1]
        found = log.segments_to_copy(0)
        assert [c.base_offset for c in found] == [s.base_offset for s in sealed]
        for c, nxt in zip(found, log.segments[1:]):
            assert c.end_offset == nxt.base_offset - 1 and os.path.exists(c.log_path)
            assert os.path.getsize(c.log_path) == c.size and c.offset_index_path.endswith(".index")
            assert c.txn_index_path is None
        assert found[0].leader_epoch_checkpoint.startswith(b"0\n")
        assert log.segments_to_copy(found[2].base_offset)[0].base_offset == found[2].base_offset
        log.high_watermark = found[3].end_offset  # the fourth segment's last record not yet replicated
        assert [c.base_offset for c in log.segments_to_copy(0)] == [c.base_offset for c in found[:3]]
    finally:
        log.close()
