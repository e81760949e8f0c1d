"""Tests of logstore's C core through cffi (logstore._native._lib), independent of the Python layer.

Cross-checks: CRC32C against RFC 3720 and the ``crc32c`` package; varints against a Python
reference; batches against kafka-python's independent encoder and decoder (byte for byte); the
appender's index files against a recovery scan of the log it wrote.
"""

from __future__ import annotations

import bisect
import os
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    from logstore._native._lib import ffi, lib
except Exception:  # pragma: no cover - the package layer is not importable; load the .so itself
    import glob
    import importlib.util
    import pathlib

    _here = pathlib.Path(__file__).resolve().parents[2] / "src" / "logstore" / "_native"
    _so = glob.glob(str(_here / "_lib*.so"))[0]
    _spec = importlib.util.spec_from_file_location("logstore._native._lib", _so)
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    ffi, lib = _mod.ffi, _mod.lib

try:  # an independent CRC32C implementation (test extra); only the cross-checks need it
    import crc32c as crc32c_ref
except ImportError:  # pragma: no cover
    crc32c_ref = None
needs_crc32c_ref = pytest.mark.skipif(crc32c_ref is None, reason="the crc32c package is not installed")
kafka_records = pytest.importorskip("kafka.record.default_records")
DefaultRecordBatch = kafka_records.DefaultRecordBatch
DefaultRecordBatchBuilder = kafka_records.DefaultRecordBatchBuilder

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)

# ---------------------------------------------------------------- helpers


def py_varint(v: int) -> bytes:
    """Kafka's ByteUtils.writeVarlong, written independently of the C code."""
    z = ((v << 1) ^ (v >> 63)) & (2**64 - 1)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def enc_headers(headers) -> bytes:
    out = b""
    for k, v in headers:
        out += py_varint(len(k)) + k + (py_varint(-1) if v is None else py_varint(len(v)) + v)
    return out


def exact(b):
    """A C buffer of exactly len(b) bytes (no trailing NUL), so that ASan sees any over-read."""
    if isinstance(b, ffi.CData):
        return b
    buf = ffi.new("char[]", len(b))
    ffi.memmove(buf, b, len(b))
    return buf


def crc_of(fn, data: bytes, crc: int = 0) -> int:
    return fn(crc, data, len(data))


class RecordsOut:
    """An ls_records_out with its arrays."""

    FIELDS = [
        ("offsets", "int64_t"),
        ("timestamps", "int64_t"),
        ("timestamp_types", "int8_t"),
        ("key_pos", "int32_t"),
        ("key_len", "int32_t"),
        ("value_pos", "int32_t"),
        ("value_len", "int32_t"),
        ("headers_pos", "int32_t"),
        ("headers_len", "int32_t"),
        ("header_count", "int32_t"),
    ]

    def __init__(self, capacity: int):
        self.ptr = ffi.new("ls_records_out *")
        self.ptr.capacity = capacity
        self.arrays = {}
        for name, ctype in self.FIELDS:
            arr = ffi.new(f"{ctype}[]", max(capacity, 1))
            self.arrays[name] = arr
            setattr(self.ptr, name, arr)

    def rows(self, buf: bytes, start: int = 0):
        """(offset, timestamp, timestamp_type, key, value, headers) for rows [start, count)."""
        a = self.arrays
        res = []
        for i in range(start, self.ptr.count):
            kp, kl, vp, vl = a["key_pos"][i], a["key_len"][i], a["value_pos"][i], a["value_len"][i]
            hp, hl, hc = a["headers_pos"][i], a["headers_len"][i], a["header_count"][i]
            res.append(
                (
                    a["offsets"][i],
                    a["timestamps"][i],
                    a["timestamp_types"][i],
                    None if kl == -1 else buf[kp : kp + kl],
                    None if vl == -1 else buf[vp : vp + vl],
                    decode_headers(buf[hp : hp + hl], hc),
                )
            )
        return res


def records_decode_rc(buf, length, hdr, min_offset, cap):
    """ls_records_decode into a fresh RecordsOut (kept alive for the call); returns the code."""
    out = RecordsOut(cap)
    return lib.ls_records_decode(exact(buf), length, hdr, min_offset, out.ptr)


def decode_headers(raw: bytes, count: int):
    arrs = [ffi.new("int32_t[]", max(count, 1)) for _ in range(4)]
    n = lib.ls_headers_decode(exact(raw), len(raw), count, *arrs)
    assert n == count, n
    kp, kl, vp, vl = arrs
    return [
        (raw[kp[j] : kp[j] + kl[j]], None if vl[j] == -1 else raw[vp[j] : vp[j] + vl[j]])
        for j in range(count)
    ]


def build_in(records, use_ts=True):
    """ls_records_in for records = [(timestamp, key, value, headers)]; returns (in, keepalive)."""
    keep = []

    def arr(ctype, values):
        a = ffi.new(f"{ctype}[]", list(values) or [0])
        keep.append(a)
        return a

    def data(b):
        a = ffi.new("char[]", b)
        keep.append(a)
        return a

    inp = ffi.new("ls_records_in *")
    inp.count = len(records)
    inp.keys = data(b"".join(r[1] or b"" for r in records))
    inp.key_lens = arr("int32_t", (-1 if r[1] is None else len(r[1]) for r in records))
    inp.values = data(b"".join(r[2] or b"" for r in records))
    inp.value_lens = arr("int32_t", (-1 if r[2] is None else len(r[2]) for r in records))
    if use_ts:
        inp.timestamps = arr("int64_t", (r[0] for r in records))
    hdrs = [h for r in records for h in r[3]]
    if hdrs:
        inp.header_counts = arr("int32_t", (len(r[3]) for r in records))
        inp.header_keys = data(b"".join(k for k, _ in hdrs))
        inp.header_key_lens = arr("int32_t", (len(k) for k, _ in hdrs))
        inp.header_values = data(b"".join(v or b"" for _, v in hdrs))
        inp.header_value_lens = arr("int32_t", (-1 if v is None else len(v) for _, v in hdrs))
    return inp, keep


def build_batch(records, base_offset=0, attributes=0, ple=0, use_ts=True, base_timestamp=0,
                producer_id=-1, producer_epoch=-1, base_sequence=-1) -> bytes:
    inp, _keep = build_in(records, use_ts)
    bound = lib.ls_records_bound(inp)
    assert bound > 0
    cap = lib.LS_BATCH_HEADER_SIZE + bound
    out = ffi.new("char[]", cap)
    hdr = ffi.new("ls_batch_header *")
    hdr.base_offset = base_offset
    hdr.partition_leader_epoch = ple
    hdr.attributes = attributes
    hdr.base_timestamp = base_timestamp
    hdr.producer_id = producer_id
    hdr.producer_epoch = producer_epoch
    hdr.base_sequence = base_sequence
    size = lib.ls_batch_encode(inp, hdr, out, cap)
    assert size > 0, size
    assert hdr.batch_length == size - 12 and hdr.magic == 2
    return bytes(ffi.buffer(out, size))


def validate(buf: bytes, max_batch_bytes=0):
    hdr = ffi.new("ls_batch_header *")
    crc = ffi.new("uint32_t *")
    rc = lib.ls_batch_validate(exact(buf), len(buf), max_batch_bytes, hdr, crc)
    return rc, hdr, crc[0]


def decode_batch(buf: bytes, min_offset=-1):
    rc, hdr, _ = validate(buf)
    assert rc == len(buf), rc
    section = buf[61:]
    out = RecordsOut(hdr.records_count)
    n = lib.ls_records_decode(section, len(section), hdr, min_offset, out.ptr)
    assert n >= 0, n
    return hdr, out.rows(section)


def kafka_build(records, base_offset=0):
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 24,
    )
    for i, (ts, k, v, h) in enumerate(records):
        assert b.append(i, ts, k, v, [(hk.decode(), hv) for hk, hv in h]) is not None
    buf = bytearray(b.build())
    buf[0:8] = struct.pack(">q", base_offset)
    return bytes(buf)


def kafka_decode(buf: bytes):
    batch = DefaultRecordBatch(bytes(buf))
    assert batch.validate_crc()
    return batch, [
        (r.offset, r.timestamp, r.key, r.value, [(k.encode(), v) for k, v in r.headers])
        for r in batch
    ]


def set_header(buf: bytes, **fields) -> bytes:
    """Rewrite header fields and re-finish the batch (CRC recomputed) with ls_batch_finish."""
    rc, hdr, _ = validate(buf)
    assert rc >= 0 or rc == lib.LS_ERR_CRC or rc == lib.LS_ERR_CORRUPT
    for k, v in fields.items():
        setattr(hdr, k, v)
    b = ffi.new("char[]", buf)
    assert lib.ls_batch_finish(b, len(buf), hdr) == len(buf)
    return bytes(ffi.buffer(b, len(buf)))


def refinish(buf: bytes) -> bytes:
    """Recompute and store the CRC of buf (header fields as they are in the bytes)."""
    crc = lib.ls_crc32c(0, buf[21:], len(buf) - 21)
    return buf[:17] + struct.pack(">I", crc) + buf[21:]


# strategies
blobs = st.binary(max_size=40)
opt_blobs = st.none() | blobs
header_keys = st.text(max_size=5).map(lambda t: t.encode("utf-8"))  # Kafka header keys are UTF-8
headers_st = st.lists(st.tuples(header_keys, st.none() | st.binary(max_size=10)), max_size=3)
ts_small = st.integers(-(2**40), 2**45)
record_st = st.tuples(ts_small, opt_blobs, opt_blobs, headers_st)
record_any_ts = st.tuples(st.integers(INT64_MIN, INT64_MAX), opt_blobs, opt_blobs, headers_st)


def record_list(rec=record_st, max_size=8):
    return st.lists(rec, min_size=1, max_size=max_size)


# ---------------------------------------------------------------- CRC32C

CRC_FUNCS = [pytest.param(lib.ls_crc32c, id="dispatch"), pytest.param(lib.ls_crc32c_sw, id="sw")]

ISCSI_READ = bytes.fromhex(
    "01c00000000000000000000000000000"
    "14000000000004000000001400000018"
    "28000000000000000200000000000000"
)


@pytest.mark.parametrize("fn", CRC_FUNCS)
@pytest.mark.parametrize(
    "data,expected",
    [
        (bytes(32), 0x8A9136AA),
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
        (ISCSI_READ, 0xD9963A56),
        (b"123456789", 0xE3069283),
        (b"", 0),
    ],
)
def test_crc32c_vectors(fn, data, expected):
    assert crc_of(fn, data) == expected


def test_crc32c_hw_available_matches_cpu():
    assert lib.ls_crc32c_hw_available() in (0, 1)
    if os.uname().machine == "x86_64":
        with open("/proc/cpuinfo") as f:
            assert lib.ls_crc32c_hw_available() == ("sse4_2" in f.read())


@pytest.mark.parametrize("fn", CRC_FUNCS)
def test_crc32c_incremental(fn):
    data = os.urandom(300)
    whole = crc_of(fn, data)
    for cut in range(len(data) + 1):
        assert crc_of(fn, data[cut:], crc_of(fn, data[:cut])) == whole
    # three pieces, one of them empty
    assert crc_of(fn, data[100:], crc_of(fn, b"", crc_of(fn, data[:100]))) == whole


def test_crc32c_hw_equals_sw_many_lengths_and_alignments():
    rnd = random.Random(7)
    big = bytes(rnd.getrandbits(8) for _ in range(3 * 8192 * 2 + 3 * 256 * 3 + 123))
    lengths = list(range(0, 80)) + [255, 256, 767, 768, 769, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 9]
    lengths += [rnd.randrange(len(big) - 16) for _ in range(40)] + [len(big) - 16]
    cbig = ffi.from_buffer(big)
    for n in lengths:
        for align in range(8):
            p = cbig + align
            hw, sw = lib.ls_crc32c(0, p, n), lib.ls_crc32c_sw(0, p, n)
            assert hw == sw, (n, align)
            seed = 0xDEADBEEF
            assert lib.ls_crc32c(seed, p, n) == lib.ls_crc32c_sw(seed, p, n)


@FAST
@given(st.binary(max_size=2000), st.integers(0, 2**32 - 1))
def test_crc32c_hw_equals_sw_random(data, seed):
    assert crc_of(lib.ls_crc32c, data, seed) == crc_of(lib.ls_crc32c_sw, data, seed)


@needs_crc32c_ref
@FAST
@given(st.binary(max_size=5000))
def test_crc32c_equals_an_independent_implementation(data):
    assert crc_of(lib.ls_crc32c, data) == crc_of(lib.ls_crc32c_sw, data) == crc32c_ref.crc32c(data)


# ---------------------------------------------------------------- varints


def varint_encode(v: int) -> bytes:
    out = ffi.new("char[10]")
    n = lib.ls_varint_encode(v, out)
    assert 1 <= n <= 10
    return bytes(ffi.buffer(out, n))


def varint_decode(b: bytes):
    v = ffi.new("int64_t *")
    n = lib.ls_varint_decode(exact(b), len(b), v)
    return n, v[0]


@pytest.mark.parametrize(
    "value,encoded",
    [(0, "00"), (-1, "01"), (1, "02"), (63, "7e"), (-64, "7f"), (64, "8001"), (-65, "8101"),
     (300, "d804"), (INT64_MAX, "feffffffffffffffff01"), (INT64_MIN, "ffffffffffffffffff01")],
)
def test_varint_known_encodings(value, encoded):
    assert varint_encode(value).hex() == encoded
    assert varint_decode(bytes.fromhex(encoded)) == (len(encoded) // 2, value)


@FAST
@given(st.integers(INT64_MIN, INT64_MAX) | st.sampled_from([0, -1, INT64_MIN, INT64_MAX, 2**31, -(2**31)]))
def test_varint_roundtrip(v):
    enc = varint_encode(v)
    assert enc == py_varint(v)
    assert varint_decode(enc + b"\x55junk") == (len(enc), v)


def test_varint_decode_errors():
    assert varint_decode(b"")[0] == lib.LS_ERR_TRUNCATED
    assert varint_decode(b"\x80")[0] == lib.LS_ERR_TRUNCATED
    assert varint_decode(b"\xff" * 9)[0] == lib.LS_ERR_TRUNCATED
    assert varint_decode(b"\x80" * 10)[0] == lib.LS_ERR_CORRUPT
    assert varint_decode(b"\x80" * 10 + b"\x00")[0] == lib.LS_ERR_CORRUPT  # 11-byte encoding
    assert varint_decode(b"\x80" * 9 + b"\x00") == (10, 0)  # non-canonical but terminated


def test_varint_decode_of_one_and_two_bytes_at_the_buffer_end_and_before_more():
    """ls_read_varlong reads one- and two-byte varints without its loop: every such value, alone
    in an exact buffer (its last byte the buffer's last) and followed by more bytes."""
    for v in range(-(2**13), 2**13):
        enc = py_varint(v)
        assert len(enc) <= 2
        assert varint_decode(enc) == (len(enc), v)
        assert varint_decode(enc + b"\x80") == (len(enc), v)
    assert varint_decode(b"\x80\x80")[0] == lib.LS_ERR_TRUNCATED
    assert varint_decode(b"\x80\x80\x01") == (3, py_varint_decode(b"\x80\x80\x01"))
    assert varint_decode(b"\xff\xff\x7f\x00") == (3, py_varint_decode(b"\xff\xff\x7f"))


def py_varint_decode(b: bytes) -> int:
    z = sum((x & 0x7F) << (7 * i) for i, x in enumerate(b))
    return (z >> 1) ^ -(z & 1)


@pytest.mark.parametrize("value_len", [0, 1, 50, 60, 61, 62, 63, 64, 120, 200, 8180, 8200, 70000])
def test_records_decode_reads_every_varint_width_up_to_the_section_end(value_len):
    """The record walk's one- and two-byte varint paths (record, key and value lengths, offset
    and timestamp deltas of one, two and three bytes) decode what was encoded, through the last
    byte of an exact buffer; a cut anywhere near the end fails."""
    count = 70 if value_len < 8000 else 3
    records = [(ts, b"k" * (i % 3) if i % 4 else None, bytes([i % 251]) * value_len if i % 5 else b"x",
                [(b"h", b"v" * i)] if i % 7 == 0 else [])
               for i, ts in enumerate([0, 1, 63, 64, 8191, 8192, 10**6] * 10)][:count]
    buf = build_batch(records, base_offset=5)
    rc, hdr, _ = validate(buf)
    assert rc == len(buf)
    section = buf[61:]
    out = RecordsOut(count)
    assert lib.ls_records_decode(exact(section), len(section), hdr, -1, out.ptr) == count
    rows = out.rows(section)
    assert [r[0] for r in rows] == [5 + i for i in range(count)]
    assert [(r[1], r[3], r[4], r[5]) for r in rows] == [(ts, k, v, h) for ts, k, v, h in records]
    for cut in range(max(0, len(section) - 300), len(section)):
        assert records_decode_rc(section[:cut], cut, hdr, -1, cap=count) in (lib.LS_ERR_TRUNCATED, lib.LS_ERR_CORRUPT)


# ---------------------------------------------------------------- batch encode/decode


def test_batch_layout_matches_kafka_python_byte_for_byte():
    records = [
        (1000, b"k", b"v", [(b"h", b"x"), (b"n", None)]),
        (999, None, None, []),
        (1005, b"", b"", [(b"", b"")]),
    ]
    ours = build_batch(records, base_offset=0)
    assert ours == kafka_build(records)
    hdr = validate(ours)[1]
    assert (hdr.base_timestamp, hdr.max_timestamp, hdr.last_offset_delta, hdr.records_count) == (
        1000, 1005, 2, 3)
    assert (hdr.producer_id, hdr.producer_epoch, hdr.base_sequence) == (-1, -1, -1)


@FAST
@given(record_list(), st.integers(0, 2**62), st.sampled_from([0, 8]), st.integers(-(2**31), INT32_MAX))
def test_batch_roundtrip_and_kafka_python_decodes_ours(records, base_offset, attributes, ple):
    buf = build_batch(records, base_offset=base_offset, attributes=attributes, ple=ple)
    hdr, rows = decode_batch(buf)
    assert hdr.base_offset == base_offset and hdr.partition_leader_epoch == ple
    assert hdr.attributes == attributes
    log_append = attributes == 8
    max_ts = max(r[0] for r in records)
    assert hdr.max_timestamp == max_ts and hdr.base_timestamp == records[0][0]
    expected = [
        (base_offset + i, max_ts if log_append else ts, int(log_append), k, v, h)
        for i, (ts, k, v, h) in enumerate(records)
    ]
    assert rows == expected
    batch, krows = kafka_decode(buf)
    assert batch.base_offset == base_offset and batch.last_offset_delta == len(records) - 1
    assert krows == [(o, t, k, v, h) for o, t, _, k, v, h in expected]
    if not log_append:
        assert buf[12:16] == struct.pack(">i", ple)
        assert buf[16:] == kafka_build(records, base_offset)[16:]


@FAST
@given(record_list(record_any_ts))
def test_batch_roundtrip_extreme_timestamps(records):
    _, rows = decode_batch(build_batch(records))
    assert [r[1] for r in rows] == [r[0] for r in records]


@FAST
@given(record_list(), st.integers(0, 2**40))
def test_we_decode_kafka_python_batches(records, base_offset):
    buf = kafka_build(records, base_offset)
    rc, hdr, crc = validate(buf)
    assert rc == len(buf) and crc == hdr.crc
    _, rows = decode_batch(buf)
    assert rows == [(base_offset + i, ts, 0, k, v, h) for i, (ts, k, v, h) in enumerate(records)]


def test_batch_encode_without_timestamps_uses_header_base_timestamp():
    records = [(0, b"a", b"1", []), (0, None, b"2", [])]
    buf = build_batch(records, use_ts=False, base_timestamp=12345)
    hdr, rows = decode_batch(buf)
    assert hdr.base_timestamp == hdr.max_timestamp == 12345
    assert [r[1] for r in rows] == [12345, 12345]


def test_records_bound_and_encode_arguments():
    records = [(5, b"key", b"value", [(b"h", b"v")]), (6, None, None, [])]
    inp, keep = build_in(records)
    bound = lib.ls_records_bound(inp)
    size = len(build_batch(records)) - 61
    assert bound >= size
    for cap in range(size):
        out = ffi.new("char[]", max(cap, 1))
        assert lib.ls_records_encode(inp, 5, out, cap) == lib.LS_ERR_NOSPACE
    out = ffi.new("char[]", size)
    assert lib.ls_records_encode(inp, 5, out, size) == size
    # invalid inputs
    key_lens, header_key_lens = inp.key_lens, inp.header_key_lens
    bad = ffi.new("int32_t[]", [-2, 3])
    inp.key_lens = bad
    assert lib.ls_records_bound(inp) == lib.LS_ERR_ARG
    assert lib.ls_records_encode(inp, 5, out, size) == lib.LS_ERR_ARG
    inp.key_lens = key_lens
    hk = ffi.new("int32_t[]", [-1])
    inp.header_key_lens = hk
    assert lib.ls_records_bound(inp) == lib.LS_ERR_ARG
    inp.header_key_lens = header_key_lens
    inp.count = 0
    assert lib.ls_records_bound(inp) == lib.LS_ERR_ARG
    inp.count = 2
    hdr = ffi.new("ls_batch_header *")
    hdr.attributes = 1  # gzip: not for ls_batch_encode
    big = ffi.new("char[]", 1000)
    assert lib.ls_batch_encode(inp, hdr, big, 1000) == lib.LS_ERR_ARG
    hdr.attributes = 0
    assert lib.ls_batch_encode(inp, hdr, big, 60) == lib.LS_ERR_NOSPACE
    assert lib.ls_batch_encode(inp, hdr, big, 1000) == size + 61
    assert lib.ls_batch_finish(big, 60, hdr) == lib.LS_ERR_ARG
    # NULL keys + NULL key_lens: every key is null
    inp.keys = ffi.NULL
    inp.key_lens = ffi.NULL
    n = lib.ls_batch_encode(inp, hdr, big, 1000)
    _, rows = decode_batch(bytes(ffi.buffer(big, n)))
    assert [r[3] for r in rows] == [None, None]


def test_records_decode_min_offset_nospace_and_log_append_time():
    records = [(100 + i, b"k%d" % i, b"v", []) for i in range(5)]
    buf = build_batch(records, base_offset=50, attributes=8)
    rc, hdr, _ = validate(buf)
    section = buf[61:]
    out = RecordsOut(5)
    out.ptr.count = 1  # rows are appended after existing ones
    assert lib.ls_records_decode(section, len(section), hdr, 0, out.ptr) == lib.LS_ERR_NOSPACE
    assert out.ptr.count == 1
    out = RecordsOut(5)
    assert lib.ls_records_decode(section, len(section), hdr, 52, out.ptr) == 3
    rows = out.rows(section)
    assert [r[0] for r in rows] == [52, 53, 54]
    assert all(r[1] == 104 and r[2] == 1 for r in rows)
    assert [r[3] for r in rows] == [b"k2", b"k3", b"k4"]


def test_records_decode_rejects_structural_errors():
    records = [(1, b"a", b"b", [(b"h", b"v")]), (2, b"c", None, [])]
    buf = build_batch(records)
    _, hdr, _ = validate(buf)
    section = buf[61:]

    def dec(sec, **fields):
        h = ffi.new("ls_batch_header *", hdr[0])
        for k, v in fields.items():
            setattr(h, k, v)
        return records_decode_rc(sec, len(sec), h, -1, cap=8)

    assert dec(section) == 2
    assert dec(section, records_count=3, last_offset_delta=2) == lib.LS_ERR_TRUNCATED
    assert dec(section, records_count=1) == lib.LS_ERR_CORRUPT  # trailing bytes
    assert dec(section, last_offset_delta=0) == lib.LS_ERR_CORRUPT  # offsetDelta 1 > lod
    assert dec(section, records_count=-1) == lib.LS_ERR_CORRUPT
    for cut in range(len(section)):
        assert dec(section[:cut]) in (lib.LS_ERR_TRUNCATED, lib.LS_ERR_CORRUPT)

    def record(body: bytes) -> bytes:
        return py_varint(len(body)) + body

    one = ffi.new("ls_batch_header *", hdr[0])
    one.records_count = 1
    one.last_offset_delta = 0

    def dec1(body):
        sec = record(body)
        return records_decode_rc(sec, len(sec), one, -1, cap=1)

    ok = b"\x00" + py_varint(0) + py_varint(0) + py_varint(-1) + py_varint(-1) + py_varint(0)
    assert dec1(ok) == 1
    # key length 2**31 (outside int32) / 6-byte int32 varint / key length < -1 / record too short
    assert dec1(b"\x00\x00\x00" + py_varint(2**31) + b"\x01\x00") == lib.LS_ERR_CORRUPT
    assert dec1(b"\x00\x00\x00\x81\x80\x80\x80\x80\x00\x01\x00") == lib.LS_ERR_CORRUPT
    assert dec1(b"\x00\x00\x00" + py_varint(-2) + b"\x01\x00") == lib.LS_ERR_CORRUPT
    assert dec1(b"\x00\x00\x00" + py_varint(5) + b"ab\x01\x00") == lib.LS_ERR_CORRUPT
    # offsetDelta must start >= 0; header count negative; header key null; extra byte in record
    assert dec1(b"\x00\x00" + py_varint(-1) + b"\x01\x01\x00") == lib.LS_ERR_CORRUPT
    assert dec1(b"\x00\x00\x00\x01\x01" + py_varint(-1)) == lib.LS_ERR_CORRUPT
    assert dec1(b"\x00\x00\x00\x01\x01\x02" + py_varint(-1) + b"\x01") == lib.LS_ERR_CORRUPT
    assert dec1(ok + b"\x00") == lib.LS_ERR_CORRUPT
    # record length: negative, beyond the section, outside int32
    for sec in (py_varint(-1) + ok, py_varint(len(ok) + 1) + ok):
        assert records_decode_rc(sec, len(sec), one, -1, cap=1) < 0
    sec = py_varint(2**32) + ok
    assert records_decode_rc(sec, len(sec), one, -1, cap=1) == lib.LS_ERR_CORRUPT


def test_headers_decode():
    hs = [(b"a", b"1"), (b"bb", None), (b"", b"")]
    raw = enc_headers(hs)
    assert decode_headers(raw, 3) == hs
    arrs = [ffi.new("int32_t[]", 4) for _ in range(4)]
    assert lib.ls_headers_decode(raw, len(raw), 2, *arrs) == lib.LS_ERR_CORRUPT
    assert lib.ls_headers_decode(raw, len(raw), 4, *arrs) == lib.LS_ERR_CORRUPT
    assert lib.ls_headers_decode(raw, len(raw), -1, *arrs) == lib.LS_ERR_ARG
    assert lib.ls_headers_decode(b"", 0, 0, *arrs) == 0


# ---------------------------------------------------------------- validation and corruption


def test_validate_reports_each_rule():
    buf = build_batch([(1, b"k", b"v", []), (2, None, b"w", [])], base_offset=10)
    rc, hdr, crc = validate(buf)
    assert rc == len(buf) and crc == hdr.crc and hdr.base_offset == 10
    assert validate(buf, max_batch_bytes=len(buf))[0] == len(buf)
    assert validate(buf, max_batch_bytes=len(buf) - 1)[0] == lib.LS_ERR_TOO_LARGE
    assert validate(buf + b"trailing")[0] == len(buf)
    assert validate(buf[:16] + b"\x01" + buf[17:])[0] == lib.LS_ERR_MAGIC
    assert validate(set_header(buf, base_offset=-1))[0] == lib.LS_ERR_CORRUPT
    assert validate(set_header(buf, base_offset=INT64_MAX))[0] == lib.LS_ERR_CORRUPT
    assert validate(set_header(buf, last_offset_delta=-1))[0] == lib.LS_ERR_CORRUPT
    assert validate(set_header(buf, records_count=3))[0] == lib.LS_ERR_CORRUPT  # > lod + 1
    assert validate(set_header(buf, records_count=3, last_offset_delta=5))[0] == lib.LS_ERR_CORRUPT
    assert validate(set_header(buf, records_count=-1))[0] == lib.LS_ERR_CORRUPT
    # a gap in offsets (lod > count - 1) is valid, as after compaction
    assert validate(set_header(buf, last_offset_delta=7))[0] == len(buf)
    # compressed batches skip the 7-bytes-per-record bound
    assert validate(set_header(buf, attributes=1, records_count=3, last_offset_delta=7))[0] == len(buf)
    short = struct.pack(">qi", 0, 48) + buf[12:]
    assert validate(short)[0] == lib.LS_ERR_CORRUPT


def test_truncation_at_every_length():
    buf = build_batch([(1, b"key", b"value", [(b"h", b"v")])] * 3)
    for cut in range(len(buf)):
        assert validate(buf[:cut])[0] == lib.LS_ERR_TRUNCATED, cut


def test_single_byte_flips_never_validate():
    buf = bytearray(build_batch([(1, b"key", b"value", [(b"h", b"v")]), (9, None, b"x" * 30, [])]))
    for pos in range(17, len(buf)):
        for delta in (1, 0x80, 0xFF):
            b = bytearray(buf)
            b[pos] ^= delta
            rc = validate(bytes(b))[0]
            assert rc < 0, (pos, delta)
            if pos >= 21:
                assert rc == lib.LS_ERR_CRC


@settings(FAST, max_examples=1500)
@given(st.binary(max_size=300), st.integers(0, 300))
def test_garbage_never_crashes(raw, split):
    data = exact(raw)
    validate(data)
    validate(data, max_batch_bytes=100)
    hdr = ffi.new("ls_batch_header *")
    if len(raw) >= 61:
        assert lib.ls_batch_header_parse(data, len(raw), hdr) == 0
        records_decode_rc(data + 61, len(raw) - 61, hdr, -1, cap=64)
    hdr.records_count = split % 17
    hdr.last_offset_delta = split
    n = records_decode_rc(data, len(raw), hdr, 0, cap=17)
    assert n < 0 or n == split % 17
    arrs = [ffi.new("int32_t[]", 8) for _ in range(4)]
    lib.ls_headers_decode(data, len(raw), split % 9, *arrs)
    varint_decode(exact(raw[:12]))
    scan(data, interval=0)
    segment_decode(data)


@settings(FAST, max_examples=1000)
@given(record_list(max_size=4), st.lists(st.tuples(st.integers(61, 10**6), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_records_with_valid_crc_never_crash(records, edits):
    """Structure-aware fuzz: corrupt the records section, fix the CRC, decode."""
    buf = bytearray(build_batch(records))
    for pos, val in edits:
        buf[61 + pos % (len(buf) - 61)] = val
    buf = refinish(bytes(buf))
    rc, hdr, _ = validate(exact(buf))
    assert rc == len(buf)
    out = RecordsOut(len(records))
    n = lib.ls_records_decode(exact(buf[61:]), len(buf) - 61, hdr, -1, out.ptr)
    if n >= 0:
        assert n == len(records)
        for row in out.rows(buf[61:]):  # every reported position lies inside the section
            assert row[3] is None or len(row[3]) >= 0
    else:
        assert out.ptr.count == 0
    res = scan(exact(buf))[0]
    assert (res.status == 0) == (n >= 0)


# ---------------------------------------------------------------- segment decode


def segment_decode(buf, min_offset=-1, max_offset=-1, cap=1000, position=0, max_batch_bytes=0):
    cur = ffi.new("ls_cursor *")
    cur.position = position
    out = RecordsOut(cap)
    rc = lib.ls_segment_decode(exact(buf), len(buf), min_offset, max_offset, max_batch_bytes, cur,
                               out.ptr)
    return rc, cur, out


def make_segment(batch_specs, base_offset=0):
    """batch_specs: list of record lists; returns (bytes, [(pos, size, last_offset, max_ts)])."""
    seg, meta, off = b"", [], base_offset
    for records in batch_specs:
        b = build_batch(records, base_offset=off)
        meta.append((len(seg), len(b), off + len(records) - 1, max(r[0] for r in records)))
        seg += b
        off += len(records)
    return seg, meta


def test_segment_decode_walks_filters_and_stops():
    specs = [[(1000 + 10 * j + i, b"k", b"v%d" % (10 * j + i), []) for i in range(j + 1)] for j in range(5)]
    seg, meta = make_segment(specs, base_offset=100)  # offsets 100..114
    rc, cur, out = segment_decode(seg)
    assert rc == 0 and cur.stop == lib.LS_STOP_END and cur.position == len(seg) and cur.batches == 5
    rows = out.rows(seg)
    assert [r[0] for r in rows] == list(range(100, 115))
    assert rows[3][4] == b"v20" and rows[3][1] == 1020  # positions are absolute in the segment

    rc, cur, out = segment_decode(seg, min_offset=104)
    assert [r[0] for r in out.rows(seg)] == list(range(104, 115)) and cur.batches == 5

    rc, cur, out = segment_decode(seg, max_offset=106)
    assert rc == 0 and cur.stop == lib.LS_STOP_MAX_OFFSET and cur.position == meta[3][0]
    assert [r[0] for r in out.rows(seg)] == list(range(100, 106))

    rc, cur, out = segment_decode(seg, cap=7)  # batches of 1, 2, 3 fit; 4 does not
    assert cur.stop == lib.LS_STOP_FULL and out.ptr.count == 6 and cur.position == meta[3][0]
    assert cur.header.base_offset == 106
    rc, cur, out = segment_decode(seg, cap=0)
    assert rc == 0 and cur.stop == lib.LS_STOP_FULL and cur.position == 0

    # resume from a position
    rc, cur, out = segment_decode(seg, position=meta[2][0])
    assert [r[0] for r in out.rows(seg)] == list(range(103, 115))

    # corrupt batch 2: stop with the error at its start, earlier rows kept
    bad = bytearray(seg)
    bad[meta[2][0] + 70] ^= 1
    rc, cur, out = segment_decode(bytes(bad))
    assert rc == lib.LS_ERR_CRC and cur.stop == lib.LS_STOP_ERROR and cur.position == meta[2][0]
    assert cur.computed_crc != cur.header.crc and out.ptr.count == 3
    rc, cur, out = segment_decode(seg[:-1])
    assert rc == lib.LS_ERR_TRUNCATED and cur.position == meta[4][0] and out.ptr.count == 10

    # a compressed batch stops the walk unless it lies wholly below min_offset
    comp = set_header(build_batch([(1, b"a", b"b", [])], base_offset=115), attributes=2)
    seg2 = seg + comp + build_batch([(2, None, b"z", [])], base_offset=116)
    rc, cur, out = segment_decode(seg2)
    assert rc == 0 and cur.stop == lib.LS_STOP_COMPRESSED and cur.position == len(seg)
    assert cur.header.attributes == 2 and cur.header.base_offset == 115
    rc, cur, out = segment_decode(seg2, min_offset=116)
    assert cur.stop == lib.LS_STOP_END and [r[0] for r in out.rows(seg2)] == [116]

    rc, cur, out = segment_decode(seg, max_batch_bytes=meta[4][1] - 1)
    assert rc == lib.LS_ERR_TOO_LARGE and cur.position == meta[4][0]
    cur = ffi.new("ls_cursor *")
    cur.position = len(seg) + 1
    out = RecordsOut(1)
    assert lib.ls_segment_decode(seg, len(seg), -1, -1, 0, cur, out.ptr) == lib.LS_ERR_ARG


# ---------------------------------------------------------------- segment scan


def scan(buf, base_offset=0, interval=4096, max_batch_bytes=0, index_cap=100, timeindex_cap=100):
    idx = ffi.new("char[]", max(index_cap, 1) * 8)
    tix = ffi.new("char[]", max(timeindex_cap, 1) * 12)
    res = ffi.new("ls_scan_result *")
    rc = lib.ls_segment_scan(exact(buf), len(buf), base_offset, interval, max_batch_bytes, idx, index_cap,
                             tix, timeindex_cap, res)
    assert rc == 0
    return (res, bytes(ffi.buffer(idx, res.index_entries * 8)),
            bytes(ffi.buffer(tix, res.timeindex_entries * 12)))


def model_index(meta, seg_base, interval):
    """Kafka's LogSegment.recover rule, independently."""
    idx, ti, since, max_ts, off_max, last_ti = [], [], 0, -1, -1, -1
    for pos, size, last, mts in meta:
        if mts > max_ts:
            max_ts, off_max = mts, last
        if since > interval:
            idx.append(struct.pack(">ii", last - seg_base, pos))
            if max_ts > last_ti:
                ti.append(struct.pack(">qi", max_ts, off_max - seg_base))
                last_ti = max_ts
            since = 0
        since += size
    return b"".join(idx), b"".join(ti)


def random_specs(rnd, n):
    return [
        [(rnd.choice([rnd.randrange(10**6), 500]), None, os.urandom(rnd.randrange(50)), [])
         for _ in range(rnd.randrange(1, 4))]
        for _ in range(n)
    ]


@pytest.mark.parametrize("interval", [0, 50, 150, 4096])
def test_segment_scan_valid_prefix_and_index(interval):
    rnd = random.Random(interval)
    seg, meta = make_segment(random_specs(rnd, 12), base_offset=1000)
    want_idx, want_ti = model_index(meta, 1000, interval)
    last = meta[-1][2]
    for tail, status in [(b"", 0), (bytes(5000), lib.LS_ERR_ZERO), (bytes(3), lib.LS_ERR_ZERO),
                         (b"\x00" * 20 + b"\x01" + bytes(100), lib.LS_ERR_CORRUPT),
                         (os.urandom(100), None)]:
        res, idx, ti = scan(seg + tail, base_offset=1000, interval=interval)
        assert res.valid_bytes == len(seg) and res.batches == 12 and res.last_offset == last
        assert res.records == last - 1000 + 1
        assert idx == want_idx and ti == want_ti
        assert res.max_timestamp == max(m[3] for m in meta)
        if status is not None:
            assert res.status == status
        else:
            assert res.status < 0
    # truncated last batch, corrupt middle batch
    res, idx, ti = scan(seg[:-1], base_offset=1000, interval=interval)
    assert res.valid_bytes == meta[-1][0] and res.status == lib.LS_ERR_TRUNCATED
    bad = bytearray(seg)
    bad[meta[5][0] + 30] ^= 0x40
    res, idx, ti = scan(bytes(bad), base_offset=1000, interval=interval)
    assert res.valid_bytes == meta[5][0] and res.status == lib.LS_ERR_CRC and res.batches == 5
    assert res.stored_crc != res.computed_crc
    assert idx == model_index(meta[:5], 1000, interval)[0]


def test_segment_scan_offset_rules_and_limits():
    a = build_batch([(1, None, b"a", [])] * 2, base_offset=10)  # offsets 10, 11
    b = build_batch([(2, None, b"b", [])], base_offset=11)      # not after 11
    c = build_batch([(3, None, b"c", [])], base_offset=12)
    assert scan(a + c, base_offset=10)[0].status == 0
    res = scan(a + b + c, base_offset=10)[0]
    assert res.status == lib.LS_ERR_CORRUPT and res.valid_bytes == len(a)
    res = scan(a, base_offset=12)[0]  # last offset below the segment's base offset
    assert res.status == lib.LS_ERR_CORRUPT and res.valid_bytes == 0 and res.last_offset == -1
    far = build_batch([(3, None, b"c", [])], base_offset=10 + INT32_MAX + 1)
    res = scan(a + far, base_offset=10)[0]
    assert res.status == lib.LS_ERR_CORRUPT and res.valid_bytes == len(a)
    res = scan(a + c, base_offset=10, max_batch_bytes=len(a) - 1)[0]
    assert res.status == lib.LS_ERR_TOO_LARGE and res.valid_bytes == 0
    res = scan(b"", base_offset=10)[0]
    assert (res.status, res.valid_bytes, res.last_offset, res.max_timestamp) == (0, 0, -1, -1)
    res = scan(bytes(100))[0]
    assert res.status == lib.LS_ERR_ZERO and res.valid_bytes == 0
    # records section broken under a valid CRC
    broken = bytearray(c)
    broken[61] = 0x7F  # record length -64
    res = scan(a + refinish(bytes(broken)), base_offset=10)[0]
    assert res.status == lib.LS_ERR_CORRUPT and res.valid_bytes == len(a)
    # index capacity
    seg, meta = make_segment(random_specs(random.Random(3), 10))
    want_idx, want_ti = model_index(meta, 0, 0)
    res, idx, ti = scan(seg, interval=0, index_cap=3, timeindex_cap=100)
    assert res.index_full == 1 and idx == want_idx[:24] and ti == want_ti and res.status == 0
    res, idx, ti = scan(seg, interval=0)
    assert res.index_full == 0 and res.index_entries == 9


# ---------------------------------------------------------------- appender


class Appender:
    def __init__(self, log_cap=1 << 16, index_cap=100, timeindex_cap=100, base_offset=0,
                 interval=100, max_batch_bytes=0, ple=7):
        self.log = bytearray(log_cap)
        self.index = bytearray(index_cap * 8)
        self.timeindex = bytearray(timeindex_cap * 12)
        self.keep = [ffi.from_buffer("char[]", b, require_writable=True)
                     for b in (self.log, self.index, self.timeindex)]
        a = self.a = ffi.new("ls_appender *")
        a.log, a.index, a.timeindex = self.keep
        a.log_capacity, a.index_capacity, a.timeindex_capacity = log_cap, index_cap, timeindex_cap
        a.base_offset = a.next_offset = base_offset
        a.index_interval_bytes = interval
        a.max_timestamp = a.offset_of_max_timestamp = a.last_timeindex_timestamp = -1
        a.max_batch_bytes = max_batch_bytes
        a.partition_leader_epoch = ple

    def record(self, ts, key=None, value=None, headers=(), attributes=0):
        raw = enc_headers(headers) if headers else ffi.NULL
        return lib.ls_appender_append_record(
            self.a, ts, attributes, key if key is not None else ffi.NULL,
            len(key) if key is not None else -1, value if value is not None else ffi.NULL,
            len(value) if value is not None else -1, raw, len(raw) if headers else 0, len(headers))

    def batch(self, buf):
        return lib.ls_appender_append_batch(self.a, buf, len(buf))

    def contents(self):
        a = self.a
        return (bytes(self.log[: a.position]), bytes(self.index[: a.index_entries * 8]),
                bytes(self.timeindex[: a.timeindex_entries * 12]))


def test_appender_matches_recovery_scan_and_kafka_python():
    rnd = random.Random(11)
    ap = Appender(base_offset=500, interval=120)
    expected = []
    for i in range(60):
        ts = rnd.choice([1000 + i, 900, 2000 + rnd.randrange(100)])
        if rnd.random() < 0.3:
            records = [(ts + j, os.urandom(3), os.urandom(rnd.randrange(20)), [(b"h", b"x")])
                       for j in range(rnd.randrange(1, 4))]
            off = ap.batch(build_batch(records, base_offset=rnd.randrange(10**6), ple=-5))
            assert off == ap.a.next_offset - len(records)
            expected += [(off + j, r[0], r[1], r[2], r[3]) for j, r in enumerate(records)]
        else:
            key = rnd.choice([None, b"", b"key%d" % i])
            value = rnd.choice([None, os.urandom(rnd.randrange(40))])
            headers = rnd.choice([(), ((b"a", b"1"),), ((b"a", None), (b"", b"zz"))])
            off = ap.record(ts, key, value, headers)
            assert off == ap.a.next_offset - 1
            expected.append((off, ts, key, value, list(headers)))
        assert off >= 500
    log, idx, ti = ap.contents()
    assert ap.a.index_entries > 5 and ap.a.timeindex_entries >= 1
    res, sidx, sti = scan(log, base_offset=500, interval=120)
    assert res.status == 0 and res.valid_bytes == len(log) and res.last_offset == ap.a.next_offset - 1
    assert sidx == idx and sti == ti
    assert res.max_timestamp == ap.a.max_timestamp
    assert res.offset_of_max_timestamp == ap.a.offset_of_max_timestamp
    assert res.records == ap.a.records == len(expected)
    # every batch decodes with kafka-python and carries the appender's leader epoch
    pos, got = 0, []
    while pos < len(log):
        size = 12 + struct.unpack(">i", log[pos + 8 : pos + 12])[0]
        batch, rows = kafka_decode(log[pos : pos + size])
        assert batch.leader_epoch == 7
        got += rows
        pos += size
    assert got == expected
    rc, cur, out = segment_decode(log)
    assert rc == 0 and [(r[0], r[1], r[3], r[4], r[5]) for r in out.rows(log)] == expected
    # seal adds the final time index entry only when the max timestamp is newer
    n = ap.a.timeindex_entries
    assert lib.ls_appender_seal(ap.a) == 0
    assert ap.a.timeindex_entries in (n, n + 1)
    last_ts = struct.unpack(">q", ap.timeindex[(ap.a.timeindex_entries - 1) * 12 :][:8])[0]
    assert last_ts == ap.a.max_timestamp
    assert lib.ls_appender_seal(ap.a) == 0 and ap.a.timeindex_entries in (n, n + 1)


def test_appender_record_bytes_equal_kafka_python_and_log_append_time():
    ap = Appender(ple=0)
    assert ap.record(1234, b"k", b"v", ((b"h", b"x"),)) == 0
    log = ap.contents()[0]
    assert log == kafka_build([(1234, b"k", b"v", [(b"h", b"x")])])
    first = len(log)
    assert ap.record(99, None, None, (), attributes=8) == 1
    log = ap.contents()[0]
    hdr, rows = decode_batch(log[first:])
    assert hdr.attributes == 8 and rows == [(1, 99, 1, None, None, [])]


def test_appender_limits():
    ap = Appender(log_cap=300, max_batch_bytes=100)
    assert ap.record(1, None, b"x" * 200) == lib.LS_ERR_TOO_LARGE  # before FULL
    assert ap.record(1, None, b"x" * 10) == 0
    n = 1
    while (rc := ap.record(1, None, b"x" * 10)) >= 0:
        assert rc == n
        n += 1
    assert rc == lib.LS_ERR_FULL
    before = ap.contents()
    assert ap.record(1, None, b"x" * 200) == lib.LS_ERR_TOO_LARGE
    assert ap.batch(build_batch([(1, None, b"y" * 100, [])])) == lib.LS_ERR_TOO_LARGE
    assert ap.batch(build_batch([(1, None, b"y", [])])) == lib.LS_ERR_FULL
    assert ap.contents() == before and ap.a.next_offset == n

    ap = Appender(index_cap=2, timeindex_cap=100, interval=0)
    for i in range(3):
        assert ap.record(i, None, b"v") == i  # second and third add index entries
    assert ap.a.index_entries == 2
    assert ap.record(3, None, b"v") == lib.LS_ERR_FULL
    ap = Appender(index_cap=100, timeindex_cap=0)
    assert ap.record(3, None, b"v") == lib.LS_ERR_FULL

    ap = Appender(base_offset=10)
    ap.a.next_offset = 10 + INT32_MAX - 1
    assert ap.batch(build_batch([(1, None, b"v", [])] * 3)) == lib.LS_ERR_FULL
    assert ap.record(1, None, b"v") == 10 + INT32_MAX - 1
    assert ap.record(1, None, b"v") == 10 + INT32_MAX
    assert ap.record(1, None, b"v") == lib.LS_ERR_FULL

    ap = Appender()
    assert ap.record(1, None, b"v", attributes=1) == lib.LS_ERR_ARG
    assert ap.record(1, None, b"v", attributes=16) == lib.LS_ERR_ARG
    bad_headers = b"\x05ab"
    assert lib.ls_appender_append_record(ap.a, 1, 0, ffi.NULL, -1, ffi.NULL, -1, bad_headers,
                                         len(bad_headers), 1) == lib.LS_ERR_ARG
    assert lib.ls_appender_append_record(ap.a, 1, 0, ffi.NULL, -1, ffi.NULL, -1, ffi.NULL, 0,
                                         1) == lib.LS_ERR_ARG
    good = build_batch([(1, None, b"v", [])])
    assert ap.batch(good[:60]) == lib.LS_ERR_TRUNCATED
    assert ap.batch(good[:-1]) == lib.LS_ERR_TRUNCATED
    assert ap.batch(good + b"x") == lib.LS_ERR_CORRUPT
    assert ap.batch(good[:16] + b"\x01" + good[17:]) == lib.LS_ERR_CORRUPT
    assert ap.a.position == 0 and ap.a.next_offset == 0


# ---------------------------------------------------------------- index files


def offset_index(entries):
    return b"".join(struct.pack(">ii", o, p) for o, p in entries)


def time_index(entries):
    return b"".join(struct.pack(">qi", t, o) for t, o in entries)


@FAST
@given(st.lists(st.integers(0, 10**6), unique=True, max_size=50).map(sorted),
       st.integers(-5, 10**6 + 5))
def test_index_lookup(offsets, target):
    buf = offset_index([(o, 10 * o + 5) for o in offsets])
    want = bisect.bisect_right(offsets, target) - 1
    assert lib.ls_index_lookup(buf, len(offsets), target) == want
    tbuf = time_index([(o * 3 - 100, o) for o in offsets])
    stamps = [o * 3 - 100 for o in offsets]
    assert lib.ls_timeindex_lookup(tbuf, len(offsets), target) == bisect.bisect_right(stamps, target) - 1


def test_index_check_and_entries():
    good = offset_index([(1, 100), (5, 300), (9, 400)])
    assert lib.ls_index_check(good, 3, 0, 9) == -1
    assert lib.ls_index_check(good, 3, 0, 8) == 2
    # Every entry marks a different batch: equal positions are damage.
    assert lib.ls_index_check(offset_index([(1, 100), (5, 300), (9, 300)]), 3, 0, 9) == 2
    assert lib.ls_index_check(offset_index([(1, 100), (1, 200)]), 2, 0, 100) == 1
    assert lib.ls_index_check(offset_index([(1, 100), (2, 50)]), 2, 0, 100) == 1
    assert lib.ls_index_check(offset_index([(-1, 100)]), 1, 0, 100) == 0
    assert lib.ls_index_check(b"", 0, 0, 0) == -1
    tgood = time_index([(5, 1), (6, 1), (7, 4)])
    assert lib.ls_index_check(tgood, 3, 1, 4) == -1
    # Appends add a time entry only for a newer timestamp: an equal one is damage.
    assert lib.ls_index_check(time_index([(5, 1), (5, 1), (7, 4)]), 3, 1, 4) == 1
    assert lib.ls_index_check(time_index([(5, 1), (4, 2)]), 2, 1, 4) == 1
    assert lib.ls_index_check(time_index([(5, 2), (6, 1)]), 2, 1, 4) == 1
    assert lib.ls_index_check(time_index([(5, 2), (6, 5)]), 2, 1, 4) == 1

    assert lib.ls_index_entries(good + bytes(80), 13, 0) == 3
    assert lib.ls_index_entries(good, 3, 0) == 3
    assert lib.ls_index_entries(bytes(80), 10, 0) == 0
    assert lib.ls_index_entries(offset_index([(0, 1), (0, 0), (3, 4)]), 3, 0) == 1
    assert lib.ls_index_entries(tgood + bytes(24), 5, 1) == 3
    assert lib.ls_index_entries(time_index([(0, 0), (5, 1)]), 2, 1) == 0
    assert lib.ls_index_entries(time_index([(0, 1)]), 1, 1) == 1
    assert lib.ls_index_lookup(b"", 0, 5) == -1 and lib.ls_timeindex_lookup(b"", 0, 5) == -1


# ---------------------------------------------------------------- Arrow columns (columns.c)


def _gather(buf: bytes, spans):
    n = len(spans)
    pos = ffi.new("int32_t[]", [p for p, _ in spans] or [0])
    lens = ffi.new("int32_t[]", [l for _, l in spans] or [0])
    cap = max(lib.ls_binary_size(lens, n), 0)
    data = ffi.new("char[]", max(cap, 1))
    offsets = ffi.new("int32_t[]", n + 1)
    validity = ffi.new("uint8_t[]", max((n + 7) // 8, 1))
    nulls = ffi.new("int32_t *")
    rc = lib.ls_gather_binary(buf, len(buf), pos, lens, n, offsets, validity, data, cap, nulls)
    return rc, ffi.buffer(data, max(rc, 0))[:], list(offsets), bytes(ffi.buffer(validity, (n + 7) // 8)), nulls[0]


@FAST
@given(st.lists(st.one_of(st.none(), st.binary(max_size=20)), max_size=40))
def test_gather_binary_builds_arrow_buffers(values):
    buf = b"".join(v for v in values if v is not None) + b"#"
    spans, at = [], 0
    for v in values:
        if v is None:
            spans.append((0, -1))
        else:
            spans.append((at, len(v)))
            at += len(v)
    rc, data, offsets, validity, nulls = _gather(buf, spans)
    assert rc == sum(len(v) for v in values if v is not None)
    assert data == b"".join(v for v in values if v is not None)
    assert nulls == sum(v is None for v in values)
    for i, v in enumerate(values):
        assert bool(validity[i >> 3] >> (i & 7) & 1) == (v is not None)
        assert offsets[i + 1] - offsets[i] == (0 if v is None else len(v))


@pytest.mark.parametrize("spans", [[(8, 4)], [(-1, 2)], [(0, 11)], [(0, -2)], [(2**31 - 1, 1)]])
def test_gather_binary_refuses_spans_outside_the_buffer(spans):
    assert _gather(b"0123456789", spans)[0] == lib.LS_ERR_CORRUPT


def test_gather_binary_refuses_output_larger_than_the_capacity():
    pos = ffi.new("int32_t[]", [0, 0])
    lens = ffi.new("int32_t[]", [6, 6])
    data = ffi.new("char[]", 10)
    offsets = ffi.new("int32_t[]", 3)
    validity = ffi.new("uint8_t[]", 1)
    nulls = ffi.new("int32_t *")
    assert lib.ls_gather_binary(b"abcdefgh", 8, pos, lens, 2, offsets, validity, data, 10, nulls) == lib.LS_ERR_NOSPACE
    assert lib.ls_binary_size(ffi.new("int32_t[]", [3, -7]), 2) == lib.LS_ERR_CORRUPT


def test_timestamps_to_microseconds_saturate():
    ms = ffi.new("int64_t[]", [0, -1, 1700000000123, INT64_MAX, INT64_MIN, INT64_MAX // 1000 + 1])
    us = ffi.new("int64_t[]", 6)
    lib.ls_ms_to_us(ms, 6, us)
    assert list(us) == [0, -1000, 1700000000123000, INT64_MAX, INT64_MIN, INT64_MAX]


def test_first_at_least_and_widen():
    values = ffi.new("int64_t[]", [5, 3, 9, 9, 1])
    assert [lib.ls_first_at_least(values, 5, t) for t in (0, 5, 6, 9, 10)] == [0, 0, 2, 2, -1]
    out = ffi.new("int32_t[]", 3)
    lib.ls_widen_int8(ffi.new("int8_t[]", [-1, 0, 1]), 3, out)
    assert list(out) == [-1, 0, 1]
