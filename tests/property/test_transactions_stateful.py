"""A stateful machine drives a Log through transactions against a model of Kafka's rules.

The model is the list of what the log holds, oldest first: ``(offset, kind, producer, value)``
with kind "plain", "txn" (a transactional record) or "commit"/"abort" (a marker). From it alone
the expected answers follow, as a read_committed Kafka consumer computes them: a producer's
transactional records belong to the next marker of that producer after them; a transaction
without a marker is open; the last stable offset is the first offset of the earliest open
transaction (else the log end); read_committed returns the records below it that are plain or
of a committed transaction. The aborted transactions the log reports must be exactly the model's.

Rules: plain appends, transactional appends of three producers, COMMIT and ABORT markers, rolls,
truncation (which may cut a marker and reopen its transaction), a clean reopen, and a crash
(``_abandon()``) after which the ``.txnindex`` files and the recovery point are lost, so that
recovery must rebuild every index from the markers.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from logstore.index import AbortedTxn
from logstore.log.log import Log

PRODUCERS = (0, 1, 2)


class TransactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="logstore-txn-")
        self.path = os.path.join(self.tmp, "t-0")
        self.log: Log | None = None
        self.model: list[tuple[int, str, int, bytes | None]] = []
        self.sequences = dict.fromkeys(PRODUCERS, 0)
        self.config: dict = {}

    @initialize(segment_bytes=st.integers(512, 4096), index_interval_bytes=st.sampled_from([0, 128]))
    def open(self, segment_bytes: int, index_interval_bytes: int) -> None:
        self.config = dict(segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes)
        self.log = Log.open(self.path, **self.config)

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def end(self) -> int:
        return self.model[-1][0] + 1 if self.model else 0

    # ------------------------------------------------------------------ the model's answers
    def transactions(self) -> tuple[dict[int, str], list[AbortedTxn], int]:
        """(offset of each transactional record -> "commit"/"abort"/"open", the aborted
        transactions as (producer, first, marker), the last stable offset)."""
        fate: dict[int, str] = {}
        pending: dict[int, list[int]] = {p: [] for p in PRODUCERS}
        aborted = []
        for offset, kind, pid, _ in self.model:
            if kind == "txn":
                pending[pid].append(offset)
            elif kind in ("commit", "abort"):
                first = pending[pid][0] if pending[pid] else offset
                for o in pending[pid]:
                    fate[o] = kind
                if kind == "abort":
                    aborted.append((pid, first, offset))
                pending[pid] = []
        opens = [offsets[0] for offsets in pending.values() if offsets]
        for offsets in pending.values():
            for o in offsets:
                fate[o] = "open"
        lso = min(opens, default=self.end)
        return fate, aborted, lso

    # ------------------------------------------------------------------ rules
    @rule(value=st.binary(max_size=40))
    def plain(self, value: bytes) -> None:
        offset = self.log.append(value)
        self.model.append((offset, "plain", -1, value))

    @rule(pid=st.sampled_from(PRODUCERS), values=st.lists(st.binary(max_size=40), min_size=1, max_size=3))
    def transactional(self, pid: int, values: list[bytes]) -> None:
        first = self.log.append_batch(values, producer_id=pid, producer_epoch=0, base_sequence=self.sequences[pid],
                                      transactional=True)
        self.sequences[pid] += len(values)
        self.model.extend((first + i, "txn", pid, v) for i, v in enumerate(values))

    @rule(pid=st.sampled_from(PRODUCERS), commit=st.booleans())
    def marker(self, pid: int, commit: bool) -> None:
        offset = self.log.append_txn_marker(pid, 0, commit)
        self.model.append((offset, "commit" if commit else "abort", pid, None))

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def truncate(self, data) -> None:
        offset = data.draw(st.integers(self.model[0][0] + 1, self.end), label="truncate to")
        self.log.truncate_to(offset)
        self.model = [entry for entry in self.model if entry[0] < offset]

    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.log = Log.open(self.path, **self.config)

    @rule()
    def crash_losing_the_indexes(self) -> None:
        self.log._abandon()
        for name in os.listdir(self.path):
            if name.endswith(".txnindex"):
                os.unlink(os.path.join(self.path, name))
        checkpoint = os.path.join(self.tmp, "recovery-point-offset-checkpoint")
        if os.path.exists(checkpoint):
            os.unlink(checkpoint)
        self.log = Log.open(self.path, **self.config)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def answers_match_the_model(self) -> None:
        if self.log is None:
            return
        fate, aborted, lso = self.transactions()
        log = self.log
        assert log.log_end_offset == self.end
        assert log.last_stable_offset == lso
        got = [(t.producer_id, t.first_offset, t.last_offset) for t in log.aborted_transactions(0, self.end)]
        assert got == aborted
        committed = [(o, v) for o, kind, _, v in self.model
                     if o < lso and (kind == "plain" or (kind == "txn" and fate[o] == "commit"))]
        assert [(r.offset, r.value) for r in log.iter(isolation_level="read_committed")] == committed
        everything = [(o, v) for o, kind, _, v in self.model if kind in ("plain", "txn")]
        assert [(r.offset, r.value) for r in log.iter()] == everything
        opens = {pid: first for pid, first in log.producer_transactions().items()}
        expected_open: dict[int, int] = {}
        for o, kind, pid, _ in self.model:
            if kind == "txn" and fate[o] == "open":
                expected_open.setdefault(pid, o)
        assert opens == expected_open


TransactionMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestTransactionMachine = TransactionMachine.TestCase
