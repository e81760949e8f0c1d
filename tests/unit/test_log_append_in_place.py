"""Log.append_idempotent(in_place=True): a writable batch handed over is stamped with its offsets
and leader epoch where it lies (the server's Produce frames), not copied; the log stores the same
bytes as without it. A read-only batch, a duplicate and a refused batch are left as they were."""

from __future__ import annotations

import pytest

from logstore import CorruptRecordError, Log
from logstore.records.batch import BatchBuilder, parse_header


def batch(values, pid=-1, seq=-1):
    return bytes(BatchBuilder().build(values, producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                                      base_sequence=seq))


def stored(log):
    return [(r.offset, r.value) for r in log.iter()]


@pytest.mark.parametrize("how", ["bytearray", "view", "slice"])
def test_a_writable_batch_is_stamped_where_it_lies(tmp_path, how):
    with Log.open(str(tmp_path / "a-0")) as a, Log.open(str(tmp_path / "b-0")) as b:
        for log in (a, b):
            log.append(b"first")
        data = batch([b"x", b"y"], pid=3, seq=0)
        frame = bytearray(b"\xee" * 9 + data + b"\xee" * 5)
        given = {"bytearray": bytearray(data), "view": memoryview(bytearray(data)),
                 "slice": memoryview(frame)[9:9 + len(data)]}[how]
        assert a.append_idempotent(given, in_place=True) == (1, 2, False)
        assert b.append_idempotent(data) == (1, 2, False)
        assert parse_header(bytes(given)).base_offset == 1  # stamped in the caller's buffer
        assert bytes(frame[:9]) == b"\xee" * 9 and bytes(frame[-5:]) == b"\xee" * 5  # nothing around it
        assert stored(a) == stored(b) == [(0, b"first"), (1, b"x"), (2, b"y")]
        assert a.append_idempotent(bytearray(data), in_place=True) == (1, 2, True)  # a duplicate still


def test_a_read_only_or_refused_batch_is_left_alone(tmp_path):
    with Log.open(str(tmp_path / "c-0")) as log:
        log.append(b"first")
        data = batch([b"z"])
        view = memoryview(data).toreadonly()
        assert log.append_idempotent(view, in_place=True) == (1, 1, False)
        assert bytes(view) == data
        bad = bytearray(batch([b"bad"]))
        bad[-1] ^= 0xFF
        before = bytes(bad)
        with pytest.raises(CorruptRecordError):
            log.append_idempotent(bad, in_place=True)
        assert bytes(bad) == before and log.log_end_offset == 2
        assert stored(log) == [(0, b"first"), (1, b"z")]
