"""Control records: the metadata records of control batches, in Kafka's schemas.

A control batch (attribute bit 5) holds one record whose key says what it is and whose value
carries the details; consumers never see it. Its key is Kafka's ``ControlRecordType`` schema,
version 0, big-endian::

    version  int16  0
    type     int16  0 ABORT, 1 COMMIT (transaction markers), 2 LEADER_CHANGE (KRaft), ...

A transaction marker (COMMIT or ABORT) is written by the partition's log when a transaction
ends, in a batch that is also transactional (bit 4) and carries the producer's id and epoch with
base sequence -1; its value is Kafka's ``EndTxnMarker``, version 0::

    version            int16  0
    coordinator_epoch  int32  the epoch of the transaction coordinator that wrote it

A leader change record (KRaft's, written by replication when a leader takes office) has the
``LeaderChangeMessage`` value, version 0, a flexible message (compact arrays, tagged fields).
FORMAT.md shows the bytes of each. Thread-safe: constants and pure functions.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any, Iterable

from ..errors import CorruptRecordError
from .batch import HEADER_SIZE

__all__ = ["ControlType", "uvarint", "end_txn_marker_record", "control_key_type", "marker_coordinator_epoch",
           "leader_change_record", "read_control_record", "read_marker", "CONTROL_LEADER_CHANGE"]

_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")


class ControlType(IntEnum):
    """Kafka's ControlRecordType: what a control record is (the type field of its key)."""

    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2


#: ControlRecordType of Kafka's KRaft leader change record.
CONTROL_LEADER_CHANGE = int(ControlType.LEADER_CHANGE)


def end_txn_marker_record(commit: bool, coordinator_epoch: int) -> tuple[bytes, bytes]:
    """(key, value) of a COMMIT (``commit``) or ABORT transaction marker record.

    >>> end_txn_marker_record(True, 5)
    (b'\\x00\\x00\\x00\\x01', b'\\x00\\x00\\x00\\x00\\x00\\x05')
    """
    if not -(2**31) <= coordinator_epoch < 2**31:
        raise ValueError(f"coordinator epoch {coordinator_epoch} does not fit an int32")
    kind = ControlType.COMMIT if commit else ControlType.ABORT
    return _KEY.pack(0, kind), _MARKER_VALUE.pack(0, coordinator_epoch)


def control_key_type(key: bytes | bytearray | memoryview | None, what: str = "control record") -> int:
    """The type of a control record from its key (version 0; Kafka reads a newer version's
    leading fields the same way, so any version >= 0 is accepted).

    Raises:
        CorruptRecordError: the key is missing or shorter than 4 bytes, or its version is negative.
    """
    if key is None or len(key) < _KEY.size:
        raise CorruptRecordError(what, 0, f"a control record key of {0 if key is None else len(key)} bytes "
                                          f"(at least {_KEY.size})")
    version, kind = _KEY.unpack_from(key)
    if version < 0:
        raise CorruptRecordError(what, 0, f"control record key version {version}")
    return kind


def marker_coordinator_epoch(value: bytes | bytearray | memoryview | None, what: str = "transaction marker") -> int:
    """The coordinator epoch of a transaction marker's value (EndTxnMarker, any version >= 0).

    Raises:
        CorruptRecordError: the value is missing, too short or of a negative version.
    """
    if value is None or len(value) < _MARKER_VALUE.size:
        raise CorruptRecordError(what, 0, f"an end transaction marker of {0 if value is None else len(value)} "
                                          f"bytes (at least {_MARKER_VALUE.size})")
    version, epoch = _MARKER_VALUE.unpack_from(value)
    if version < 0:
        raise CorruptRecordError(what, 0, f"end transaction marker version {version}")
    return epoch


def uvarint(n: int) -> bytes:
    """An unsigned varint (Kafka's UNSIGNED_VARINT: the compact lengths and tag numbers of a
    flexible message), for the record values logstore writes in Kafka's flexible formats."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """A zigzag varint at ``pos`` (Kafka's record fields); raises IndexError past ``end``."""
    shift = result = 0
    while True:
        if pos >= end or shift > 63:
            raise IndexError(pos)
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def read_control_record(buf: Any, position: int, size: int, what: str = "control batch") -> tuple[int, bytes | None]:
    """(control type, value) of the control batch of ``size`` bytes at ``position`` of ``buf``
    (an uncompressed batch whose CRC was checked): its first record's key type and value. Reads
    that record's fields in order, each bounds-checked against the batch.

    Raises:
        CorruptRecordError: the first record, its key or its value does not fit the batch.
    """
    end = position + size
    pos = position + HEADER_SIZE
    try:
        _, pos = _read_varint(buf, pos, end)          # record length
        pos += 1                                      # attributes
        _, pos = _read_varint(buf, pos, end)          # timestamp delta
        _, pos = _read_varint(buf, pos, end)          # offset delta
        key_len, pos = _read_varint(buf, pos, end)
        if key_len < _KEY.size or pos + key_len > end:
            raise CorruptRecordError(what, position, f"its first record's key ({key_len} bytes) is not a control key")
        kind = control_key_type(bytes(buf[pos:pos + _KEY.size]), what)
        pos += key_len
        value_len, pos = _read_varint(buf, pos, end)
    except IndexError:
        raise CorruptRecordError(what, position, "its first record does not fit the batch") from None
    if value_len < 0:
        return kind, None
    if pos + value_len > end:
        raise CorruptRecordError(what, position, f"its first record's value ({value_len} bytes) overruns the batch")
    return kind, bytes(buf[pos:pos + value_len])


def read_marker(buf: Any, position: int, size: int, what: str = "control batch") -> tuple[int, int]:
    """(control type, coordinator epoch) of the control batch at ``position`` of ``buf``; the
    epoch is -1 unless the batch is a COMMIT or ABORT marker.

    Raises:
        CorruptRecordError: as :func:`read_control_record`, or a marker's value is too short.
    """
    kind, value = read_control_record(buf, position, size, what)
    if kind in (ControlType.ABORT, ControlType.COMMIT):
        return kind, marker_coordinator_epoch(value, what)
    return kind, -1


def leader_change_record(leader: int, voters: Iterable[int], granting: Iterable[int]) -> tuple[bytes, bytes]:
    """(key, value) of a leader change control record as Kafka's KRaft writes it: the key is
    ControlRecordType (version 0, type 2), the value LeaderChangeMessage version 0 (flexible:
    compact arrays of voters, empty tagged fields). FORMAT.md §13 shows the bytes."""
    def voter_array(ids: Iterable[int]) -> bytes:
        ids = list(ids)
        return uvarint(len(ids) + 1) + b"".join(struct.pack(">i", v) + b"\x00" for v in ids)

    key = _KEY.pack(0, CONTROL_LEADER_CHANGE)
    value = struct.pack(">hi", 0, leader) + voter_array(voters) + voter_array(granting) + b"\x00"
    return key, value
