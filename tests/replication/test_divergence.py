"""Log divergence and truncation by leader epoch (KIP-101, KIP-279), with in-process replicas.

Every history is forced by which nodes run (a node wins an election only with a majority's votes
and a log at least as up to date as each voter's), by restarting nodes on the same data
directory, and by cutting directed network links: every node reaches each peer through its own
LinkProxy (tests/replication/proxy.py), so a leader can be cut off at once (it keeps leading for
two election timeouts, long enough for acks=1 writes nobody else sees), and a voter can grant its
vote without ever being able to fetch from the leader it elected. Waits use generous timeouts,
roles are assigned at run time, and no assertion is about speed or about which node wins an
election the test does not force.

Every newly elected leader appends a leader change control record (it takes an offset but reads
pass over it), so logs are compared by values, by {offset: value}, and batch for batch by (base
offset, CRC, partition leader epoch).

The scenarios:

* KIP-101 scenario 1: a follower that holds a committed record restarts (in Kafka before
  KIP-101 it truncated to its stale high watermark there) and becomes the leader: the record
  must survive, at the offset acknowledged.
* KIP-101 scenario 2: two replicas hold different records at the same offsets (normally equal
  log lengths, so no high-watermark or length rule can see it); the one that rejoins must end
  byte identical to the leader. And a replica restarted with an uncommitted tail must not take
  that tail for committed.
* KIP-279: the leader's history changes twice while a replica is down; and a replica whose
  uncommitted tail spans several epochs the final leader never had (one round of "end offset of
  my last epoch" is not enough: the follower must also bound the truncation by its own end of
  the epoch the leader answers with, and repeat).
* The leader-epoch-checkpoint of every replica (in memory and on disk) agrees with the leader's.
"""

from __future__ import annotations

import errno
import struct
import sys
import threading
import time
import traceback

import pytest

from logstore import Log
from logstore.log.epochs import LeaderEpochCache
from logstore.records.batch import parse_header
from logstore.replication import Client, ReplicaNode

from .proxy import LinkProxy
from .test_inprocess import SECRET, free_ports

KEY = ("replicated", 0)
TOPIC, PART = KEY
TIMEOUT = 20.0


# ---------------------------------------------------------------------- harness
#: The first election timeout of a set whose leader gets cut off: it keeps leading for twice this
#: after its last contact, time enough for acks=1 writes even on a loaded machine.
ISOLATED_LEADER_MS = 1500
#: Nodes (re)started later. Request timeouts derive from it (a quarter for leader discovery):
#: not too short, so that a node on a loaded machine still gets its requests through.
RESTART_MS = 500


class Cluster:
    """Three replicas on loopback; node i reaches node j through ``links[(i, j)]``, a
    :class:`LinkProxy` that the test can cut. Clients connect to the nodes directly."""

    def __init__(self, tmp_path, n=3):
        self.tmp = tmp_path
        ports = free_ports(n)
        self.addrs = {i: ("127.0.0.1", ports[i]) for i in range(n)}
        self.links = {(i, j): LinkProxy(self.addrs[j], name=f"{i}->{j}")
                      for i in range(n) for j in range(n) if i != j}
        self.nodes: dict[int, ReplicaNode] = {}   # the running ones
        self._every: list[ReplicaNode] = []       # every node ever started, for cleanup
        self._clients: list[Client] = []

    def start_all(self, election_timeout_ms=RESTART_MS):
        for i in self.addrs:
            self.start(i, election_timeout_ms)

    def start(self, i, election_timeout_ms=RESTART_MS):
        assert i not in self.nodes
        peers = {j: self.links[(i, j)].address for j in self.addrs if j != i}
        # A restarted node binds its old port, which the kernel may have lent meanwhile to an
        # outgoing connection as its local port (the proxies' connections): wait until free.
        deadline = time.monotonic() + 20
        while True:
            try:
                node = ReplicaNode(i, str(self.tmp / f"node{i}"), self.addrs[i], peers, SECRET,
                                   election_timeout_ms=election_timeout_ms, min_insync_replicas=1)
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self._every.append(node)
        self.nodes[i] = node.start()
        return node

    def stop(self, *ids):
        for i in ids:
            self.nodes.pop(i).stop()

    def isolate(self, i):
        """Cut every link from and to node i."""
        for (src, dst), link in self.links.items():
            if i in (src, dst):
                link.block()

    def cut(self, src, dst):
        self.links[(src, dst)].block()

    def heal_all(self):
        for link in self.links.values():
            link.unblock()

    def client(self, *ids, timeout=10.0):
        c = Client([self.addrs[i] for i in ids], SECRET, timeout=timeout)
        self._clients.append(c)
        return c

    def close(self):
        """Stop every node and proxy (the fixture's teardown: runs whatever the test did)."""
        errors = []
        for thing in [*self._clients, *(n for n in self._every if not n._stop.is_set()), *self.links.values()]:
            try:
                thing.close() if not isinstance(thing, ReplicaNode) else thing.stop()
            except Exception as exc:  # keep stopping the rest
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def make_cluster(tmp_path):
    made = []

    def make():
        c = Cluster(tmp_path)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def log(node):
    return node.store.partition(TOPIC, PART)


def leo(node):
    return log(node).log_end_offset


def values(node):
    return [r.value for r in log(node).read(0)]


def by_offset(node):
    return {r.offset: r.value for r in log(node).read(0)}


def batches(node_or_log):
    """(base offset, CRC, partition leader epoch) of every batch of a node's log (or of a Log)."""
    lg = log(node_or_log) if isinstance(node_or_log, ReplicaNode) else node_or_log
    out, offset = [], lg.log_start_offset
    end = lg.log_end_offset
    while offset < end:
        h = parse_header(lg.read_raw(offset, 1), 0)
        out.append((h.base_offset, h.crc, h.partition_leader_epoch))
        offset = h.base_offset + h.last_offset_delta + 1
    return out


def epochs(node):
    return list(log(node).leader_epochs.entries)


def _varint(buf, pos):
    """A zigzag varint of a Kafka record (returns value, next position)."""
    shift = raw = 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def elected_leader_at(node, offset):
    """The leaderId of the leader change control record at ``offset`` of the node's log (the
    record a newly elected leader appends first; FORMAT.md §13)."""
    raw = log(node).read_raw(offset, 1)
    h = parse_header(raw, 0)
    assert h.base_offset == offset and h.attributes & 0x20 and h.records_count == 1, h   # a control batch
    pos = 61                          # past the batch header: the one record
    _, pos = _varint(raw, pos)        # length
    pos += 1                          # attributes
    _, pos = _varint(raw, pos)        # timestamp delta
    _, pos = _varint(raw, pos)        # offset delta
    klen, pos = _varint(raw, pos)
    assert struct.unpack_from(">hh", raw, pos) == (0, 2)   # ControlRecordType: LEADER_CHANGE
    _, pos = _varint(raw, pos + klen)
    _version, leader = struct.unpack_from(">hi", raw, pos)
    return leader


def role(node):
    return node.describe()[KEY]["role"]


def wait_for(cond, timeout=TIMEOUT, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout} s")


def leader_of(nodes, timeout=TIMEOUT):
    """The one running node that leads (and that every other running node follows)."""
    found = []

    def one():
        found[:] = [i for i, n in nodes.items() if role(n) == "leader"]
        if len(found) != 1:
            return False
        return all(n.describe()[KEY]["leader"] == found[0] for n in nodes.values())

    try:
        wait_for(one, timeout, "a single leader that every running node follows")
    except AssertionError:
        raise AssertionError(f"no single leader: {state(nodes)}") from None
    return found[0]


def converged(nodes):
    """Every running replica holds the same batches (and so the same bytes at every offset)."""
    return len({tuple(batches(n)) for n in nodes.values()}) == 1


def state(nodes):
    """What each node says and holds, and where its threads are (for failure messages)."""
    frames = sys._current_frames()
    stacks = {t.name: "".join(traceback.format_stack(frames[t.ident], limit=6))
              for t in threading.enumerate() if t.name.startswith("replica-") and t.ident in frames}
    return {"nodes": {i: dict(n.describe()[KEY], batches=batches(n), epochs=epochs(n), values=values(n))
                      for i, n in nodes.items()},
            "threads": stacks}


def wait_converged(nodes, timeout=TIMEOUT):
    try:
        wait_for(lambda: converged(nodes), timeout, "identical batch sequences")
    except AssertionError:
        raise AssertionError(f"replicas did not converge: {state(nodes)}") from None


def batches_from_epochs_of(node_or_log):
    """The epoch cache a log's batches imply: (epoch, base offset of its first batch) at every
    increase of the partition leader epoch down the log."""
    out = []
    for base, _, epoch in batches(node_or_log):
        if not out or epoch > out[-1][0]:
            out.append((epoch, base))
    return out


def check_epochs_agree(nodes):
    """Test 4's check, on a snapshot: every replica's leader epoch cache equals the leader's,
    answers end_offset_for_epoch the same for every epoch that survives in the log, and is
    exactly the cache its own batches imply."""
    leader = leader_of(nodes)
    lead = log(nodes[leader])
    expected = epochs(nodes[leader])
    assert expected == batches_from_epochs_of(nodes[leader]), (leader, expected, batches(nodes[leader]))
    for i, node in nodes.items():
        lg = log(node)
        assert epochs(node) == expected, (i, epochs(node), leader, expected)
        assert epochs(node) == batches_from_epochs_of(node), (i, epochs(node), batches(node))
        assert lg.latest_epoch == lead.latest_epoch, (i, lg.latest_epoch, lead.latest_epoch)
        for e, _ in expected:
            assert lg.end_offset_for_epoch(e) == lead.end_offset_for_epoch(e), (i, e)
    return expected


def assert_epochs_agree(nodes, timeout=TIMEOUT):
    """check_epochs_agree, retried while the replicas catch up (a late re-election may append one
    more leader change record that a follower has not fetched yet). Returns the leader's cache."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check_epochs_agree(nodes)
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def produce(client, value, acks):
    (offset,) = client.produce(TOPIC, PART, [value], acks=acks)
    return offset


def settle(nodes):
    """Wait for a quiet moment: one leader that every running node follows, every log identical.
    Returns (leader, its batches)."""
    def quiet():
        leaders = [i for i, n in nodes.items() if role(n) == "leader"]
        return (len(leaders) == 1 and all(n.describe()[KEY]["leader"] == leaders[0] for n in nodes.values())
                and converged(nodes))
    try:
        wait_for(quiet, what="a settled replica set")
    except AssertionError:
        raise AssertionError(f"the set did not settle: {state(nodes)}") from None
    (leader,) = [i for i, n in nodes.items() if role(n) == "leader"]
    return leader, batches(nodes[leader])


def commit_everywhere(c, value):
    """Produce ``value`` with acks=all and wait until every running replica holds it."""
    offset = produce(c.client(*c.nodes), value, "all")
    wait_for(lambda: all(by_offset(n).get(offset) == value for n in c.nodes.values()), what=f"{value!r} everywhere")
    return offset


# ---------------------------------------------------------------------- 1. KIP-101 scenario 1
def test_kip101_scenario1_committed_record_survives_follower_restart_and_promotion(make_cluster):
    """A (leader), B, C. m1 and m2 committed with acks=all, m2 while C is down (so only A and B
    hold it). A dies and B restarts: before KIP-101, B truncated to its high watermark on
    restart (which may not yet cover m2) and, elected, lost m2. Here B is the only replica that
    can win (C lacks m2): it must lead with m1 and m2 at their acknowledged offsets."""
    c = make_cluster()
    c.start_all()
    leader_of(c.nodes)
    o1 = commit_everywhere(c, b"m1")
    acked = {o1: b"m1"}
    cc = 2
    c.stop(cc)
    o2 = produce(c.client(*c.nodes), b"m2", "all")
    acked[o2] = b"m2"
    # Committed means held by a majority: both running replicas (whichever of them leads).
    a = leader_of(c.nodes)
    (b,) = [i for i in c.nodes if i != a]
    assert by_offset(c.nodes[b]).get(o2) == b"m2"
    b_end, b_batches = leo(c.nodes[b]), batches(c.nodes[b])

    c.stop(a)                # the leader dies ...
    c.stop(b)                # ... and the follower holding m2 restarts
    c.start(b)
    assert leo(c.nodes[b]) == b_end and batches(c.nodes[b]) == b_batches  # no truncation on restart
    c.start(cc)
    leader_of(c.nodes)
    # C's log lacks m2: only B could win the first election after the restart.
    wait_for(lambda: leo(c.nodes[b]) > b_end, what="a new epoch")
    assert elected_leader_at(c.nodes[b], b_end) == b
    for n in c.nodes.values():
        wait_for(lambda n=n: {o: by_offset(n).get(o) for o in acked} == acked, what="committed records")
    acked[produce(c.client(b, cc), b"m3", "all")] = b"m3"

    c.start(a)               # the old leader rejoins as a follower
    wait_converged(c.nodes)
    for i, n in c.nodes.items():
        assert values(n) == [b"m1", b"m2", b"m3"], i
        got = by_offset(n)
        assert {o: got.get(o) for o in acked} == acked, i
    assert_epochs_agree(c.nodes)


# ---------------------------------------------------------------------- 2. KIP-101 scenario 2
def _divergent_tails(c):
    """A leads and commits `c`; cut off from B and C, it appends x1, x2 with acks=1 and stops. B
    and C elect a leader N, which writes its leader change record and y with acks=all: where A
    holds x1, x2, N holds its control record and y (or, after a re-election among B and C,
    another control record), so the two logs differ at offsets both hold.
    Returns (A, N, offsets, A's batches); the batches but the last two are the common history."""
    c.start_all(ISOLATED_LEADER_MS)
    leader_of(c.nodes)
    oc = commit_everywhere(c, b"c")
    a, common = settle(c.nodes)
    others = [i for i in range(3) if i != a]
    client = c.client(a, timeout=5)
    c.isolate(a)
    ox = [produce(client, b"x1", 1), produce(client, b"x2", 1)]
    assert ox[0] > oc and ox[1] == ox[0] + 1
    a_batches = batches(c.nodes[a])
    assert a_batches[:len(common)] == common and len(a_batches) == len(common) + 2
    c.stop(a)
    c.heal_all()

    n = leader_of(c.nodes)            # B and C elect one of them
    oy = produce(c.client(*others), b"y", "all")
    assert oy >= ox[1]                # N's leader change record comes first, at ox[0]
    wait_for(lambda: all(by_offset(c.nodes[i]).get(oy) == b"y" for i in others), what="y on B and C")
    return a, n, {"c": oc, "x": ox, "y": oy}, a_batches


def test_kip101_scenario2_same_offset_different_records_converge(make_cluster):
    c = make_cluster()
    a, n, off, a_batches = _divergent_tails(c)
    n_batches = batches(c.nodes[n])
    a_at = {base: rest for base, *rest in a_batches}
    n_at = {base: rest for base, *rest in n_batches}
    for o in off["x"]:   # the same offsets hold different batches, of different epochs
        assert o in n_at and a_at[o] != n_at[o] and a_at[o][1] < n_at[o][1], (a_batches, n_batches)
    assert n_batches[:len(a_batches) - 2] == a_batches[:-2]   # after the same history

    c.start(a)   # A rejoins
    wait_converged(c.nodes)
    # N's history is kept whole (a later election may follow it: A's return can depose N).
    assert batches(c.nodes[a])[:len(n_batches)] == n_batches
    for i, node in c.nodes.items():
        assert values(node) == [b"c", b"y"], i
        assert by_offset(node) == {off["c"]: b"c", off["y"]: b"y"}, i
    # The set accepts more committed writes, and A takes them too.
    commit_everywhere(c, b"z")
    wait_converged(c.nodes)
    assert values(c.nodes[a]) == [b"c", b"y", b"z"]
    assert_epochs_agree(c.nodes)


def test_a_restarted_replica_does_not_report_its_uncommitted_tail_as_committed(make_cluster):
    """A, cut off, holds x1 and x2 uncommitted and restarts. Its high watermark must come back as
    it was (Kafka's replication-offset-checkpoint), not as its log end: a replica that took its
    whole log for committed would report, and serve to follower reads, records that the next
    leader truncates. (The replica used to do exactly that: its committed offset was the
    reopened log's high watermark, which is the log end offset when none is set.)"""
    c = make_cluster()
    c.start_all(ISOLATED_LEADER_MS)
    leader_of(c.nodes)
    commit_everywhere(c, b"c")
    a, _ = settle(c.nodes)
    client = c.client(a, timeout=5)
    c.isolate(a)
    ox = [produce(client, b"x1", 1), produce(client, b"x2", 1)]
    # A knows that x1 and x2 are not committed: its high watermark is below them.
    committed = c.nodes[a].describe()[KEY]["high_watermark"]
    assert committed <= ox[0]
    c.stop(a)
    node = c.start(a)   # still cut off: it can neither be elected nor learn a high watermark
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        hw = node.describe()[KEY]["high_watermark"]
        assert hw <= committed, f"restarted replica reports high watermark {hw}, {committed} before (x1, x2 at {ox})"
        # What a follower read serves: committed records only.
        assert [r.value for r in node.read(TOPIC, PART, 0)] == [b"c"]
        time.sleep(0.1)
    c.heal_all()                     # A rejoins B and C, which elected a leader meanwhile
    wait_converged(c.nodes)
    for i, n in c.nodes.items():
        assert values(n) == [b"c"] and [r.value for r in n.read(TOPIC, PART, 0)] == [b"c"], i


# ---------------------------------------------------------------------- 3. KIP-279
def test_kip279_history_changed_twice_while_follower_was_down(make_cluster):
    """A leads, commits c, takes x1, x2 alone (acks=1) and stops. B and C elect N1 (y), then N1
    restarts and a second election among B and C writes y2 in a later epoch: the leader's history
    has changed twice past A's last epoch. A must converge to it exactly."""
    c = make_cluster()
    a, n1, off, _ = _divergent_tails(c)
    first_epochs = epochs(c.nodes[n1])
    c.stop(n1)
    c.start(n1)
    leader_of(c.nodes)
    oy2 = commit_everywhere(c, b"y2")
    wait_converged(c.nodes)
    assert len(epochs(c.nodes[n1])) >= len(first_epochs) + 1   # a third epoch (at least)

    c.start(a)
    wait_converged(c.nodes)
    for i, node in c.nodes.items():
        assert values(node) == [b"c", b"y", b"y2"], i
        assert by_offset(node) == {off["c"]: b"c", off["y"]: b"y", oy2: b"y2"}, i
    assert_epochs_agree(c.nodes)


def test_kip279_follower_diverging_across_several_epochs_converges(make_cluster):
    """X, Y, L (roles fixed at run time). L leads epoch e1 and commits c; then, every link cut,
    L appends a2, a3 alone (acks=1, uncommitted) and everyone stops. X and Y come back without L,
    with Y's link to X cut: Y grants X its votes (X -> Y works) but can never fetch, so X leads
    epoch after epoch (it steps down each time it has not heard from Y for two election
    timeouts) writing only to its own log: its leader change records and b, at the offsets where
    L holds a2, a3. Then L and Y elect L (Y saw every epoch of X, so L's epoch is above all of
    them): L's history is e1 up to a3, then its new epoch. When X rejoins, its last epoch is
    unknown to L, which answers (e1, end of a3); X must end with exactly L's log.

    A follower that truncates only to min(answered end offset, own log end) -- one round, as the
    code did before KIP-279's rule was added -- keeps its records of X's first epochs below that
    offset and is answered the same again forever: it never converges."""
    c = make_cluster()
    c.start_all(ISOLATED_LEADER_MS)
    leader_of(c.nodes)
    oc = commit_everywhere(c, b"c")
    lead, common = settle(c.nodes)
    x, y = [i for i in range(3) if i != lead]
    client = c.client(lead, timeout=5)
    e1 = log(c.nodes[lead]).latest_epoch
    history = epochs(c.nodes[lead])
    end = leo(c.nodes[lead])
    for i in range(3):               # nobody hears anybody: no election can succeed
        c.isolate(i)
    oa = [produce(client, b"a2", 1), produce(client, b"a3", 1)]
    assert oa == [end, end + 1]
    c.stop(x, y, lead)
    c.heal_all()

    # X and Y without L; Y -> X is cut. Y's long election timeout keeps it from campaigning.
    c.cut(y, x)
    c.start(y, election_timeout_ms=60_000)
    c.start(x)
    wait_for(lambda: role(c.nodes[x]) == "leader", what="X elected by Y's vote")
    assert produce(c.client(x, timeout=15), b"b", 1) > oa[0]
    # X's tail spans at least two epochs L never had (one per election it won).
    wait_for(lambda: len([e for e, _ in epochs(c.nodes[x]) if e > e1]) >= 2, what="X's second epoch")
    x_tail = [(e, o) for e, o in epochs(c.nodes[x]) if e > e1]
    assert x_tail[0][1] == oa[0] and all(elected_leader_at(c.nodes[x], o) == x for _, o in x_tail)
    x_path = log(c.nodes[x]).path
    c.stop(x)
    assert batches(c.nodes[y]) == common and epochs(c.nodes[y]) == history   # Y never fetched from X
    c.stop(y)
    c.heal_all()
    x_epochs = [e for e, _ in LeaderEpochCache(x_path).entries]

    # L and Y: Y's log is behind L's, so only L can win, in an epoch above every one of X's.
    c.start(lead)
    c.start(y)
    leader_of(c.nodes)
    od = commit_everywhere(c, b"d")
    wait_converged(c.nodes)
    l_epochs = epochs(c.nodes[lead])
    assert l_epochs[:len(history)] == history and l_epochs[len(history)][1] == oa[1] + 1
    assert l_epochs[len(history)][0] > max(x_epochs)   # so X's tail epochs are unknown to L
    assert elected_leader_at(c.nodes[lead], oa[1] + 1) == lead

    c.start(x)
    wait_converged(c.nodes)
    for i, node in c.nodes.items():
        assert values(node) == [b"c", b"a2", b"a3", b"d"], i
        assert by_offset(node) == {oc: b"c", oa[0]: b"a2", oa[1]: b"a3", od: b"d"}, i
    assert_epochs_agree(c.nodes)


# ---------------------------------------------------------------------- 4. leader-epoch-checkpoint
def test_leader_epoch_checkpoints_agree_on_disk_and_after_restart(make_cluster):
    """After the KIP-101 scenario 2 history and one more failover, every replica's leader epoch
    cache agrees with the leader's; its leader-epoch-checkpoint file, read back after a full
    stop, holds that history and exactly the epochs stamped in its own batches; after a restart
    of all three the caches still agree and the set still commits."""
    c = make_cluster()
    a, n, _, _ = _divergent_tails(c)
    c.start(a)
    wait_converged(c.nodes)
    c.stop(n)                        # a second failover: A or the third node leads now
    leader_of(c.nodes)
    commit_everywhere(c, b"w")
    c.start(n)
    wait_converged(c.nodes)
    expected = assert_epochs_agree(c.nodes)
    assert len(expected) >= 3
    expected_batches = batches(c.nodes[leader_of(c.nodes)])

    ids = sorted(c.nodes)
    paths = {i: log(c.nodes[i]).path for i in ids}
    c.stop(*ids)
    # Stopping one node after another may let the last two elect once more, so each file is
    # compared with the converged history (a prefix) and with its own log's batches.
    for i in ids:
        on_disk = LeaderEpochCache(paths[i]).entries
        assert on_disk[:len(expected)] == expected, (i, on_disk, expected)
        with Log.open(paths[i]) as lg:
            assert batches(lg)[:len(expected_batches)] == expected_batches, i
            assert on_disk == batches_from_epochs_of(lg), (i, on_disk, batches(lg))

    c.start_all()
    leader = leader_of(c.nodes)
    commit_everywhere(c, b"v")
    wait_converged(c.nodes)
    for i in ids:   # the history before the restart is kept as it was (a new epoch may follow it)
        assert batches(c.nodes[i])[:len(expected_batches)] == expected_batches, i
        assert epochs(c.nodes[i])[:len(expected)] == expected, i
    assert values(c.nodes[leader]) == [b"c", b"y", b"w", b"v"]
    assert_epochs_agree(c.nodes)
