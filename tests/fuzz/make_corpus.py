"""Write the seed corpus of the C fuzz targets (tests/fuzz/corpus/<target>/) from real data.

Seeds are what the parsers meet in practice: RecordBatches of every codec with and without keys,
headers and control flags, segments of many batches (with torn and zero tails), offset and time
indexes written by the appender, varints, and column spans. Run it again after a format change:
``python tests/fuzz/make_corpus.py``. The files are small and committed.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import struct
import sys
import tempfile
import uuid

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))

from logstore import Log, LogstoreError
from logstore.records import compression  # noqa: E402
from logstore._native import ffi, lib  # noqa: E402
from logstore.records.batch import BatchBuilder  # noqa: E402


def write(target: str, name: str, data: bytes) -> None:
    path = HERE / "corpus" / target
    path.mkdir(parents=True, exist_ok=True)
    (path / name).write_bytes(data)


def batches() -> list[bytes]:
    out = []
    builder = BatchBuilder()
    for name in ("none", "gzip", "snappy", "lz4", "zstd"):
        codec = compression.codec_from_name(name)
        for n in (1, 3, 40):
            values = [b"value-%d" % i * (i % 5) if i % 7 else None for i in range(n)]
            keys = [b"k%d" % i if i % 2 else None for i in range(n)]
            headers = [[("h%d" % i, b"x" * i), ("none", None)] if i % 3 == 0 else [] for i in range(n)]
            try:
                out.append(bytes(builder.build(values, keys, headers, base_offset=100 + n, codec=codec)))
            except LogstoreError:  # a codec whose package is missing
                continue
    out.append(bytes(builder.build([b"\x00\x00\x00\x00"], [b"\x00\x00\x00\x00"], control=True, base_offset=7)))
    return out


def main() -> None:
    shutil.rmtree(HERE / "corpus", ignore_errors=True)
    all_batches = batches()
    for i, b in enumerate(all_batches):
        write("batch", f"batch-{i:02d}", b)
    write("batch", "truncated", all_batches[0][:70])
    tmp = tempfile.mkdtemp()
    try:
        with Log.open(os.path.join(tmp, "t-0"), segment_bytes=16 << 10, index_interval_bytes=256) as log:
            for i in range(300):
                log.append(b"v%d" % i * (i % 9), key=b"k%d" % (i % 11), headers=[("a", b"b")] if i % 5 == 0 else ())
            log.append_batch([b"z" * 50] * 20, compression="zstd")
            segments = [s.base_offset for s in log.segments]
            path = log.path
        for base in segments[:3]:
            stem = os.path.join(path, "%020d" % base)
            data = open(stem + ".log", "rb").read()
            header = struct.pack(">qq", base + 5, base + 200)  # the target's offset window
            write("segment", f"segment-{base}", header + data)
            write("segment", f"segment-{base}-torn", header + data[: len(data) - 17])
            write("segment", f"segment-{base}-zero-tail", header + data + bytes(300))
            index = open(stem + ".index", "rb").read()
            timeindex = open(stem + ".timeindex", "rb").read()
            write("index", f"index-{base}", struct.pack(">q", 17) + index)
            write("index", f"timeindex-{base}", struct.pack(">q", 1_700_000_000_000) + timeindex)
            write("index", f"preallocated-{base}", struct.pack(">q", 5) + index + bytes(64))
    finally:
        shutil.rmtree(tmp)
    out = ffi.new("char[16]")
    for i, value in enumerate((0, 1, -1, 63, -64, 300, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63))):
        n = lib.ls_varint_encode(value, out)
        write("varint", f"varint-{i}", ffi.buffer(out, n)[:] * 3)
    for i, spans in enumerate(([(0, 4), (4, -1), (4, 8)], [(2, 2)] * 10, [(0, 0)])):
        table = b"".join(struct.pack(">ii", p, n) for p, n in spans)
        buf = b"0123456789abcdef" * 2
        write("columns", f"columns-{i}", table + buf[: max(len(table), 16)])
    flexcheck()


def flexcheck() -> None:
    """Seeds of the flexcheck target: the program bounds.py compiles for a request class, then
    a request body of that class written as a client writes it."""
    from kio.index import load_request_schema

    from logstore.kafka import bounds
    from logstore.kafka.writer import write_request

    fetch = {"replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
             "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
             "topics": [{"topic_id": uuid.UUID(int=7), "partitions": [
                 {"partition": p, "current_leader_epoch": 2, "fetch_offset": 5, "last_fetched_epoch": 2,
                  "log_start_offset": -1, "partition_max_bytes": 1000} for p in range(3)]}]}
    produce = {"transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": bytes(BatchBuilder().build([b"v"] * 3))}]}]}
    metadata = {"topics": [{"topic_id": uuid.UUID(int=0), "name": "t"}],
                "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
    for name, key, version, fields in (("fetch-v16", 1, 16, fetch), ("produce-v10", 0, 10, produce),
                                       ("metadata-v12", 3, 12, metadata)):
        cls = load_request_schema(key, version)
        frame = write_request(3, cls, "fuzz", fields)[4:]
        body = frame[8 + 2 + len("fuzz") + 1:]  # after header v2 (its tagged fields: one byte)
        words = bounds._program(bounds._plan_of(cls))
        write("flexcheck", name, struct.pack(f">H{len(words)}i", len(words), *words) + body)
        write("flexcheck", name + "-cut", struct.pack(f">H{len(words)}i", len(words), *words) + body[:len(body) // 2])


if __name__ == "__main__":
    main()
