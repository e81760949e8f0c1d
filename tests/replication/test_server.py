"""The node as a server: client fetches (committed records only), follower reads, connection and
idle limits, and mutual TLS."""

from __future__ import annotations

import shutil
import socket
import subprocess

import pytest

from logstore import OffsetOutOfRangeError
from logstore.kafka.client import KafkaClientError
from logstore.replication import Client, NotLeaderError, ReplicaNode, TLSConfig
from logstore.replica.client import BEGIN_QUORUM_EPOCH, FETCH, PRODUCE, VERSIONS, VOTE, NodeConnection

from .test_inprocess import SECRET, cluster, free_ports, leader_of, wait_for


def stop_all(nodes):
    for n in nodes.values():
        if not n._stop.is_set():
            n.stop()


def served_connections(node):
    """The connections the node's listener serves now (handshaking ones included)."""
    return next(v for k, v in node.metrics().items() if k.startswith("kafka.server:type=socket-server-metrics,")
                and k.endswith(",name=connection-count"))


def kafka_frame(api_key, fields, correlation_id=1, version=None):
    """One framed request (size, header, body)."""
    from kio.index import load_request_schema

    from logstore.kafka.writer import write_request

    version = VERSIONS[api_key] if version is None else version
    return write_request(correlation_id, load_request_schema(api_key, version), "test", fields)


def produce_fields(topic, records, partition=0, acks=1):
    return {"transactional_id": None, "acks": acks, "timeout": 1000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}]}


def replica_fetch_fields(replica_id, epoch, offset=0, last_epoch=-1, topic="replicated"):
    return {"replica_id": replica_id, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "current_leader_epoch": epoch, "fetch_offset": offset,
                 "last_fetched_epoch": last_epoch, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]}


def vote_fields(epoch, candidate, last_epoch, last_offset, pre_vote=False, cluster_id=None):
    return {"cluster_id": cluster_id, "voter_id": -1, "topics": [{"topic_name": "replicated", "partitions": [
        {"partition_index": 0, "replica_epoch": epoch, "replica_id": candidate, "replica_directory_id": None,
         "voter_directory_id": None, "last_offset_epoch": last_epoch, "last_offset": last_offset,
         "pre_vote": pre_vote}]}]}


def begin_epoch_fields(epoch, leader):
    return {"cluster_id": None, "voter_id": -1, "leader_endpoints": [], "topics": [
        {"topic_name": "replicated", "partitions": [{"partition_index": 0, "voter_directory_id": None,
                                                     "leader_id": leader, "leader_epoch": epoch}]}]}


def single(tmp_path, **kw):
    (port,) = free_ports(1)
    node = ReplicaNode(0, str(tmp_path / "solo"), ("127.0.0.1", port), {}, SECRET, election_timeout_ms=100,
                       min_insync_replicas=1, **kw).start()
    wait_for(lambda: node.describe()[("replicated", 0)]["role"] == "leader")
    return node


# ---------------------------------------------------------------------- fetch and read
def test_fetch_returns_committed_records_and_passes_control_batches(tmp_path):
    nodes, addrs = cluster(tmp_path)
    client = Client(list(addrs.values()), SECRET)
    try:
        leader_of(nodes)
        offsets = client.produce("replicated", 0, [b"a", b"b"], keys=[b"k", None], acks="all")
        offsets += client.produce("replicated", 0, [b"c"], acks="all")
        got = client.fetch("replicated", 0, 0)
        # Offset 0 is the leader's control record: skipped, but next_offset passes it.
        assert [(r.offset, r.key, r.value) for r in got.records] == [(offsets[0], b"k", b"a"),
                                                                   (offsets[1], None, b"b"), (offsets[2], None, b"c")]
        assert got.next_offset == offsets[2] + 1 == got.high_watermark
        empty = client.fetch("replicated", 0, got.next_offset)
        assert empty.records == [] and empty.next_offset == got.next_offset
        # From the middle of a batch: only the records at or after the offset.
        assert [r.value for r in client.fetch("replicated", 0, offsets[1]).records] == [b"b", b"c"]
        with pytest.raises(OffsetOutOfRangeError):
            client.fetch("replicated", 0, got.high_watermark + 1)
        with pytest.raises(ValueError):
            client.fetch("replicated", 0, 0, max_bytes=0)
    finally:
        client.close()
        stop_all(nodes)


def test_fetch_and_follower_reads_never_show_uncommitted_records(tmp_path):
    nodes, addrs = cluster(tmp_path, election_timeout_ms=1500, min_insync_replicas=1)
    try:
        first = leader_of(nodes)
        client = Client([addrs[first]], SECRET, timeout=2)
        (committed,) = client.produce("replicated", 0, [b"committed"], acks="all")
        followers = [i for i in nodes if i != first]
        wait_for(lambda: all(nodes[i].read("replicated", 0, 0) != [] for i in followers))
        assert [r.value for r in nodes[followers[0]].read("replicated", 0, 0)] == [b"committed"]
        for i in followers:
            nodes[i].stop()
        (uncommitted,) = client.produce("replicated", 0, [b"uncommitted"], acks=1)
        # On the leader's log the record exists, but no reader sees it: it is not committed.
        leader_log = nodes[first].store.partition("replicated", 0)
        assert leader_log.log_end_offset == uncommitted + 1
        assert [r.value for r in client.fetch("replicated", 0, 0).records] == [b"committed"]
        assert [r.value for r in nodes[first].read("replicated", 0, 0)] == [b"committed"]
        with pytest.raises(OffsetOutOfRangeError):
            nodes[first].read("replicated", 0, uncommitted + 1)
        client.close()
    finally:
        stop_all(nodes)


def test_a_follower_refuses_client_requests_and_the_client_follows_the_leader(tmp_path):
    from logstore import replication

    nodes, addrs = cluster(tmp_path)
    try:
        first = leader_of(nodes)
        writer = Client([addrs[first]], SECRET)
        (offset,) = writer.produce("replicated", 0, [b"x"], acks="all")
        writer.close()
        follower = next(i for i in nodes if i != first)
        wait_for(lambda: nodes[follower].describe()[("replicated", 0)]["leader"] == first)
        # The follower answers a consumer's fetch "not the leader or follower"...
        conn = NodeConnection(addrs[follower], SECRET, -1, 5.0)
        answer = conn.request(FETCH, replica_fetch_fields(-1, -1))
        assert answer.responses[0].partitions[0].error_code == replication.NOT_LEADER
        conn.close()
        # ...and a client that knows only the follower goes to the leader it names.
        client = Client([addrs[follower]], SECRET)
        assert [(r.offset, r.value) for r in client.fetch("replicated", 0, 0).records] == [(offset, b"x")]
        (second,) = client.produce("replicated", 0, [b"y"], acks="all")
        assert second > offset
        assert client._leaders[("replicated", 0)] == first and client._nodes[first] == addrs[first]
        client.close()
        # A client whose only node is down names no leader when it gives up.
        nodes[follower].stop()
        lost = Client([addrs[follower]], SECRET, timeout=0.3)
        with pytest.raises(NotLeaderError):
            lost.fetch("replicated", 0, 0)
        lost.close()
    finally:
        stop_all(nodes)


# ---------------------------------------------------------------------- limits
def test_connections_over_the_limit_are_closed_at_once(tmp_path):
    node = single(tmp_path, max_connections=2)
    try:
        a, b = Client([node.address], SECRET), Client([node.address], SECRET)
        assert a.metadata() and b.metadata()
        wait_for(lambda: served_connections(node) == 2)
        third = Client([node.address], SECRET, timeout=2)
        with pytest.raises(Exception):  # the server closes it before the handshake
            third.produce("replicated", 0, [b"x"], acks=1, timeout=0.5)
        third.close()
        a.close()
        wait_for(lambda: served_connections(node) == 1)
        c = Client([node.address], SECRET)
        assert c.produce("replicated", 0, [b"y"], acks=1) != []
        b.close()
        c.close()
    finally:
        node.stop()


def test_idle_connections_are_closed_and_clients_reconnect(tmp_path):
    node = single(tmp_path, connections_max_idle_ms=200)
    try:
        client = Client([node.address], SECRET)
        client.produce("replicated", 0, [b"one"], acks=1)
        wait_for(lambda: served_connections(node) == 1)
        wait_for(lambda: served_connections(node) == 0, timeout=5)  # closed for idling
        # The client notices the closed connection and reconnects once, transparently.
        client.produce("replicated", 0, [b"two"], acks=1)
        assert [r.value for r in client.fetch("replicated", 0, 0).records] == [b"one", b"two"]
        client.close()
    finally:
        node.stop()


def test_a_silent_connection_is_dropped_after_the_handshake_timeout(tmp_path):
    node = single(tmp_path, handshake_timeout_ms=200)
    try:
        s = socket.create_connection(node.address)
        s.settimeout(5)
        assert s.recv(1) == b""  # nothing sent: the server hangs up
        s.close()
    finally:
        node.stop()


@pytest.mark.parametrize("kw", [dict(max_connections=0), dict(connections_max_idle_ms=0),
                                dict(handshake_timeout_ms=-1)])
def test_bad_limits_are_refused(tmp_path, kw):
    with pytest.raises(ValueError):
        ReplicaNode(0, str(tmp_path / "bad"), ("127.0.0.1", 0), {}, SECRET, **kw)


# ---------------------------------------------------------------------- TLS
def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(directory, name):
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", cwd=directory)


def _leaf(directory, name, ca):
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", cwd=directory)
    return TLSConfig(str(directory / f"{name}.pem"), str(directory / f"{name}.key"), str(directory / f"{ca}.pem"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "other-ca")
    return dict(node=_leaf(d, "node", "ca"), client=_leaf(d, "client", "ca"),
                stranger=_leaf(d, "stranger", "other-ca"),
                no_cert=TLSConfig(str(d / "client.pem"), str(d / "client.key"), str(d / "ca.pem")), dir=d)


def test_replica_set_over_mutual_tls(tmp_path, pki):
    nodes, addrs = cluster(tmp_path, tls=pki["node"])
    try:
        leader_of(nodes)
        client = Client(list(addrs.values()), SECRET, tls=pki["client"])
        offsets = client.produce("replicated", 0, [b"over", b"tls"], acks="all")
        assert [r.value for r in client.fetch("replicated", 0, offsets[0]).records] == [b"over", b"tls"]
        # Every replica received the batch through TLS connections.
        wait_for(lambda: all([r.value for r in n.read("replicated", 0, 0)] == [b"over", b"tls"] for n in nodes.values()))
        client.close()
    finally:
        stop_all(nodes)


def test_tls_refuses_plain_clients_and_certificates_of_another_ca(tmp_path, pki):
    node = single(tmp_path, tls=pki["node"])
    try:
        plain = Client([node.address], SECRET, timeout=2)
        with pytest.raises(NotLeaderError):  # every attempt fails: the server wants TLS first
            plain.produce("replicated", 0, [b"x"], acks=1, timeout=0.5)
        plain.close()
        stranger = Client([node.address], SECRET, timeout=2, tls=pki["stranger"])
        with pytest.raises(NotLeaderError):
            stranger.produce("replicated", 0, [b"x"], acks=1, timeout=0.5)
        stranger.close()
        # A TLS client without a certificate: the server requires one.
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.load_verify_locations(str(pki["dir"] / "ca.pem"))
        with socket.create_connection(node.address, timeout=5) as raw:
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                with ctx.wrap_socket(raw) as tls_sock:
                    tls_sock.sendall(b"\0" * 16)
                    if tls_sock.recv(1) == b"":  # TLS 1.3 reports the refusal on first read
                        raise ConnectionError("closed")
        assert node.store.partition("replicated", 0).log_end_offset == 1  # only the control record
        good = Client([node.address], SECRET, tls=pki["client"])
        assert good.produce("replicated", 0, [b"ok"], acks=1) == [1]
        good.close()
    finally:
        node.stop()


def test_tls_with_a_wrong_secret_still_fails_the_login(tmp_path, pki):
    node = single(tmp_path, tls=pki["node"])
    try:
        with pytest.raises(KafkaClientError, match="authentication"):
            NodeConnection(node.address, b"wrong", -1, 2.0, pki["client"].client_context())
    finally:
        node.stop()


def test_unreadable_tls_files_are_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="TLS configuration"):
        TLSConfig(str(tmp_path / "missing.pem"), str(tmp_path / "missing.key"), str(tmp_path / "ca.pem")).client_context()


# ---------------------------------------------------------------------- hostile peers
def hung_up(sock):
    """True when the peer closed the connection (an orderly close, or a reset because it left
    our bytes unread)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True

def _raw_produce(address, records, topic="replicated", secret=SECRET):
    conn = NodeConnection(address, secret, -1, 5.0)
    try:
        return conn.request(PRODUCE, produce_fields(topic, records)).responses[0].partition_responses[0].error_code
    finally:
        conn.close()


def test_corrupt_or_forbidden_produced_batches_are_refused_and_change_nothing(tmp_path):
    from logstore import replication
    from logstore.records.batch import BatchBuilder

    node = single(tmp_path)
    try:
        log = node.store.partition("replicated", 0)
        end = log.log_end_offset
        good = bytes(BatchBuilder().build([b"a"]))
        bad_crc = bytearray(good)
        bad_crc[-1] ^= 1
        assert _raw_produce(node.address, bytes(bad_crc)) == replication.CORRUPT_BATCH
        control = bytes(BatchBuilder().build([b"c"], [b"k"], control=True))
        assert _raw_produce(node.address, control) == replication.INVALID_RECORD
        assert _raw_produce(node.address, good, topic="nope") == replication.UNKNOWN_PARTITION
        assert log.log_end_offset == end
        assert _raw_produce(node.address, good) == replication.OK
        assert log.log_end_offset == end + 1
    finally:
        node.stop()


def test_unauthenticated_and_wrong_secret_peers_are_refused_and_change_nothing(tmp_path):
    from logstore.records.batch import BatchBuilder

    node = single(tmp_path)
    try:
        log = node.store.partition("replicated", 0)
        end, epoch = log.log_end_offset, node.describe()[("replicated", 0)]["epoch"]
        batch = bytes(BatchBuilder().build([b"x"]))
        with pytest.raises(KafkaClientError, match="authentication"):
            _raw_produce(node.address, batch, secret=b"not the secret")
        # Skipping the login: before it only ApiVersions and the SASL requests are read; anything
        # else ends the connection unanswered.
        for frame in (kafka_frame(PRODUCE, produce_fields("replicated", batch)),
                      kafka_frame(VOTE, vote_fields(epoch + 5, 7, 99, 10**9))):
            with socket.create_connection(node.address, timeout=5) as s:
                s.sendall(frame)
                assert hung_up(s)
        assert log.log_end_offset == end
        assert node.describe()[("replicated", 0)]["epoch"] == epoch
        assert node.describe()[("replicated", 0)]["role"] == "leader"
    finally:
        node.stop()


def test_kafka_clients_users_may_not_send_replication_requests(tmp_path):
    from logstore.kafka.client import Security, Connection

    node = single(tmp_path, kafka_options={"sasl_credentials": {"alice": "alice-secret"}})
    try:
        epoch = node.describe()[("replicated", 0)]["epoch"]
        alice = Connection(*node.address, 5.0, "alice", Security("SASL_PLAINTEXT", "SCRAM-SHA-256", "alice",
                                                                  "alice-secret"))
        try:
            # A Kafka client's user may produce...
            from logstore.records.batch import BatchBuilder
            answer = alice.request(PRODUCE, produce_fields("replicated", bytes(BatchBuilder().build([b"a"]))))
            assert answer.responses[0].partition_responses[0].error_code == 0
            # ...but not vote, announce an epoch or fetch as a replica (CLUSTER_AUTHORIZATION_FAILED).
            assert alice.request(VOTE, vote_fields(epoch + 5, 1, 99, 10**9), VERSIONS[VOTE]).error_code == 31
            assert alice.request(BEGIN_QUORUM_EPOCH, begin_epoch_fields(epoch + 5, 1),
                                 VERSIONS[BEGIN_QUORUM_EPOCH]).error_code == 31
            assert alice.request(FETCH, replica_fetch_fields(1, epoch), VERSIONS[FETCH]).error_code == 31
        finally:
            alice.close()
        d = node.describe()[("replicated", 0)]
        assert (d["role"], d["epoch"]) == ("leader", epoch)
        with pytest.raises(ValueError, match="replica"):
            ReplicaNode(1, str(tmp_path / "other"), ("127.0.0.1", 0), {}, SECRET,
                        kafka_options={"sasl_credentials": {"replica": "mine"}})
    finally:
        node.stop()


def test_a_request_naming_another_cluster_is_refused(tmp_path):
    node = single(tmp_path)
    conn = NodeConnection(node.address, SECRET, -1, 5.0)
    try:
        epoch = node.describe()[("replicated", 0)]["epoch"]
        assert conn.request(VOTE, vote_fields(epoch + 5, 1, 99, 10**9, cluster_id="another")).error_code == 104
        assert node.describe()[("replicated", 0)]["epoch"] == epoch
    finally:
        conn.close()
        node.stop()


@pytest.mark.parametrize("length", [2**31 - 1, -1, -(2**31), 65 * 1024])
def test_bogus_length_prefixes_before_authentication_close_the_connection_without_allocating(tmp_path, length):
    import resource
    import struct

    node = single(tmp_path)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with socket.create_connection(node.address, timeout=5) as s:
            s.sendall(struct.pack(">i", length) + b"\0" * 8)
            assert hung_up(s)
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert grown_kib < 64 * 1024, f"the node grew by {grown_kib} KiB"
        assert Client([node.address], SECRET).metadata()  # still serving
    finally:
        node.stop()


def test_huge_lengths_and_counts_inside_an_authenticated_frame_are_rejected(tmp_path):
    import resource
    import struct

    node = single(tmp_path)
    try:
        end = node.store.partition("replicated", 0).log_end_offset
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # A records field claiming 2^31-1 bytes inside a small frame.
        frame = bytearray(kafka_frame(PRODUCE, produce_fields("replicated", b"\0" * 16)))
        at = bytes(frame).index(struct.pack(">i", 16) + b"\0" * 16)
        frame[at:at + 4] = struct.pack(">i", 2**31 - 1)
        conn = NodeConnection(node.address, SECRET, -1, 5.0)
        conn.conn.sock.sendall(bytes(frame))
        assert hung_up(conn.conn.sock)
        conn.close()
        # A frame larger than the node's limit after authentication.
        conn = NodeConnection(node.address, SECRET, -1, 5.0)
        conn.conn.sock.sendall(struct.pack(">ihhi", 2**31 - 1, PRODUCE, 8, 1))
        assert hung_up(conn.conn.sock)
        conn.close()
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert grown_kib < 64 * 1024, f"the node grew by {grown_kib} KiB"
        assert node.store.partition("replicated", 0).log_end_offset == end
        assert Client([node.address], SECRET).produce("replicated", 0, [b"fine"], acks=1) == [end]
    finally:
        node.stop()


def test_requests_from_a_stale_epoch_are_fenced(tmp_path):
    from logstore import replication

    nodes, addrs = cluster(tmp_path)
    try:
        leader = leader_of(nodes)
        client = Client([addrs[leader]], SECRET)
        client.produce("replicated", 0, [b"x"], acks="all")
        client.close()
        epoch = nodes[leader].describe()[("replicated", 0)]["epoch"]
        end = nodes[leader].store.partition("replicated", 0).log_end_offset
        conn = NodeConnection(addrs[leader], SECRET, 9, 5.0)
        try:
            # A fetch from a replica still in an older epoch is fenced, not served. (The replica
            # must be a voter other than the leader: the leader refuses its own id.)
            follower = next(i for i in nodes if i != leader)
            answer = conn.request(FETCH, replica_fetch_fields(follower, epoch - 1))
            p = answer.responses[0].partitions[0]
            assert p.error_code == replication.FENCED_EPOCH
            assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (leader, epoch)
            # A vote request of an older epoch is not granted and changes nothing.
            p = conn.request(VOTE, vote_fields(epoch - 1, follower, epoch - 1, 10**6)).topics[0].partitions[0]
            assert (p.leader_epoch, p.vote_granted) == (epoch, False)
            # A stale BeginQuorumEpoch naming another leader is ignored.
            conn.request(BEGIN_QUORUM_EPOCH, begin_epoch_fields(epoch - 1, follower))
        finally:
            conn.close()
        d = nodes[leader].describe()[("replicated", 0)]
        assert (d["role"], d["epoch"], d["log_end_offset"]) == ("leader", epoch, end)
    finally:
        stop_all(nodes)


def test_acks_all_needs_min_insync_replicas_in_sync(tmp_path):
    from logstore.replication import NotEnoughReplicasError

    nodes, addrs = cluster(tmp_path, min_insync_replicas=3, replica_lag_time_max_ms=500)
    restarted = {}
    try:
        leader = leader_of(nodes)
        client = Client([addrs[leader]], SECRET)
        client.produce("replicated", 0, [b"all three"], acks="all")
        assert sorted(nodes[leader].describe()[("replicated", 0)]["in_sync"]) == [0, 1, 2]
        gone = next(i for i in nodes if i != leader)
        nodes[gone].stop()
        client.produce("replicated", 0, [b"moves the end"], acks=1)  # the stopped one falls behind
        wait_for(lambda: gone not in nodes[leader].describe()[("replicated", 0)]["in_sync"])
        end = nodes[leader].store.partition("replicated", 0).log_end_offset
        with pytest.raises(NotEnoughReplicasError):
            client.produce("replicated", 0, [b"refused"], acks="all")
        assert nodes[leader].store.partition("replicated", 0).log_end_offset == end  # nothing written
        assert client.produce("replicated", 0, [b"acks=1 still works"], acks=1) == [end]
        peers = {j: a for j, a in addrs.items() if j != gone}
        restarted[gone] = ReplicaNode(gone, str(tmp_path / f"node{gone}"), addrs[gone], peers, SECRET,
                                      election_timeout_ms=300, min_insync_replicas=3,
                                      replica_lag_time_max_ms=500).start()
        wait_for(lambda: gone in nodes[leader].describe()[("replicated", 0)]["in_sync"])
        (offset,) = client.produce("replicated", 0, [b"back to three"], acks="all")
        assert offset == end + 1
        client.close()
    finally:
        stop_all(nodes)
        stop_all(restarted)


def test_acks_all_not_confirmed_in_time_is_a_timeout_not_a_leader_change(tmp_path):
    from logstore.replication import ReplicationTimeoutError

    nodes, addrs = cluster(tmp_path, election_timeout_ms=1500, min_insync_replicas=1)
    try:
        leader = leader_of(nodes)
        client = Client([addrs[leader]], SECRET, timeout=5)
        client.produce("replicated", 0, [b"committed"], acks="all")
        for i in nodes:
            if i != leader:
                nodes[i].stop()
        with pytest.raises(ReplicationTimeoutError, match="timed out"):
            client.produce("replicated", 0, [b"unconfirmed"], acks="all", timeout=0.5)
        client.close()
    finally:
        stop_all(nodes)


def test_pre_vote_keeps_an_impatient_follower_from_deposing_a_live_leader(tmp_path):
    import time

    nodes, addrs = cluster(tmp_path)
    try:
        leader = leader_of(nodes)
        client = Client([addrs[leader]], SECRET)
        client.produce("replicated", 0, [b"x"], acks="all")
        epoch = nodes[leader].describe()[("replicated", 0)]["epoch"]
        impatient = next(i for i in nodes if i != leader)
        rep = nodes[impatient]._replicas[("replicated", 0)]
        # Make its election timer fire over and over, as if it had stopped hearing the leader.
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            with rep.cond:
                rep.deadline = 0.0
            time.sleep(0.05)
        # Its pre-votes were refused (the others hear from the leader): no election happened.
        for n in nodes.values():
            d = n.describe()[("replicated", 0)]
            assert (d["epoch"], d["leader"]) == (epoch, leader), d
        assert client.produce("replicated", 0, [b"y"], acks="all")
        client.close()
    finally:
        stop_all(nodes)
