"""AppendWaiters: threads long-polling a partition for appends, and the notification page that wakes them.

A waiter sleeps on a futex word (``ls_notify_*`` in the C core) instead of polling. The word
lives in a notification page: the partition's own (process-private) page, the ``.shared`` page
of a log shared by several processes (so that an append in any process wakes it), or a page a
LogStore passes for all of its partitions (so that one wait covers a whole store; every append
then notifies).

Invariant: a waiter registers (``ls_notify_enter``) before it checks the condition, so an append
between the check and the sleep changes the counter and the sleep returns at once: a wake-up is
never missed. A crashed process can leave a registration behind, never a missed wake-up; waits
without a deadline still wake once a second to be safe.

Thread-safety: thread-safe; uses the owning Log's lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from .._native import lib
from ..errors import LogClosedError
from .shared import new_notify_page

__all__ = ["AppendWaiters"]


class AppendWaiters:
    """The long-pollers of one log.

    Args:
        name: the log's path, for error messages.
        lock: the log's lock (the condition checks run under it).
        on_change: called with the lock held whenever the number of waiters changes (the log
            makes every append notify while anyone waits).
        notify_page: a page shared by several logs (a store's), or None for a private one.
    """

    def __init__(self, name: str, lock: Any, on_change: Callable[[], None], notify_page: Any = None) -> None:
        self._name = name
        self._lock = lock
        self._on_change = on_change
        self._private_page = new_notify_page()
        #: the page appends notify and waiters sleep on
        self.page = notify_page if notify_page is not None else self._private_page
        #: True when the page is a store's: every append notifies, waiters or not
        self.always = notify_page is not None
        #: threads waiting now
        self.count = 0
        self._closing = False
        self._left = threading.Condition(lock)

    def notify(self) -> None:
        """Wake every thread sleeping on the page."""
        lib.ls_notify(self.page)

    def use_page(self, page: Any) -> None:
        """Sleep on ``page`` from now on (a shared log's page), unless a store's page is used."""
        if not self.always:
            self.page = page

    def use_private_page(self) -> None:
        """Go back to the private page (a shared log closes its ``.shared`` file)."""
        if not self.always:
            self.page = self._private_page

    def wait(self, reached: Callable[[], bool], timeout: float | None) -> bool:
        """Block until ``reached()`` (called with the lock held; it may raise) is true or
        ``timeout`` seconds pass; True when it is.

        Raises:
            LogClosedError: the log is closed while waiting.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._lock:
            if reached():
                return True
            if timeout is not None and timeout <= 0:
                return False
            self.count += 1
            self._on_change()
            page = self.page
        try:
            while True:
                seen = lib.ls_notify_enter(page)
                try:
                    with self._lock:
                        if self._closing:
                            raise LogClosedError(f"log {self._name} was closed while waiting")
                        if reached():
                            return True
                    if deadline is None:
                        lib.ls_notify_wait(page, seen, 1_000_000)
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    lib.ls_notify_wait(page, seen, max(1, int(remaining * 1e6)))
                finally:
                    lib.ls_notify_leave(page)
        finally:
            with self._lock:
                self.count -= 1
                self._on_change()
                if self.count == 0:
                    self._left.notify_all()

    def wake_all(self) -> None:
        """Make every waiter leave with LogClosedError (the log is closing); holds the lock."""
        self._closing = True
        while self.count:
            lib.ls_notify(self.page)
            self._left.wait(0.05)
