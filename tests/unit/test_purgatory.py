"""Delayed requests (purgatory.py): answered at once when they can be, by a check after a
change, or as expired by the timer; exactly once however many threads check; close() answers
what waits."""

from __future__ import annotations

import threading
import time

import pytest

from logstore.net.purgatory import Purgatory


@pytest.fixture
def purgatory():
    p = Purgatory("test")
    yield p
    p.close()


class Waiter:
    """An attempt that answers once ``ready`` is set (or when expired), counting its calls."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = False
        self.calls = 0

    def __call__(self, expired: bool):
        self.calls += 1
        if self.ready:
            return f"{self.name}: ready"
        return f"{self.name}: expired" if expired else None


def test_a_request_that_can_answer_at_once_is_never_registered(purgatory):
    w = Waiter("a")
    w.ready = True
    future = purgatory.watch("k", w, 10)
    assert future.done() and future.result() == "a: ready"
    assert w.calls == 1 and purgatory.pending == 0


def test_a_check_answers_only_the_requests_of_its_key_that_can_answer(purgatory):
    a, b, c = Waiter("a"), Waiter("b"), Waiter("c")
    fa, fb, fc = purgatory.watch("k", a, 10), purgatory.watch("k", b, 10), purgatory.watch("other", c, 10)
    assert purgatory.pending == 3 and not (fa.done() or fb.done() or fc.done())
    a.ready = c.ready = True
    assert purgatory.check("k") == 1
    assert fa.result(0) == "a: ready"
    assert not fb.done() and not fc.done()   # b cannot answer; c watches another key
    assert purgatory.check("k") == 0
    assert purgatory.pending == 2
    b.ready = True
    assert purgatory.check("k") == 1 and fb.result(0) == "b: ready"
    assert purgatory.check("nobody watches this") == 0


def test_a_request_is_answered_as_expired_after_its_timeout(purgatory):
    w = Waiter("w")
    started = time.monotonic()
    future = purgatory.watch("k", w, 0.2)
    assert future.result(5) == "w: expired"
    assert 0.15 <= time.monotonic() - started < 3
    assert purgatory.pending == 0


def test_timeouts_fire_in_deadline_order_whatever_the_order_of_watching(purgatory):
    done: list[str] = []
    futures = [purgatory.watch(name, Waiter(name), seconds) for name, seconds in (("slow", 0.6), ("quick", 0.1),
                                                                                    ("middle", 0.3))]
    for f in futures:
        f.add_done_callback(lambda f: done.append(f.result().split(":")[0]))
    for f in futures:
        f.result(5)
    assert done == ["quick", "middle", "slow"]


def test_a_zero_timeout_is_answered_as_expired_at_once(purgatory):
    assert purgatory.watch("k", Waiter("z"), 0).result(2) == "z: expired"


def test_each_request_is_answered_exactly_once_under_concurrent_checks(purgatory):
    answers: list[str] = []
    lock = threading.Lock()
    waiters = [Waiter(str(i)) for i in range(200)]
    futures = [purgatory.watch("k", w, 30) for w in waiters]
    for f in futures:
        f.add_done_callback(lambda f: (lock.acquire(), answers.append(f.result()), lock.release()))
    for w in waiters:
        w.ready = True
    threads = [threading.Thread(target=lambda: [purgatory.check("k") for _ in range(20)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == sorted(f"{i}: ready" for i in range(200))
    assert purgatory.pending == 0


def test_an_attempt_that_raises_fails_only_its_request(purgatory):
    def broken(expired):
        raise ValueError("bad request")

    good = Waiter("good")
    failed, waiting = purgatory.watch("k", broken, 10), purgatory.watch("k", good, 10)
    with pytest.raises(ValueError, match="bad request"):
        failed.result(0)
    good.ready = True
    assert purgatory.check("k") == 1 and waiting.result(0) == "good: ready"


def test_an_expired_attempt_must_answer():
    p = Purgatory("strict")
    try:
        future = p.watch("k", lambda expired: None, 0.05)
        with pytest.raises(RuntimeError, match="gave no answer"):
            future.result(5)
    finally:
        p.close()


def test_close_answers_what_waits_and_later_watches_at_once():
    p = Purgatory("closing")
    futures = [p.watch("k", Waiter(str(i)), 60) for i in range(3)]
    p.close()
    assert [f.result(0) for f in futures] == ["0: expired", "1: expired", "2: expired"]
    assert p.watch("k", Waiter("late"), 60).result(0) == "late: expired"
    p.close()  # idempotent


def test_requests_answered_early_do_not_pile_up_in_the_timer(purgatory):
    """Thousands of requests answered long before their timeout: the timer's heap is rebuilt,
    and a short timeout among them still fires on time."""
    for i in range(5000):
        w = Waiter(str(i))
        purgatory.watch("k", w, 3600)
        w.ready = True
        purgatory.check("k")
    assert purgatory.pending == 0
    assert len(purgatory._timeouts) < 200
    assert purgatory.watch("k", Waiter("short"), 0.05).result(5) == "short: expired"


def test_answers_made_inside_a_deferred_block_are_completed_when_it_ends(purgatory):
    w = Waiter("w")
    future = purgatory.watch("k", w, 10)
    lock = threading.Lock()
    seen_locked: list[bool] = []
    future.add_done_callback(lambda f: seen_locked.append(lock.locked()))
    with purgatory.deferred():
        with purgatory.deferred():  # nested: only the outermost block completes
            with lock:
                w.ready = True
                assert purgatory.check("k") == 1
            assert not future.done()
        assert not future.done()
    assert future.result(0) == "w: ready"
    assert seen_locked == [False]   # the answer was written after the lock was released
    assert purgatory.pending == 0


def test_a_deferred_block_defers_only_its_own_threads_answers(purgatory):
    w = Waiter("w")
    future = purgatory.watch("k", w, 10)
    with purgatory.deferred():
        w.ready = True
        other = threading.Thread(target=purgatory.check, args=("k",))
        other.start()
        other.join()
        assert future.done()   # completed by the other thread, which defers nothing


def test_when_settled_answers_once_every_future_filled_its_item():
    from concurrent.futures import Future

    from logstore.net.purgatory import when_settled

    answer = {"items": [{"n": 0}, {"n": 0}]}
    futures = [Future(), Future()]
    done = when_settled(answer, list(zip(answer["items"], futures)),
                        lambda item, f: item.update(n=f.result() if f.exception() is None else -1))
    futures[1].set_result(7)
    assert not done.done()
    futures[0].set_exception(TimeoutError())
    assert done.result(0) is answer and answer["items"] == [{"n": -1}, {"n": 7}]
    assert when_settled(answer, [], lambda item, f: None).result(0) is answer  # nothing to wait for
