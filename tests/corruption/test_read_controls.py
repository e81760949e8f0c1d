"""Controls: reads of an undamaged log with the read options the corruption tests use.

The corruption tests read with ``max_records=1`` and with small ``max_bytes`` to reach one batch
at a time; if those reads go wrong on intact data, a corruption test cannot tell damage from a
read bug. Every read here must return exactly the written records from the offset asked for.
"""

from __future__ import annotations

import random

import pytest

from .helpers import as_recs, make_log, read_everything


@pytest.mark.regression(reason="fixed: read(offset, max_bytes=small) returns [] from a segment "
                   "when its byte window ends exactly after batches below offset, and Log.read "
                   "then continues in the next segment (or returns [] in the last): records are "
                   "silently skipped")
def test_undamaged_log_reads_every_offset_with_tiny_max_bytes(tmp_path):
    path = str(tmp_path / "t-0")
    log, written = make_log(path, random.Random(1), 200)
    with log:
        by_offset = written.by_offset()
        wrong = {}
        for max_bytes in (1, 60, 100):
            for rec in written.records:
                got = as_recs(log.read(rec.offset, max_bytes=max_bytes))
                assert all(by_offset[r.offset] == r for r in got)
                if not got or got[0].offset != rec.offset:
                    wrong[(max_bytes, rec.offset)] = got[0].offset if got else "nothing"
        assert wrong == {}


@pytest.mark.parametrize("max_records", [1, 2, 3, 50])
def test_undamaged_uncompressed_log_reads_every_offset_with_max_records(tmp_path, max_records):
    path = str(tmp_path / "t-0")
    log, written = make_log(path, random.Random(2), 120)
    with log:
        for rec in written.records:
            got = as_recs(log.read(rec.offset, max_records=max_records))
            assert got == written.records[rec.offset : rec.offset + len(got)]
            assert got[0] == rec and len(got) <= max_records


@pytest.mark.regression(reason="fixed: read(offset, max_records=n) raises LogstoreError('output "
                   "buffer too small') when a compressed batch comes up: decode() narrows "
                   "out.capacity to the records still wanted, _decode_compressed only grows to "
                   "self.capacity, and ls_records_decode returns LS_ERR_NOSPACE")
@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_undamaged_compressed_log_reads_every_offset_with_max_records(tmp_path, codec):
    path = str(tmp_path / "t-0")
    log, written = make_log(path, random.Random(3), 60, codecs=(codec,))
    with log:
        assert read_everything(log) == written.records
        for rec in written.records:
            got = as_recs(log.read(rec.offset, max_records=1))
            assert got == [rec]
