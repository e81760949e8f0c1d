"""A replica set served to Kafka clients: every node's listener speaks Kafka's protocol to
clients and peers alike (SASL: clients log in as the replica user here), Metadata names the elected leaders, produce and fetch go to them, acks=all
means held by a majority, consumers see committed records only, and an idempotent producer's
retries after a failover are not appended twice. The clients (kafka-python's protocol structs,
confluent-kafka) are independent implementations of the protocol."""

from __future__ import annotations

import socket
import struct
import time

import pytest
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.old.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.old.produce import ProduceRequest, ProduceResponse
from kafka.net.sasl.scram import ScramClient
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, \
    SaslHandshakeResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from logstore.replication import ReplicaNode

from .kafkanodes import KafkaNodes
from .test_inprocess import SECRET, free_ports, wait_for

confluent_kafka = pytest.importorskip("confluent_kafka")

NONE, LEADER_NOT_AVAILABLE, NOT_LEADER, NOT_ENOUGH_REPLICAS, NOT_CONTROLLER = 0, 5, 6, 19, 41
KEY = ("replicated", 0)


#: librdkafka's and kafka-python's settings to log in as the replica user
CONFLUENT_LOGIN = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                   "sasl.username": "replica", "sasl.password": SECRET.decode()}
KAFKA_PYTHON_LOGIN = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                      "sasl_plain_username": "replica", "sasl_plain_password": SECRET.decode()}


def kafka_cluster(tmp_path, n=3, election_timeout_ms=300, partitions=(("replicated", 1),), **kw):
    ports = free_ports(n)
    addrs = {i: ("127.0.0.1", ports[i]) for i in range(n)}
    nodes = {}
    for i in range(n):
        nodes[i] = ReplicaNode(i, str(tmp_path / f"node{i}"), addrs[i], {j: a for j, a in addrs.items() if j != i},
                               SECRET, election_timeout_ms=election_timeout_ms, partitions=partitions, **kw).start()
    return nodes, addrs


def leader_of(nodes, key=KEY, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders = [i for i, n in nodes.items() if not n._stop.is_set() and n.describe()[key]["role"] == "leader"]
        if len(leaders) == 1:
            return leaders[0]
        time.sleep(0.05)
    raise AssertionError("no single leader elected")


def stop_all(nodes):
    for n in nodes.values():
        if not n._stop.is_set():
            n.stop()


class Conn:
    """kafka-python's protocol structs over a socket, logged in with SCRAM (kafka-python's)."""

    def __init__(self, address, user="replica", password=SECRET.decode()):
        self.sock = socket.create_connection(address, timeout=20)
        self.correlation = 0
        if user is not None:
            self.login(user, password)

    def login(self, user, password):
        answer = self.call(SaslHandshakeRequest(mechanism="SCRAM-SHA-256", version=1), SaslHandshakeResponse)
        assert answer.error_code == 0, answer
        scram = ScramClient(user, password, "SCRAM-SHA-256")
        first = self.call(SaslAuthenticateRequest(auth_bytes=scram.first_message(), version=1), SaslAuthenticateResponse)
        assert first.error_code == 0, first
        scram.process_server_first_message(first.auth_bytes)
        final = self.call(SaslAuthenticateRequest(auth_bytes=scram.final_message(), version=1), SaslAuthenticateResponse)
        assert final.error_code == 0, final

    def call(self, request, response_cls):
        self.correlation += 1
        request.with_header(self.correlation, "listener-test")
        self.sock.sendall(request.encode(header=True, framed=True))
        (size,) = struct.unpack(">i", self._exactly(4))
        data = self._exactly(size)
        version = getattr(request, "version", None)  # kafka-python's newer structs carry it per instance
        answer = response_cls.decode(data, header=True) if version is None else \
            response_cls.decode(data, version=version, header=True)
        assert answer.header.correlation_id == self.correlation
        return answer

    def _exactly(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def close(self):
        self.sock.close()


def batch(values, producer_id=-1, epoch=-1, sequence=-1):
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
                                        producer_epoch=epoch, base_sequence=sequence, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
    return bytes(builder.build())


def produce(conn, records, acks=-1, timeout_ms=5000):
    answer = conn.call(ProduceRequest[3](None, acks, timeout_ms, [("replicated", [(0, records)])]),
                       ProduceResponse[3])
    (_, [(partition, error, base, *_)]), = answer.topics
    return error, base


def test_metadata_names_every_node_and_the_elected_leader(tmp_path):
    nodes, kafka = kafka_cluster(tmp_path)
    try:
        leader = leader_of(nodes)
        wait_for(lambda: all(n.describe()[KEY]["leader"] == leader for n in nodes.values()))
        for i in nodes:
            conn = Conn(kafka[i])
            answer = conn.call(MetadataRequest[8](None, False, False, False), MetadataResponse[8])
            conn.close()
            assert sorted((b[0], b[1], b[2]) for b in answer.brokers) == sorted(
                (j, host, port) for j, (host, port) in kafka.items())
            topics = {t[1]: t for t in answer.topics}
            # groups' offsets and the transactions' state are replicated too
            assert sorted(topics) == ["__consumer_offsets", "__transaction_state", "replicated"]
            assert topics["__consumer_offsets"][2] is True and topics["__transaction_state"][2] is True  # is_internal
            (error, name, internal, partitions, *_) = topics["replicated"]
            assert (error, internal) == (NONE, False)
            (p_error, index, leader_id, epoch, replicas, isr, offline), = partitions
            assert (p_error, index, leader_id, replicas) == (NONE, 0, leader, [0, 1, 2])
            assert epoch == nodes[leader].describe()[KEY]["epoch"]
            if i == leader:
                assert leader in isr
        ids = set()
        for i in nodes:  # producer ids are unique across the set
            from kafka.protocol.old.init_producer_id import InitProducerIdRequest, InitProducerIdResponse
            conn = Conn(kafka[i])
            got = conn.call(InitProducerIdRequest[0](None, 60000), InitProducerIdResponse[0])
            conn.close()
            assert got.error_code == NONE
            ids.add(got.producer_id)
        assert len(ids) == 3
    finally:
        stop_all(nodes)


def _fetch(conn, offset):
    ask = FetchRequest[4](replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                          session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="", topics=[FetchRequest.FetchTopic(topic="replicated", partitions=[
                              FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset,
                                                                      partition_max_bytes=1 << 20)])])
    answer = conn.call(ask, FetchResponse[4])
    (topic,) = answer.responses
    (partition,) = topic.partitions
    return partition


def test_followers_refuse_produce_and_fetch_and_forward_a_topic_creation(tmp_path):
    nodes, kafka = kafka_cluster(tmp_path)
    try:
        leader = leader_of(nodes)
        follower = next(i for i in nodes if i != leader)
        conn = Conn(kafka[follower])
        assert produce(conn, batch([b"x"]))[0] == NOT_LEADER
        assert _fetch(conn, 0).error_code == NOT_LEADER
        T = CreateTopicsRequest.CreatableTopic
        deadline = time.monotonic() + 30
        while True:  # forwarded to the metadata's leader (NOT_CONTROLLER while there is none)
            made = conn.call(CreateTopicsRequest[2](topics=[T(name="new", num_partitions=1, replication_factor=-1,
                                                              assignments=[], configs=[])],
                                                    timeout_ms=5000, validate_only=False), CreateTopicsResponse[2])
            if made.topics[0].error_code != NOT_CONTROLLER or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [t.error_code for t in made.topics] == [NONE]
        wait_for(lambda: ("new", 0) in nodes[follower].describe())
        conn.close()
        conn = Conn(kafka[leader])
        error, base = produce(conn, batch([b"a", b"b"]))
        assert error == NONE and base >= 1  # after the leader's LeaderChange control record
        got = _fetch(conn, base)
        assert got.error_code == NONE and got.high_watermark == base + 2 and got.records
        conn.close()
    finally:
        stop_all(nodes)


def test_list_offsets_carries_the_epoch_caches_leader_epochs(tmp_path):
    """ListOffsets through confluent-kafka's AdminClient carries the epoch cache's leader epochs.
    (CreatePartitions and topic configs on a replica set: test_metadata.py.)"""
    from confluent_kafka.admin import AdminClient

    nodes, kafka = kafka_cluster(tmp_path)
    bootstrap = ",".join(f"{h}:{p}" for h, p in kafka.values())
    try:
        leader = leader_of(nodes)
        conn = Conn(kafka[leader])
        assert produce(conn, batch([b"a", b"b"]))[0] == NONE
        conn.close()
        admin = AdminClient({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap})
        # ListOffsets (v8 here) answers with the leader epoch of the log's epoch cache
        from confluent_kafka.admin import OffsetSpec
        epoch = nodes[leader].describe()[KEY]["epoch"]
        whole = confluent_kafka.TopicPartition("replicated", 0)
        [latest] = admin.list_offsets({whole: OffsetSpec.latest()}).values()
        [earliest] = admin.list_offsets({whole: OffsetSpec.earliest()}).values()
        latest, earliest = latest.result(timeout=20), earliest.result(timeout=20)
        assert (latest.offset, latest.leader_epoch) == (nodes[leader].describe()[KEY]["high_watermark"], epoch)
        first_epoch = nodes[leader].store.partition("replicated", 0).leader_epochs.entries[0][0]
        assert (earliest.offset, earliest.leader_epoch) == (0, first_epoch)  # the epoch that wrote offset 0
    finally:
        stop_all(nodes)


def test_delete_records_moves_every_replicas_log_start_and_survives_a_failover(tmp_path):
    """DeleteRecords through confluent-kafka's AdminClient: the leader answers once every
    follower moved its log start (they learn it from their fetches), so the leader
    elected after the old one stops starts there too; a consumer reads from it."""
    from confluent_kafka.admin import AdminClient, OffsetSpec

    nodes, kafka = kafka_cluster(tmp_path)
    bootstrap = ",".join(f"{h}:{p}" for h, p in kafka.values())
    try:
        first = leader_of(nodes)
        conn = Conn(kafka[first])
        error, base = produce(conn, batch([b"r%d" % i for i in range(10)]))
        conn.close()
        assert error == NONE
        admin = AdminClient({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap})
        target = base + 6
        [deleted] = admin.delete_records([confluent_kafka.TopicPartition("replicated", 0, target)]).values()
        assert deleted.result(timeout=30).low_watermark == target
        # answered: every replica's log already starts there (the followers were in sync)
        assert [n.store.partition("replicated", 0).log_start_offset for n in nodes.values()] == [target] * 3
        # DescribeLogDirs on each node, leader and followers alike, lists the replica it holds
        from kafka.protocol.admin.cluster import DescribeLogDirsRequest, DescribeLogDirsResponse
        T = DescribeLogDirsRequest.DescribableLogDirTopic
        for i, node in nodes.items():
            conn = Conn(kafka[i])
            answer = conn.call(DescribeLogDirsRequest(topics=[T(topic="replicated", partitions=[0])], version=4),
                               DescribeLogDirsResponse)
            conn.close()
            [result] = answer.results
            [topic] = result.topics
            [p] = topic.partitions
            assert (result.log_dir, topic.name, p.partition_size) == \
                (node.store.root, "replicated", node.store.partition("replicated", 0).size_in_bytes)
        nodes[first].stop()
        survivors = {i: n for i, n in nodes.items() if i != first}
        leader_of(survivors)
        admin = AdminClient({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap})
        whole = confluent_kafka.TopicPartition("replicated", 0)
        deadline = time.monotonic() + 30
        while True:  # until the client found the new leader
            [earliest] = admin.list_offsets({whole: OffsetSpec.earliest()}).values()
            try:
                assert earliest.result(timeout=20).offset == target
                break
            except confluent_kafka.KafkaException:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        consumer = confluent_kafka.Consumer({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap, "group.id": "trim",
                                             "enable.auto.commit": False})
        consumer.assign([confluent_kafka.TopicPartition("replicated", 0, confluent_kafka.OFFSET_BEGINNING)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 4 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append((msg.offset(), msg.value()))
        consumer.close()
        assert got == [(base + i, b"r%d" % i) for i in range(6, 10)]
    finally:
        stop_all(nodes)


@pytest.mark.regression
def test_delete_records_is_not_acknowledged_while_a_voter_that_could_lead_next_lacks_the_new_log_start(tmp_path):
    """A follower out of sync (here: down, past replica.lag.time.max.ms) holds a log as long as
    the others, so it can win the next election; a DeleteRecords answered without it could be
    undone by it. The leader answers REQUEST_TIMED_OUT (its own log start moved) until every
    voter has the new start; once the follower is back, DeleteRecords succeeds and every
    replica starts there."""
    from confluent_kafka.admin import AdminClient

    nodes, kafka = kafka_cluster(tmp_path, replica_lag_time_max_ms=300)
    bootstrap = ",".join(f"{h}:{p}" for h, p in kafka.values())
    try:
        leader = leader_of(nodes)
        conn = Conn(kafka[leader])
        error, base = produce(conn, batch([b"r%d" % i for i in range(10)]))
        conn.close()
        assert error == NONE
        follower = next(i for i in nodes if i != leader)
        wait_for(lambda: nodes[follower].store.partition("replicated", 0).log_end_offset ==
                        nodes[leader].store.partition("replicated", 0).log_end_offset)
        nodes[follower].stop()
        wait_for(lambda: follower not in nodes[leader].describe()[KEY]["in_sync"])
        admin = AdminClient({**CONFLUENT_LOGIN, "bootstrap.servers": ",".join(
            f"{h}:{p}" for i, (h, p) in kafka.items() if i != follower)})
        target = base + 6
        [deleted] = admin.delete_records([confluent_kafka.TopicPartition("replicated", 0, target)],
                                         operation_timeout=2, request_timeout=20).values()
        with pytest.raises(confluent_kafka.KafkaException) as refused:
            deleted.result(timeout=30)
        assert refused.value.args[0].code() == confluent_kafka.KafkaError.REQUEST_TIMED_OUT
        nodes[follower] = ReplicaNode(follower, str(tmp_path / f"node{follower}"), kafka[follower],
                                      {j: a for j, a in kafka.items() if j != follower}, SECRET,
                                      election_timeout_ms=300, partitions=(("replicated", 1),),
                                      replica_lag_time_max_ms=300).start()
        admin = AdminClient({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap})
        [deleted] = admin.delete_records([confluent_kafka.TopicPartition("replicated", 0, target)],
                                         operation_timeout=30).values()
        assert deleted.result(timeout=60).low_watermark == target
        assert [n.store.partition("replicated", 0).log_start_offset for n in nodes.values()] == [target] * 3
    finally:
        stop_all(nodes)

def test_a_transactional_batch_the_coordinator_does_not_know_is_refused(tmp_path):
    """KIP-890's verification on a replica set: a transactional batch that would open a
    transaction the coordinator (another node, asked with AddPartitionsToTxn v4) does not know
    is refused, and nothing is written (it would hold the last stable offset back for good)."""
    from kafka.protocol.old.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

    nodes, kafka = kafka_cluster(tmp_path)
    try:
        leader = leader_of(nodes)
        conn = Conn(kafka[leader])
        coordinator = leader_of(nodes, ("__transaction_state", 0))
        found = conn.call(FindCoordinatorRequest[1]("tx", 1), FindCoordinatorResponse[1])
        assert (found.error_code, found.coordinator_id) == (NONE, coordinator)
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=9,
                                            producer_epoch=0, base_sequence=0, batch_size=1 << 20)
        builder.append(0, timestamp=int(time.time() * 1000), key=None, value=b"t", headers=[])
        log = nodes[leader].store.partition("replicated", 0)
        end = log.log_end_offset
        # ProduceRequest v3 carries the transactional id
        deadline = time.monotonic() + 20
        while True:
            answer = conn.call(ProduceRequest[3]("tx", -1, 5000, [("replicated", [(0, bytes(builder.build()))])]),
                               ProduceResponse[3])
            (_, [(partition, error, base, *_)]), = answer.topics
            if error != NOT_ENOUGH_REPLICAS or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # the coordinator is still taking the state up: retried, as a producer does
        assert error == 49  # INVALID_PRODUCER_ID_MAPPING: "tx" has no producer 9
        answer = conn.call(ProduceRequest[3](None, -1, 5000, [("replicated", [(0, bytes(builder.build()))])]),
                           ProduceResponse[3])
        (_, [(partition, error, base, *_)]), = answer.topics
        assert error == 48  # INVALID_TXN_STATE: a transactional batch without a transactional id
        assert log.log_end_offset == end and log.producer_transactions() == {}
        conn.close()
    finally:
        stop_all(nodes)


def test_confluent_kafka_idempotent_producer_and_consumer_across_a_failover(tmp_path):
    nodes, kafka = kafka_cluster(tmp_path)
    bootstrap = ",".join(f"{h}:{p}" for h, p in kafka.values())
    try:
        first = leader_of(nodes)
        producer = confluent_kafka.Producer({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap, "enable.idempotence": True,
                                             "acks": "all", "linger.ms": 5, "message.timeout.ms": 30000,
                                             "topic.metadata.refresh.interval.ms": 500})
        delivered, failed = [], []

        def report(err, msg):
            (failed if err else delivered).append(err or msg.value())

        for i in range(200):
            producer.produce("replicated", value=b"v%d" % i, partition=0, on_delivery=report)
        assert producer.flush(30) == 0
        nodes[first].stop()  # the leader goes; the client follows the new metadata
        for i in range(200, 400):
            producer.produce("replicated", value=b"v%d" % i, partition=0, on_delivery=report)
        assert producer.flush(60) == 0
        assert failed == [] and len(delivered) == 400
        leader_of({i: n for i, n in nodes.items() if i != first})  # the survivors elected a leader
        consumer = confluent_kafka.Consumer({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap, "group.id": "check",
                                             "enable.auto.commit": False})
        consumer.assign([confluent_kafka.TopicPartition("replicated", 0, confluent_kafka.OFFSET_BEGINNING)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 400 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value())
        consumer.close()
        assert got == [b"v%d" % i for i in range(400)]  # each once, in order: no retry appended twice
    finally:
        stop_all(nodes)


def test_consumers_see_committed_records_only(tmp_path):
    nodes, kafka = kafka_cluster(tmp_path, election_timeout_ms=1000, min_insync_replicas=1)
    try:
        leader = leader_of(nodes)
        for i, n in nodes.items():
            if i != leader:
                n.stop()  # the leader alone cannot commit anything new
        conn = Conn(kafka[leader])
        error, base = produce(conn, batch([b"uncommitted"]), acks=1)
        assert error == NONE  # acks=1: the leader holds it
        log = nodes[leader].store.partition(*KEY)
        assert log.log_end_offset > base and log.high_watermark <= base
        error, _ = produce(conn, batch([b"again"]), acks=-1, timeout_ms=500)
        assert error in (7, NOT_ENOUGH_REPLICAS)  # never "done" without a majority
        conn.close()
        consumer = confluent_kafka.Consumer({**CONFLUENT_LOGIN, "bootstrap.servers": f"{kafka[leader][0]}:{kafka[leader][1]}",
                                             "group.id": "c", "enable.auto.commit": False})
        consumer.assign([confluent_kafka.TopicPartition("replicated", 0, confluent_kafka.OFFSET_BEGINNING)])
        seen = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                seen.append(msg.value())
        consumer.close()
        assert seen == []
    finally:
        stop_all(nodes)


def test_a_retry_after_a_failover_is_answered_with_the_first_offsets(tmp_path):
    """The producer state travels with the log: the new leader knows the batch its predecessor
    appended and answers the retry with its offsets instead of appending it again."""
    nodes, kafka = kafka_cluster(tmp_path)
    try:
        first = leader_of(nodes)
        from kafka.protocol.old.init_producer_id import InitProducerIdRequest, InitProducerIdResponse
        conn = Conn(kafka[first])
        pid = conn.call(InitProducerIdRequest[0](None, 60000), InitProducerIdResponse[0]).producer_id
        records = batch([b"once-a", b"once-b"], producer_id=pid, epoch=0, sequence=0)
        error, base = produce(conn, records)
        conn.close()
        assert error == NONE
        end = nodes[first].store.partition(*KEY).log_end_offset
        wait_for(lambda: all(n.store.partition(*KEY).log_end_offset >= end for n in nodes.values()))
        nodes[first].stop()
        rest = {i: n for i, n in nodes.items() if i != first}
        second = leader_of(rest)
        conn = Conn(kafka[second])
        assert produce(conn, records) == (NONE, base)  # the retry: the same offsets
        error, after = produce(conn, batch([b"next"], producer_id=pid, epoch=0, sequence=2))
        conn.close()
        assert error == NONE and after > base + 1
        values = [r.value for r in nodes[second].store.partition(*KEY).read(0)]
        assert values.count(b"once-a") == 1 and values[-1] == b"next"
    finally:
        stop_all(nodes)


def test_sigkill_of_the_leader_under_an_idempotent_confluent_kafka_producer(tmp_path):
    """Node processes; the leader is SIGKILLed and restarted while confluent-kafka produces with
    acks=all and idempotence: every acknowledged value is read back, each exactly once, in order."""
    import os

    cluster = KafkaNodes(tmp_path, SECRET)
    for i in range(3):
        cluster.start(i)
    bootstrap = cluster.bootstrap
    producer = confluent_kafka.Producer({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                         "linger.ms": 2, "message.timeout.ms": 60000,
                                         "topic.metadata.refresh.interval.ms": 500})
    acked, failed = [], []

    def report(err, msg):
        (failed if err else acked).append(err or msg.value())

    kills = int(os.environ.get("LOGSTORE_KAFKA_FAILOVERS", "3"))
    try:
        sent = 0
        for _ in range(kills):
            for _ in range(150):
                producer.produce("replicated", value=b"v%06d" % sent, partition=0, on_delivery=report)
                sent += 1
                producer.poll(0)
            time.sleep(0.2)
            victim = cluster.leader("replicated")
            assert victim is not None, "no leader named by any node"
            cluster.kill(victim)
            for _ in range(150):  # produced while the set elects a new leader
                producer.produce("replicated", value=b"v%06d" % sent, partition=0, on_delivery=report)
                sent += 1
                producer.poll(0)
            cluster.start(victim)
        assert producer.flush(90) == 0
        assert failed == []
        consumer = confluent_kafka.Consumer({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap, "group.id": "audit",
                                             "enable.auto.commit": False})
        consumer.assign([confluent_kafka.TopicPartition("replicated", 0, confluent_kafka.OFFSET_BEGINNING)])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < len(acked) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value())
        consumer.close()
        assert len(acked) == sent
        assert got == [b"v%06d" % i for i in range(sent)]  # each once and in order
    finally:
        cluster.stop_all()


def test_a_kafka_python_group_keeps_its_offsets_when_the_coordinator_node_stops(tmp_path):
    """Two kafka-python consumers in one group on the replica set. The group's coordinator is the
    leader of __consumer_offsets-0; it is stopped: the consumers find the new coordinator (the
    group's membership and commits were replicated), go on, and the committed offsets are there."""
    import threading

    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import CommitFailedError as KafkaCommitFailed
    from kafka.errors import KafkaConnectionError

    nodes, kafka = kafka_cluster(tmp_path, partitions=(("replicated", 2),))
    bootstrap = [f"{h}:{p}" for h, p in kafka.values()]
    stop = threading.Event()
    seen: dict[int, list[tuple[int, int, bytes]]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def consume(i):
        try:
            c = KafkaConsumer("replicated", group_id="g", bootstrap_servers=bootstrap, **KAFKA_PYTHON_LOGIN, enable_auto_commit=False,
                              auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=500,
                              request_timeout_ms=10000, client_id=f"c{i}")
            while not stop.is_set():
                batches = c.poll(timeout_ms=200)
                for tp, records in batches.items():
                    seen[i].extend((tp.partition, r.offset, r.value) for r in records)
                if batches:
                    try:
                        c.commit()
                    except KafkaCommitFailed:
                        pass  # the group rebalanced: the next owner reads them again
            c.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def produce_values(start, count):
        p = confluent_kafka.Producer({**CONFLUENT_LOGIN, "bootstrap.servers": ",".join(bootstrap), "enable.idempotence": True,
                                      "acks": "all", "topic.metadata.refresh.interval.ms": 500})
        for i in range(start, start + count):
            p.produce("replicated", value=b"g%d" % i, partition=i % 2)
        assert p.flush(60) == 0

    def values():
        return {v for got in seen.values() for _, _, v in got}

    threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in (0, 1)]
    try:
        leader_of(nodes, key=OFFSETS_KEY)
        for t in threads:
            t.start()
        produce_values(0, 200)
        wait_for(lambda: len(values()) == 200, timeout=60)
        coordinator = leader_of(nodes, key=OFFSETS_KEY)
        nodes[coordinator].stop()
        rest = {i: n for i, n in nodes.items() if i != coordinator}
        leader_of(rest, key=OFFSETS_KEY)  # a new coordinator is elected
        produce_values(200, 200)
        wait_for(lambda: len(values()) == 400, timeout=90)
        assert values() == {b"g%d" % i for i in range(400)}
        stop.set()
        for t in threads:
            t.join(30)
        assert errors == []
        last = {}
        for got in seen.values():
            for partition, offset, _ in got:
                last[partition] = max(last.get(partition, -1), offset)
        live = [f"{h}:{p}" for i, (h, p) in kafka.items() if i != coordinator]  # not the stopped node
        check = KafkaConsumer(group_id="g", bootstrap_servers=live, **KAFKA_PYTHON_LOGIN, enable_auto_commit=False)
        # Metadata still names the stopped node (brokers are the configured ones), and
        # kafka-python raises when it happens to try it: ask again, as an application would.
        for attempt in range(20):
            try:
                committed = {p: check.committed(TopicPartition("replicated", p)) for p in (0, 1)}
                break
            except KafkaConnectionError:
                time.sleep(0.2)
        check.close()
        assert committed == {p: last[p] + 1 for p in (0, 1)}  # every commit answered survived the stop
    finally:
        stop.set()
        stop_all(nodes)


OFFSETS_KEY = ("__consumer_offsets", 0)


def test_a_node_that_is_not_the_coordinator_says_so_for_each_partition(tmp_path):
    """OffsetFetch to a node other than the group coordinator: NOT_COORDINATOR for every
    partition asked for (clients read those), and FindCoordinator names the leader of
    __consumer_offsets-0."""
    from kafka.protocol.old.commit import OffsetFetchRequest, OffsetFetchResponse
    from kafka.protocol.old.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

    nodes, kafka = kafka_cluster(tmp_path)
    try:
        coordinator = leader_of(nodes, key=OFFSETS_KEY)
        wait_for(lambda: all(n.describe()[OFFSETS_KEY]["leader"] == coordinator for n in nodes.values()))
        other = next(i for i in nodes if i != coordinator)
        conn = Conn(kafka[other])
        found = conn.call(FindCoordinatorRequest[1]("g", 0), FindCoordinatorResponse[1])
        assert (found.error_code, found.coordinator_id) == (NONE, coordinator)
        assert (found.host, found.port) == kafka[coordinator]
        answer = conn.call(OffsetFetchRequest[3]("g", [("replicated", [0])]), OffsetFetchResponse[3])
        conn.close()
        assert answer.error_code == 16
        assert [(p[0], p[-1]) for _, parts in answer.topics for p in parts] == [(0, 16)]
    finally:
        stop_all(nodes)


