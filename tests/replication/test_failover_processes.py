"""3 replica processes; the leader is killed with SIGKILL over and over while a client produces
with acks="all". Checks: no acknowledged record lost, every replica ends with the same offsets
and the same batches (CRC sequence), no acknowledged produce duplicated by the client's retries."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from logstore import Log
from logstore.records.batch import parse_header
from logstore.replication import Client, NotEnoughReplicasError, NotLeaderError, ReplicationError

from .test_inprocess import free_ports

SECRET = b"failover-secret"
FAILOVERS = int(os.environ.get("LOGSTORE_FAILOVERS", "6"))


class Cluster:
    def __init__(self, tmp_path, n=3):
        self.tmp = tmp_path
        ports = free_ports(n)
        self.addrs = {i: ("127.0.0.1", ports[i]) for i in range(n)}
        self.secret_file = tmp_path / "secret"
        self.secret_file.write_bytes(SECRET)
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, i):
        peers = [f"--peer={j}={h}:{p}" for j, (h, p) in self.addrs.items() if j != i]
        h, p = self.addrs[i]
        self.procs[i] = subprocess.Popen(
            [sys.executable, "-m", "logstore", "node", f"--node-id={i}", f"--data-dir={self.tmp / f'n{i}'}",
             f"--listen={h}:{p}", f"--secret-file={self.secret_file}", "--election-timeout-ms=300",
             "--log-level=INFO", *peers],
            stdout=subprocess.PIPE, stderr=open(self.tmp / f"node{i}.log", "ab"))
        assert b"serving" in self.procs[i].stdout.readline()

    def kill(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()

    def stop_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def batches(path):
    """(batch (base offset, CRC) sequence, {offset: value} of the records) of one replica's log."""
    with Log.open(path) as log:
        out, offset = [], log.log_start_offset
        while offset < log.log_end_offset:
            h = parse_header(log.read_raw(offset, 1), 0)
            out.append((h.base_offset, h.crc))
            offset = h.base_offset + h.last_offset_delta + 1
        return out, {r.offset: r.value for r in log.iter()}


def self_declared_leader(cluster):
    """The node that says it leads replicated-0 (the newest epoch's, if two do), or None."""
    best = None
    for i, address in cluster.addrs.items():
        if cluster.procs[i].poll() is not None:
            continue
        probe = Client([address], SECRET, timeout=1)
        try:
            leader, epoch, _ = probe.metadata()[("replicated", 0)]
        except ReplicationError:
            continue
        finally:
            probe.close()
        if leader == i and (best is None or epoch > best[1]):
            best = (i, epoch)
    return None if best is None else best[0]


def converged_high_watermark(cluster, timeout=20.0):
    """Wait until every node names the same leader, epoch and high watermark; return that."""
    deadline = time.monotonic() + timeout
    views = []
    while time.monotonic() < deadline:
        views = []
        for address in cluster.addrs.values():
            probe = Client([address], SECRET, timeout=1)
            try:
                views.append(probe.metadata()[("replicated", 0)])
            except ReplicationError:
                views.append(None)
            finally:
                probe.close()
        if None not in views and len(set(views)) == 1 and views[0][0] >= 0:
            return views[0][2]
        time.sleep(0.1)
    raise AssertionError(f"the replicas did not converge: {views}")


def test_sigkill_the_leader_repeatedly_while_producing_with_acks_all(tmp_path):
    kill_leaders_while_producing(tmp_path, FAILOVERS)


@pytest.mark.slow
def test_soak_many_failovers(tmp_path):
    """Opt-in (make soak): LOGSTORE_SOAK_FAILOVERS kills (default 200)."""
    kill_leaders_while_producing(tmp_path, int(os.environ.get("LOGSTORE_SOAK_FAILOVERS", "200")))


def kill_leaders_while_producing(tmp_path, kills):
    cluster = Cluster(tmp_path)
    for i in range(3):
        cluster.start(i)
    client = Client(list(cluster.addrs.values()), SECRET, timeout=5)
    acked: dict[bytes, int] = {}
    failovers = []
    stalls = []
    done = threading.Event()

    def killer():
        # Kill the leader at a random moment once the set has acknowledged a write since the last
        # kill (so every failover interrupts a live leader with produces in flight); a set that
        # acknowledges nothing for 30 s after a failover has lost liveness.
        rng = random.Random(7)
        try:
            while len(failovers) < kills:
                seen = len(acked)
                deadline = time.monotonic() + 30
                while len(acked) == seen and time.monotonic() < deadline:
                    time.sleep(0.01)
                if len(acked) == seen:
                    stalls.append(len(failovers))
                    return
                time.sleep(rng.uniform(0.0, 0.3))
                leader = self_declared_leader(cluster)
                if leader is None:
                    continue
                cluster.kill(leader)
                cluster.start(leader)
                failovers.append(leader)
        finally:
            done.set()

    thread = threading.Thread(target=killer)
    thread.start()
    n = 0
    try:
        while not done.is_set():
            value = f"v{n}".encode()
            n += 1
            try:
                (offset,) = client.produce("replicated", 0, [value], acks="all", timeout=10)
            except (NotLeaderError, NotEnoughReplicasError, ReplicationError):
                continue
            acked[value] = offset
    finally:
        done.wait()
        thread.join()
        client.close()
        try:
            hw = converged_high_watermark(cluster)
        finally:
            cluster.stop_all()
    assert not stalls, f"nothing acknowledged for 30 s after failover {stalls[0]}"
    assert len(failovers) == kills
    logs = [batches(str(tmp_path / f"n{i}" / "replicated-0")) for i in range(3)]
    # Every acknowledged record is present, at the offset it was acknowledged with, on a majority.
    for value, offset in acked.items():
        holding = [values for _, values in logs if values.get(offset) == value]
        assert len(holding) >= 2, (value, offset)
    # Every replica holds the committed prefix, byte-identical batch for batch.
    committed = [[b for b in batch_list if b[0] < hw] for batch_list, _ in logs]
    assert committed[0] == committed[1] == committed[2]
    assert max(acked.values()) < hw and committed[0][-1][0] < hw
    # No produce appears twice, although the client retried those whose answer a kill lost.
    for _, values in logs:
        assert len(values) == len(set(values.values()))


def test_a_paused_leader_steps_down_and_rejoins_as_a_follower(tmp_path):
    cluster = Cluster(tmp_path)
    for i in range(3):
        cluster.start(i)
    client = Client(list(cluster.addrs.values()), SECRET, timeout=5)
    try:
        (before,) = client.produce("replicated", 0, [b"before"], acks="all", timeout=10)
        old = client.metadata()[("replicated", 0)][0]
        cluster.procs[old].send_signal(signal.SIGSTOP)  # past the election timeout
        others = Client([a for i, a in cluster.addrs.items() if i != old], SECRET, timeout=5)
        (during,) = others.produce("replicated", 0, [b"during"], acks="all", timeout=15)
        assert during > before
        new = others.metadata()[("replicated", 0)]
        assert new[0] not in (old, -1)
        cluster.procs[old].send_signal(signal.SIGCONT)
        # The old leader learns of the new epoch and follows: every node names the same leader.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            views = []
            for a in cluster.addrs.values():
                probe = Client([a], SECRET, timeout=2)
                try:
                    views.append(probe.metadata()[("replicated", 0)][0])
                except ReplicationError:
                    views.append(-1)
                finally:
                    probe.close()
            if len(set(views)) == 1 and views[0] != -1:
                break
            time.sleep(0.2)
        assert len(set(views)) == 1 and views[0] != -1, views
        (after,) = client.produce("replicated", 0, [b"after"], acks="all", timeout=15)
        assert after > during
        others.close()
    finally:
        client.close()
        time.sleep(1.0)
        cluster.stop_all()
    logs = [batches(str(tmp_path / f"n{i}" / "replicated-0")) for i in range(3)]
    assert all(values == {before: b"before", during: b"during", after: b"after"} for _, values in logs), logs
    assert logs[0][0] == logs[1][0] == logs[2][0]
