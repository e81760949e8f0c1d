"""validate_client_batch checks an uncompressed batch's CRC once (one C pass: CRC, header and every
record) and refuses every bad batch with the same error as the step-by-step check (the CRC and
header first, then the client rules, then the record walk): every byte of a batch changed in
turn, cut at every length, and two batches where one is allowed."""

from __future__ import annotations

import pytest

from logstore import LogstoreError
from logstore._native import ffi, lib
from logstore.records.batch import BatchBuilder, reason, validate_batch, validate_client_batch
from logstore.records.batch import _client_header_rules  # the header rules, shared by both orders
from logstore.errors import CorruptRecordError  # noqa: I001


def step_by_step(buf, max_message_bytes=0, what="produced batch"):
    """The order validate_client_batch refused bad batches in before: the oracle."""
    n = len(buf)
    header = validate_batch(buf, 0, 0, what)
    _client_header_rules(header, n, what)
    res = ffi.new("ls_scan_result *")
    lib.ls_segment_scan(ffi.from_buffer(buf), n, header.base_offset, 0, 0, ffi.NULL, 0, ffi.NULL, 0, res)
    if res.status != lib.LS_OK or res.valid_bytes != n:
        raise CorruptRecordError(what, res.valid_bytes, reason(res.status))
    return header


def outcome(check, buf):
    try:
        return ("ok", check(buf, 0))
    except LogstoreError as exc:
        return (type(exc).__name__, str(exc))


def good_batch(pid=-1):
    return bytes(BatchBuilder().build([b"value %d" % i for i in range(5)], keys=[b"k%d" % i for i in range(5)],
                                      producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                                      base_sequence=0 if pid >= 0 else -1))


@pytest.mark.parametrize("pid", [-1, 9])
def test_every_changed_byte_is_refused_as_before(pid):
    data = good_batch(pid)
    assert outcome(validate_client_batch, data) == outcome(step_by_step, data)
    for at in range(len(data)):
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(data)
            bad[at] ^= flip
            assert outcome(validate_client_batch, bytes(bad)) == outcome(step_by_step, bytes(bad)), (at, flip)


def test_every_cut_and_two_batches_are_refused_as_before():
    data = good_batch()
    for n in range(61, len(data)):
        assert outcome(validate_client_batch, data[:n]) == outcome(step_by_step, data[:n])
    two = data + data
    assert outcome(validate_client_batch, two)[0] == "CorruptRecordError"
    assert outcome(validate_client_batch, two) == outcome(step_by_step, two)
