"""The transaction state record (Kafka's TransactionLogKey v0 / TransactionLogValue v0-v1) and
TransactionMetadata's transitions. The record bytes are laid out by hand from Kafka's JSON schemas
(transaction-coordinator's TransactionLogKey.json and TransactionLogValue.json), not by the codec
under test."""

from __future__ import annotations

import pickle
import struct

import pytest
from hypothesis import given, strategies as st

from logstore.errors import CorruptRecordError, LogstoreError
from logstore.errors import ProducerFencedError
from logstore.txn.metadata import (
    MAX_PRODUCER_EPOCH,
    TRANSACTION_STATE_TOPIC,
    TRANSACTION_STATE_TOPIC_CONFIG,
    VALID_PREVIOUS_STATES,
    IllegalTxnTransitionError,
    TransactionMetadata,
    TransactionState as S,
    TxnLogEntry,
    TxnRecordError,
    decode_txn_key,
    decode_txn_value,
    encode_txn_key,
    encode_txn_value,
    is_epoch_exhausted,
)


# ------------------------------------------------------------------ bytes by hand, from the JSON schemas
def i8(v):
    return struct.pack(">b", v)


def i16(v):
    return struct.pack(">h", v)


def i32(v):
    return struct.pack(">i", v)


def i64(v):
    return struct.pack(">q", v)


def uvarint(n):
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def string(text):  # non-flexible: int16 length
    raw = text.encode()
    return i16(len(raw)) + raw


def compact_string(text):  # flexible: unsigned varint length + 1
    raw = text.encode()
    return uvarint(len(raw) + 1) + raw


def v0_value(pid, epoch, timeout, state, partitions, last_update, start):
    """TransactionLogValue v0: ProducerId, ProducerEpoch, TransactionTimeoutMs, TransactionStatus,
    TransactionPartitions (nullable array of Topic + PartitionIds), LastUpdate, Start."""
    out = i16(0) + i64(pid) + i16(epoch) + i32(timeout) + i8(state)
    if partitions is None:
        out += i32(-1)
    else:
        out += i32(len(partitions))
        for topic, ids in partitions:
            out += string(topic) + i32(len(ids)) + b"".join(i32(p) for p in ids)
    return out + i64(last_update) + i64(start)


def v1_value(pid, epoch, timeout, state, partitions, last_update, start, tagged=(), entry_tags=b"\x00"):
    """TransactionLogValue v1 (flexible): compact arrays and strings, a tagged-field section after
    each partitions entry and at the end (PreviousProducerId tag 0, NextProducerId tag 1,
    ClientTransactionVersion tag 2)."""
    out = i16(1) + i64(pid) + i16(epoch) + i32(timeout) + i8(state)
    if partitions is None:
        out += uvarint(0)
    else:
        out += uvarint(len(partitions) + 1)
        for topic, ids in partitions:
            out += compact_string(topic) + uvarint(len(ids) + 1) + b"".join(i32(p) for p in ids) + entry_tags
    out += i64(last_update) + i64(start) + uvarint(len(tagged))
    for tag, data in tagged:
        out += uvarint(tag) + uvarint(len(data)) + data
    return out


ONGOING = TxnLogEntry(producer_id=4000, producer_epoch=3, txn_timeout_ms=60_000, state=S.ONGOING,
                      topic_partitions=frozenset({("orders", 2), ("orders", 0), ("audit", 7)}),
                      txn_start_timestamp=1_700_000_000_000, txn_last_update_timestamp=1_700_000_000_500)


# ------------------------------------------------------------------ states
def test_states_have_kafkas_ids_and_names():
    assert [(s.value, s.kafka_name) for s in S] == [
        (0, "Empty"), (1, "Ongoing"), (2, "PrepareCommit"), (3, "PrepareAbort"), (4, "CompleteCommit"),
        (5, "CompleteAbort"), (6, "Dead"), (7, "PrepareEpochFence")]
    assert S.from_kafka_name("PrepareEpochFence") is S.PREPARE_EPOCH_FENCE
    assert S.from_kafka_name("Nope") is None and S.from_kafka_name("ONGOING") is None


def test_valid_previous_states_are_kafkas():
    assert VALID_PREVIOUS_STATES == {
        S.EMPTY: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.ONGOING: {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.PREPARE_COMMIT: {S.ONGOING},
        S.PREPARE_ABORT: {S.ONGOING, S.PREPARE_EPOCH_FENCE},
        S.COMPLETE_COMMIT: {S.PREPARE_COMMIT},
        S.COMPLETE_ABORT: {S.PREPARE_ABORT},
        S.DEAD: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.PREPARE_EPOCH_FENCE: {S.ONGOING},
    }
    assert S.ONGOING.valid_previous_states == VALID_PREVIOUS_STATES[S.ONGOING]
    assert {s for s in S if s.is_expiration_allowed} == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}


def test_topic_and_defaults_are_kafkas():
    assert TRANSACTION_STATE_TOPIC == "__transaction_state"
    assert TRANSACTION_STATE_TOPIC_CONFIG["cleanup_policy"] == "compact"
    assert TRANSACTION_STATE_TOPIC_CONFIG["segment_bytes"] == 100 * 1024 * 1024
    assert not is_epoch_exhausted(32765) and is_epoch_exhausted(32766) and MAX_PRODUCER_EPOCH == 32767


# ------------------------------------------------------------------ key
def test_key_is_kafkas_version_0():
    assert encode_txn_key("my-txn") == i16(0) + string("my-txn") == b"\x00\x00\x00\x06my-txn"
    assert decode_txn_key(b"\x00\x00\x00\x06my-txn") == "my-txn"
    assert decode_txn_key(i16(0) + string("ü")) == "ü"


def test_unknown_key_version_is_skipped():
    assert decode_txn_key(i16(1) + string("x")) is None
    assert decode_txn_key(i16(-1)) is None


@pytest.mark.parametrize("key, field", [
    (b"", "version"), (b"\x00", "version"), (i16(0), "transactional id length"),
    (i16(0) + i16(5) + b"abc", "transactional id"), (i16(0) + i16(-1), "not nullable"),
    (i16(0) + string("a") + b"!", "1 bytes after its last field"), (i16(0) + i16(1) + b"\xff", "not UTF-8"),
])
def test_a_bad_key_is_corrupt_and_says_why(key, field):
    with pytest.raises(TxnRecordError, match=field) as info:
        decode_txn_key(key)
    assert isinstance(info.value, CorruptRecordError) and isinstance(info.value, LogstoreError)
    assert "__transaction_state record: key" in str(info.value)


# ------------------------------------------------------------------ value v0
def test_value_v0_decodes_and_encodes_byte_for_byte():
    raw = v0_value(4000, 3, 60_000, 1, [("audit", [7]), ("orders", [0, 2])], 1_700_000_000_500, 1_700_000_000_000)
    assert decode_txn_value(raw) == ONGOING
    assert encode_txn_value(ONGOING, 0) == raw


def test_value_v0_of_an_empty_transaction_has_null_partitions():
    empty = TxnLogEntry(9, 0, 1000, S.EMPTY, frozenset(), -1, 55)
    raw = v0_value(9, 0, 1000, 0, None, 55, -1)
    assert encode_txn_value(empty, 0) == raw
    assert decode_txn_value(raw) == empty


def test_partitions_of_an_empty_state_are_ignored_and_null_reads_as_none():
    # Kafka reads the partitions only when the state is not Empty
    assert decode_txn_value(v0_value(9, 0, 1000, 0, [("t", [1])], 55, -1)).topic_partitions == frozenset()
    assert decode_txn_value(v0_value(9, 0, 1000, 4, None, 55, 5)).topic_partitions == frozenset()
    assert decode_txn_value(v1_value(9, 0, 1000, 4, None, 55, 5)).topic_partitions == frozenset()


def test_complete_state_has_an_empty_not_null_array():
    done = TxnLogEntry(9, 0, 1000, S.COMPLETE_COMMIT, frozenset(), 5, 55)
    assert encode_txn_value(done, 0) == v0_value(9, 0, 1000, 4, [], 55, 5)
    assert encode_txn_value(done, 1) == v1_value(9, 0, 1000, 4, [], 55, 5)


# ------------------------------------------------------------------ value v1
def test_value_v1_decodes_and_encodes_byte_for_byte():
    entry = ONGOING._replace(previous_producer_id=3999, next_producer_id=4001, client_transaction_version=2)
    raw = v1_value(4000, 3, 60_000, 1, [("audit", [7]), ("orders", [0, 2])], 1_700_000_000_500,
                   1_700_000_000_000, tagged=[(0, i64(3999)), (1, i64(4001)), (2, i16(2))])
    assert encode_txn_value(entry, 1) == raw
    assert decode_txn_value(raw) == entry


def test_value_v1_leaves_tagged_fields_at_their_default_out():
    raw = v1_value(4000, 3, 60_000, 1, [("audit", [7]), ("orders", [0, 2])], 1_700_000_000_500, 1_700_000_000_000)
    assert raw.endswith(b"\x00")  # no tagged field
    assert encode_txn_value(ONGOING, 1) == raw
    assert decode_txn_value(raw) == ONGOING
    only_next = v1_value(4000, 3, 60_000, 1, [("audit", [7]), ("orders", [0, 2])], 1_700_000_000_500,
                         1_700_000_000_000, tagged=[(1, i64(77))])
    assert encode_txn_value(ONGOING._replace(next_producer_id=77), 1) == only_next


def test_value_v1_skips_unknown_tagged_fields():
    raw = v1_value(4000, 3, 60_000, 1, [("audit", [7]), ("orders", [0, 2])], 1_700_000_000_500, 1_700_000_000_000,
                   tagged=[(0, i64(3999)), (9, b"future"), (300, b"")], entry_tags=uvarint(1) + uvarint(5) + uvarint(2) + b"ok")
    assert decode_txn_value(raw) == ONGOING._replace(previous_producer_id=3999)


def test_version_0_cannot_hold_tagged_fields():
    with pytest.raises(ValueError, match="version 0 cannot hold tagged fields"):
        encode_txn_value(ONGOING._replace(previous_producer_id=1), 0)
    with pytest.raises(ValueError, match="version 2"):
        encode_txn_value(ONGOING, 2)


def test_an_empty_transaction_with_partitions_is_refused():
    with pytest.raises(ValueError, match="no partitions"):
        encode_txn_value(TxnLogEntry(1, 0, 10, S.EMPTY, frozenset({("t", 0)})))


def test_out_of_range_fields_are_value_errors():
    with pytest.raises(ValueError, match="out of range"):
        encode_txn_value(ONGOING._replace(producer_epoch=40_000))
    with pytest.raises(ValueError, match="partition"):
        encode_txn_value(ONGOING._replace(topic_partitions=frozenset({("t", 2**31)})))


def test_tombstone_is_none():
    assert decode_txn_value(None) is None


# ------------------------------------------------------------------ corrupt values
@pytest.mark.parametrize("version", [0, 1])
def test_every_truncation_of_a_value_is_corrupt(version):
    raw = encode_txn_value(ONGOING._replace(previous_producer_id=1) if version else ONGOING, version)
    for n in range(len(raw)):
        with pytest.raises(TxnRecordError, match="runs past its end|count|unsigned varint"):
            decode_txn_value(raw[:n])


@pytest.mark.parametrize("raw, reason", [
    (v0_value(1, 0, 10, 1, [("t", [0])], 2, 3) + b"\x00", "1 bytes after its last field"),
    (v0_value(1, 0, 10, 8, [("t", [0])], 2, 3), "transaction status 8 is not a state"),
    (v0_value(1, 0, 10, -1, [("t", [0])], 2, 3), "transaction status -1"),
    (i16(2) + v0_value(1, 0, 10, 1, [], 2, 3)[2:], "version 2 is not supported"),
    (i16(-1), "version -1 is not supported"),
    (v0_value(1, 0, 10, 1, [], 2, 3)[:17] + i32(-2) + i64(2) + i64(3), "partitions count -2"),
    (v0_value(1, 0, 10, 1, [], 2, 3)[:17] + i32(1_000_000) + i64(2) + i64(3), "partitions count 1000000"),
    (v0_value(1, 0, 10, 1, [("t", [0])], 2, 3).replace(string("t"), i16(-1) + b"t", 1), "topic length -1"),
    (v1_value(1, 0, 10, 1, [("t", [0])], 2, 3, tagged=[(0, i32(5))]), "tagged field 0 has 4 bytes, expected 8"),
    (v1_value(1, 0, 10, 1, [("t", [0])], 2, 3, tagged=[(2, i64(5))]), "tagged field 2 has 8 bytes, expected 2"),
    (i16(1) + i64(1) + i16(0) + i32(10) + i8(1) + b"\xff\xff\xff\xff\xff\x01", "longer than 5 bytes"),
    (i16(1) + i64(1) + i16(0) + i32(10) + i8(1) + uvarint(2) + uvarint(0) + bytes(20), "topic is null"),
    (i16(1) + i64(1) + i16(0) + i32(10) + i8(1) + uvarint(2) + compact_string("t") + uvarint(0) + bytes(20),
     "partition ids count -1: null"),
    (v1_value(1, 0, 10, 1, [("t", [0])], 2, 3).replace(b"\x02t", b"\x02\xff", 1), "not UTF-8"),
])
def test_a_bad_value_is_corrupt_and_says_why(raw, reason):
    with pytest.raises(TxnRecordError, match=reason):
        decode_txn_value(raw)


def test_record_error_names_the_offset_and_pickles():
    exc = TxnRecordError("value: something", 42)
    assert "__transaction_state record at offset 42: value: something" in str(exc)
    again = pickle.loads(pickle.dumps(exc))
    assert (again.detail, again.offset, str(again)) == (exc.detail, exc.offset, str(exc))


# ------------------------------------------------------------------ round trips
topics = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
int64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def entries(draw, version):
    state = draw(st.sampled_from(list(S)))
    parts = frozenset() if state == S.EMPTY else draw(
        st.frozensets(st.tuples(topics, st.integers(-(2**31), 2**31 - 1)), max_size=8))
    tagged = version >= 1
    return TxnLogEntry(
        draw(int64), draw(st.integers(-(2**15), 2**15 - 1)), draw(st.integers(-(2**31), 2**31 - 1)), state, parts,
        draw(int64), draw(int64),
        draw(int64) if tagged else -1, draw(int64) if tagged else -1, -1,
        draw(st.integers(-(2**15), 2**15 - 1)) if tagged else 0)


@given(entries(0))
def test_v0_round_trip(entry):
    assert decode_txn_value(encode_txn_value(entry, 0)) == entry


@given(entries(1))
def test_v1_round_trip(entry):
    assert decode_txn_value(encode_txn_value(entry, 1)) == entry


@given(st.text(max_size=100))
def test_key_round_trip(transactional_id):
    assert decode_txn_key(encode_txn_key(transactional_id)) == transactional_id


@given(st.binary(max_size=80))
def test_garbage_is_a_record_error_or_a_value(raw):
    try:
        decode_txn_value(raw)
        decode_txn_key(raw)
    except TxnRecordError:
        pass


# ------------------------------------------------------------------ metadata transitions
def meta(**kw):
    base = dict(transactional_id="tx", producer_id=100, producer_epoch=0, txn_timeout_ms=1000, state=S.EMPTY,
                txn_last_update_timestamp=1)
    base.update(kw)
    return TransactionMetadata(**base)


def apply(m, entry):
    m.complete_transition(entry)
    return m


def test_a_new_producer_gets_epoch_0():
    m = meta(producer_epoch=-1)
    entry = m.prepare_init(5000, now_ms=10)
    assert (entry.state, entry.producer_id, entry.producer_epoch, entry.last_producer_epoch) == (S.EMPTY, 100, 0, -1)
    assert (entry.txn_timeout_ms, entry.txn_last_update_timestamp, entry.txn_start_timestamp) == (5000, 10, -1)
    assert m.pending_state == S.EMPTY and m.producer_epoch == -1  # nothing applies before the record is durable
    apply(m, entry)
    assert (m.producer_epoch, m.txn_timeout_ms, m.pending_state, m.txn_last_update_timestamp) == (0, 5000, None, 10)


def test_a_pending_transition_refuses_another():
    m = meta()
    m.prepare_init(1000, 2)
    with pytest.raises(IllegalTxnTransitionError, match="pending"):
        m.prepare_add_partitions({("t", 0)}, 3)
    m.clear_pending()
    m.prepare_add_partitions({("t", 0)}, 3)


def test_kip_360_expected_epochs():
    m = meta(producer_epoch=5)
    bumped = m.prepare_init(1000, 2, expected_epoch=5)  # the current epoch: bump, remember it
    assert (bumped.producer_epoch, bumped.last_producer_epoch) == (6, 5)
    apply(m, bumped)
    retry = m.prepare_init(1000, 3, expected_epoch=5)  # the last epoch: a retry, the current epoch again
    assert (retry.producer_epoch, retry.last_producer_epoch) == (6, 5)
    apply(m, retry)
    with pytest.raises(ProducerFencedError, match="expected producer epoch 3"):
        m.prepare_init(1000, 4, expected_epoch=3)
    assert m.pending_state is None
    fresh = m.prepare_init(1000, 4)  # no expected epoch: bump, forget the last
    assert (fresh.producer_epoch, fresh.last_producer_epoch) == (7, -1)


def test_exhausted_epoch_moves_to_a_new_producer_id():
    m = meta(producer_epoch=32766)
    assert m.is_producer_epoch_exhausted and m.needs_new_producer_id() and m.needs_new_producer_id(32766)
    assert not m.needs_new_producer_id(32765)
    with pytest.raises(ValueError, match="new producer id is needed"):
        m.prepare_init(1000, 2)
    entry = m.prepare_init(1000, 2, expected_epoch=32766, new_producer_id=200)
    assert (entry.producer_id, entry.producer_epoch, entry.last_producer_epoch, entry.previous_producer_id) == \
        (200, 0, 32766, 100)
    apply(m, entry)
    assert (m.producer_id, m.producer_epoch, m.previous_producer_id) == (200, 0, 100)
    with pytest.raises(IllegalTxnTransitionError, match="no producer epoch left"):
        meta(producer_epoch=32766).prepare_increment_producer_epoch(1000, None, 2)


def test_rotation_is_refused_while_a_transaction_is_open():
    with pytest.raises(IllegalTxnTransitionError, match="rotate"):
        meta(state=S.ONGOING, producer_epoch=32766).prepare_producer_id_rotation(7, 1000, 2, False)


def test_add_partitions_starts_a_transaction_and_grows_it():
    m = meta()
    first = m.prepare_add_partitions({("t", 0)}, 50)
    assert (first.state, first.txn_start_timestamp, first.topic_partitions) == (S.ONGOING, 50, {("t", 0)})
    apply(m, first)
    more = m.prepare_add_partitions({("t", 1), ("u", 0)}, 60)
    assert (more.txn_start_timestamp, more.topic_partitions) == (50, {("t", 0), ("t", 1), ("u", 0)})
    apply(m, more)
    assert m.topic_partitions == {("t", 0), ("t", 1), ("u", 0)} and m.txn_last_update_timestamp == 60


def test_commit_goes_through_prepare_and_complete():
    m = meta()
    apply(m, m.prepare_add_partitions({("t", 0), ("t", 1)}, 50))
    with pytest.raises(IllegalTxnTransitionError, match="PrepareCommit or PrepareAbort"):
        m.remove_partition(("t", 0))
    prepare = m.prepare_abort_or_commit(S.PREPARE_COMMIT, 0, -1, 60)
    assert (prepare.state, prepare.producer_epoch, prepare.topic_partitions) == (S.PREPARE_COMMIT, 0,
                                                                                {("t", 0), ("t", 1)})
    apply(m, prepare)
    complete = m.prepare_complete(70)
    m.remove_partition(("t", 0))
    m.remove_partition(("t", 1))
    assert (complete.state, complete.topic_partitions, complete.txn_start_timestamp) == (S.COMPLETE_COMMIT,
                                                                                        frozenset(), 50)
    apply(m, complete)
    assert (m.state, m.topic_partitions, m.producer_epoch) == (S.COMPLETE_COMMIT, set(), 0)
    # a new transaction may start from CompleteCommit, and starts now
    assert m.prepare_add_partitions({("t", 2)}, 80).txn_start_timestamp == 80


@pytest.mark.parametrize("state, call", [
    (S.EMPTY, lambda m: m.prepare_abort_or_commit(S.PREPARE_COMMIT, 0, -1, 1)),
    (S.EMPTY, lambda m: m.prepare_complete(1)),
    (S.ONGOING, lambda m: m.prepare_init(1000, 1)),
    (S.ONGOING, lambda m: m.prepare_dead()),
    (S.PREPARE_COMMIT, lambda m: m.prepare_add_partitions({("t", 0)}, 1)),
    (S.COMPLETE_ABORT, lambda m: m.prepare_fence_producer_epoch()),
    (S.ONGOING, lambda m: m.prepare_abort_or_commit(S.COMPLETE_COMMIT, 0, -1, 1)),
])
def test_transitions_the_state_machine_forbids(state, call):
    m = meta(state=state, topic_partitions={("t", 0)} if state != S.EMPTY else (), txn_start_timestamp=1)
    with pytest.raises(IllegalTxnTransitionError):
        call(m)
    assert m.pending_state is None


def test_fence_bumps_the_epoch_and_aborts():
    m = meta(state=S.ONGOING, producer_epoch=4, last_producer_epoch=3, topic_partitions={("t", 0)},
             txn_start_timestamp=5)
    fence = m.prepare_fence_producer_epoch()
    assert (fence.state, fence.producer_epoch, m.pending_state, m.producer_epoch) == (S.PREPARE_EPOCH_FENCE, 5,
                                                                                     S.PREPARE_EPOCH_FENCE, 4)
    abort = m.prepare_fenced_abort(fence, 9)
    assert (abort.state, abort.producer_epoch, abort.last_producer_epoch) == (S.PREPARE_ABORT, 5, -1)
    assert m.producer_epoch == 5 and m.pending_state == S.PREPARE_ABORT  # the bump is in memory, never answered
    apply(m, abort)
    assert m.state == S.PREPARE_ABORT


def test_a_failed_fence_is_not_bumped_twice():
    m = meta(state=S.ONGOING, producer_epoch=4, topic_partitions={("t", 0)}, txn_start_timestamp=5)
    m.prepare_fenced_abort(m.prepare_fence_producer_epoch(), 9)
    m.clear_pending(failed_epoch_fence=True)  # the PrepareAbort record could not be written
    assert (m.state, m.producer_epoch, m.has_failed_epoch_fence) == (S.ONGOING, 5, True)
    again = m.prepare_fenced_abort(m.prepare_fence_producer_epoch(), 10)
    assert again.producer_epoch == 5
    apply(m, again)
    m.prepare_complete(11)
    assert not m.has_failed_epoch_fence


def test_fencing_the_last_epoch_is_refused():
    m = meta(state=S.ONGOING, producer_epoch=MAX_PRODUCER_EPOCH, topic_partitions={("t", 0)}, txn_start_timestamp=5)
    with pytest.raises(IllegalTxnTransitionError, match="overflow"):
        m.prepare_fence_producer_epoch()
    with pytest.raises(IllegalTxnTransitionError, match="PrepareEpochFence"):
        meta(state=S.ONGOING).prepare_fenced_abort(TxnLogEntry(100, 1, 1000, S.PREPARE_EPOCH_FENCE), 1)


def test_dead_is_prepared_but_never_completed():
    m = meta(state=S.COMPLETE_COMMIT, txn_start_timestamp=5)
    dead = m.prepare_dead()
    assert dead.state == S.DEAD and m.pending_state == S.DEAD
    with pytest.raises(IllegalTxnTransitionError):
        m.complete_transition(dead)
    assert meta(producer_epoch=-1).prepare_dead().producer_epoch == -1  # an id never initialised may expire


@pytest.mark.parametrize("bad", [
    lambda e: e._replace(state=S.ONGOING),  # not the pending state
    lambda e: e._replace(producer_epoch=e.producer_epoch + 2),  # neither the same nor the next epoch
    lambda e: e._replace(topic_partitions=frozenset({("t", 0)})),
    lambda e: e._replace(txn_start_timestamp=4),
])
def test_completing_with_an_entry_that_breaks_the_rules_is_refused(bad):
    m = meta(producer_epoch=3)
    entry = m.prepare_init(1000, 2)
    with pytest.raises(IllegalTxnTransitionError):
        m.complete_transition(bad(entry))
    assert m.pending_state == S.EMPTY and m.producer_epoch == 3


def test_completing_without_a_pending_transition_is_refused():
    with pytest.raises(IllegalTxnTransitionError, match="nothing is pending"):
        meta().complete_transition(TxnLogEntry(100, 1, 1000, S.EMPTY))


def test_ongoing_may_not_drop_partitions_or_change_epoch():
    m = meta(state=S.ONGOING, topic_partitions={("t", 0), ("t", 1)}, txn_start_timestamp=5)
    entry = m.prepare_add_partitions({("t", 2)}, 6)
    with pytest.raises(IllegalTxnTransitionError):
        m.complete_transition(entry._replace(topic_partitions=frozenset({("t", 2)})))
    with pytest.raises(IllegalTxnTransitionError):
        m.complete_transition(entry._replace(producer_epoch=1))


def test_transaction_version_2_bumps_the_epoch_at_every_end():
    m = meta(state=S.ONGOING, producer_epoch=7, topic_partitions={("t", 0)}, txn_start_timestamp=5)
    prepare = m.prepare_abort_or_commit(S.PREPARE_COMMIT, 2, -1, 8)
    assert (prepare.producer_epoch, prepare.last_producer_epoch, prepare.client_transaction_version) == (8, 7, 2)
    apply(m, prepare)
    assert (m.producer_epoch, m.last_producer_epoch) == (8, 7)
    complete = m.prepare_complete(9)
    assert (complete.producer_id, complete.producer_epoch) == (100, 8)
    apply(m, complete)
    assert (m.state, m.producer_epoch, m.client_transaction_version) == (S.COMPLETE_COMMIT, 8, 2)


def test_transaction_version_2_moves_to_the_next_producer_id_when_exhausted():
    m = meta(state=S.ONGOING, producer_epoch=32766, topic_partitions={("t", 0)}, txn_start_timestamp=5)
    prepare = m.prepare_abort_or_commit(S.PREPARE_ABORT, 2, 555, 8)
    assert (prepare.producer_epoch, prepare.next_producer_id) == (32767, 555)
    apply(m, prepare)
    assert m.next_producer_id == 555
    complete = m.prepare_complete(9)
    assert (complete.producer_id, complete.producer_epoch, complete.previous_producer_id,
            complete.last_producer_epoch) == (555, 0, 100, 32767)
    apply(m, complete)
    assert (m.producer_id, m.producer_epoch, m.previous_producer_id, m.next_producer_id) == (555, 0, 100, -1)


def test_from_entry_and_entry_agree():
    m = TransactionMetadata.from_entry("tx", ONGOING._replace(previous_producer_id=7, client_transaction_version=1))
    assert (m.state, m.topic_partitions, m.last_producer_epoch) == (S.ONGOING, set(ONGOING.topic_partitions), -1)
    assert m.entry() == ONGOING._replace(previous_producer_id=7, client_transaction_version=1)
    assert "Ongoing" in repr(m)
