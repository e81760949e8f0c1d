"""A consumer group of three processes, one per Kafka client library (confluent-kafka,
kafka-python, aiokafka), against one served store: while the group is stable every record is
consumed once; a member killed with SIGKILL loses its partitions to the others after its session
timeout, and they resume from its committed offsets (no record read twice, none skipped). The
records are appended by the library, and the committed offsets are read back by the library."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from logstore.client.consumer import offset_store
from logstore.kafka.server import KafkaServer

pytest.importorskip("confluent_kafka")
pytest.importorskip("aiokafka")

MEMBER = os.path.join(os.path.dirname(__file__), "group_member.py")
CLIENTS = ("confluent", "kafka-python", "aiokafka")
PARTITIONS = 6
PER_PARTITION = 15


class Process:
    def __init__(self, client, bootstrap):
        self.client = client
        self.proc = subprocess.Popen([sys.executable, MEMBER, client, bootstrap, "work", "grp"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def assignment(self):
        found = [line for line in list(self.lines) if line.startswith("A ")]
        return {int(p) for p in found[-1][2:].split(",") if p} if found else None

    def records(self):
        return [(int(p), int(o), v) for _, p, o, v in
                (line.split(" ", 3) for line in list(self.lines) if line.startswith("R "))]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for(what, predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def twice(members):
    """Which client read which record more than once, with each client's lines in order."""
    seen: dict[tuple, list[str]] = {}
    for m in members:
        for r in m.records():
            seen.setdefault(r, []).append(m.client)
    repeated = sorted((r, who) for r, who in seen.items() if len(who) > 1)
    return f"read twice: {repeated[:20]}; lines: " + "; ".join(
        f"{m.client}: {[line for line in m.lines if line.startswith('A ') or line.split(' ')[1:2] == [str(p)]]}"
        for m in members for p in sorted({r[0] for r, _ in repeated[:1]}))


def append_phase(store, phase):
    for p in range(PARTITIONS):
        log = store.partition("work", p)
        log.append_batch([f"{phase}-{p}-{i}".encode() for i in range(PER_PARTITION)])


def stable(members):
    found = [m.assignment() for m in members]
    if any(not a for a in found):
        return False
    together = set().union(*found)
    return together == set(range(PARTITIONS)) and sum(len(a) for a in found) == PARTITIONS


def test_three_clients_in_one_group_survive_a_sigkill(tmp_path):
    server = KafkaServer(str(tmp_path), ("127.0.0.1", 0), group_min_session_timeout_ms=1000).start()
    members = []
    try:
        server.store.create_topic("work", PARTITIONS)
        members = [Process(client, server.bootstrap_servers) for client in CLIENTS]
        wait_for("a stable group of three", lambda: stable(members))
        append_phase(server.store, 1)
        wait_for("phase 1 consumed", lambda: sum(len(m.records()) for m in members) >= PARTITIONS * PER_PARTITION)
        consumed = [r for m in members for r in m.records()]
        assert sorted(consumed) == sorted({r for r in consumed}), "a record was consumed twice"
        assert {v for _, _, v in consumed} == {f"1-{p}-{i}" for p in range(PARTITIONS) for i in range(PER_PARTITION)}
        for m in members:  # each read only what it was assigned
            assert {p for p, _, _ in m.records()} <= m.assignment()

        victim = members[1]  # kafka-python: idle, every record it returned is committed
        lost = victim.assignment()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        survivors = [m for m in members if m is not victim]
        wait_for("the survivors to take the killed member's partitions", lambda: stable(survivors))
        append_phase(server.store, 2)
        wait_for("phase 2 consumed", lambda: sum(1 for m in survivors for r in m.records() if r[2].startswith("2-"))
                 >= PARTITIONS * PER_PARTITION)
        time.sleep(0.5)  # nothing more may come: a re-read would show up here
        consumed = [r for m in members for r in m.records()]
        assert len(consumed) == len(set(consumed)) == 2 * PARTITIONS * PER_PARTITION, twice(members)
        taken_over = [r for m in survivors for r in m.records() if r[0] in lost and r[2].startswith("2-")]
        assert sorted(o for p, o, _ in taken_over if p == min(lost))[0] == PER_PARTITION  # from the commit on
        offsets = offset_store(server.store)
        assert [offsets.committed("grp", "work", p) for p in range(PARTITIONS)] == [2 * PER_PARTITION] * PARTITIONS
    finally:
        for m in members:
            m.stop()
        server.stop()
