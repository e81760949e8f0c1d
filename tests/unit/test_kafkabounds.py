"""kafkabounds: flexible requests and responses are walked before kio's native reader sees them,
so a compact count or length the bytes cannot hold is refused instead of aborting the process
(kio allocates a compact array's items from its count). Well-formed requests and responses
pass unchanged."""

from __future__ import annotations

import struct

import pytest
from kio.index import load_request_schema, load_response_schema

from logstore.kafka.bounds import BoundsError, check_flexible, check_flexible_header, check_response
from logstore.kafka.wire import KafkaProtocolError, parse_request
from logstore.kafka.writer import write_request, write_response

SERVED = {1: (4, 12), 52: (2, 2), 53: (1, 1), 55: (1, 1)}
HUGE = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F])  # uvarint 2^32 - 1: an array of 2^32 - 2 items


def request(api_key, version, fields, client_id="t"):
    """The request after its size, and where its body starts (written as test_kafkawriter
    shows kio writes it)."""
    frame = write_request(3, load_request_schema(api_key, version), client_id, fields)[4:]
    return frame, 8 + 2 + (len(client_id) if client_id is not None else 0) + 1


FETCH = {"replica_id": 1, "max_wait": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
         "session_id": 0, "session_epoch": -1, "rack_id": "", "cluster_id": "c", "forgotten_topics_data": [],
         "topics": [{"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": 2, "fetch_offset": 5,
                                                   "last_fetched_epoch": 2, "log_start_offset": -1,
                                                   "partition_max_bytes": 1000}]}]}
VOTE = {"cluster_id": "c", "voter_id": -1, "topics": [{"topic_name": "t", "partitions": [
    {"partition_index": 0, "replica_epoch": 3, "replica_id": 1, "replica_directory_id": None,
     "voter_directory_id": None, "last_offset_epoch": 2, "last_offset": 9, "pre_vote": True}]}]}


@pytest.mark.parametrize("api_key,version,fields", [(1, 12, FETCH), (52, 2, VOTE)])
@pytest.mark.parametrize("client_id", ["t", None])
def test_requests_written_by_kio_pass(api_key, version, fields, client_id):
    frame, offset = request(api_key, version, fields, client_id)
    check_flexible_header(frame)
    check_flexible(load_request_schema(api_key, version), frame, offset)
    parsed = parse_request(frame, SERVED)
    assert parsed.api_key == api_key and parsed.client_id == client_id


def test_a_huge_compact_array_count_is_refused_not_allocated():
    frame, offset = request(1, 12, {**FETCH, "topics": []})
    # The topics array (count 0 -> one byte 0x01) becomes 2^32 - 2 items.
    at = offset + 25  # after replica id, max wait, min and max bytes, isolation, session id and epoch
    assert frame[at] == 1
    bad = frame[:at] + HUGE + frame[at + 1:]
    with pytest.raises(BoundsError, match="array of 4294967294 items"):
        check_flexible(load_request_schema(1, 12), bad, offset)
    with pytest.raises(KafkaProtocolError, match="malformed"):
        parse_request(bad, SERVED)


@pytest.mark.parametrize("tail", [
    b"\x05",            # a tagged-field count past what is left
    HUGE[:3],           # a varint cut short
    b"\x01\x00\x7f",    # one tagged field claiming 127 bytes
])
def test_lengths_past_the_end_are_refused(tail):
    frame, offset = request(53, 1, {"cluster_id": None, "voter_id": -1, "leader_endpoints": [], "topics": []})
    # Replace the body's tagged-field section (its last byte) with the tail.
    bad = frame[:-1] + tail
    with pytest.raises((BoundsError, KafkaProtocolError)):
        check_flexible(load_request_schema(53, 1), bad, offset)
    with pytest.raises(KafkaProtocolError):
        parse_request(bad, SERVED)


def test_a_header_whose_client_id_or_tags_run_past_the_end_is_refused():
    head = struct.pack(">hhi", 52, 2, 1)
    with pytest.raises(BoundsError, match="client id"):
        check_flexible_header(head + struct.pack(">h", 50) + b"abc")
    with pytest.raises(BoundsError, match="tagged fields"):
        check_flexible_header(head + struct.pack(">h", -1) + HUGE)
    with pytest.raises(KafkaProtocolError):
        parse_request(head + struct.pack(">h", -1) + HUGE, SERVED)


def test_responses_are_checked_too():
    cls = load_response_schema(52, 2)
    good = b"".join(write_response(7, cls, {"error_code": 0, "topics": []}))[4:]  # header v1, body
    check_response(cls, good)
    # error code (2 bytes), then the topics array: make it 2^32 - 2 items.
    bad = good[:7] + HUGE + good[8:]
    with pytest.raises(BoundsError):
        check_response(cls, bad)
    check_response(load_response_schema(1, 11), b"anything: a legacy version is kio's to check")


# ---------------------------------------------------------------------- the C walk against the Python one
from hypothesis import given, settings, strategies as st  # noqa: E402

from logstore.kafka import bounds  # noqa: E402

BODIES = [(1, 12, FETCH), (52, 2, VOTE), (53, 1, {"cluster_id": None, "voter_id": -1, "leader_endpoints": [],
                                                 "topics": []})]


def outcome(walk):
    try:
        return walk()
    except BoundsError as exc:
        return str(exc)


def both(cls, data, offset):
    """What the C core's walk and the plan's Python walk make of ``data[offset:]``."""
    plan = bounds._plan_of(cls)
    return (outcome(lambda: bounds._walk(plan, data, offset)),
            outcome(lambda: plan.walk(data, offset, len(data))))


@pytest.mark.parametrize("api_key,version,fields", BODIES)
def test_the_c_walk_ends_where_the_python_walk_ends_on_whole_requests(api_key, version, fields):
    frame, offset = request(api_key, version, fields)
    c, py = both(load_request_schema(api_key, version), frame, offset)
    assert c == py == len(frame)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(BODIES), st.data())
def test_the_c_walk_agrees_with_the_python_walk_on_damaged_requests(body, data):
    api_key, version, fields = body
    frame, offset = request(api_key, version, fields)
    damaged = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(offset, len(damaged) - 1))
        damaged[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(offset, len(damaged)))
    c, py = both(load_request_schema(api_key, version), bytes(damaged[:cut]), offset)
    assert c == py


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_the_c_walk_agrees_with_the_python_walk_on_any_bytes(raw):
    for api_key, version in ((1, 16), (0, 10), (3, 12)):
        cls = load_request_schema(api_key, version)
        c, py = both(cls, raw, 0)
        assert c == py


@pytest.mark.parametrize("words", [[1, 9], [1, 0, 0, 0], [1, 3, 99, 0, 0], [-1, 0], [1, 2], [0]])
def test_a_malformed_program_is_refused_by_the_c_walk(words):
    from logstore._native import ffi, lib

    detail = ffi.new("int64_t[2]")
    program = ffi.new("int32_t[]", words)
    assert lib.ls_flex_check(program, len(words), 0, b"\x01\x02\x03", 3, 0, detail) == lib.LS_FLEX_PROGRAM
    assert lib.ls_flex_check(program, len(words), 0, b"\x01", 1, 2, detail) == lib.LS_FLEX_PROGRAM  # pos past len
