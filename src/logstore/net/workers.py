"""A pool of threads that run the network layer's request handlers (:class:`WorkerPool`).

Threads start on demand, up to a limit, and an idle one exits after ``_WORKER_LINGER_S``, so an
idle server holds no threads beyond its loop. Thread-safety: every method may be called from
any thread. Imports nothing of logstore.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Any, Callable

__all__ = ["WorkerPool"]

#: How long an idle worker thread waits for a request before it exits.
_WORKER_LINGER_S = 30.0


class WorkerPool:
    """Threads that run request handlers: started on demand up to ``limit``; an idle one exits
    after ``_WORKER_LINGER_S``. Thread-safe."""

    def __init__(self, name: str, limit: int) -> None:
        self._name = name
        self._limit = limit
        self._cond = threading.Condition()
        self._jobs: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._idle = 0
        self._threads: set[threading.Thread] = set()
        self._closed = False
        self._numbers = itertools.count(1)

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on a pool thread (dropped after :meth:`close`). ``fn`` must not
        raise: an exception would end its thread."""
        with self._cond:
            if self._closed:
                return
            self._jobs.append((fn, args))
            # Invariant: every queued job has an idle thread to take it, or a thread is started.
            if len(self._jobs) > self._idle and len(self._threads) < self._limit:
                t = threading.Thread(target=self._run, name=f"{self._name}-{next(self._numbers)}", daemon=True)
                self._threads.add(t)
                t.start()
            self._cond.notify()

    @property
    def queued(self) -> int:
        """Requests waiting for a thread."""
        return len(self._jobs)

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                self._idle += 1
                try:
                    deadline = time.monotonic() + _WORKER_LINGER_S
                    while not self._jobs and not self._closed:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                    if not self._jobs:
                        self._threads.discard(me)
                        return
                    fn, args = self._jobs.popleft()
                finally:
                    self._idle -= 1
            fn(*args)  # never raises: the network layer's handlers catch everything

    def close(self, timeout: float) -> None:
        """Drop queued jobs and wait up to ``timeout`` seconds for the running ones."""
        with self._cond:
            self._closed = True
            self._jobs.clear()
            self._cond.notify_all()
            threads = list(self._threads)
        deadline = time.monotonic() + timeout
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
