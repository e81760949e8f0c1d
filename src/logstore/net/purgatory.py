"""Delayed requests: answers that wait for a condition or a timeout (Kafka's purgatory).

A request that cannot be answered yet (a fetch with nothing new to return, a produce with
acks="all" waiting for the high watermark) is *watched* instead of parking a thread: the
handler gives :meth:`Purgatory.watch` an ``attempt`` function and a timeout and returns the
:class:`concurrent.futures.Future` it gets back, which ``net.Server`` writes when it completes.
Whoever changes what the request waits for (an append, a high watermark move, an election)
calls :meth:`Purgatory.check` with the same key, on its own thread: the attempts that can answer
now do, and their answers are written from that thread at once, without a hop through a queue.
A timer thread answers the requests whose timeout passes.

``attempt(expired)`` returns the answer, or None while it cannot answer yet; with
``expired=True`` it must answer. It may be called on any thread, more than once, and at the
same time as a check on another thread; the purgatory completes each request exactly once, with
the first answer. An attempt that raises fails the request's Future (the network layer then
closes that connection).

Lock order: the purgatory's own lock is never held while an attempt runs, so an attempt may
take the locks of whoever calls :meth:`check` (the replication leader checks while holding a
partition's lock, which its attempts take again: it is re-entrant). Inside
:meth:`Purgatory.deferred`, the answers a thread's checks produce are completed (and so written)
when the block ends, after the caller released its locks.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, Callable, Hashable, Iterator, Sequence

__all__ = ["Purgatory", "mapped", "when_settled"]

logger = logging.getLogger("logstore.net.purgatory")

#: An attempt: expired in, the answer (or None: not yet) out.
Attempt = Callable[[bool], Any]


class _Delayed:
    """One watched request."""

    __slots__ = ("key", "attempt", "deadline", "future", "done", "queued")

    def __init__(self, key: Hashable, attempt: Attempt, deadline: float) -> None:
        self.key = key
        self.attempt = attempt
        self.deadline = deadline
        self.future: Future = Future()
        self.done = False
        self.queued = False  # in the timeout heap


class Purgatory:
    """The requests of one server that wait, by key (Kafka keys them by partition).

    The timer thread starts with the first watched request and ends at :meth:`close`.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._watchers: dict[Hashable, list[_Delayed]] = {}
        self._timeouts: list[tuple[float, int, _Delayed]] = []
        self._seq = itertools.count()
        self._timer: threading.Thread | None = None
        self._closed = False
        self._finished = 0  # completed requests still in the timeout heap
        self._local = threading.local()  # .pending: completions deferred by deferred()

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Within the block, answers that this thread's checks and watches produce are completed
        when it ends (outermost block), so that no socket is written while the caller holds a
        lock taken inside the block."""
        local = self._local
        outermost = getattr(local, "pending", None) is None
        if outermost:
            local.pending = []
        try:
            yield
        finally:
            if outermost:
                pending, local.pending = local.pending, None
                for op, answer, exc in pending:
                    self._settle(op, answer, exc)

    def watch(self, key: Hashable, attempt: Attempt, timeout_s: float) -> Future:
        """Answer with ``attempt`` as soon as it can, or with ``attempt(True)`` after
        ``timeout_s`` seconds. The attempt is made once at once, and again after the request is
        registered (so a change between the two is not missed). Returns the answer's Future.
        After :meth:`close`, the request is answered at once as expired."""
        op = _Delayed(key, attempt, time.monotonic() + timeout_s)
        if self._try(op, False):
            return op.future
        with self._lock:
            if not self._closed:
                self._watchers.setdefault(key, []).append(op)
                heapq.heappush(self._timeouts, (op.deadline, next(self._seq), op))
                op.queued = True
                if self._timer is None:
                    self._timer = threading.Thread(target=self._run_timer, name=f"{self.name}-purgatory",
                                                   daemon=True)
                    self._timer.start()
                elif self._timeouts[0][2] is op:
                    self._wakeup.notify()
                closed = False
            else:
                closed = True
        self._try(op, closed)
        return op.future

    def check(self, key: Hashable) -> int:
        """Make the attempts of the requests watching ``key`` (after a change they may wait
        for); returns how many completed."""
        with self._lock:
            ops = list(self._watchers.get(key, ()))
        return sum(self._try(op, False) for op in ops)

    def keys(self) -> list[Hashable]:
        """The keys that requests are watching now."""
        with self._lock:
            return list(self._watchers)

    @property
    def pending(self) -> int:
        """Requests waiting now."""
        with self._lock:
            return sum(len(ops) for ops in self._watchers.values())

    def close(self) -> None:
        """Answer every waiting request as expired and stop the timer; later watches are
        answered at once. Idempotent."""
        with self._lock:
            self._closed = True
            ops = [op for _, _, op in self._timeouts]
            self._wakeup.notify()
            timer = self._timer
        for op in ops:
            self._try(op, True)
        if timer is not None and timer is not threading.current_thread():
            timer.join(5)

    # ------------------------------------------------------------------ internals
    def _try(self, op: _Delayed, expired: bool) -> bool:
        """Attempt ``op``; complete it (once) when it answers. True if this call completed it."""
        if op.done:
            return False
        try:
            answer = op.attempt(expired)
        except BaseException as exc:  # noqa: BLE001 - the request fails, not the caller
            return self._finish(op, None, exc)
        if answer is None:
            if expired:
                return self._finish(op, None, RuntimeError(f"{self.name}: an expired request gave no answer"))
            return False
        return self._finish(op, answer, None)

    def _finish(self, op: _Delayed, answer: Any, exc: BaseException | None) -> bool:
        with self._lock:
            if op.done:
                return False
            op.done = True
            ops = self._watchers.get(op.key)
            if ops is not None:
                try:
                    ops.remove(op)
                except ValueError:
                    pass  # completed before it was registered
                if not ops:
                    del self._watchers[op.key]
            # Completed requests leave the timeout heap when they reach its top; rebuild it
            # when they outnumber the waiting ones (requests answered long before their timeout).
            self._finished += op.queued
            if self._finished > 64 and self._finished * 2 > len(self._timeouts):
                self._timeouts = [entry for entry in self._timeouts if not entry[2].done]
                heapq.heapify(self._timeouts)
                self._finished = 0
        pending = getattr(self._local, "pending", None)
        if pending is not None:
            pending.append((op, answer, exc))
        else:
            self._settle(op, answer, exc)
        return True

    @staticmethod
    def _settle(op: _Delayed, answer: Any, exc: BaseException | None) -> None:
        # Outside every lock of ours: the Future's callbacks write the answer.
        if exc is not None:
            op.future.set_exception(exc)
        else:
            op.future.set_result(answer)

    def _run_timer(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._closed:
                        return
                    # Drop the completed requests from the heap's top.
                    while self._timeouts and self._timeouts[0][2].done:
                        heapq.heappop(self._timeouts)
                        self._finished -= 1
                    now = time.monotonic()
                    if self._timeouts and self._timeouts[0][0] <= now:
                        op = heapq.heappop(self._timeouts)[2]
                        op.queued = False
                        break
                    self._wakeup.wait(self._timeouts[0][0] - now if self._timeouts else None)
            try:
                self._try(op, True)
            except Exception:  # noqa: BLE001 - never lose the timer thread
                logger.exception("%s: answering an expired request failed", self.name)


def mapped(future: Future, fn: Callable[[Any], Any]) -> Future:
    """A Future of ``fn(future.result())``, settled when ``future`` is: its exception, or one
    ``fn`` raises, fails it (an answer that waited, turned into what is sent). Thread-safe."""
    out: Future = Future()

    def done(f: Future) -> None:
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
            return
        try:
            out.set_result(fn(f.result()))
        except BaseException as err:  # noqa: BLE001 - fails the request, closing its connection
            out.set_exception(err)

    future.add_done_callback(done)
    return out


def when_settled(answer: Any, waiting: Sequence[tuple[Any, Future]], fill: Callable[[Any, Future], None]) -> Future:
    """A Future of ``answer``, settled once every future of ``waiting`` has: ``fill(item,
    future)`` runs for each (item, future) pair as its future settles (on the thread that
    settles it), writing what it came to into ``answer``'s ``item``. Thread-safe."""
    done: Future = Future()
    left = [len(waiting)]
    lock = threading.Lock()
    if not waiting:
        done.set_result(answer)
        return done

    def one(item: Any, future: Future) -> None:
        fill(item, future)
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            done.set_result(answer)

    for item, future in waiting:
        future.add_done_callback(lambda f, i=item: one(i, f))
    return done
