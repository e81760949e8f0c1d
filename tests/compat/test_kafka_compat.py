"""Kafka compatibility both ways, checked with an independent decoder and a Kafka-written file.

kafka-python's ``kafka.record`` is a pure-Python implementation of Kafka's record format written
without reference to logstore; it is a test-only dependency. The fixture in
``../shared/fixtures/kafka/`` was written by Apache Kafka itself.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from logstore import Log, TimestampType
from logstore.records import compression

kafka_records = pytest.importorskip("kafka.record")
from kafka.record import MemoryRecords  # noqa: E402
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402

# A copy of ../shared/fixtures/kafka/ kept in the repository so that a clean clone tests it.
FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "kafka"

CODECS = {
    "none": DefaultRecordBatchBuilder.CODEC_NONE if hasattr(DefaultRecordBatchBuilder, "CODEC_NONE") else 0,
    "gzip": 1,
    "snappy": 2,
    "lz4": 3,
    "zstd": 4,
}
AVAILABLE = [name for name, code in CODECS.items() if code in compression.available_codecs()]


def _records(n: int) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]]:
    out = []
    for i in range(n):
        key = None if i % 7 == 3 else f"key-{i}".encode()
        value = None if i % 11 == 5 else (f'{{"n": {i}, "pad": "' + "x" * (i % 50) + '"}').encode()
        headers = [("h", f"{i}".encode())] if i % 4 == 0 else []
        out.append((key, value, headers, 1_700_000_000_000 + i))
    return out


def _segment_files(path: pathlib.Path) -> list[pathlib.Path]:
    return sorted(path.glob("*.log"))


def _decode_with_kafka_python(data: bytes) -> list[tuple[int, int, bytes | None, bytes | None, list]]:
    records = MemoryRecords(data)
    out = []
    while True:
        batch = records.next_batch()
        if batch is None:
            break
        assert batch.validate_crc(), "kafka-python rejects our CRC"
        assert batch.magic == 2
        for record in batch:
            out.append((record.offset, record.timestamp, record.key, record.value,
                        [(k, v) for k, v in record.headers]))
    return out


@pytest.mark.parametrize("codec", AVAILABLE)
def test_segments_we_write_decode_with_kafka_python(tmp_path: pathlib.Path, codec: str) -> None:
    data = _records(300)
    with Log.open(tmp_path / "compat-0", segment_bytes=8192) as log:
        for i in range(0, 100):
            key, value, headers, ts = data[i]
            log.append(value, key=key, headers=headers, timestamp=ts)
        for start in range(100, 300, 50):
            chunk = data[start : start + 50]
            log.append_batch([c[1] for c in chunk], keys=[c[0] for c in chunk],
                             headers=[c[2] for c in chunk], timestamps=[c[3] for c in chunk],
                             compression=codec)
    decoded = []
    files = _segment_files(tmp_path / "compat-0")
    assert len(files) > 1, "the test should span several segments"
    for f in files:
        decoded += _decode_with_kafka_python(f.read_bytes())
    assert [d[0] for d in decoded] == list(range(300))
    for (offset, ts, key, value, headers), (ekey, evalue, eheaders, ets) in zip(decoded, data):
        assert (key, value, ts) == (ekey, evalue, ets), offset
        assert headers == eheaders


@pytest.mark.parametrize("codec", AVAILABLE)
def test_batches_built_by_kafka_python_read_back_through_log(tmp_path: pathlib.Path, codec: str) -> None:
    data = _records(120)
    # Build three batches with kafka-python and splice them into a segment file.
    blob = bytearray()
    offset = 0
    for start in (0, 40, 80):
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=CODECS[codec], is_transactional=False,
                                            producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                            batch_size=1 << 20)
        for i in range(start, start + 40):
            key, value, headers, ts = data[i]
            builder.append(i - start, timestamp=ts, key=key, value=value, headers=headers)
        batch = bytearray(builder.build())
        batch[0:8] = offset.to_bytes(8, "big")  # base offset lies outside the CRC
        offset += 40
        blob += batch
    part = tmp_path / "fromkafka-0"
    part.mkdir()
    (part / "00000000000000000000.log").write_bytes(bytes(blob))
    with Log.open(part) as log:
        assert log.recovery_report.bytes_truncated == 0
        assert log.log_end_offset == 120
        got = list(log.iter())
    assert [r.offset for r in got] == list(range(120))
    for r, (key, value, headers, ts) in zip(got, data):
        assert (r.key, r.value, r.timestamp, r.timestamp_type) == (key, value, ts, TimestampType.CREATE_TIME)
        assert r.headers == headers


def test_appends_continue_after_kafka_python_batches(tmp_path: pathlib.Path) -> None:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i in range(5):
        builder.append(i, timestamp=1000 + i, key=None, value=b"k%d" % i, headers=[])
    part = tmp_path / "mixed-0"
    part.mkdir()
    (part / "00000000000000000000.log").write_bytes(bytes(builder.build()))
    with Log.open(part) as log:
        assert log.append(b"ours") == 5
    with Log.open(part) as log:
        assert [r.value for r in log.iter()] == [b"k0", b"k1", b"k2", b"k3", b"k4", b"ours"]
    # The old timestamps (1000 ms) make segment.ms roll the segment first, as Kafka would.
    decoded = []
    for f in _segment_files(part):
        decoded += _decode_with_kafka_python(f.read_bytes())
    assert [d[3] for d in decoded] == [b"k0", b"k1", b"k2", b"k3", b"k4", b"ours"]


def _open_fixture(tmp_path: pathlib.Path) -> Log:
    part = tmp_path / "__cluster_metadata-0"
    part.mkdir()
    shutil.copy(FIXTURE / "cluster-metadata-00000000000000000000.log", part / "00000000000000000000.log")
    os.chmod(part / "00000000000000000000.log", 0o644)
    return Log.open(part)


def test_kafka_written_segment_reads_its_four_records(tmp_path: pathlib.Path) -> None:
    with _open_fixture(tmp_path) as log:
        assert log.recovery_report.bytes_truncated == 0
        assert (log.log_start_offset, log.log_end_offset) == (0, 4)
        records = log.read(0)
        assert [r.offset for r in records] == [0, 1, 2, 3]
        assert [len(r.value) for r in records] == [23, 24, 65, 65]
        assert all(r.key is None for r in records)
        assert [r.timestamp for r in records] == [1726045943832, 1726045957397, 1726045957397, 1726045957397]
        assert all(r.timestamp_type == TimestampType.CREATE_TIME for r in records)
        assert log.read(2, max_records=1)[0].offset == 2
        assert log.offset_for_timestamp(1726045943833) == 1
        info = log.segments
        assert info[0].record_count == 4 and info[0].max_timestamp == 1726045957397


def test_kafka_fixture_matches_independent_decoder(tmp_path: pathlib.Path) -> None:
    data = (FIXTURE / "cluster-metadata-00000000000000000000.log").read_bytes()
    theirs = _decode_with_kafka_python(data)
    with _open_fixture(tmp_path) as log:
        ours = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in log.iter()]
    assert ours == [tuple(t) for t in theirs]


def test_kafka_fixture_is_byte_identical_after_open_and_close(tmp_path: pathlib.Path) -> None:
    original = (FIXTURE / "cluster-metadata-00000000000000000000.log").read_bytes()
    with _open_fixture(tmp_path):
        pass
    assert (tmp_path / "__cluster_metadata-0" / "00000000000000000000.log").read_bytes() == original
    # Index files were rebuilt (Kafka's fixture ships without them) and are Kafka-shaped.
    index = tmp_path / "__cluster_metadata-0" / "00000000000000000000.index"
    assert index.exists() and index.stat().st_size % 8 == 0


def test_leader_change_control_batch_is_a_control_batch_to_kafka_python(tmp_path: pathlib.Path) -> None:
    from logstore.records.control import leader_change_record

    key, value = leader_change_record(2, [0, 1, 2], [0, 2])
    with Log.open(tmp_path / "ctl-0", compression_type="gzip") as log:
        log.append(b"before")
        log.append_batch([value], [key], control=True)
        log.append(b"after")
        assert [(r.offset, r.value) for r in log.read(0)] == [(0, b"before"), (2, b"after")]
    records = MemoryRecords(_segment_files(tmp_path / "ctl-0")[0].read_bytes())
    seen = []
    while (batch := records.next_batch()) is not None:
        assert batch.validate_crc()
        seen.append((batch.base_offset, batch.is_control_batch, batch.compression_type,
                     [(r.key, r.value) for r in batch]))
    assert seen[0][:2] == (0, False) and seen[2][:2] == (2, False)
    # The control batch stays uncompressed although the log compresses everything else.
    assert seen[1] == (1, True, 0, [(key, value)])
    assert seen[0][2] == 1
