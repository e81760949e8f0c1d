"""The transaction coordinator over a real ``__transaction_state`` log: Kafka's answers to
InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, the verification of a produce,
timeouts, expiration, restarts in the middle of a commit, failures of the state log and of the
marker writes, and a stateful model of the whole state machine."""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from logstore.errorcodes import ErrorCode as E
from logstore.log.log import Log
from logstore.txn.coordinator import ListedTxn, TransactionCoordinator, TxnConfig, TxnCoordinatorError
from logstore.txn.metadata import (
    TRANSACTION_STATE_TOPIC_CONFIG,
    TransactionState as S,
    TxnLogEntry,
    TxnRecordError,
    decode_txn_key,
    decode_txn_value,
    encode_txn_key,
    encode_txn_value,
)

T0 = 1_700_000_000_000
FAST = TxnConfig(retry_backoff_ms=1, retry_backoff_max_ms=5, fsync=True)  # (the power-loss safe mode)


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Markers:
    """A fake ``write_markers``: records every call; answers each partition 0 (or what
    ``script`` says for the next calls: a {partition: error} dict, or an exception to raise);
    with ``hold`` set, keeps the futures until ``release()``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool, int, list[tuple[str, int]]]] = []
        self.script: list[dict | Exception] = []
        self.hold = False
        self.held: list[tuple[Future, dict]] = []
        self.lock = threading.Lock()
        self.inside: list = []  # a hook run inside the call (to check the coordinator's lock is free)

    def __call__(self, producer_id, epoch, commit, coordinator_epoch, partitions):
        with self.lock:
            self.calls.append((producer_id, epoch, commit, coordinator_epoch, list(partitions)))
            step = self.script.pop(0) if self.script else {}
        for hook in self.inside:
            hook()
        if isinstance(step, Exception):
            raise step
        answer = {tp: step.get(tp, 0) for tp in partitions}
        future: Future = Future()
        if self.hold:
            with self.lock:
                self.held.append((future, answer))
        else:
            future.set_result(answer)
        return future

    def release(self) -> None:
        with self.lock:
            held, self.held = self.held, []
            self.hold = False
        for future, answer in held:
            future.set_result(answer)


class Env:
    """A coordinator over a real log in ``root``, restartable."""

    def __init__(self, root: Path, config: TxnConfig = FAST, log_wrapper=None) -> None:
        self.root = root
        self.config = config
        self.clock = Clock()
        self.markers = Markers()
        self.ids = itertools.count(1000)
        self.log_wrapper = log_wrapper
        self.log: Log | None = None
        self.coord: TransactionCoordinator | None = None
        self.start()

    def new_id(self) -> int:
        return next(self.ids)

    def start(self, load: bool = True) -> TransactionCoordinator:
        self.log = Log.open(self.root / "__transaction_state-0", TRANSACTION_STATE_TOPIC_CONFIG)
        state_log = self.log if self.log_wrapper is None else self.log_wrapper(self.log)
        self.coord = TransactionCoordinator(state_log, self.new_id, self.markers, clock=self.clock,
                                            config=self.config, coordinator_epoch=3)
        if load:
            self.coord.load()
        return self.coord

    def stop(self) -> None:
        self.coord.close()
        self.log.close()

    def restart(self) -> TransactionCoordinator:
        self.stop()
        return self.start()

    def records(self) -> list[tuple[str, TxnLogEntry | None]]:
        return [(decode_txn_key(r.key), decode_txn_value(r.value)) for r in self.log.iter()]

    def states(self, tid: str) -> list[S | None]:
        return [None if entry is None else entry.state for key, entry in self.records() if key == tid]

    def describe(self, tid: str):
        [found] = self.coord.describe([tid])
        return found


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.stop()


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def begin(env: Env, tid: str = "tx", partitions=(("t", 0), ("t", 1)), timeout_ms: int = 60_000):
    error, pid, epoch = env.coord.init_producer_id(tid, timeout_ms)
    assert error == E.none
    assert env.coord.add_partitions(tid, pid, epoch, partitions) == {tp: E.none for tp in partitions}
    return pid, epoch


# ------------------------------------------------------------------ the happy paths
def test_commit_writes_prepare_markers_complete(env):
    pid, epoch = begin(env)
    assert (pid, epoch) == (1000, 0)
    assert env.describe("tx").state == "Ongoing"
    assert env.coord.end_txn("tx", pid, epoch, True).result(timeout=5) == E.none
    assert env.coord.drain(5)
    assert env.markers.calls == [(1000, 0, True, 3, [("t", 0), ("t", 1)])]
    assert env.states("tx") == [S.EMPTY, S.ONGOING, S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
    found = env.describe("tx")
    assert (found.error, found.state, found.producer_id, found.producer_epoch, found.topics) == (
        E.none, "CompleteCommit", 1000, 0, ())
    prepared = [entry for _, entry in env.records() if entry.state == S.PREPARE_COMMIT][0]
    assert prepared.topic_partitions == {("t", 0), ("t", 1)} and prepared.txn_start_timestamp == T0


def test_abort_writes_abort_markers(env):
    pid, epoch = begin(env, partitions=[("t", 0)])
    assert env.coord.end_txn("tx", pid, epoch, False).result(timeout=5) == E.none
    assert env.coord.drain(5)
    assert env.markers.calls == [(1000, 0, False, 3, [("t", 0)])]
    assert env.states("tx")[-2:] == [S.PREPARE_ABORT, S.COMPLETE_ABORT]


def test_a_second_transaction_follows_the_first(env):
    pid, epoch = begin(env)
    env.coord.end_txn("tx", pid, epoch, True).result()
    env.coord.drain(5)
    env.clock.now += 10
    assert env.coord.add_partitions("tx", pid, epoch, [("u", 0)]) == {("u", 0): E.none}
    found = env.describe("tx")
    assert (found.state, found.txn_start_timestamp, found.topics) == ("Ongoing", T0 + 10, (("u", (0,)),))
    env.coord.end_txn("tx", pid, epoch, False).result()
    env.coord.drain(5)
    assert env.markers.calls[-1] == (1000, 0, False, 3, [("u", 0)])


def test_the_answer_comes_before_the_markers_and_retries_are_kafkas(env):
    pid, epoch = begin(env)
    env.markers.hold = True
    assert env.coord.end_txn("tx", pid, epoch, True).result(timeout=5) == E.none
    assert env.describe("tx").state == "PrepareCommit"
    # while it completes: the same outcome is CONCURRENT_TRANSACTIONS, and so is any other request
    assert env.coord.end_txn("tx", pid, epoch, True).result() == E.concurrent_transactions
    assert env.coord.end_txn("tx", pid, epoch, False).result() == E.concurrent_transactions
    assert env.coord.add_partitions("tx", pid, epoch, [("t", 9)]) == {("t", 9): E.concurrent_transactions}
    assert env.coord.init_producer_id("tx", 60_000) == (E.concurrent_transactions, -1, -1)
    assert not env.coord.drain(0.05)
    env.markers.release()
    assert env.coord.drain(5)
    assert env.coord.end_txn("tx", pid, epoch, True).result() == E.none  # a retry of a completed commit
    assert env.coord.end_txn("tx", pid, epoch, False).result() == E.invalid_txn_state
    assert env.states("tx").count(S.PREPARE_COMMIT) == 1


def test_a_retried_abort_after_completion_is_none_and_commit_invalid(env):
    pid, epoch = begin(env)
    env.coord.end_txn("tx", pid, epoch, False).result()
    env.coord.drain(5)
    assert env.coord.end_txn("tx", pid, epoch, False).result() == E.none
    assert env.coord.end_txn("tx", pid, epoch, True).result() == E.invalid_txn_state


def test_add_offsets_adds_the_groups_offsets_partition(env):
    error, pid, epoch = env.coord.init_producer_id("tx", 60_000)
    seen = []
    assert env.coord.add_offsets("tx", pid, epoch, "grp", lambda g: seen.append(g) or 17) == E.none
    assert seen == ["grp"]
    assert env.describe("tx").topics == (("__consumer_offsets", (17,)),)
    assert env.coord.add_offsets("tx", pid, epoch, "", lambda g: 0) == E.invalid_request


def test_partitions_already_in_the_transaction_write_nothing(env):
    pid, epoch = begin(env)
    before = len(env.records())
    assert env.coord.add_partitions("tx", pid, epoch, [("t", 1)]) == {("t", 1): E.none}
    assert env.coord.add_partitions("tx", pid, epoch, []) == {}
    assert len(env.records()) == before


def test_new_partitions_join_those_already_in_the_transaction(env):
    pid, epoch = begin(env, partitions=[("t", 0)])
    assert env.coord.add_partitions("tx", pid, epoch, [("t", 0), ("u", 4)]) == {("t", 0): E.none, ("u", 4): E.none}
    assert env.describe("tx").topics == (("t", (0,)), ("u", (4,)))
    assert env.records()[-1][1].topic_partitions == {("t", 0), ("u", 4)}


def test_verify_partitions(env):
    pid, epoch = begin(env, partitions=[("t", 0)])
    assert env.coord.verify_partitions("tx", pid, epoch, [("t", 0), ("t", 1)]) == {
        ("t", 0): E.none, ("t", 1): E.transaction_abortable}
    assert env.coord.verify_partitions("tx", pid, epoch + 1, [("t", 0)]) == {("t", 0): E.producer_fenced}
    assert env.coord.verify_partitions("tx", pid + 1, epoch, [("t", 0)]) == {("t", 0): E.invalid_producer_id_mapping}
    assert env.coord.verify_partitions("nope", pid, epoch, [("t", 0)]) == {("t", 0): E.invalid_producer_id_mapping}
    assert env.coord.verify_partitions("", pid, epoch, [("t", 0)]) == {("t", 0): E.invalid_request}
    env.markers.hold = True
    env.coord.end_txn("tx", pid, epoch, True).result()
    assert env.coord.verify_partitions("tx", pid, epoch, [("t", 0)]) == {("t", 0): E.concurrent_transactions}
    env.markers.release()
    env.coord.drain(5)
    assert env.coord.verify_partitions("tx", pid, epoch, [("t", 0)]) == {("t", 0): E.transaction_abortable}
    assert len(env.records()) == 4  # verification writes nothing


def test_an_idempotent_producer_gets_an_id_and_nothing_is_written(env):
    assert env.coord.init_producer_id(None, 0) == (E.none, 1000, 0)
    assert env.records() == []


# ------------------------------------------------------------------ fencing
def test_a_second_init_fences_the_first_producer_and_aborts_its_transaction(env):
    pid, epoch = begin(env)
    # the new producer: the open transaction is aborted first, and it is told to retry
    assert env.coord.init_producer_id("tx", 60_000) == (E.concurrent_transactions, -1, -1)
    assert env.coord.drain(5)
    assert env.markers.calls == [(pid, epoch + 1, False, 3, [("t", 0), ("t", 1)])]
    assert env.states("tx")[-2:] == [S.PREPARE_ABORT, S.COMPLETE_ABORT]
    assert env.coord.init_producer_id("tx", 60_000) == (E.none, pid, epoch + 2)
    # the old producer is fenced everywhere
    assert env.coord.add_partitions("tx", pid, epoch, [("t", 2)]) == {("t", 2): E.producer_fenced}
    assert env.coord.end_txn("tx", pid, epoch, True).result() == E.producer_fenced
    assert env.coord.verify_partitions("tx", pid, epoch, [("t", 0)]) == {("t", 0): E.producer_fenced}


def test_a_second_init_without_a_transaction_bumps_the_epoch(env):
    assert env.coord.init_producer_id("tx", 60_000) == (E.none, 1000, 0)
    assert env.coord.init_producer_id("tx", 30_000) == (E.none, 1000, 1)
    assert env.describe("tx").txn_timeout_ms == 30_000
    assert env.coord.add_partitions("tx", 1000, 0, [("t", 0)]) == {("t", 0): E.producer_fenced}


def test_kip_360_recovery_with_the_expected_epoch(env):
    _, pid, epoch = env.coord.init_producer_id("tx", 60_000)
    assert env.coord.init_producer_id("tx", 60_000, pid, epoch) == (E.none, pid, epoch + 1)
    # its answer was lost: the retry names the old epoch again and gets the same answer
    assert env.coord.init_producer_id("tx", 60_000, pid, epoch) == (E.none, pid, epoch + 1)
    assert env.coord.init_producer_id("tx", 60_000, pid, epoch + 5) == (E.producer_fenced, -1, -1)
    assert env.coord.init_producer_id("tx", 60_000, pid + 7, epoch + 1) == (E.producer_fenced, -1, -1)
    assert env.coord.init_producer_id("tx", 60_000, pid, -1) == (E.invalid_request, -1, -1)
    assert env.coord.init_producer_id("tx", 60_000, -1, 0) == (E.invalid_request, -1, -1)
    # an id the coordinator forgot (expired) is created again for a recovering producer
    assert env.coord.init_producer_id("other", 60_000, 4242, 9) == (E.none, 1001, 0)


def write_record(log: Log, tid: str, entry: TxnLogEntry | None, version: int = 1) -> None:
    log.append_batch([None if entry is None else encode_txn_value(entry, version)], [encode_txn_key(tid)])
    log.flush()


def test_epoch_exhaustion_moves_to_a_new_producer_id(env):
    env.stop()
    env.start(load=False)
    write_record(env.log, "tx", TxnLogEntry(77, 32765, 60_000, S.EMPTY, txn_last_update_timestamp=T0))
    env.coord.load()
    assert env.coord.init_producer_id("tx", 60_000) == (E.none, 77, 32766)  # the last epoch given out
    assert env.coord.init_producer_id("tx", 60_000, 77, 32766) == (E.none, 1000, 0)  # rotated
    last = env.records()[-1][1]
    assert (last.producer_id, last.producer_epoch, last.previous_producer_id) == (1000, 0, 77)
    # the retry of that call (its answer lost) gets the same answer (KIP-360: the previous id, exhausted)
    assert env.coord.init_producer_id("tx", 60_000, 77, 32766) == (E.none, 1000, 0)
    assert env.coord.init_producer_id("tx", 60_000) == (E.none, 1000, 1)


def test_fencing_the_last_epoch_then_rotating(env):
    env.stop()
    env.start(load=False)
    write_record(env.log, "tx", TxnLogEntry(77, 32766, 60_000, S.ONGOING, frozenset({("t", 0)}), T0, T0))
    env.coord.load()
    assert env.coord.init_producer_id("tx", 60_000) == (E.concurrent_transactions, -1, -1)
    env.coord.drain(5)
    assert env.markers.calls == [(77, 32767, False, 3, [("t", 0)])]  # the fence takes the very last epoch
    assert env.coord.init_producer_id("tx", 60_000) == (E.none, 1000, 0)


def test_the_allocator_failing_is_answered(env):
    env.stop()

    def broken():
        raise OSError(28, "no space left on device")

    env.new_id = broken
    env.start()
    error, pid, epoch = env.coord.init_producer_id("tx", 60_000)
    assert error == E.unknown_server_error and (pid, epoch) == (-1, -1)
    assert env.records() == []


# ------------------------------------------------------------------ timeouts
def test_a_timed_out_transaction_is_fenced_and_aborted(env):
    pid, epoch = begin(env, timeout_ms=1000)
    env.clock.now = T0 + 1000
    assert env.coord.abort_expired() == []  # not past its timeout yet
    env.clock.now = T0 + 1001
    assert env.coord.abort_expired() == ["tx"]
    assert env.coord.drain(5)
    assert env.markers.calls == [(pid, epoch + 1, False, 3, [("t", 0), ("t", 1)])]
    assert env.states("tx")[-2:] == [S.PREPARE_ABORT, S.COMPLETE_ABORT]
    assert env.coord.end_txn("tx", pid, epoch, True).result() == E.producer_fenced
    assert env.coord.add_partitions("tx", pid, epoch, [("t", 0)]) == {("t", 0): E.producer_fenced}
    assert env.coord.init_producer_id("tx", 1000) == (E.none, pid, epoch + 2)
    assert env.coord.abort_expired(T0 + 10**9) == []  # nothing open any more


def test_only_ongoing_transactions_time_out(env):
    begin(env, "a", timeout_ms=1000)
    env.coord.init_producer_id("b", 1000)
    pid, epoch = begin(env, "c", timeout_ms=1000)
    env.markers.hold = True
    env.coord.end_txn("c", pid, epoch, True).result()
    assert env.coord.abort_expired(T0 + 5000) == ["a"]
    env.markers.release()
    env.coord.drain(5)
    assert env.describe("c").state == "CompleteCommit"


def test_a_failed_fence_write_does_not_bump_the_epoch_twice(tmp_path):
    flaky = Flaky()
    env = Env(tmp_path, log_wrapper=flaky.wrap)
    try:
        pid, epoch = begin(env, timeout_ms=1000)
        flaky.fail_flushes = 1
        assert env.coord.abort_expired(T0 + 2000) == []
        assert env.describe("tx").state == "Ongoing"
        assert env.coord.end_txn("tx", pid, epoch, True).result() == E.producer_fenced  # fenced in memory already
        assert env.coord.abort_expired(T0 + 3000) == ["tx"]
        env.coord.drain(5)
        assert env.markers.calls[-1][:2] == (pid, epoch + 1)
    finally:
        env.stop()


# ------------------------------------------------------------------ concurrency
def test_concurrent_end_txn_decides_once(env):
    pid, epoch = begin(env)
    env.markers.hold = True
    barrier = threading.Barrier(8)
    answers = []

    def end(commit):
        barrier.wait()
        answers.append(env.coord.end_txn("tx", pid, epoch, commit).result(timeout=5))

    threads = [threading.Thread(target=end, args=(True,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [E.none] + [E.concurrent_transactions] * 7
    assert env.states("tx").count(S.PREPARE_COMMIT) == 1
    env.markers.release()
    assert env.coord.drain(5)
    assert len(env.markers.calls) == 1


def test_concurrent_commit_and_abort_decide_one_outcome(env):
    pid, epoch = begin(env)
    barrier = threading.Barrier(2)
    answers = {}

    def end(commit):
        barrier.wait()
        answers[commit] = env.coord.end_txn("tx", pid, epoch, commit).result(timeout=5)

    threads = [threading.Thread(target=end, args=(c,)) for c in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    env.coord.drain(5)
    winners = [commit for commit, answer in answers.items() if answer == E.none]
    assert len(winners) == 1
    assert answers[not winners[0]] in (E.concurrent_transactions, E.invalid_txn_state)
    assert env.describe("tx").state == ("CompleteCommit" if winners[0] else "CompleteAbort")


def test_many_producers_in_parallel(env):
    errors = []

    def producer(i):
        tid = f"tx-{i}"
        try:
            for _ in range(5):
                error, pid, epoch = env.coord.init_producer_id(tid, 60_000)
                assert error == E.none
                assert env.coord.add_partitions(tid, pid, epoch, [("t", i % 3)]) == {("t", i % 3): E.none}
                assert env.coord.end_txn(tid, pid, epoch, i % 2 == 0).result(timeout=5) == E.none
                assert env.coord.drain(5)
        except AssertionError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    listing = env.coord.list()
    assert {(t.transactional_id, t.state) for t in listing.transactions} == {
        (f"tx-{i}", "CompleteCommit" if i % 2 == 0 else "CompleteAbort") for i in range(6)}
    assert len(env.markers.calls) == 30


def test_the_lock_is_free_while_markers_and_ids_are_asked_for(env):
    # write_markers and the allocator call back into the coordinator on their thread: a held
    # lock would deadlock them (the lock is not re-entrant)
    asked = []
    env.markers.inside.append(lambda: asked.append(env.coord.describe(["tx"])[0].state))
    env.stop()
    counter = itertools.count(5000)

    def allocator():
        asked.append(env.coord.list().error)
        return next(counter)

    env.new_id = allocator
    env.start()
    pid, epoch = begin(env)
    env.coord.end_txn("tx", pid, epoch, True).result(timeout=5)
    assert env.coord.drain(5)
    assert asked == [E.none, "PrepareCommit"]


# ------------------------------------------------------------------ restarts
def test_restart_in_prepare_commit_finishes_the_markers(tmp_path):
    env = Env(tmp_path)
    pid, epoch = begin(env)
    env.markers.hold = True  # the markers never come back: the server dies in the middle of the commit
    assert env.coord.end_txn("tx", pid, epoch, True).result() == E.none
    env.stop()
    env.markers = Markers()
    env.start()
    assert env.coord.drain(5)
    assert env.markers.calls == [(pid, epoch, True, 3, [("t", 0), ("t", 1)])]
    assert env.describe("tx").state == "CompleteCommit"
    assert env.states("tx")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
    env.stop()


def test_a_prepare_abort_found_at_load_is_completed(tmp_path):
    env = Env(tmp_path)
    env.stop()
    env.start(load=False)
    write_record(env.log, "a", TxnLogEntry(5, 2, 1000, S.PREPARE_ABORT, frozenset({("x", 3)}), T0, T0), version=0)
    write_record(env.log, "b", TxnLogEntry(6, 0, 1000, S.PREPARE_COMMIT, frozenset({("y", 0), ("y", 1)}), T0, T0))
    assert env.describe("a").error == E.coordinator_load_in_progress
    assert env.coord.load() == 2
    assert env.coord.drain(5)
    assert sorted(env.markers.calls) == [(5, 2, False, 3, [("x", 3)]), (6, 0, True, 3, [("y", 0), ("y", 1)])]
    assert (env.describe("a").state, env.describe("b").state) == ("CompleteAbort", "CompleteCommit")
    env.stop()


def test_state_survives_a_restart(tmp_path):
    env = Env(tmp_path)
    pid, epoch = begin(env, "open")
    begin(env, "done")
    env.coord.end_txn("done", 1001, 0, True).result()
    env.coord.drain(5)
    env.restart()
    found = env.describe("open")
    assert (found.state, found.producer_id, found.producer_epoch, found.topics) == ("Ongoing", pid, epoch,
                                                                                    (("t", (0, 1)),))
    assert env.describe("done").state == "CompleteCommit"
    assert env.coord.end_txn("open", pid, epoch, True).result() == E.none
    assert env.coord.init_producer_id("done", 60_000) == (E.none, 1001, 1)
    env.stop()


def test_load_replays_the_last_record_per_id_and_tombstones(tmp_path):
    env = Env(tmp_path)
    env.stop()
    env.start(load=False)
    write_record(env.log, "a", TxnLogEntry(5, 0, 1000, S.EMPTY, txn_last_update_timestamp=T0))
    write_record(env.log, "b", TxnLogEntry(6, 0, 1000, S.EMPTY, txn_last_update_timestamp=T0))
    write_record(env.log, "a", TxnLogEntry(5, 1, 1000, S.EMPTY, txn_last_update_timestamp=T0))
    write_record(env.log, "b", None)
    env.log.append_batch([b"whatever"], [b"\x00\x07future-key"])  # a key version from the future: skipped
    assert env.coord.load() == 1
    assert env.describe("a").producer_epoch == 1
    assert env.describe("b").error == E.transactional_id_not_found
    env.stop()


def test_a_corrupt_record_fails_the_load_and_names_its_offset(tmp_path):
    env = Env(tmp_path)
    env.stop()
    env.start(load=False)
    write_record(env.log, "a", TxnLogEntry(5, 0, 1000, S.EMPTY, txn_last_update_timestamp=T0))
    env.log.append_batch([b"\x00\x01\x00"], [encode_txn_key("b")])
    with pytest.raises(TxnRecordError, match="at offset 1: value: producer id runs past its end"):
        env.coord.load()
    assert env.coord.init_producer_id("a", 1000)[0] == E.coordinator_load_in_progress
    env.stop()


def test_life_cycle(tmp_path):
    env = Env(tmp_path)
    with pytest.raises(TxnCoordinatorError, match="active"):
        env.coord.load()
    env.coord.close()
    env.coord.close()
    assert env.coord.init_producer_id("tx", 1000) == (E.coordinator_not_available, -1, -1)
    assert env.coord.end_txn("tx", 1, 0, True).result() == E.coordinator_not_available
    assert env.coord.list().error == E.coordinator_not_available
    assert env.coord.abort_expired() == [] and env.coord.expire_ids() == []
    with pytest.raises(TxnCoordinatorError, match="closed"):
        env.coord.load()
    env.log.close()


# ------------------------------------------------------------------ expiration
def test_idle_ids_expire_with_a_tombstone(env):
    week = env.config.transactional_id_expiration_ms
    env.coord.init_producer_id("idle", 60_000)
    pid, epoch = begin(env, "open")
    env.clock.now = T0 + 5
    begin(env, "done")
    env.coord.end_txn("done", 1002, 0, False).result()
    env.coord.drain(5)
    assert env.coord.expire_ids(T0 + week - 1) == []
    assert env.coord.expire_ids(T0 + week) == ["idle"]
    assert env.coord.expire_ids(T0 + 10 * week) == ["done"]  # an open transaction never expires
    assert env.records()[-1] == ("done", None)
    assert env.describe("idle").error == E.transactional_id_not_found
    env.restart()
    assert env.describe("done").error == E.transactional_id_not_found
    assert env.describe("open").state == "Ongoing"
    assert env.coord.init_producer_id("idle", 60_000) == (E.none, 1003, 0)  # a new producer id


# ------------------------------------------------------------------ bad input
def test_bad_requests(env):
    pid, epoch = begin(env, partitions=[("t", 0)])
    c = env.coord
    assert c.init_producer_id("", 1000) == (E.invalid_request, -1, -1)
    assert c.init_producer_id("tx", 900_001) == (E.invalid_transaction_timeout, -1, -1)
    assert c.init_producer_id("tx", 0) == (E.invalid_transaction_timeout, -1, -1)
    assert c.add_partitions("nope", pid, epoch, [("t", 0)]) == {("t", 0): E.invalid_producer_id_mapping}
    assert c.add_partitions("tx", pid + 1, epoch, [("t", 0)]) == {("t", 0): E.invalid_producer_id_mapping}
    assert c.add_partitions("tx", pid, epoch + 1, [("t", 0)]) == {("t", 0): E.producer_fenced}
    assert c.add_partitions("", pid, epoch, [("t", 0)]) == {("t", 0): E.invalid_request}
    assert c.end_txn("nope", pid, epoch, True).result() == E.invalid_producer_id_mapping
    assert c.end_txn("tx", pid + 1, epoch, True).result() == E.invalid_producer_id_mapping
    assert c.end_txn("tx", pid, epoch - 1, True).result() == E.producer_fenced
    assert c.end_txn("", pid, epoch, True).result() == E.invalid_request
    with pytest.raises(ValueError, match="partition"):
        c.add_partitions("tx", pid, epoch, [("t", -1)])
    with pytest.raises(ValueError, match="partition"):
        c.add_partitions("tx", pid, epoch, ["t-0"])
    c.init_producer_id("empty", 1000)
    assert c.end_txn("empty", 1001, 0, True).result() == E.invalid_txn_state  # no transaction to end
    assert [found.error for found in c.describe(["", "nope", "tx"])] == [
        E.invalid_request, E.transactional_id_not_found, E.none]


def test_config_is_checked():
    with pytest.raises(ValueError, match="max_ongoing"):
        TxnConfig(max_ongoing=0)
    with pytest.raises(ValueError, match="value_version"):
        TxnConfig(value_version=2)
    with pytest.raises(ValueError, match="transaction_max_timeout_ms"):
        TxnConfig(transaction_max_timeout_ms=0)
    assert TxnConfig().transaction_max_timeout_ms == 900_000
    assert TxnConfig().transactional_id_expiration_ms == 604_800_000


# ------------------------------------------------------------------ limits, listing, versions
def test_max_ongoing_refuses_a_new_transaction_with_a_retriable_error(tmp_path):
    env = Env(tmp_path, TxnConfig(max_ongoing=1, retry_backoff_ms=1))
    try:
        pid, epoch = begin(env, "a")
        _, pid_b, epoch_b = env.coord.init_producer_id("b", 60_000)
        assert env.coord.add_partitions("b", pid_b, epoch_b, [("t", 0)]) == {("t", 0): E.concurrent_transactions}
        assert env.coord.add_partitions("a", pid, epoch, [("t", 5)]) == {("t", 5): E.none}  # the open one grows
        env.coord.end_txn("a", pid, epoch, True).result()
        env.coord.drain(5)
        assert env.coord.add_partitions("b", pid_b, epoch_b, [("t", 0)]) == {("t", 0): E.none}
    finally:
        env.stop()


def test_list_filters(env):
    begin(env, "a")
    env.clock.now = T0 + 100
    env.coord.init_producer_id("b", 60_000)
    listing = env.coord.list()
    assert listing.error == E.none and listing.unknown_state_filters == ()
    assert listing.transactions == (ListedTxn("a", 1000, "Ongoing"), ListedTxn("b", 1001, "Empty"))
    assert env.coord.list(["Ongoing", "Bogus"]).transactions == (ListedTxn("a", 1000, "Ongoing"),)
    assert env.coord.list(["Ongoing", "Bogus"]).unknown_state_filters == ("Bogus",)
    assert env.coord.list(producer_id_filters=[1001]).transactions == (ListedTxn("b", 1001, "Empty"),)
    assert env.coord.list(["PrepareCommit"]).transactions == ()
    assert env.coord.list(["Ongoing"], min_duration_ms=99).transactions == (ListedTxn("a", 1000, "Ongoing"),)
    assert env.coord.list(["Ongoing"], min_duration_ms=100).transactions == ()


@pytest.mark.parametrize("version", [0, 1])
def test_the_configured_value_version_is_written(tmp_path, version):
    env = Env(tmp_path, TxnConfig(value_version=version))
    try:
        begin(env)
        values = [r.value for r in env.log.iter()]
        assert {v[:2] for v in values} == {bytes([0, version])}
        assert env.records()[0][1].previous_producer_id == (1000 if version else -1)
    finally:
        env.stop()


# ------------------------------------------------------------------ failures of the state log and of the markers
class Flaky:
    """Wraps a Log: the next ``fail_appends`` appends and ``fail_flushes`` flushes raise OSError."""

    def __init__(self) -> None:
        self.fail_appends = 0
        self.fail_flushes = 0

    def wrap(self, log: Log):
        flaky = self

        class FlakyLog:
            def append_batch(self, values, keys):
                if flaky.fail_appends:
                    flaky.fail_appends -= 1
                    raise OSError(5, "injected write failure")
                return log.append_batch(values, keys)

            def flush(self):
                if flaky.fail_flushes:
                    flaky.fail_flushes -= 1
                    raise OSError(5, "injected fsync failure")
                return log.flush()

            def __getattr__(self, name):
                return getattr(log, name)

        return FlakyLog()


def test_a_failed_prepare_write_is_answered_and_nothing_changes(tmp_path):
    flaky = Flaky()
    env = Env(tmp_path, log_wrapper=flaky.wrap)
    try:
        pid, epoch = begin(env)
        flaky.fail_appends = 1
        assert env.coord.end_txn("tx", pid, epoch, True).result() == E.not_coordinator
        assert env.describe("tx").state == "Ongoing" and env.markers.calls == []
        assert env.coord.end_txn("tx", pid, epoch, True).result() == E.none  # the client's retry
        env.coord.drain(5)
        assert env.describe("tx").state == "CompleteCommit"
        flaky.fail_flushes = 1
        assert env.coord.init_producer_id("tx", 60_000) == (E.not_coordinator, -1, -1)
        assert env.describe("tx").producer_epoch == epoch
        assert env.coord.init_producer_id("tx", 60_000) == (E.none, pid, epoch + 1)
    finally:
        env.stop()


def test_a_failed_complete_write_is_retried(tmp_path):
    flaky = Flaky()
    env = Env(tmp_path, log_wrapper=flaky.wrap)
    try:
        pid, epoch = begin(env)
        env.markers.hold = True
        env.coord.end_txn("tx", pid, epoch, True).result()
        flaky.fail_appends = 2
        env.markers.release()
        assert env.coord.drain(5)
        assert flaky.fail_appends == 0
        assert env.describe("tx").state == "CompleteCommit"
        assert env.states("tx")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
    finally:
        env.stop()


def test_retriable_marker_errors_are_retried_for_those_partitions(env):
    pid, epoch = begin(env, partitions=[("t", 0), ("t", 1), ("t", 2)])
    env.markers.script = [{("t", 1): E.not_leader_or_follower, ("t", 2): E.request_timed_out},
                          {("t", 2): E.kafka_storage_error}, OSError("connection reset")]
    env.coord.end_txn("tx", pid, epoch, True).result()
    assert env.coord.drain(5)
    assert [call[4] for call in env.markers.calls] == [[("t", 0), ("t", 1), ("t", 2)], [("t", 1), ("t", 2)],
                                                       [("t", 2)], [("t", 2)]]
    assert env.describe("tx").state == "CompleteCommit"


def test_a_failed_marker_future_is_retried(env):
    pid, epoch = begin(env, partitions=[("t", 0)])
    env.markers.hold = True
    env.coord.end_txn("tx", pid, epoch, False).result()
    wait_for(lambda: env.markers.held)
    with env.markers.lock:
        future, _ = env.markers.held.pop()
        env.markers.hold = False
    future.set_exception(ConnectionError("peer went away"))
    assert env.coord.drain(5)
    assert len(env.markers.calls) == 2 and env.describe("tx").state == "CompleteAbort"


def test_a_deleted_partition_needs_no_marker(env):
    pid, epoch = begin(env)
    env.markers.script = [{("t", 1): E.unknown_topic_or_partition}]
    env.coord.end_txn("tx", pid, epoch, True).result()
    assert env.coord.drain(5)
    assert len(env.markers.calls) == 1 and env.describe("tx").state == "CompleteCommit"


def test_a_fenced_marker_stops_the_completion_as_kafka(env):
    pid, epoch = begin(env)
    env.markers.script = [{("t", 0): E.transaction_coordinator_fenced}]
    env.coord.end_txn("tx", pid, epoch, True).result()
    assert env.coord.drain(5)
    assert len(env.markers.calls) == 1
    assert env.describe("tx").state == "PrepareCommit"  # left to the coordinator that fenced this one
    assert env.coord.end_txn("tx", pid, epoch, True).result() == E.concurrent_transactions
    env.restart()  # a load tries again
    assert env.coord.drain(5)
    assert env.describe("tx").state == "CompleteCommit"


def test_close_while_markers_are_held_leaves_the_commit_to_the_next_load(env):
    pid, epoch = begin(env)
    env.markers.hold = True
    env.coord.end_txn("tx", pid, epoch, True).result()
    env.coord.close()
    env.markers.release()  # an answer arriving after close changes nothing
    time.sleep(0.05)
    assert env.states("tx")[-1] == S.PREPARE_COMMIT
    env.log.close()
    env.start()
    assert env.coord.drain(5)
    assert env.states("tx")[-1] == S.COMPLETE_COMMIT


# ------------------------------------------------------------------ the state machine against a model
class Model:
    def __init__(self, producer_id: int) -> None:
        self.producer_id = producer_id
        self.epoch = 0
        self.state = "Empty"
        self.partitions: set[tuple[str, int]] = set()


class CoordinatorMachine(RuleBasedStateMachine):
    """Drives the coordinator (restarts included) against a model of Kafka's rules: after each
    step every transaction has completed, so each id is Empty, Ongoing or Complete*."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="txn-machine-"))
        self.env = Env(self.dir)
        self.model: dict[str, Model] = {}
        self.next_id = 1000
        self.marker_calls = 0

    def teardown(self) -> None:
        self.env.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def settle(self) -> None:
        assert self.env.coord.drain(5)

    def expect_markers(self, *expected: tuple[Model, bool]) -> None:
        """The marker writes since the last call are exactly one per (model, commit) given."""
        calls = self.env.markers.calls[self.marker_calls:]
        self.marker_calls = len(self.env.markers.calls)
        assert sorted(calls) == sorted((m.producer_id, m.epoch, commit, 3, sorted(m.partitions))
                                       for m, commit in expected)

    tids = st.sampled_from(["a", "b", "c"])

    @rule(tid=tids)
    def init(self, tid):
        m = self.model.get(tid)
        error, pid, epoch = self.env.coord.init_producer_id(tid, 1000)
        if m is None:
            assert (error, pid, epoch) == (E.none, self.next_id, 0)
            self.model[tid] = Model(self.next_id)
            self.next_id += 1
            return
        if m.state == "Ongoing":  # the open transaction is fenced and aborted first
            assert (error, pid, epoch) == (E.concurrent_transactions, -1, -1)
            self.settle()
            m.epoch += 1
            self.expect_markers((m, False))
            m.state, m.partitions = "CompleteAbort", set()
            return
        assert (error, pid, epoch) == (E.none, m.producer_id, m.epoch + 1)
        m.epoch += 1
        m.state = "Empty"

    @rule(tid=tids, partitions=st.sets(st.tuples(st.sampled_from("xy"), st.integers(0, 2)), min_size=1, max_size=3),
          stale=st.booleans())
    def add(self, tid, partitions, stale):
        m = self.model.get(tid)
        pid, epoch = (4242, 0) if m is None else (m.producer_id, m.epoch - 1 if stale and m.epoch > 0 else m.epoch)
        answer = self.env.coord.add_partitions(tid, pid, epoch, partitions)
        if m is None:
            assert set(answer.values()) == {E.invalid_producer_id_mapping}
        elif epoch != m.epoch:
            assert set(answer.values()) == {E.producer_fenced}
        else:
            assert set(answer.values()) == {E.none}
            m.state = "Ongoing"
            m.partitions |= partitions

    @precondition(lambda self: self.model)
    @rule(data=st.data(), commit=st.booleans())
    def end(self, data, commit):
        tid = data.draw(st.sampled_from(sorted(self.model)))
        m = self.model[tid]
        error = self.env.coord.end_txn(tid, m.producer_id, m.epoch, commit).result(timeout=5)
        self.settle()
        if m.state == "Ongoing":
            assert error == E.none
            self.expect_markers((m, commit))
            m.state, m.partitions = ("CompleteCommit" if commit else "CompleteAbort"), set()
        elif m.state == "Empty":
            assert error == E.invalid_txn_state
        else:
            assert error == (E.none if (m.state == "CompleteCommit") == commit else E.invalid_txn_state)

    @rule(elapsed=st.sampled_from([500, 1001]))
    def time_passes(self, elapsed):
        self.env.clock.now += elapsed
        aborted = set(self.env.coord.abort_expired())
        self.settle()
        # a transaction is open at most as long as this rule's steps: the model tracks whether it
        # outlived its 1000 ms timeout through the coordinator's start timestamps
        for tid in aborted:
            assert self.model[tid].state == "Ongoing"
            self.model[tid].epoch += 1
        self.expect_markers(*[(self.model[tid], False) for tid in aborted])
        for tid in aborted:
            self.model[tid].state, self.model[tid].partitions = "CompleteAbort", set()
        for tid, m in self.model.items():
            if tid not in aborted and m.state == "Ongoing":
                assert self.env.describe(tid).txn_start_timestamp + 1000 >= self.env.clock.now

    @rule()
    def restart(self):
        self.env.restart()
        self.settle()
        self.marker_calls = len(self.env.markers.calls)

    @rule()
    def expire(self):
        self.env.clock.now += self.env.config.transactional_id_expiration_ms
        self.env.coord.abort_expired()  # the open transactions time out first
        self.settle()
        removed = set(self.env.coord.expire_ids())
        aborted = {tid for tid, m in self.model.items() if m.state == "Ongoing"}
        for tid in aborted:
            self.model[tid].epoch += 1
        self.expect_markers(*[(self.model[tid], False) for tid in aborted])
        assert removed == set(self.model) - aborted  # the aborted ones were updated just now: not idle
        for tid in removed:
            del self.model[tid]
        for tid in aborted:
            self.model[tid].state, self.model[tid].partitions = "CompleteAbort", set()

    @invariant()
    def agrees_with_the_model(self):
        for tid in ("a", "b", "c"):
            found = self.env.describe(tid)
            m = self.model.get(tid)
            if m is None:
                assert found.error == E.transactional_id_not_found
                continue
            topics = {}
            for topic, partition in sorted(m.partitions):
                topics.setdefault(topic, []).append(partition)
            assert (found.error, found.state, found.producer_id, found.producer_epoch, found.topics) == (
                E.none, m.state, m.producer_id, m.epoch, tuple((t, tuple(ps)) for t, ps in sorted(topics.items())))


CoordinatorMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None,
                                                suppress_health_check=[HealthCheck.too_slow])
test_coordinator_state_machine = CoordinatorMachine.TestCase


def test_without_fsync_the_state_records_are_written_but_never_fsynced(tmp_path):
    """TxnConfig.fsync=False (the default: records durable as an acknowledged produce is, in the
    page cache): the coordinator never flushes its log; the records are there all the same."""
    flushes = []

    def counting(log: Log):
        class Counting:
            def flush(self):
                flushes.append(1)
                return log.flush()

            def __getattr__(self, name):
                return getattr(log, name)

        return Counting()

    env = Env(tmp_path, config=TxnConfig(retry_backoff_ms=1, retry_backoff_max_ms=5), log_wrapper=counting)
    try:
        pid, epoch = begin(env)
        assert env.coord.end_txn("tx", pid, epoch, True).result() == E.none
        env.coord.drain(5)
        assert env.describe("tx").state == "CompleteCommit" and flushes == []
        env.restart()
        assert env.describe("tx").state == "CompleteCommit"
    finally:
        env.stop()
