"""The response writer against kio's own writer, byte for byte, for every response class the
server answers with and every flexible version of those and of the KRaft APIs (random fields by
hypothesis), plus its errors, file regions and flexible versions' tagged fields."""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from logstore._fileio import FileRegion
from logstore.kafka.wire import SUPPORTED, encode
from logstore.kafka.writer import write_request, write_response

_UTC = datetime.timezone.utc
_BOUNDS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
_UNSIGNED = {"uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}
_CODES = sorted(code.value for code in ErrorCode)

#: (api key, version) of every response the server writes through the writer (Produce v0-v2
#: are advertised but refused without an answer: kio has no classes for them).
CLASSES = [(key, version) for key, (low, high) in sorted(SUPPORTED.items()) for version in range(low, high + 1)
           if not (key == 0 and version < 3)]


def _flexible_versions(key):
    for version in range(32):
        try:
            cls = load_response_schema(key, version)
        except KioIndexError:  # a version kio has no class for
            continue
        if cls.__flexible__:
            yield version


#: every flexible response version kio has of the APIs served and of OffsetForLeaderEpoch,
#: Vote, BeginQuorumEpoch and EndQuorumEpoch (which a server may serve with ``supported=``).
FLEXIBLE = [(key, version) for key in sorted({*SUPPORTED, 23, 52, 53, 54}) for version in _flexible_versions(key)]


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
    tagged = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        nullable = type(None) in typing.get_args(hint) and "tag" not in f.metadata
        array, item = _shape(hint)
        if item is not None:
            inner = fields_of(item)
            values = st.lists(inner, max_size=2) if array else inner
        elif array:
            values = st.lists(_primitive(f.metadata["kafka_type"], False), max_size=3)
        else:
            values = _primitive(f.metadata["kafka_type"], nullable)
        values = st.one_of(st.none(), values) if nullable and (array or item) else values
        (tagged if "tag" in f.metadata else members)[f.name] = values
    return st.fixed_dictionaries(members, optional=tagged)  # a tagged field may be left out


def kio_instance(cls, fields):
    """The kio dataclass for ``fields``, converted to the types kio's writer wants."""
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in fields:  # a tagged field left out, or a field left to its default
            continue
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


@pytest.mark.parametrize("key,version", FLEXIBLE, ids=[f"{k}v{v}" for k, v in FLEXIBLE])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_flexible_response_class_is_written_as_kio_writes_it(key, version, data):
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


# ---------------------------------------------------------------------- flexible versions
_PARTITION_V12 = {"partition_index": 0, "error_code": 0, "high_watermark": 10, "last_stable_offset": 10,
                  "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1,
                  "records": b"some records"}
_FETCH_CASES = {
    "records": {},
    "null records": {"records": None},
    "tags given": {"diverging_epoch": {"epoch": 3, "end_offset": 100},
                   "current_leader": {"leader_id": 1, "leader_epoch": 4}},
    "tags at defaults": {"diverging_epoch": {"epoch": -1, "end_offset": -1}, "current_leader": {},
                         "snapshot_id": {"end_offset": -1, "epoch": -1}},
    "null aborted transactions": {"aborted_transactions": None},
    "aborted transactions": {"aborted_transactions": [{"producer_id": 7, "first_offset": 3},
                                                      {"producer_id": 8, "first_offset": 5}]},
}


def _fetch_v12(**partition):
    return {"throttle_time": 0, "error_code": 0, "session_id": 0,
            "responses": [{"topic": "t", "partitions": [dict(_PARTITION_V12, **partition)]}]}


@pytest.mark.parametrize("case", list(_FETCH_CASES))
def test_fetch_v12_is_written_as_kio_writes_it(case):
    cls = load_response_schema(1, 12)
    fields = _fetch_v12(**_FETCH_CASES[case])
    assert b"".join(write_response(3, cls, fields)) == kio_frame(3, cls, fields)


def test_fetch_v12_tagged_fields_are_written_only_when_not_default():
    """A nested entity given field values other than its default's is written as tag, size,
    bytes (its own empty tagged section included); at its default, or left out, it is not."""
    cls = load_response_schema(1, 12)
    bare = b"".join(write_response(3, cls, _fetch_v12()))
    assert b"".join(write_response(3, cls, _fetch_v12(**_FETCH_CASES["tags at defaults"]))) == bare
    assert b"".join(write_response(3, cls, _fetch_v12(diverging_epoch=None, current_leader=None))) == bare
    given = b"".join(write_response(3, cls, _fetch_v12(**_FETCH_CASES["tags given"])))
    section = (b"\x02" + b"\x00\x0d" + (3).to_bytes(4, "big") + (100).to_bytes(8, "big") + b"\x00"
               + b"\x01\x09" + (1).to_bytes(4, "big") + (4).to_bytes(4, "big") + b"\x00")
    assert section in given and len(given) == len(bare) + len(section) - 1  # (bare's count: one 0 byte)


def test_a_file_region_stays_a_buffer_of_its_own_in_a_flexible_version(tmp_path):
    """Fetch v12: the region after its compact (uvarint) length, a part of its own."""
    path = tmp_path / "records"
    payload = os.urandom(300)
    path.write_bytes(b"x" * 100 + payload)
    fields = _fetch_v12()
    second = dict(fields["responses"][0]["partitions"][0], partition_index=1, records=b"tail")
    fields["responses"][0]["partitions"].append(second)
    cls = load_response_schema(1, 12)
    region = FileRegion(os.open(path, os.O_RDONLY), 100, 300)
    try:
        fields["responses"][0]["partitions"][0]["records"] = region
        parts = write_response(5, cls, fields)
        assert [type(p) for p in parts] == [bytes, FileRegion, bytes] and parts[1] is region
        assert parts[0].endswith(b"\xad\x02")  # uvarint(301)
        flat = parts[0] + os.pread(region.fd, region.length, region.position) + parts[2]
    finally:
        region.close()
    fields["responses"][0]["partitions"][0]["records"] = payload
    assert flat == kio_frame(5, cls, fields)
    assert int.from_bytes(flat[:4], "big") == len(flat) - 4


_QUORUM = {"error_code": 0, "topics": [{"topic_name": "__cluster_metadata", "partitions": [
    {"partition_index": 0, "error_code": 0, "leader_id": 1, "leader_epoch": 5, "vote_granted": True}]}]}
_ENDPOINTS = {"with endpoints": [{"node_id": 1, "host": "localhost", "port": 9093}], "no endpoints": []}
_EPOCHS = {"throttle_time": 0, "topics": [{"topic": "t", "partitions": [
    {"error_code": 0, "partition": 0, "leader_epoch": 3, "end_offset": 42},
    {"error_code": 75, "partition": 1}]}]}
_RESPONSES = [(52, 0), (52, 1), (52, 2), (53, 0), (53, 1), (23, 3), (23, 4)]


@pytest.mark.parametrize("endpoints", list(_ENDPOINTS))
@pytest.mark.parametrize("key,version", _RESPONSES, ids=[f"{k}v{v}" for k, v in _RESPONSES])
def test_kraft_responses_are_written_as_kio_writes_them(key, version, endpoints):
    """Vote, BeginQuorumEpoch, OffsetForLeaderEpoch, fields named as in the latest version
    (node_endpoints, a tagged field from Vote v1 and BeginQuorumEpoch v1 on)."""
    cls = load_response_schema(key, version)
    fields = dict(_EPOCHS) if key == 23 else dict(_QUORUM, node_endpoints=_ENDPOINTS[endpoints])
    assert b"".join(write_response(11, cls, fields)) == kio_frame(11, cls, {
        name: value for name, value in fields.items() if name in {f.name for f in dataclasses.fields(cls)}})


@pytest.mark.parametrize("brokers", [[], [{"node_id": 1, "host": "h", "port": 9092, "rack": None},
                                          {"node_id": 2, "host": "h2", "port": 9092, "rack": "r1"}]])
def test_metadata_v9_with_null_strings_and_empty_arrays(brokers):
    cls = load_response_schema(3, 9)
    partition = {"error_code": 0, "partition_index": 0, "leader_id": 1, "leader_epoch": 0, "replica_nodes": [],
                 "isr_nodes": [], "offline_replicas": []}
    fields = {"throttle_time": 0, "brokers": brokers, "cluster_id": None, "controller_id": 1,
              "topics": [{"error_code": 0, "name": "t", "is_internal": False, "partitions": [partition],
                          "topic_authorized_operations": -2147483648},
                         {"error_code": 3, "name": "gone", "is_internal": False, "partitions": [],
                          "topic_authorized_operations": -2147483648}],
              "cluster_authorized_operations": -2147483648}
    frame = b"".join(write_response(2, cls, fields))
    assert frame == kio_frame(2, cls, fields)
    # size, correlation id, header's tagged fields, throttle time, then the brokers' compact count
    assert frame[8:9] == b"\x00" and frame[13:14] == bytes([len(brokers) + 1])


def test_api_versions_v3_has_a_flexible_body_and_header_v0():
    cls = load_response_schema(18, 3)
    fields = {"error_code": 0, "api_keys": [{"api_key": 0, "min_version": 3, "max_version": 8},
                                            {"api_key": 18, "min_version": 0, "max_version": 3}],
              "throttle_time": 0, "finalized_features_epoch": 4}
    frame = b"".join(write_response(6, cls, fields))
    assert frame == kio_frame(6, cls, fields)
    # size, correlation id, then at once the body: error code, compact array of 2
    assert frame[4:8] == (6).to_bytes(4, "big") and frame[8:11] == b"\x00\x00\x03"


def test_a_missing_required_field_is_named_in_a_flexible_version():
    cls = load_response_schema(52, 2)
    with pytest.raises(KeyError, match="error_code"):
        write_response(1, cls, {"topics": []})
    partition = dict(_QUORUM["topics"][0]["partitions"][0])
    del partition["vote_granted"]
    with pytest.raises(KeyError, match="vote_granted"):
        write_response(1, cls, {"error_code": 0, "topics": [{"topic_name": "t", "partitions": [partition]}]})


def test_a_null_where_a_flexible_version_allows_none_is_refused():
    cls = load_response_schema(52, 2)
    with pytest.raises(TypeError, match="topics may not be null"):
        write_response(1, cls, {"error_code": 0, "topics": None})
    with pytest.raises(TypeError, match="topic_name may not be null"):
        write_response(1, cls, {"error_code": 0, "topics": [{"topic_name": None, "partitions": []}]})


#: the requests logstore sends (kafkaclient: the mirror, group members, replication's peers and Client)
REQUESTS = [(18, 0), (3, 8), (0, 8), (2, 5), (19, 4), (17, 1), (36, 1), (8, 7), (11, 5), (12, 3), (13, 3), (14, 3),
            (1, 12), (52, 2), (53, 1), (55, 1)]


@pytest.mark.parametrize("key,version", REQUESTS, ids=[f"{k}v{v}" for k, v in REQUESTS])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_request_sent_is_written_as_kio_writes_it(key, version, data):
    cls = load_request_schema(key, version)
    fields = data.draw(fields_of(cls))
    correlation_id = data.draw(st.integers(-(1 << 31), (1 << 31) - 1))
    client_id = data.draw(st.one_of(st.none(), st.text(max_size=8)))
    out = io.BytesIO()
    header = cls.__header_schema__
    entity_writer(header)(out, header(request_api_key=key, request_api_version=version, correlation_id=correlation_id,
                                      client_id=client_id))
    entity_writer(cls)(out, kio_instance(cls, fields))
    body = out.getvalue()
    assert write_request(correlation_id, cls, client_id, fields) == len(body).to_bytes(4, "big") + body
