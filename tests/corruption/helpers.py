"""Byte-level helpers for the corruption tests (Kafka LogSegmentTest / LevelDB log_test style).

Everything here works on closed files by path: flip a bit, overwrite bytes, cut a file, write
garbage from a position to the end, recompute a batch's CRC32C so that a structural corruption is
tested past the checksum, and walk the batch headers of a segment. The writer helpers build a log
of known records in known batches and return what was written, so that a test can compare the
survivors of a corruption with the truth.

Timestamps are explicit and strictly increasing (``TS0 + TS_STEP * offset``), so time lookups
have exactly one right answer.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import logstore
from logstore._native import lib

# Batch header layout, from the header (never retyped).
HEADER_SIZE: int = lib.LS_BATCH_HEADER_SIZE
LOG_OVERHEAD: int = lib.LS_LOG_OVERHEAD
POS_BASE_OFFSET: int = lib.LS_POS_BASE_OFFSET
POS_BATCH_LENGTH: int = lib.LS_POS_BATCH_LENGTH
POS_LEADER_EPOCH: int = lib.LS_POS_LEADER_EPOCH
POS_MAGIC: int = lib.LS_POS_MAGIC
POS_CRC: int = lib.LS_POS_CRC
POS_ATTRIBUTES: int = lib.LS_POS_ATTRIBUTES
POS_LAST_OFFSET_DELTA: int = lib.LS_POS_LAST_OFFSET_DELTA
POS_BASE_TIMESTAMP: int = lib.LS_POS_BASE_TIMESTAMP
POS_MAX_TIMESTAMP: int = lib.LS_POS_MAX_TIMESTAMP
POS_PRODUCER_ID: int = lib.LS_POS_PRODUCER_ID
POS_PRODUCER_EPOCH: int = lib.LS_POS_PRODUCER_EPOCH
POS_BASE_SEQUENCE: int = lib.LS_POS_BASE_SEQUENCE
POS_RECORDS_COUNT: int = lib.LS_POS_RECORDS_COUNT
POS_RECORDS: int = lib.LS_POS_RECORDS
INDEX_ENTRY_SIZE: int = lib.LS_INDEX_ENTRY_SIZE
TIMEINDEX_ENTRY_SIZE: int = lib.LS_TIMEINDEX_ENTRY_SIZE

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"

#: Small segments and dense indexes: several segments and many index entries from few records.
CONFIG: dict[str, Any] = dict(segment_bytes=4096, index_interval_bytes=128, segment_index_bytes=4096)

TS0 = 1_600_000_000_000
TS_STEP = 10


class HangError(Exception):
    """A call ran past its deadline: most likely an endless loop on corrupt input."""


@contextmanager
def deadline(seconds: float, what: str = "call"):
    """Raise HangError in the main thread if the block runs longer than ``seconds`` (SIGALRM;
    the loops this guards against are in Python, between C calls). Restores an outer alarm."""

    def expired(signum, frame):
        raise HangError(f"{what} still running after {seconds} s (endless loop on corrupt input?)")

    outer_remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    previous = signal.signal(signal.SIGALRM, expired)
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_remaining:
            signal.setitimer(signal.ITIMER_REAL, max(outer_remaining - (time.monotonic() - started), 0.001))


def timestamp_of(offset: int) -> int:
    """The timestamp the writer helpers give the record at ``offset``."""
    return TS0 + TS_STEP * offset


# ====================================================================== byte-level mutations
def read_bytes(path: str | os.PathLike[str]) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def flip(path: str | os.PathLike[str], position: int, bit: int) -> None:
    """Invert bit ``bit`` (0 = least significant) of the byte at ``position``."""
    assert 0 <= bit < 8
    with open(path, "r+b") as f:
        f.seek(position)
        (byte,) = f.read(1)
        f.seek(position)
        f.write(bytes([byte ^ (1 << bit)]))


def set_bytes(path: str | os.PathLike[str], position: int, data: bytes) -> bytes:
    """Overwrite ``data`` at ``position``; return the bytes that were there."""
    with open(path, "r+b") as f:
        f.seek(position)
        old = f.read(len(data))
        assert len(old) == len(data), f"{path}: cannot set {len(data)} bytes at {position}"
        f.seek(position)
        f.write(data)
    return old


def shrink(path: str | os.PathLike[str], size: int) -> None:
    """Cut the file to ``size`` bytes (a torn write)."""
    assert size <= os.path.getsize(path)
    os.truncate(path, size)


def garbage_tail(path: str | os.PathLike[str], position: int, rng: random.Random) -> bytes:
    """Overwrite the file from ``position`` to its end with random bytes; return them."""
    size = os.path.getsize(path)
    assert 0 <= position <= size
    garbage = rng.randbytes(size - position)
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(garbage)
    return garbage


def zero_tail(path: str | os.PathLike[str], position: int) -> None:
    """Overwrite the file from ``position`` to its end with zero bytes."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(bytes(size - position))


def dropped_bytes(data: bytes, valid: int) -> int:
    """What recovery reports as truncated when ``data`` (a whole segment file) is valid up to
    ``valid``: the bytes after it up to the last non-zero byte (a zero tail is preallocated
    space, not lost data)."""
    return len(data[valid:].rstrip(b"\0"))


def crc32c(data: bytes) -> int:
    return lib.ls_crc32c(0, data, len(data))


def fix_crc(path: str | os.PathLike[str], batch_position: int) -> int:
    """Recompute and store the CRC32C of the batch at ``batch_position`` (its batchLength as
    stored decides the covered range); return the new CRC."""
    data = read_bytes(path)
    length = struct.unpack_from(">i", data, batch_position + POS_BATCH_LENGTH)[0]
    end = batch_position + LOG_OVERHEAD + length
    assert end <= len(data), f"batch at {batch_position} claims {length} bytes past the file end"
    crc = crc32c(data[batch_position + POS_ATTRIBUTES : end])
    set_bytes(path, batch_position + POS_CRC, struct.pack(">I", crc))
    return crc


def stored_crc(path: str | os.PathLike[str], batch_position: int) -> int:
    return struct.unpack_from(">I", read_bytes(path), batch_position + POS_CRC)[0]


def computed_crc(path: str | os.PathLike[str], batch_position: int) -> int:
    data = read_bytes(path)
    length = struct.unpack_from(">i", data, batch_position + POS_BATCH_LENGTH)[0]
    return crc32c(data[batch_position + POS_ATTRIBUTES : batch_position + LOG_OVERHEAD + length])


class BatchInfo(NamedTuple):
    position: int
    size: int
    base_offset: int
    last_offset: int
    records_count: int

    @property
    def end(self) -> int:
        return self.position + self.size


def batch_positions(segment: str | os.PathLike[str] | bytes) -> list[BatchInfo]:
    """Walk the batch headers of a segment (a file path, or its bytes) from position 0, without
    checking CRCs.

    Stops at the first header that cannot start a batch: a zero (preallocated) tail, a length
    below the minimum, or a batch running past the end of the file.
    """
    data = segment if isinstance(segment, bytes) else read_bytes(segment)
    out = []
    pos = 0
    while pos + HEADER_SIZE <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        size = LOG_OVERHEAD + length
        if length < lib.LS_BATCH_MIN_LENGTH or pos + size > len(data):
            break
        lod = struct.unpack_from(">i", data, pos + POS_LAST_OFFSET_DELTA)[0]
        count = struct.unpack_from(">i", data, pos + POS_RECORDS_COUNT)[0]
        out.append(BatchInfo(pos, size, base, base + lod, count))
        pos += size
    return out


# ====================================================================== records inside a batch
def varint_encode(value: int) -> bytes:
    """Kafka's zigzag varint (ByteUtils.writeVarlong), written independently of the C core."""
    z = ((value << 1) ^ (value >> 63)) & (2**64 - 1)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def varint_decode(data: bytes, position: int) -> tuple[int, int]:
    """Return (value, size in bytes) of the zigzag varint at ``position``."""
    z = shift = 0
    for i in range(10):
        byte = data[position + i]
        z |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (z >> 1) ^ -(z & 1), i + 1
    raise ValueError(f"varint at {position} does not end within 10 bytes")


class Field(NamedTuple):
    """A varint field of a record: its file position, encoded size and value."""

    position: int
    size: int
    value: int


class RecordLayout(NamedTuple):
    length: Field
    attributes: int  # file position of the attributes byte
    timestamp_delta: Field
    offset_delta: Field
    key_length: Field
    value_length: Field
    header_count: Field
    end: int


def record_layout(path: str | os.PathLike[str], batch_position: int) -> list[RecordLayout]:
    """Positions of every varint field of the records of the uncompressed batch at
    ``batch_position`` (file positions, so that a test can set_bytes a field in place)."""
    data = read_bytes(path)
    length = struct.unpack_from(">i", data, batch_position + POS_BATCH_LENGTH)[0]
    count = struct.unpack_from(">i", data, batch_position + POS_RECORDS_COUNT)[0]
    p = batch_position + POS_RECORDS
    out = []

    def field() -> Field:
        nonlocal p
        value, size = varint_decode(data, p)
        f = Field(p, size, value)
        p += size
        return f

    for _ in range(count):
        rec_len = field()
        body_end = p + rec_len.value
        attributes = p
        p += 1
        ts = field()
        od = field()
        kl = field()
        p += max(kl.value, 0)
        vl = field()
        p += max(vl.value, 0)
        hc = field()
        out.append(RecordLayout(rec_len, attributes, ts, od, kl, vl, hc, body_end))
        p = body_end
    assert p == batch_position + LOG_OVERHEAD + length, "records do not fill the batch"
    return out


def set_varint(path: str | os.PathLike[str], f: Field, value: int) -> None:
    """Overwrite varint field ``f`` with ``value``, which must encode to the same size."""
    encoded = varint_encode(value)
    assert len(encoded) == f.size, f"{value} needs {len(encoded)} bytes, the field has {f.size}"
    set_bytes(path, f.position, encoded)


# ====================================================================== files of a log
def segment_logs(log_dir: str | os.PathLike[str]) -> list[str]:
    """Paths of the ``.log`` segment files of a partition directory, oldest first."""
    names = sorted(n for n in os.listdir(log_dir) if n.endswith(".log") and n[:20].isdigit())
    return [os.path.join(log_dir, n) for n in names]


def segment_base(path: str) -> int:
    return int(os.path.basename(path)[:20])


def index_path(log_path: str) -> str:
    return log_path[: -len(".log")] + ".index"


def timeindex_path(log_path: str) -> str:
    return log_path[: -len(".log")] + ".timeindex"


def remove_clean_marker(log_dir: str | os.PathLike[str]) -> None:
    """Make the next open run recovery, as after a crash after a clean close."""
    os.unlink(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE))


def has_clean_marker(log_dir: str | os.PathLike[str]) -> bool:
    return os.path.exists(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE))


def copy_log(src_root: str | os.PathLike[str], dst_root: str | os.PathLike[str]) -> None:
    """Copy a whole log directory tree (partition dir plus the checkpoint files beside it)."""
    shutil.copytree(src_root, dst_root)


def index_entries(path: str | os.PathLike[str], base_offset: int = 0) -> list[tuple[int, int]]:
    """(absolute offset, position) entries of an ``.index`` file (whole entries only)."""
    data = read_bytes(path)
    n = len(data) // INDEX_ENTRY_SIZE
    return [(base_offset + rel, pos) for rel, pos in (struct.unpack_from(">ii", data, i * INDEX_ENTRY_SIZE) for i in range(n))]


def timeindex_entries(path: str | os.PathLike[str], base_offset: int = 0) -> list[tuple[int, int]]:
    """(timestamp, absolute offset) entries of a ``.timeindex`` file (whole entries only)."""
    data = read_bytes(path)
    n = len(data) // TIMEINDEX_ENTRY_SIZE
    return [(ts, base_offset + rel) for ts, rel in (struct.unpack_from(">qi", data, i * TIMEINDEX_ENTRY_SIZE) for i in range(n))]


# ====================================================================== records
class Rec(NamedTuple):
    """What a test compares: every user-visible field of a record."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def as_rec(record: logstore.Record) -> Rec:
    return Rec(record.offset, record.timestamp, record.key, record.value, list(record.headers))


def as_recs(records: Sequence[logstore.Record]) -> list[Rec]:
    return [as_rec(r) for r in records]


@dataclass
class Written:
    """The truth about a written log: its records and how they were grouped into batches."""

    records: list[Rec] = field(default_factory=list)
    batches: list[tuple[int, int]] = field(default_factory=list)  # (first, last) offset per batch

    def upto(self, end_offset: int) -> list[Rec]:
        """The records with offset < end_offset."""
        return [r for r in self.records if r.offset < end_offset]

    def by_offset(self) -> dict[int, Rec]:
        return {r.offset: r for r in self.records}

    def extend(self, other: "Written") -> None:
        self.records += other.records
        self.batches += other.batches


def _record_fields(rng: random.Random, offset: int) -> tuple[bytes | None, bytes | None, list]:
    roll = rng.random()
    key = None if roll < 0.25 else b"key-%d" % offset
    value = None if rng.random() < 0.05 else rng.randbytes(rng.randrange(0, 48))
    headers: list[tuple[str, bytes | None]] = []
    if rng.random() < 0.4:
        headers = [("h%d" % j, None if rng.random() < 0.2 else rng.randbytes(rng.randrange(0, 8)))
                   for j in range(rng.randrange(1, 3))]
    return key, value, headers


def write_records(log: logstore.Log, rng: random.Random, n_batches: int,
                  codecs: Sequence[str | None] = (None,)) -> Written:
    """Append ``n_batches`` batches: single appends and append_batch calls of 2..6 records, with
    random keys (some null), values (some tombstones), headers and increasing timestamps.

    ``codecs`` is cycled for the multi-record batches (None = uncompressed).
    """
    written = Written()
    multi = 0
    for _ in range(n_batches):
        first = log.log_end_offset
        if rng.random() < 0.5:
            key, value, headers = _record_fields(rng, first)
            offset = log.append(value, key=key, headers=headers, timestamp=timestamp_of(first))
            assert offset == first
            written.records.append(Rec(first, timestamp_of(first), key, value, headers))
            written.batches.append((first, first))
        else:
            n = rng.randrange(2, 7)
            fields = [_record_fields(rng, first + i) for i in range(n)]
            codec = codecs[multi % len(codecs)]
            multi += 1
            offset = log.append_batch([f[1] for f in fields], keys=[f[0] for f in fields],
                                      headers=[f[2] for f in fields],
                                      timestamps=[timestamp_of(first + i) for i in range(n)],
                                      compression=codec)
            assert offset == first
            for i, (key, value, headers) in enumerate(fields):
                written.records.append(Rec(first + i, timestamp_of(first + i), key, value, headers))
            written.batches.append((first, first + n - 1))
    assert log.log_end_offset == (written.records[-1].offset + 1 if written.records else first)
    return written


def ensure_room(log: logstore.Log, rng: random.Random, written: Written, needed: int) -> None:
    """Make sure the next ``needed`` bytes of batches land in the active segment, behind at least
    two other batches of it: roll first if they would not fit."""
    if log.segments[-1].size + needed + 1000 > log.config.segment_bytes:
        log.roll()
    if log.segments[-1].size < 200:
        written.extend(write_records(log, rng, 2))


def make_log(path: str | os.PathLike[str], rng: random.Random, n_batches: int,
             codecs: Sequence[str | None] = (None,), **config: Any) -> tuple[logstore.Log, Written]:
    """Open a new log at ``path`` (CONFIG overridden by ``config``), write ``n_batches`` batches,
    and return the open log and what was written."""
    log = logstore.Log.open(path, **{**CONFIG, **config})
    return log, write_records(log, rng, n_batches, codecs)


def open_log(path: str | os.PathLike[str], **config: Any) -> logstore.Log:
    return logstore.Log.open(path, **{**CONFIG, **config})


# ====================================================================== checks
def read_everything(log: logstore.Log) -> list[Rec]:
    """Every record of the log, via iter()."""
    return as_recs(list(log.iter()))


def assert_log_is(log: logstore.Log, expected: Sequence[Rec], end_offset: int) -> None:
    """The log holds exactly ``expected`` and ends at ``end_offset``: same records by iter() and
    by a read at every offset."""
    expected = list(expected)
    assert log.log_end_offset == end_offset
    assert read_everything(log) == expected
    for rec in expected:
        got = log.read(rec.offset, max_bytes=1024)
        assert got, f"read({rec.offset}) returned nothing"
        assert as_rec(got[0]) == rec, f"read({rec.offset}) returned {got[0]!r}, expected {rec!r}"


def first_offset_at_or_after(records: Sequence[Rec], timestamp: int) -> int | None:
    """The right answer of offset_for_timestamp over ``records``."""
    for rec in records:
        if rec.timestamp >= timestamp:
            return rec.offset
    return None


def assert_append_continues(log: logstore.Log, expected: list[Rec]) -> list[Rec]:
    """Appends after a recovery get the next offsets and read back, next to the survivors;
    returns the records appended."""
    end = log.log_end_offset
    new = []
    for i in range(3):
        offset = log.append(b"after-%d" % i, key=b"k-after", headers=[("after", b"%d" % i)],
                            timestamp=timestamp_of(end + i))
        assert offset == end + i
        new.append(Rec(end + i, timestamp_of(end + i), b"k-after", b"after-%d" % i, [("after", b"%d" % i)]))
    first = log.append_batch([b"b0", b"b1"], timestamps=[timestamp_of(end + 3), timestamp_of(end + 4)])
    assert first == end + 3
    new += [Rec(end + 3, timestamp_of(end + 3), None, b"b0", []), Rec(end + 4, timestamp_of(end + 4), None, b"b1", [])]
    assert log.log_end_offset == end + 5
    assert read_everything(log) == list(expected) + new
    got = as_recs(log.read(end))  # one segment's worth: a prefix of the new records
    assert got and got == new[: len(got)]
    assert as_recs(list(log.iter(end))) == new
    return new
