"""Hypothesis fuzzing of the Python parsers of bytes from disk or the network: checkpoint files
(Kafka's text format), leader-epoch-checkpoint, quorum-state, ``__consumer_offsets`` keys and
values, the Queue's state operations and snapshots, and replication frames. Each must return a
value or raise its documented error (a LogstoreError subclass), never anything else."""

from __future__ import annotations

import pathlib
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import LogstoreError
from logstore.checkpoint import CheckpointFile, CorruptCheckpointError, OffsetCheckpoints
from logstore.replica.quorum import QuorumStateFile
from logstore.log.epochs import LeaderEpochCache
from logstore.errors import CorruptRecordError
from logstore.groups.offsets import decode_offset_key, decode_offset_value, encode_offset_key, encode_offset_value
from logstore.client.queue import _State

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
TMP = pathlib.Path(tempfile.mkdtemp(prefix="logstore-fuzz-"))


def near_checkpoint():
    """Random bytes, and text that looks like a checkpoint with one thing wrong."""
    line = st.from_regex(r"[a-z_.-]{1,8} -?[0-9]{1,3} -?[0-9]{1,20}", fullmatch=True)
    text = st.builds(lambda v, c, rows: f"{v}\n{c}\n" + "".join(r + "\n" for r in rows),
                     st.sampled_from(["0", "1", "x", ""]), st.integers(-1, 4).map(str), st.lists(line, max_size=4))
    return st.one_of(st.binary(max_size=200), text.map(str.encode))


@FUZZ
@given(near_checkpoint())
def test_checkpoint_files(data):
    path = TMP / "recovery-point-offset-checkpoint"
    path.write_bytes(data)
    for fields in (2, 3):
        try:
            rows = CheckpointFile(str(path), fields).read()
        except CorruptCheckpointError:
            continue
        assert all(len(r) == fields for r in rows)
    try:
        offsets = OffsetCheckpoints(str(TMP), "recovery-point-offset-checkpoint").read()
    except CorruptCheckpointError:
        return
    assert all(isinstance(o, int) for o in offsets.values())


@FUZZ
@given(near_checkpoint())
def test_leader_epoch_checkpoint(data):
    (TMP / "leader-epoch-checkpoint").write_bytes(data)
    try:
        cache = LeaderEpochCache(str(TMP))
    except CorruptCheckpointError:
        return
    epochs = [e for e, _ in cache.entries]
    assert epochs == sorted(set(epochs))


@FUZZ
@given(st.one_of(st.binary(max_size=120),
                 st.fixed_dictionaries({"leaderEpoch": st.integers(-3, 9), "votedId": st.integers(-3, 9),
                                        "leaderId": st.one_of(st.integers(-3, 9), st.text(max_size=3))})
                 .map(lambda d: __import__("json").dumps(d).encode())))
def test_quorum_state(data):
    (TMP / "quorum-state").write_bytes(data)
    try:
        state = QuorumStateFile(str(TMP), [0, 1, 2]).load()
    except LogstoreError:
        return
    assert state.epoch >= 0


@FUZZ
@given(st.binary(max_size=80), st.binary(max_size=80))
def test_consumer_offsets_records(key, value):
    for parse, data in ((decode_offset_key, key), (decode_offset_value, value)):
        try:
            parse(data)
        except CorruptRecordError:
            pass
    # Mutations of valid records, too.
    good_key = bytearray(encode_offset_key("group", "topic", 3))
    good_value = bytearray(encode_offset_value(42, "meta", 1))
    for buf, mutation in ((good_key, key), (good_value, value)):
        for i, b in enumerate(mutation[:8]):
            buf[(b * 7 + i) % len(buf)] = b
    for parse, data in ((decode_offset_key, bytes(good_key)), (decode_offset_value, bytes(good_value))):
        try:
            parse(data)
        except CorruptRecordError:
            pass


@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=60), st.binary(min_size=24, max_size=24),
                          st.binary(min_size=12, max_size=12)), max_size=6),
       st.sampled_from([b"L", b"A", b"D", b"N", b"S", b"?"]))
def test_queue_state_operations(values, op):
    """Exact-size payloads reach the field checks: a partition outside the queue's must be
    reported as corruption, not raise IndexError or (negative) pick another partition."""
    state = _State(2)
    for raw in values:
        try:
            state.apply(0, op + raw)
        except CorruptRecordError:
            pass
        except IndexError:
            raise AssertionError(f"operation {op + raw!r} reached past the partitions") from None


@FUZZ
@given(st.sampled_from([(1, 12), (52, 2), (53, 1), (55, 1)]), st.binary(max_size=96))
def test_replication_requests(api, body):
    """Replication's Kafka requests (a follower's Fetch, Vote, BeginQuorumEpoch, DescribeQuorum)
    with arbitrary bodies: parsed, or refused as malformed; nothing else escapes."""
    import struct

    from logstore.kafka.wire import KafkaProtocolError, parse_request
    from logstore.replica.peerapis import PEER_VERSIONS

    key, version = api
    frame = struct.pack(">hhih", key, version, 1, -1) + b"\0" + body  # header v2: no client id, no tags
    try:
        parse_request(frame, PEER_VERSIONS)
    except KafkaProtocolError:
        pass


@FUZZ
@given(st.sampled_from([(1, 12), (52, 2), (53, 1), (55, 1)]), st.binary(max_size=96))
def test_replication_responses(api, body):
    """What a peer or client reads of a node's answers: checked, then read by kio, or refused;
    never an allocation from an unchecked count (kio's native reader would abort)."""
    import struct

    from kio.index import load_response_schema
    from kio.serial import entity_reader
    from kio.serial.errors import SerialError

    from logstore.kafka.bounds import BoundsError, check_response

    cls = load_response_schema(*api)
    frame = struct.pack(">i", 1) + b"\0" + body  # response header v1: no tags
    try:
        check_response(cls, frame)
        _, offset = entity_reader(cls.__header_schema__)(frame, 0)
        entity_reader(cls)(frame, offset)
    except (BoundsError, SerialError, ValueError, KeyError, struct.error):  # refused (KeyError: an unknown tag)
        pass
