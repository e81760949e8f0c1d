"""Regression tests for the replication bugs a code review found (replication.py, election.py,
the network layer), one per reproduction script of the review (ported to Kafka's protocol when
replication moved onto it):

1. a follower whose leader-epoch-checkpoint was damaged kept records the leader never had, and
   the leader counted offsets that follower did not really hold towards acks="all";
2. a BEGIN_EPOCH or a fetch answer naming the receiving node itself, or a node that is not a
   voter, as the leader made it a leader without an election, or killed its fetcher thread;
3. a pre-auth connection dribbling one byte at a time held a connection slot forever (the
   handshake timeout applied to each recv, not to the handshake);
4. an acks="all" produce that could not be confirmed raised NotLeaderError after twice its
   timeout (the client's socket gave up first and the request was sent again);
5. a new leader counted follower offsets learnt in an earlier epoch in its first high watermark;
6. an OSError persisting the election state killed the tick thread, and one while taking up
   leadership left a half-made leader (and killed the vote thread);
7. a produce handler of a deposed leader that learnt the new leader's high watermark
   acknowledged its own record, which the new leader had replaced.

Roles are assigned at run time; waits are generous and no assertion is about speed beyond
"about the timeout". Faults are injected with pytest's monkeypatch, which restores them.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from concurrent.futures import Future

import pytest

from logstore import Log
from logstore.replica.quorum import NONE, Election, QuorumStateFile
from logstore.records.batch import BatchBuilder
from logstore.kafka.apis import KafkaApis
from logstore.kafka.client import KafkaClientError
from logstore.kafka.server import KafkaServer
from logstore.replication import NOT_LEADER, Client, ReplicaNode, ReplicationError, ReplicationTimeoutError
from logstore.replica.client import BEGIN_QUORUM_EPOCH, FETCH, NodeConnection

from .proxy import LinkProxy
from .test_divergence import (
    ISOLATED_LEADER_MS,
    KEY,
    _divergent_tails,
    batches,
    by_offset,
    commit_everywhere,
    converged,
    elected_leader_at,
    leo,
    log,
    produce,
    settle,
    state,
    wait_converged,
)
from .test_divergence import leader_of as sole_leader_of
from .test_inprocess import SECRET, cluster, free_ports, leader_of, wait_for
from .test_network_faults import NetCluster
from .test_server import _raw_produce, begin_epoch_fields, replica_fetch_fields, single, stop_all

TOPIC, PART = KEY


# ---------------------------------------------------------------------- helpers
@pytest.fixture
def thread_errors(monkeypatch):
    """Exceptions that end a thread (the node's background threads must never die of one):
    a list of (thread name, exception), filled while the test runs."""
    seen = []
    previous = threading.excepthook

    def hook(args):
        seen.append((args.thread.name if args.thread is not None else "?", args.exc_value))
        previous(args)

    monkeypatch.setattr(threading, "excepthook", hook)
    return seen


def dead_threads(nodes):
    return {n.node_id: [t.name for t in n._threads if not t.is_alive()] for n in nodes.values()
            if any(not t.is_alive() for t in n._threads)}


def produce_payload(value):
    return bytes(BatchBuilder().build([value]))


def assert_leads_with_its_own_epoch(node):
    """A leader that took up its epoch: its log's latest epoch is the election epoch, its leader
    change record opens the epoch, and every batch it wrote since is stamped with that epoch."""
    rep = node._replicas[KEY]
    with rep.cond:
        role, epoch, start = rep.election.role.value, rep.election.epoch, rep.epoch_start
    assert role == "leader"
    assert log(node).latest_epoch == epoch, (log(node).latest_epoch, epoch)
    assert elected_leader_at(node, start) == node.node_id
    mine = [(base, e) for base, _, e in batches(node) if base >= start]
    assert mine and all(e == epoch for _, e in mine), (epoch, start, batches(node))


def watch_for_leadership(node, seconds, named=(99,)):
    """Poll ``node`` for ``seconds``: every state seen in which it leads, or names itself or one
    of ``named`` as the leader (a node made leader by a message steps down at its next tick, so
    the poll is tight)."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        d = node.describe()[KEY]
        if d["role"] == "leader" or d["leader"] in (node.node_id, *named):
            seen.append(d)
        time.sleep(0.0005)
    return seen


def half_made_leaders(nodes):
    """Nodes whose election says "leader" while their log was not given the epoch."""
    out = []
    for i, n in nodes.items():
        rep = n._replicas[KEY]
        with rep.cond:
            if rep.election.role.value == "leader" and rep.log.latest_epoch != rep.election.epoch:
                out.append((i, rep.election.epoch, rep.log.latest_epoch))
    return out


# ---------------------------------------------------------------------- 1. lost epoch history
@pytest.mark.regression(reason="fixed: a follower without epoch history kept records the leader never had")
def test_a_follower_whose_epoch_checkpoint_was_lost_keeps_nothing_the_leader_lacks(make_cluster, tmp_path):
    """A, cut off, holds x1 and x2 where the leader N holds its leader change record and y. While
    A is down its leader-epoch-checkpoint is damaged (the log drops it with a warning), so A
    fetches with no last epoch: nothing proves its tail matches the leader's, and it must start
    again from the leader's log start rather than be served from its own end on."""
    c = make_cluster()
    a, n, off, _ = _divergent_tails(c)
    cl = c.client(*c.nodes)
    for k in range(3):   # the leader's log end passes A's
        produce(cl, b"z%d" % k, "all")
    lead = c.nodes[n]
    expected = {off["c"]: b"c", off["y"]: b"y"}
    expected.update({o: v for o, v in by_offset(lead).items() if v.startswith(b"z")})
    assert len(expected) == 5 and leo(lead) > off["x"][1] + 1
    with open(os.path.join(str(tmp_path / f"node{a}"), TOPIC + f"-{PART}", "leader-epoch-checkpoint"), "w") as f:
        f.write("garbage\n")
    node = c.start(a)
    assert log(node).latest_epoch == -1   # the history is gone
    deadline = time.monotonic() + 20
    while not converged(c.nodes):
        # What A reports as committed is never a record the leader does not hold.
        try:
            committed = {r.offset: r.value for r in node.read(TOPIC, PART, 0)}
        except Exception:  # noqa: BLE001 - a read racing a truncation
            committed = {}
        held = by_offset(lead)
        assert all(held.get(o) == v for o, v in committed.items()), (committed, held)
        assert time.monotonic() < deadline, f"replicas did not converge: {state(c.nodes)}"
        time.sleep(0.05)
    wait_converged(c.nodes)
    assert by_offset(node) == by_offset(lead) == expected
    assert batches(node) == batches(lead)
    assert {r.offset: r.value for r in node.read(TOPIC, PART, 0)} == expected


@pytest.mark.regression(reason="fixed: acks=all counted offsets of a follower without epoch history")
def test_acks_all_is_not_confirmed_by_a_follower_without_epoch_history(make_cluster, tmp_path):
    """A (the old leader) holds a 10-record uncommitted tail, longer than the new leader N's log,
    and loses its leader-epoch-checkpoint; the third replica is down. An acks="all" produce to N
    must be acknowledged only once A really holds the record (A fetching from its own, longer
    end must not count), and A must end with N's log."""
    c = make_cluster()
    c.start_all(ISOLATED_LEADER_MS)
    leader_of(c.nodes)
    commit_everywhere(c, b"c")
    a, _ = settle(c.nodes)
    others = [i for i in range(3) if i != a]
    ca = c.client(a, timeout=5)
    c.isolate(a)
    for k in range(10):
        produce(ca, b"x%d" % k, 1)
    c.stop(a)
    c.heal_all()
    n = sole_leader_of(c.nodes)
    produce(c.client(*others), b"y", "all")
    (b,) = [i for i in others if i != n]
    with open(os.path.join(str(tmp_path / f"node{a}"), TOPIC + f"-{PART}", "leader-epoch-checkpoint"), "w") as f:
        f.write("garbage\n")
    c.stop(b)
    node = c.start(a)
    assert log(node).latest_epoch == -1 and leo(node) > leo(c.nodes[n])
    n = sole_leader_of(c.nodes)          # A follows the leader (N, unless A's return re-elected)
    o = produce(c.client(n, timeout=10), b"ACKED", "all")
    # Acknowledged: a majority (the leader and A) holds it, so A holds it now.
    assert by_offset(node).get(o) == b"ACKED", (o, by_offset(node), by_offset(c.nodes[n]))
    wait_converged(c.nodes)
    assert by_offset(node) == by_offset(c.nodes[n])
    assert sorted(by_offset(node).values()) == [b"ACKED", b"c", b"y"]


# ---------------------------------------------------------------------- 2. a leader named by others
@pytest.mark.regression(reason="fixed: BEGIN_EPOCH naming the node itself or a non-voter made it leader or killed its fetcher")
@pytest.mark.parametrize("named", ["itself", "non-voter"])
def test_begin_epoch_naming_itself_or_a_non_voter_does_not_make_a_leader(tmp_path, named, thread_errors,
                                                                          monkeypatch):
    nodes, addrs = cluster(tmp_path)
    conn = None
    try:
        first = leader_of(nodes)
        client = Client([addrs[first]], SECRET)
        client.produce(TOPIC, PART, [b"x"], acks="all")
        client.close()
        # acks=all is a majority: a third node may still be fetching "x" (its log end moving
        # under the check below), so every node holds it first.
        wait_converged(nodes)
        f = next(i for i in nodes if i != first)
        # f must not campaign during the test (on a loaded machine its peer may miss a fetch
        # answer and grant a pre-vote): whatever leadership it shows comes from the messages.
        monkeypatch.setattr(nodes[f], "election_timeout_s", 60.0)
        conn = NodeConnection(addrs[f], SECRET, -1, 5.0)
        epoch = nodes[f].describe()[KEY]["epoch"]
        if named == "itself":
            # A fetch of a higher epoch from a voter moves f to that epoch with no leader; then
            # BeginQuorumEpoch of that epoch names f itself.
            epoch += 5
            conn.request(FETCH, replica_fetch_fields(first, epoch))
            leader_id = f
        else:
            epoch += 1
            leader_id = 99
        conn.request(BEGIN_QUORUM_EPOCH, begin_epoch_fields(epoch, leader_id))
        d = nodes[f].describe()[KEY]
        assert d["role"] != "leader" and d["leader"] not in (f, 99), d
        end = leo(nodes[f])
        assert _raw_produce(addrs[f], produce_payload(b"y")) == NOT_LEADER
        assert leo(nodes[f]) == end and b"y" not in by_offset(nodes[f]).values()
        assert watch_for_leadership(nodes[f], 1.0) == []
        assert dead_threads(nodes) == {}, thread_errors
        assert thread_errors == []
    finally:
        if conn is not None:
            conn.close()
        stop_all(nodes)


class _FakeLeaderApis(KafkaApis):
    """Answers the first follower Fetch with NOT_LEADER_OR_FOLLOWER in the next epoch, naming
    ``named`` as the leader; every later one is refused the same way, naming no leader."""

    named = -1
    answered: threading.Event

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.supported = {**self.supported, 1: (4, 12)}

    def on_fetch(self, request):
        p = request.body.topics[0].partitions[0]
        first = not self.answered.is_set()
        self.answered.set()
        return {"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": TOPIC, "partitions": [
            {"partition_index": p.partition, "error_code": 6, "high_watermark": -1, "log_start_offset": -1,
             "current_leader": {"leader_id": self.named if first else -1,
                                "leader_epoch": p.current_leader_epoch + 1},
             "aborted_transactions": None, "records": None}]}]}


class _FakeLeader:
    """A peer (a Kafka listener the node logs in to as the replica user) whose fetch answers
    are :class:`_FakeLeaderApis`'."""

    def __init__(self, tmp_path, named: int) -> None:
        self.answered = threading.Event()
        answered = self.answered

        class Apis(_FakeLeaderApis):
            pass

        Apis.named, Apis.answered = named, answered
        self.server = KafkaServer(str(tmp_path / "fake"), ("127.0.0.1", 0), sasl_credentials={"replica": SECRET.decode()},
                                  sasl_mechanisms=("SCRAM-SHA-256",), apis_factory=Apis).start()
        self.address = self.server.address

    def close(self) -> None:
        self.server.stop()


@pytest.mark.regression(reason="fixed: a fetch answer naming the node itself or a non-voter made it leader or killed its fetcher")
@pytest.mark.parametrize("named", ["itself", "non-voter"])
def test_a_fetch_answer_naming_itself_or_a_non_voter_does_not_make_a_leader(tmp_path, named, thread_errors):
    """Node 0 follows node 1 (a fake peer), whose fetch answer says "not the leader, epoch + 1,
    the leader is X" with X node 0 itself or node 99."""
    x = 0 if named == "itself" else 99
    fake = _FakeLeader(tmp_path, x)
    (dead,) = free_ports(1)
    node = None
    conn = None
    try:
        node = ReplicaNode(0, str(tmp_path / "node0"), ("127.0.0.1", 0), {1: fake.address, 2: ("127.0.0.1", dead)},
                           SECRET, election_timeout_ms=300).start()
        conn = NodeConnection(node.address, SECRET, -1, 5.0)
        epoch = node.describe()[KEY]["epoch"] + 1
        conn.request(BEGIN_QUORUM_EPOCH, begin_epoch_fields(epoch, 1))
        assert fake.answered.wait(10), node.describe()
        assert watch_for_leadership(node, 0.5) == []
        d = node.describe()[KEY]
        assert d["role"] != "leader" and d["leader"] not in (0, 99) and d["epoch"] >= epoch + 1, d
        assert dead_threads({0: node}) == {}, thread_errors
        end = leo(node)
        assert _raw_produce(node.address, produce_payload(b"y")) == NOT_LEADER
        assert leo(node) == end
        assert thread_errors == []
    finally:
        if conn is not None:
            conn.close()
        if node is not None:
            node.stop()
        fake.close()


@pytest.mark.regression(reason="fixed: observe_epoch took the node itself or a non-voter as leader")
def test_the_election_takes_no_leader_from_a_message_naming_itself_or_a_non_voter(tmp_path):
    e = Election(0, [0, 1, 2], QuorumStateFile(str(tmp_path), [0, 1, 2]))
    e.observe_epoch(3, 0)
    assert (e.epoch, e.leader, e.role.value) == (3, NONE, "follower")
    e.observe_epoch(3, 99)
    assert (e.epoch, e.leader, e.role.value) == (3, NONE, "follower")
    e.observe_epoch(4, 99)
    assert (e.epoch, e.leader, e.role.value) == (4, NONE, "follower")
    e.observe_epoch(4, 1)   # a real voter is still followed
    assert (e.epoch, e.leader, e.role.value) == (4, 1, "follower")
    # and what was persisted comes back the same
    again = Election(0, [0, 1, 2], QuorumStateFile(str(tmp_path), [0, 1, 2]))
    assert (again.epoch, again.leader) == (4, 1)


# ---------------------------------------------------------------------- 3. slow-drip handshakes
@pytest.mark.regression(reason="fixed: the handshake timeout applied to each recv, so a slow drip held a slot forever")
def test_slow_drip_connections_are_closed_after_the_handshake_timeout(tmp_path):
    handshake_s = 0.5
    node = single(tmp_path, handshake_timeout_ms=int(handshake_s * 1000), max_connections=2)
    stop = threading.Event()
    closed_after: dict[int, float] = {}

    def drip(i: int) -> None:
        s = socket.create_connection(node.address)
        started = time.monotonic()
        try:
            s.sendall(struct.pack(">i", 4000))   # a pre-auth frame of 4000 bytes, one byte at a time
            s.settimeout(0.1)
            while not stop.is_set():
                s.sendall(b"\0")
                try:
                    if s.recv(1) == b"":
                        break
                except socket.timeout:
                    continue
        except OSError:
            pass   # reset by the server
        finally:
            if not stop.is_set():
                closed_after[i] = time.monotonic() - started
            s.close()

    drippers = [threading.Thread(target=drip, args=(i,), daemon=True) for i in range(2)]
    client = Client([node.address], SECRET, timeout=2)
    try:
        started = time.monotonic()
        for t in drippers:
            t.start()
        time.sleep(0.2)   # both slots taken
        # A legitimate client gets in once the drippers are dropped: within about the timeout.
        served = None
        while served is None and time.monotonic() - started < handshake_s + 1.5:
            try:
                served = client.metadata()
            except (ReplicationError, OSError):
                time.sleep(0.05)
        waited = time.monotonic() - started
        assert served is not None and served[KEY][0] == 0, f"locked out for {waited:.1f} s"
        for t in drippers:
            t.join(handshake_s + 1.5)
        assert sorted(closed_after) == [0, 1], closed_after
        assert all(after < handshake_s + 1.5 for after in closed_after.values()), closed_after
    finally:
        stop.set()
        for t in drippers:
            t.join(5)
        client.close()
        node.stop()


# ---------------------------------------------------------------------- 4. acks=all timeout
@pytest.mark.regression(reason="fixed: an unconfirmed acks=all produce raised NotLeaderError after twice its timeout")
def test_an_unconfirmed_acks_all_produce_times_out_after_about_its_timeout(tmp_path, monkeypatch):
    """The leader's followers are gone; the client reaches it over a link with some latency
    (0.15 s each way). The leader answers "timed out" at the produce's timeout; the client must
    wait for that answer (not give up first and send the request again)."""
    client_timeout = 1.0
    nodes, addrs = cluster(tmp_path, min_insync_replicas=1)
    proxy = None
    client = None
    try:
        first = leader_of(nodes)
        # It keeps leading without followers for the whole test (it would step down after two
        # election timeouts without a fetch).
        monkeypatch.setattr(nodes[first], "election_timeout_s", 60.0)
        proxy = LinkProxy(addrs[first], name="client->leader")
        proxy.set_delay(0.15)
        client = Client([proxy.address], SECRET, timeout=client_timeout)
        assert client.produce(TOPIC, PART, [b"a"], acks="all") == [1]
        for i in nodes:
            if i != first:
                nodes[i].stop()
        for value, kw, timeout in ((b"b1", {}, client_timeout), (b"b2", {"timeout": 0.5}, 0.5)):
            started = time.monotonic()
            with pytest.raises(ReplicationError) as info:
                client.produce(TOPIC, PART, [value], acks="all", **kw)
            took = time.monotonic() - started
            assert info.type is ReplicationTimeoutError, (kw, repr(info.value), f"after {took:.2f} s")
            assert timeout - 0.05 <= took < timeout + 1.5, (kw, took)
        assert nodes[first].describe()[KEY]["role"] == "leader"
        # Appended once each (only the leader holds them: never committed).
        assert [r.value for r in log(nodes[first]).read(0)] == [b"a", b"b1", b"b2"]
    finally:
        if client is not None:
            client.close()
        stop_all(nodes)
        if proxy is not None:
            proxy.close()


# ---------------------------------------------------------------------- 5. stale follower offsets
@pytest.mark.regression(reason="fixed: a new leader's first high watermark counted follower offsets of an earlier epoch")
def test_a_new_leader_does_not_count_follower_offsets_of_an_earlier_epoch(tmp_path):
    ports = free_ports(2)
    node = ReplicaNode(0, str(tmp_path / "n0"), ("127.0.0.1", 0),
                       {1: ("127.0.0.1", ports[0]), 2: ("127.0.0.1", ports[1])}, SECRET,
                       replica_fetch_wait_max_ms=50)   # never started: driven by hand
    rep = node._replicas[KEY]
    try:
        # Epoch 1: node 0 leads; follower 1 fetched up to offset 6 (left in rep.leo at the end).
        with rep.cond:
            rep.election.start_campaign()
            assert rep.election.on_vote_response(rep.election.epoch, 1, True)
            node._leader.become_leader(rep)
        rep.log.append_batch([b"a", b"b", b"c", b"d", b"e"])
        rep.leo = {1: 6, 2: 0}
        # Deposed; the next leader truncates its uncommitted tail.
        with rep.cond:
            rep.election.observe_epoch(rep.election.epoch + 1, 1)
        rep.log.truncate_to(2)
        rep.hw = min(rep.hw, 2)
        hw_before = rep.hw
        # Epoch 3: node 0 wins again; no follower has fetched from it in this epoch.
        with rep.cond:
            rep.election.start_campaign()
            assert rep.election.on_vote_response(rep.election.epoch, 2, True)
            node._leader.become_leader(rep)
        epoch = rep.election.epoch
        assert rep.epoch_start == 2 and rep.log.log_end_offset == 3
        assert rep.hw == hw_before <= rep.epoch_start, (rep.hw, rep.epoch_start, rep.leo)
        assert rep.log.high_watermark <= rep.epoch_start
        # A fetch of this epoch from follower 1 at the leader's end commits the new record.
        answer = node._leader.follower_fetch(rep, 1, epoch, 3, epoch, 1 << 20, 0.05)
        if isinstance(answer, Future):  # a caught-up fetch is held until records come or its wait ends
            answer = answer.result(10)
        assert answer.code == 0
        assert rep.hw == 3
    finally:
        node.stop()


# ---------------------------------------------------------------------- 6. disk errors in elections
@pytest.mark.regression(reason="fixed: an OSError persisting the election state killed the tick thread")
def test_a_disk_error_saving_the_election_state_does_not_kill_the_tick_thread(tmp_path, monkeypatch, thread_errors):
    nodes, addrs = cluster(tmp_path)
    try:
        first = leader_of(nodes)
        rest = {i: n for i, n in nodes.items() if i != first}
        original = QuorumStateFile.save
        failed = []

        def flaky(self, st):
            if len(failed) < 2 and threading.current_thread().name.endswith("-tick"):
                failed.append(threading.current_thread().name)
                raise OSError(28, "No space left on device (injected)")
            return original(self, st)

        with monkeypatch.context() as m:
            m.setattr(QuorumStateFile, "save", flaky)
            nodes[first].stop()
            wait_for(lambda: len(failed) == 2)
        # The disk is back: the election goes on.
        second = leader_of(rest)
        assert dead_threads(rest) == {}, thread_errors
        client = Client([addrs[i] for i in rest], SECRET)
        try:
            (offset,) = client.produce(TOPIC, PART, [b"after"], acks="all")
        finally:
            client.close()
        assert by_offset(rest[second]).get(offset) == b"after"
        assert_leads_with_its_own_epoch(rest[second])
        assert dead_threads(rest) == {}
        assert thread_errors == []
    finally:
        stop_all(nodes)


@pytest.mark.regression(reason="fixed: an OSError taking up leadership left a half-made leader and killed the vote thread")
def test_a_disk_error_taking_up_leadership_leaves_no_half_made_leader(tmp_path, monkeypatch, thread_errors):
    nodes, addrs = cluster(tmp_path)
    try:
        first = leader_of(nodes)
        client = Client(list(addrs.values()), SECRET)
        client.produce(TOPIC, PART, [b"x"], acks="all")
        wait_for(lambda: all(leo(n) == 2 for n in nodes.values()))
        rest = {i: n for i, n in nodes.items() if i != first}
        original = Log.assign_leader_epoch
        failed = []

        def flaky(self, epoch):
            if not failed:
                failed.append(epoch)
                raise OSError(28, "No space left on device (injected)")
            return original(self, epoch)

        half_made = []
        with monkeypatch.context() as m:
            m.setattr(Log, "assign_leader_epoch", flaky)
            nodes[first].stop()
            deadline = time.monotonic() + 15
            while not failed and time.monotonic() < deadline:
                half_made += half_made_leaders(rest)
                time.sleep(0.002)
            assert failed, "no election took place"
            # Until the next leader is in place, no node leads without its epoch.
            deadline = time.monotonic() + 15
            while not any(n.describe()[KEY]["role"] == "leader" and not half_made_leaders({0: n})
                          for n in rest.values()) and time.monotonic() < deadline:
                half_made += half_made_leaders(rest)
                time.sleep(0.002)
        assert half_made == []
        second = leader_of(rest)
        (offset,) = client.produce(TOPIC, PART, [b"y"], acks="all", timeout=10)
        client.close()
        assert by_offset(rest[second]).get(offset) == b"y"
        assert_leads_with_its_own_epoch(rest[second])
        assert dead_threads(rest) == {}
        assert thread_errors == []
    finally:
        stop_all(nodes)


# ---------------------------------------------------------------------- 7. deposed leader's ack
@pytest.mark.regression(reason="fixed: a deposed leader's produce handler acknowledged a replaced record")
def test_a_deposed_leaders_produce_handler_never_acknowledges_a_replaced_record(tmp_path, monkeypatch):
    """Leader A, cut off, appends LOST and its produce handler waits for the high watermark. The
    handler is held (as if descheduled) while B is elected, commits five records and A rejoins B
    as a follower with a high watermark past LOST's offset; only then does it run again. Every
    acknowledged (offset, value) must be in the converged log."""
    net = NetCluster(tmp_path, election_timeout_ms=300)
    release = threading.Event()
    try:
        a = net.leader_among([0, 1, 2])
        to_a = net.client([a], timeout=20)
        acked = {to_a.produce(*KEY, [b"committed"], acks="all")[0]: b"committed"}
        node_a = net.nodes[a]
        leader_side = node_a._leader
        real_committed = leader_side._committed
        held = threading.Event()

        def committed(rep, epoch, first, last, expired):
            # LOST's answer is held (as if its handler were descheduled) until released.
            if first >= lost_at and not release.is_set() and not expired:
                held.set()
                return None
            return real_committed(rep, epoch, first, last, expired)

        monkeypatch.setattr(leader_side, "_committed", committed)
        lost_at = leo(node_a)
        net.isolate(a)
        res = {}

        def produce_lost():
            try:
                res["ok"] = to_a.produce(*KEY, [b"LOST"], acks="all", timeout=20)
            except Exception as exc:  # noqa: BLE001 - reported below
                res["err"] = exc

        th = threading.Thread(target=produce_lost)
        th.start()
        assert held.wait(10), "the produce's answer was never held"
        assert leo(node_a) == lost_at + 1   # LOST appended, not committed
        others = [i for i in net.nodes if i != a]
        b = net.leader_among(others)
        cb = net.client(others)
        for k in range(5):
            (o,) = cb.produce(*KEY, [b"new-%d" % k], acks="all")
            acked[o] = b"new-%d" % k
        net.heal()
        # A follows the new leader and has learnt a high watermark past LOST's offset.
        net.wait_until(lambda: net.state(a)["role"] == "follower" and net.state(a)["leader"] not in (NONE, a)
                       and net.state(a)["high_watermark"] > lost_at, "A rejoined as a follower")
        assert b is not None
        release.set()
        node_a.purgatory.check(KEY)  # the held answer is decided now
        th.join(60)
        assert not th.is_alive()
        if "ok" in res:
            (o,) = res["ok"]
            acked[o] = b"LOST"
        st = net.wait_converged()
        missing = {o: (v, st["values"].get(o)) for o, v in acked.items() if st["values"].get(o) != v}
        assert missing == {}, (res, st["values"])
    finally:
        release.set()
        net.stop()


@pytest.mark.regression(reason=("fixed: a connect to a peer that was not listening yet could connect to "
    "itself (TCP simultaneous open on loopback) and hold the port the peer was about to bind"))
def test_a_connection_to_itself_is_refused_and_frees_the_port(monkeypatch):
    from logstore.kafka import client as kafkaclient
    from logstore.replica import client as replication_client

    made: list[socket.socket] = []

    def self_connected(address, timeout=None):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(timeout)
        sock.connect(sock.getsockname())  # Linux: a socket connecting to its own address
        made.append(sock)
        return sock

    monkeypatch.setattr(kafkaclient.socket, "create_connection", self_connected)
    with pytest.raises(KafkaClientError, match="connected to itself") as info:
        replication_client.NodeConnection(("127.0.0.1", 1), SECRET, 0, 1.0)
    assert isinstance(info.value.__cause__, ConnectionRefusedError)
    assert made and made[0].fileno() == -1  # closed: the port is free again


@pytest.mark.regression(reason=("fixed: after a lost answer and a resend refused with NOT_ENOUGH_REPLICAS, the Client "
                                "reused the sequence of a batch already in the log, so the next batch was answered as "
                                "its duplicate and never written"))
def test_a_refused_resend_never_lets_the_next_batch_pass_for_a_duplicate(tmp_path, monkeypatch):
    from logstore.kafka.client import KafkaClientError
    from logstore.replication import NotEnoughReplicasError
    from logstore.replica.client import PRODUCE, NodeConnection

    node = single(tmp_path)
    client = Client([node.address], SECRET)
    try:
        client.produce(TOPIC, PART, [b"warm"], acks=1)  # a cached connection, so a failure is resent once
        real = NodeConnection.request
        lost = []

        def lose_the_answer(self, api_key, fields, timeout=None):
            answer = real(self, api_key, fields, timeout)
            if api_key == PRODUCE and not lost:
                lost.append(answer)
                node.min_insync = 2  # the resend is refused before the leader looks for a duplicate
                raise KafkaClientError("Produce: the connection was reset (injected, after the append)")
            return answer

        monkeypatch.setattr(NodeConnection, "request", lose_the_answer)
        with pytest.raises(NotEnoughReplicasError):
            client.produce(TOPIC, PART, [b"A1", b"A2"], acks="all")
        node.min_insync = 1
        offsets = client.produce(TOPIC, PART, [b"B1", b"B2"], acks="all")
        values = by_offset(node)
        assert [values[o] for o in offsets] == [b"B1", b"B2"]
        assert sorted(v for v in values.values() if v != b"warm" and v is not None) == [b"A1", b"A2", b"B1", b"B2"]
    finally:
        client.close()
        node.stop()


@pytest.mark.regression(reason="fixed: replication accepted TLS without a private CA (any public certificate passed)")
def test_replication_refuses_tls_without_a_private_ca(tmp_path):
    from logstore.net.protocol import TLSConfig

    with pytest.raises(ValueError, match="mutual TLS"):
        ReplicaNode(0, str(tmp_path / "n0"), ("127.0.0.1", 0), {}, SECRET, tls=TLSConfig("cert.pem", "key.pem"))
    with pytest.raises(ValueError, match="SCRAM-SHA-256"):
        ReplicaNode(0, str(tmp_path / "n1"), ("127.0.0.1", 0), {}, SECRET,
                    kafka_options={"sasl_mechanisms": ("PLAIN",)})
