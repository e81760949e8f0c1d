"""The network layer's request threads (:class:`logstore.net.workers.WorkerPool`): jobs run on
pool threads, at most ``limit`` at once; idle threads leave after the linger time; close drops
what is queued and ends the idle threads."""

from __future__ import annotations

import threading
import time

import pytest

from logstore.net import workers
from logstore.net.workers import WorkerPool


def pool_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"{name}-")]


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def run_together(p: WorkerPool, n: int) -> None:
    """``n`` jobs that wait for each other (so ``n`` threads, the limit allowing it: none is
    idle before all run), all finished on return."""
    barrier = threading.Barrier(n, timeout=10)
    done = threading.Semaphore(0)
    for _ in range(n):
        p.submit(lambda: (barrier.wait(), done.release()))
    for _ in range(n):
        assert done.acquire(timeout=10)


@pytest.fixture
def pool(request):
    made: list[WorkerPool] = []

    def make(name: str, limit: int) -> WorkerPool:
        p = WorkerPool(name, limit)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close(5)


def test_every_job_runs_once_on_a_pool_thread(pool):
    p = pool("wp-every", 4)
    ran: list[tuple[int, str]] = []
    lock = threading.Lock()
    done = threading.Semaphore(0)

    def job(i: int) -> None:
        with lock:
            ran.append((i, threading.current_thread().name))
        done.release()

    for i in range(500):
        p.submit(job, i)
    for _ in range(500):
        assert done.acquire(timeout=10)
    assert sorted(i for i, _ in ran) == list(range(500))
    assert {name.rsplit("-", 1)[0] for _, name in ran} == {"wp-every"}
    assert len(pool_threads("wp-every")) <= 4


def test_at_most_limit_jobs_run_at_once_and_the_rest_wait_in_the_queue(pool):
    p = pool("wp-limit", 2)
    gate = threading.Event()
    running = threading.Semaphore(0)
    finished = threading.Semaphore(0)

    def job() -> None:
        running.release()
        gate.wait(10)
        finished.release()

    for _ in range(5):
        p.submit(job)
    for _ in range(2):
        assert running.acquire(timeout=10)
    assert not running.acquire(timeout=0.2)  # a third job does not start while two block
    assert p.queued == 3 and len(pool_threads("wp-limit")) == 2
    gate.set()
    for _ in range(5):
        assert finished.acquire(timeout=10)
    assert p.queued == 0


def test_idle_threads_leave_after_the_linger_time_and_new_ones_start_on_demand(pool, monkeypatch):
    monkeypatch.setattr(workers, "_WORKER_LINGER_S", 0.1)
    p = pool("wp-linger", 3)
    run_together(p, 3)
    wait_until(lambda: not pool_threads("wp-linger"))
    done = threading.Semaphore(0)
    p.submit(done.release)
    assert done.acquire(timeout=10)
    assert len(pool_threads("wp-linger")) <= 1


def test_close_drops_queued_jobs_ends_idle_threads_and_refuses_later_ones(pool):
    p = pool("wp-close", 1)
    gate, started = threading.Event(), threading.Event()
    ran: list[str] = []

    def blocking() -> None:
        started.set()
        gate.wait(10)
        ran.append("blocking")

    p.submit(blocking)
    assert started.wait(10)
    p.submit(ran.append, "queued")
    assert p.queued == 1
    closer = threading.Thread(target=p.close, args=(10,))
    closer.start()
    wait_until(lambda: p.queued == 0)  # dropped by close, which now waits for the running job
    gate.set()
    closer.join(10)
    assert not closer.is_alive()
    wait_until(lambda: not pool_threads("wp-close"))
    p.submit(ran.append, "after close")
    time.sleep(0.1)
    assert ran == ["blocking"] and not pool_threads("wp-close")


def test_close_wakes_idle_threads(pool):
    p = pool("wp-wake", 3)
    run_together(p, 3)
    wait_until(lambda: len(pool_threads("wp-wake")) == 3)
    started = time.monotonic()
    p.close(10)
    wait_until(lambda: not pool_threads("wp-wake"))
    assert time.monotonic() - started < 5  # woken, not left until the linger time (30 s)
