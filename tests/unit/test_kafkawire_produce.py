"""The zero-copy read of a large Produce request (wire.parse_produce_body): the same kio objects
as kio's own reader, each partition's records a view of the frame, and the same refusals.
kio's writer writes the requests and kio's reader is the oracle; a malformed request (cut
short, a length past the end, a byte changed anywhere) is refused by both or read the same by
both."""

from __future__ import annotations

import datetime
import importlib
import io

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer

from logstore.kafka.wire import PRODUCE_VIEW_BYTES, KafkaProtocolError, parse_produce_body, parse_request

VERSIONS = range(3, 12)


def _request(version, transactional_id, acks, timeout_ms, topics):
    cls = load_request_schema(0, version)
    schema = importlib.import_module(cls.__module__)
    return cls(transactional_id=transactional_id, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
               topic_data=tuple(schema.TopicProduceData(name=name, partition_data=tuple(
                   schema.PartitionProduceData(index=index, records=records) for index, records in partitions))
                   for name, partitions in topics))


def _body(version, request):
    out = io.BytesIO()
    entity_writer(load_request_schema(0, version))(out, request)
    return out.getvalue()


def _frame(version, body, client_id="producer"):
    """The request after its size prefix: header v1, or v2 (tagged fields) when flexible."""
    cid = client_id.encode()
    header = (0).to_bytes(2, "big") + version.to_bytes(2, "big") + (7).to_bytes(4, "big") \
        + len(cid).to_bytes(2, "big") + cid
    return header + (b"\x00" if version >= 9 else b"") + body


def _kio(version, data):
    """kio's reading: (body, size), or None when it refuses the bytes. kio reads an array
    Kafka's spec does not let be null (a count of -1 for topic_data or a partition_data) as
    None; the server's old path then failed in the handler, the new reader refuses it at
    once: the oracle counts it as refused."""
    try:
        body, size = entity_reader(load_request_schema(0, version))(memoryview(data).toreadonly(), 0)
    except Exception:  # noqa: BLE001 - any refusal: the oracle's answer is "malformed"
        return None
    if body.topic_data is None or any(topic.partition_data is None for topic in body.topic_data):
        return None
    return body, size


def _ours(version, data):
    try:
        return parse_produce_body(memoryview(data).toreadonly(), 0, version)
    except ValueError:
        return None


names = st.text(min_size=0, max_size=8)
records = st.one_of(st.none(), st.binary(max_size=40))
topics = st.lists(st.tuples(names, st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), records), max_size=3)),
                  max_size=3)


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), transactional_id=st.one_of(st.none(), names),
       acks=st.sampled_from([0, 1, -1, 2]), timeout_ms=st.integers(-2**31, 2**31 - 1), topics=topics)
def test_reads_what_kio_reads(version, transactional_id, acks, timeout_ms, topics):
    data = _body(version, _request(version, transactional_id, acks, timeout_ms, topics))
    expected, size = _kio(version, data)
    got, got_size = parse_produce_body(memoryview(data).toreadonly(), 0, version)
    assert (got, got_size) == (expected, size)
    assert type(got) is type(expected)
    for topic in got.topic_data:
        for partition in topic.partition_data:
            assert partition.records is None or isinstance(partition.records, memoryview)


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), topics=topics, cut=st.integers(0, 400), at=st.integers(0, 400),
       byte=st.integers(0, 255))
@example(version=9, topics=[("t", [])], cut=400, at=13, byte=0)  # partition_data: a compact count of 0, null
def test_malformed_bodies_are_refused_as_kio_refuses_them(version, topics, cut, at, byte):
    data = bytearray(_body(version, _request(version, "txn", 1, 30_000, topics)))
    if at < len(data):
        data[at] = byte
    data = bytes(data[:min(cut, len(data))]) if cut < len(data) else bytes(data)
    expected, ours = _kio(version, data), _ours(version, data)
    if expected is None:
        assert ours is None
    else:
        # kio may take a truncated array's count of 0 where the walk does too: equal either way
        assert ours == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_a_large_request_is_read_without_a_copy(version):
    batch = bytes(range(256)) * (PRODUCE_VIEW_BYTES // 256 + 1)
    frame = bytearray(_frame(version, _body(version, _request(version, None, -1, 5000, [("t", [(0, batch)])]))))
    request = parse_request(frame)
    records = request.body.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and not records.readonly and records == batch  # (the log stamps it)
    assert records.obj is frame  # a view of the frame itself
    assert request.body == _kio(version, _body(version, _request(version, None, -1, 5000, [("t", [(0, batch)])])))[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_large_malformed_request_closes_as_before(version):
    batch = b"\x00" * PRODUCE_VIEW_BYTES
    good = _frame(version, _body(version, _request(version, None, 1, 5000, [("t", [(0, batch)])])))
    for bad in (good[:-1], good + b"\x00", good[:-(len(batch) // 2)]):
        with pytest.raises(KafkaProtocolError):
            parse_request(bad)


@pytest.mark.parametrize("version", [3, 8, 9, 11])
@pytest.mark.parametrize("size", ["small", "large"])
def test_a_null_topic_or_partition_array_is_a_malformed_request(version, size):
    """Kafka's spec lets neither be null; kio reads a null as None (the handler then failed with
    a TypeError): both paths refuse it as malformed, small requests and large ones."""
    batch = b"\x00" * (PRODUCE_VIEW_BYTES if size == "large" else 10)
    # topic "t" with no partitions, then topic "u" with a batch: t's count becomes a null
    body = bytearray(_body(version, _request(version, None, 1, 5000, [("t", []), ("u", [(0, batch)])])))
    flexible = version >= 9
    count_at = (1 if flexible else 2) + 2 + 4  # after transactional_id (null), acks, timeout
    at = count_at + (1 if flexible else 4) + (2 if flexible else 3)  # after topic_data's count and "t"
    empty, null = (b"\x01", b"\x00") if flexible else (b"\x00" * 4, b"\xff" * 4)
    assert body[at:at + len(empty)] == empty
    partitions_null = bytes(body[:at]) + null + bytes(body[at + len(empty):])
    assert (_frame(version, partitions_null) and len(partitions_null) >= PRODUCE_VIEW_BYTES) == (size == "large")
    with pytest.raises(KafkaProtocolError):
        parse_request(_frame(version, partitions_null))
    topics_null = bytes(body[:count_at]) + (b"\x00" if flexible else b"\xff" * 4) + (b"\x00" if flexible else b"")
    with pytest.raises(KafkaProtocolError):
        parse_request(_frame(version, topics_null))


def test_a_tagged_field_is_refused():
    body = _body(9, _request(9, None, 1, 5000, [("t", [(0, b"x")])]))
    tagged = body[:-1] + b"\x01\x05\x01\x00"  # the request's tagged fields: tag 5, one byte
    assert _kio(9, tagged) is None
    assert _ours(9, tagged) is None


def test_versions_outside_the_walk_are_refused():
    with pytest.raises(ValueError):
        parse_produce_body(memoryview(b""), 0, 12)
