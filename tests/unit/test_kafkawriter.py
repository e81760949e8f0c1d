"""The response writer against kio's own writer, byte for byte, for every response class the
server answers with (random fields by hypothesis), plus its errors and file regions."""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from logstore._fileio import FileRegion
from logstore.kafkawire import SUPPORTED, encode
from logstore.kafkawriter import write_response

_UTC = datetime.timezone.utc
_BOUNDS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
_UNSIGNED = {"uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}
_CODES = sorted(code.value for code in ErrorCode)

#: (api key, version) of every response the server writes through the writer (Produce v0-v2
#: are advertised but refused without an answer: kio has no classes for them).
CLASSES = [(key, version) for key, (low, high) in sorted(SUPPORTED.items()) for version in range(low, high + 1)
           if not (key == 0 and version < 3)]


def _hints(cls):
    return typing.get_type_hints(cls)


def _shape(hint):
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is tuple:
            item = typing.get_args(arg)[0]
            return True, item if dataclasses.is_dataclass(item) else None
        if dataclasses.is_dataclass(arg):
            return False, arg
    return False, None


def _primitive(kind, nullable):
    if kind in _BOUNDS:
        bits = _BOUNDS[kind]
        values = st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    elif kind in _UNSIGNED:
        values = st.integers(0, (1 << _UNSIGNED[kind]) - 1)
    elif kind == "float64":
        values = st.floats(allow_nan=False)
    elif kind == "bool":
        values = st.booleans()
    elif kind == "error_code":
        values = st.sampled_from(_CODES)
    elif kind == "timedelta_i32":
        values = st.integers(0, (1 << 31) - 1)
    elif kind == "timedelta_i64":
        values = st.integers(0, 1 << 50)
    elif kind == "datetime_i64":
        values = st.integers(0, 1 << 44)  # milliseconds since the epoch
    elif kind == "string":
        values = st.text(max_size=20)
    elif kind in ("bytes", "records"):
        values = st.binary(max_size=40)
    elif kind == "uuid":
        values = st.uuids()
    else:
        raise AssertionError(f"no strategy for {kind!r}")
    return st.one_of(st.none(), values) if nullable else values


def fields_of(cls):
    """A strategy of field mappings (as handlers give them: plain ints, ms, nested mappings)."""
    hints = _hints(cls)
    members = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        nullable = type(None) in typing.get_args(hint)
        array, item = _shape(hint)
        if item is not None:
            inner = fields_of(item)
            values = st.lists(inner, max_size=2) if array else inner
        elif array:
            values = st.lists(_primitive(f.metadata["kafka_type"], False), max_size=3)
        else:
            values = _primitive(f.metadata["kafka_type"], nullable)
        members[f.name] = st.one_of(st.none(), values) if nullable and (array or item) else values
    return st.fixed_dictionaries(members)


def kio_instance(cls, fields):
    """The kio dataclass for ``fields``, converted to the types kio's writer wants."""
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = fields[f.name]
        array, item = _shape(hints[f.name])
        kind = f.metadata.get("kafka_type", "")
        if value is None:
            pass
        elif item is not None:
            value = tuple(kio_instance(item, v) for v in value) if array else kio_instance(item, value)
        elif array:
            value = tuple(value)
        elif kind in ("timedelta_i32", "timedelta_i64"):
            value = datetime.timedelta(milliseconds=value)
        elif kind == "error_code":
            value = ErrorCode(value)
        elif kind == "datetime_i64":
            value = datetime.datetime.fromtimestamp(value / 1000, _UTC)
        kwargs[f.name] = value
    return cls(**kwargs)


def kio_frame(correlation_id, cls, fields):
    out = io.BytesIO()
    header = cls.__header_schema__
    entity_writer(header)(out, header(correlation_id=correlation_id))
    entity_writer(cls)(out, kio_instance(cls, fields))
    body = out.getvalue()
    return len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("key,version", CLASSES, ids=[f"{k}v{v}" for k, v in CLASSES])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_response_class_is_written_as_kio_writes_it(key, version, data):
    cls = load_response_schema(key, version)
    fields = data.draw(fields_of(cls))
    correlation_id = data.draw(st.integers(-(1 << 31), (1 << 31) - 1))
    ours = b"".join(write_response(correlation_id, cls, fields))
    assert ours == kio_frame(correlation_id, cls, fields)


def test_fields_a_version_lacks_are_left_out_and_defaults_filled():
    """Handlers name fields as in the latest version: Produce v3 has no log_start_offset,
    record_errors or error_message; they are ignored."""
    fields = {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 7, "log_append_time": None, "log_start_offset": 3,
         "record_errors": [], "error_message": None}]}], "throttle_time": 0}
    frame = b"".join(encode(9, 0, 3, fields))
    # size, correlation id, 1 topic "t", 1 partition: index, error, base offset, log append time, throttle
    body = (9).to_bytes(4, "big") + b"\0\0\0\1" + b"\0\1t" + b"\0\0\0\1" + b"\0\0\0\0" + b"\0\0" \
        + (7).to_bytes(8, "big") + b"\xff" * 8 + b"\0\0\0\0"
    assert frame == len(body).to_bytes(4, "big") + body


def test_a_missing_required_field_is_named():
    cls = load_response_schema(12, 0)  # Heartbeat v0: error_code only
    with pytest.raises(KeyError, match="error_code"):
        write_response(1, cls, {})


def test_a_flexible_version_is_refused():
    with pytest.raises(ValueError, match="flexible"):
        write_response(1, load_response_schema(18, 3), {"error_code": 0, "api_keys": []})


def test_a_string_too_long_for_its_length_prefix_is_refused():
    cls = load_response_schema(17, 1)  # SaslHandshake: error_code, mechanisms (array of strings)
    with pytest.raises(ValueError, match="too long"):
        write_response(1, cls, {"error_code": 0, "mechanisms": ["x" * 40000]})


def test_a_file_region_stays_a_buffer_of_its_own(tmp_path):
    """A fetch's records given as a file region: the frame is the run before it, the region,
    the run after it (the next partition); read back, the bytes are what kio writes for the same records."""
    path = tmp_path / "records"
    payload = os.urandom(300)
    path.write_bytes(b"x" * 100 + payload)
    partition = {"partition_index": 0, "error_code": 0, "high_watermark": 10, "last_stable_offset": 10,
                 "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1}
    fields = {"throttle_time": 0, "error_code": 0, "session_id": 0,
              "responses": [{"topic": "t", "partitions": [dict(partition, records=None),
                                                           dict(partition, partition_index=1, records=b"tail")]}]}
    cls = load_response_schema(1, 11)
    region = FileRegion(os.open(path, os.O_RDONLY), 100, 300)
    try:
        fields["responses"][0]["partitions"][0]["records"] = region
        parts = write_response(5, cls, fields)
        assert [type(p) for p in parts] == [bytes, FileRegion, bytes] and parts[1] is region
        flat = parts[0] + os.pread(region.fd, region.length, region.position) + parts[2]
    finally:
        region.close()
    fields["responses"][0]["partitions"][0]["records"] = payload
    assert flat == kio_frame(5, cls, fields)


def test_kio_typed_values_are_accepted():
    """kio's own value types (timedelta, ErrorCode) are written as its ints."""
    cls = load_response_schema(22, 1)  # InitProducerId: throttle_time, error_code, producer id, epoch
    typed = {"throttle_time": datetime.timedelta(milliseconds=5), "error_code": ErrorCode(0), "producer_id": 1,
             "producer_epoch": 2}
    plain = dict(typed, throttle_time=5, error_code=0)
    assert write_response(1, cls, typed) == write_response(1, cls, plain) == [kio_frame(1, cls, plain)]


def test_a_null_where_the_version_allows_none_is_refused():
    cls = load_response_schema(17, 1)  # SaslHandshake: mechanisms is a non-nullable array of strings
    with pytest.raises(TypeError, match="mechanisms may not be null"):
        write_response(1, cls, {"error_code": 0, "mechanisms": None})
    with pytest.raises(TypeError, match="item may not be null"):
        write_response(1, cls, {"error_code": 0, "mechanisms": [None]})
