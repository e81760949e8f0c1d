"""The Kafka server's append watcher: a fetch waiting in the purgatory is woken by any append
to the store, whatever the order in which the fetch, the append and the watcher thread run."""

from __future__ import annotations

import threading

from logstore.kafka.apis import _AppendWatcher
from logstore.net.purgatory import Purgatory


class _Store:
    """The notification counter of a store, with a gate that holds the watcher thread just
    before it reads the counter, so a test can place an append exactly there."""

    def __init__(self) -> None:
        self.counter = 0
        self.changed = threading.Condition()
        self.gate: threading.Event | None = None
        self.at_gate = threading.Event()
        self.read_by_watcher = threading.Event()

    def notification(self) -> int:
        if threading.current_thread().name == "watcher":
            self.read_by_watcher.set()
        if self.gate is not None and threading.current_thread().name == "watcher":
            self.at_gate.set()
            self.gate.wait(5)
        return self.counter

    def wait(self, seen: int, timeout: float) -> None:
        with self.changed:
            self.changed.wait_for(lambda: self.counter != seen, timeout)

    def append(self) -> None:
        with self.changed:
            self.counter += 1
            self.changed.notify_all()


def test_an_append_between_the_fetchs_check_and_the_watchers_wakeup_is_not_lost():
    store = _Store()
    purgatory = Purgatory("test")
    watcher = _AppendWatcher(store, purgatory, "watcher")  # type: ignore[arg-type]
    try:
        # The watcher runs and goes idle: no fetch waits yet.
        watcher.watch(store.notification(), set())
        assert store.read_by_watcher.wait(5)
        first = store.counter
        # A fetch finds nothing, waits, and its own check finds no append yet; the watcher,
        # woken by it, is held before it reads the counter; the append lands there.
        data: list[bytes] = []
        store.gate = threading.Event()
        waiting = purgatory.watch(("t", 0), lambda expired: data or (None if not expired else []), 10.0)
        watcher.watch(first, {("t", 0)})
        assert store.at_gate.wait(5)
        data.append(b"record")
        store.append()
        store.gate.set()
        assert waiting.result(timeout=3) == [b"record"]  # woken at once, not after 10 s
    finally:
        store.gate = None
        watcher.close()
        purgatory.close()


def test_a_fetch_registered_while_the_watcher_waits_is_checked_on_the_next_append():
    store = _Store()
    purgatory = Purgatory("test")
    watcher = _AppendWatcher(store, purgatory, "watcher")  # type: ignore[arg-type]
    try:
        a: list[bytes] = []
        b: list[bytes] = []
        first = purgatory.watch(("t", 0), lambda expired: a or (None if not expired else []), 10.0)
        watcher.watch(store.notification(), {("t", 0)})
        second = purgatory.watch(("t", 1), lambda expired: b or (None if not expired else []), 10.0)
        watcher.watch(store.notification(), {("t", 1)})
        b.append(b"to the second")
        store.append()
        assert second.result(timeout=3) == [b"to the second"]
        assert not first.done()
        a.append(b"to the first")
        store.append()
        assert first.result(timeout=3) == [b"to the first"]
    finally:
        watcher.close()
        purgatory.close()
