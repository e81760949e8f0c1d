"""A hypothesis state machine driving logstore.Queue against a model.

Rules put (one or many), get (one or many), ack, nack, ack twice, reopen the queue (a restart of
the process, sometimes through a second store on the same root, which contends like another
process), and force a snapshot of the state log. The visibility timeout is long, so leases only
end by ack or nack. The model: messages put, which are done, which are leased (with their
delivery counts). Invariants after every step: qsize and in_flight match; a get never returns a
done or leased message, and returns None only when nothing is available.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from logstore import LogStore, Queue
from logstore.client import queue as workqueue


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="logstore-queue-stateful-")
        self.q: Queue | None = None
        self.extra_store: LogStore | None = None
        self.values: dict[tuple[int, int], bytes] = {}
        self.done: set[tuple[int, int]] = set()
        self.leased: dict[tuple[int, int], object] = {}   # -> the current Message
        self.counts: dict[tuple[int, int], int] = {}
        self.max_deliveries: int | None = None
        self.dead: set[tuple[int, int]] = set()

    def teardown(self) -> None:
        if self.q is not None:
            self.q.close()
        if self.extra_store is not None:
            self.extra_store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def _open(self, via_store: bool = False) -> Queue:
        if self.extra_store is not None:
            self.extra_store.close()
            self.extra_store = None
        kw = dict(partitions=self.partitions, visibility_timeout=3600, max_deliveries=self.max_deliveries,
                  durability="written")
        if via_store:
            self.extra_store = LogStore(self.root, maintenance=False)
            return Queue(self.extra_store, "jobs", **kw)
        return Queue(self.root, "jobs", **kw)

    @initialize(partitions=st.integers(1, 3), max_deliveries=st.sampled_from([None, None, 2, 3]),
                snapshot_every=st.sampled_from([5, 20, 20_000]))
    def start(self, partitions, max_deliveries, snapshot_every):
        self.partitions = partitions
        self.max_deliveries = max_deliveries
        self.snapshot_every = snapshot_every
        self.q = self._open()

    def _available(self) -> set[tuple[int, int]]:
        return set(self.values) - self.done - set(self.leased)

    # ------------------------------------------------------------------ rules
    @rule(value=st.binary(max_size=20))
    def put(self, value):
        meta = self.q.put(value)
        self.values[(meta.partition, meta.offset)] = value

    @rule(values=st.lists(st.binary(max_size=8), min_size=1, max_size=5))
    def put_many(self, values):
        for meta, value in zip(self.q.put_many(values), values):
            self.values[(meta.partition, meta.offset)] = value

    def _check_delivery(self, msg) -> None:
        key = (msg.partition, msg.offset)
        assert key in self.values and key not in self.done and key not in self.leased, key
        assert msg.value == self.values[key]
        assert msg.delivery_count == self.counts.get(key, 0) + 1
        assert self.max_deliveries is None or msg.delivery_count <= self.max_deliveries
        self.counts[key] = msg.delivery_count
        self.leased[key] = msg

    def _dead_letters(self) -> set[tuple[int, int]]:
        if self.max_deliveries is None:
            return set()
        dlq = self.q.store.partition("jobs.dlq", 0)
        return {(int(dict(r.headers)["logstore.partition"]), int(dict(r.headers)["logstore.offset"]))
                for r in dlq.iter()}

    def _expect_dead(self) -> None:
        """Messages that reached max_deliveries may be dead-lettered by a get, and only those."""
        if self.max_deliveries is None:
            return
        new = self._dead_letters() - self.dead
        for key in new:
            assert key in self._available() and self.counts.get(key, 0) >= self.max_deliveries, key
        self.dead |= new
        self.done |= new

    @rule()
    def get(self):
        with _snapshot_every(self.snapshot_every):
            msg = self.q.get(0)
        self._expect_dead()
        if msg is None:
            assert not self._available()  # every exhausted message was dead-lettered on the way
        else:
            self._check_delivery(msg)

    @rule(n=st.integers(1, 4))
    def get_many(self, n):
        with _snapshot_every(self.snapshot_every):
            msgs = self.q.get_many(n, timeout=0)
        self._expect_dead()
        deliverable = [k for k in self._available() if k not in {(m.partition, m.offset) for m in msgs}]
        assert len(msgs) == n or not deliverable, (len(msgs), n, deliverable)
        for msg in msgs:
            self._check_delivery(msg)

    @precondition(lambda self: self.leased)
    @rule(data=st.data())
    def ack(self, data):
        key = data.draw(st.sampled_from(sorted(self.leased)))
        msg = self.leased.pop(key)
        assert self.q.ack(msg) is True
        self.done.add(key)

    @precondition(lambda self: self.leased)
    @rule(data=st.data())
    def nack(self, data):
        key = data.draw(st.sampled_from(sorted(self.leased)))
        msg = self.leased.pop(key)
        assert self.q.nack(msg) is True
        assert self.q.nack(msg) is False  # no longer the current delivery

    @precondition(lambda self: self.done - self.dead)
    @rule(data=st.data())
    def ack_again(self, data):
        key = data.draw(st.sampled_from(sorted(self.done - self.dead)))
        msg = workqueue.Message(None, None, [], 0, key[0], key[1], 1, -1)
        assert self.q.ack(msg) is False

    @rule(via_store=st.booleans())
    def reopen(self, via_store):
        self.q.close()
        self.q = self._open(via_store)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def sizes_match(self):
        if self.q is None:
            return
        assert self.q.qsize() == len(self.values) - len(self.done)
        assert self.q.in_flight() == len(self.leased)

    @invariant()
    def dead_letters_match(self):
        if self.q is None or self.max_deliveries is None:
            return
        assert self._dead_letters() == self.dead


class _snapshot_every:
    """Temporarily lower the snapshot interval (module constant read at each operation)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> None:
        self.saved = workqueue._SNAPSHOT_EVERY
        workqueue._SNAPSHOT_EVERY = self.n

    def __exit__(self, *exc: object) -> None:
        workqueue._SNAPSHOT_EVERY = self.saved


#: 20 runs in make test; LOGSTORE_STATEFUL_EXAMPLES=200 for a deeper search.
QueueMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("LOGSTORE_STATEFUL_EXAMPLES", "20")),
    stateful_step_count=30,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestQueueMachine = QueueMachine.TestCase
