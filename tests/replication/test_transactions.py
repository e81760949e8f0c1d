"""Transactions on a replica set, with Kafka clients (confluent-kafka's librdkafka, kafka-python)
as independent implementations of the protocol: the leader of ``__transaction_state-0``
coordinates, markers go to every partition's leader (WriteTxnMarkers between nodes) and count
once a majority holds them, read_committed consumers see committed transactions only, whole,
also after the coordinator's node or a partition leader fails mid-commit."""

from __future__ import annotations

import time

import pytest

from logstore.replication import ReplicaNode

from .test_inprocess import SECRET, free_ports, wait_for
from .test_kafka_listener import CONFLUENT_LOGIN, Conn, leader_of, stop_all

confluent_kafka = pytest.importorskip("confluent_kafka")

TXN_KEY = ("__transaction_state", 0)
OFFSETS_KEY = ("__consumer_offsets", 0)
TOPIC = "replicated"


def txn_cluster(tmp_path, n=3, partitions=2, **kw):
    ports = free_ports(n)
    addrs = {i: ("127.0.0.1", ports[i]) for i in range(n)}
    nodes = {}
    for i in range(n):
        nodes[i] = ReplicaNode(i, str(tmp_path / f"node{i}"), addrs[i], {j: a for j, a in addrs.items() if j != i},
                               SECRET, partitions=((TOPIC, partitions),), **{"election_timeout_ms": 300, **kw}).start()
    return nodes, addrs


def bootstrap(addrs):
    return ",".join(f"{h}:{p}" for h, p in addrs.values())


def transactional_producer(addrs, tid, **extra):
    return confluent_kafka.Producer({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap(addrs),
                                     "transactional.id": tid, "transaction.timeout.ms": 10000,
                                     "topic.metadata.refresh.interval.ms": 500, **extra})


def read_committed(addrs, partitions=2, expect=None, timeout=30.0):
    consumer = confluent_kafka.Consumer({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap(addrs),
                                         "group.id": "check", "enable.auto.commit": False,
                                         "isolation.level": "read_committed"})
    consumer.assign([confluent_kafka.TopicPartition(TOPIC, p, confluent_kafka.OFFSET_BEGINNING)
                     for p in range(partitions)])
    got = []
    deadline = time.monotonic() + timeout
    idle = 0
    while time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            idle += 1
            if expect is not None and len(got) >= expect and idle >= 4:
                break
            continue
        idle = 0
        if not msg.error():
            got.append(msg.value())
    consumer.close()
    return got


def test_commit_and_abort_across_partitions_with_a_read_committed_consumer(tmp_path):
    nodes, addrs = txn_cluster(tmp_path)
    try:
        coordinator = leader_of(nodes, TXN_KEY)
        conn = Conn(addrs[(coordinator + 1) % 3])
        from kafka.protocol.old.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
        deadline = time.monotonic() + 15
        while True:  # the node asked may not have learned the leader yet: COORDINATOR_NOT_AVAILABLE, retried
            found = conn.call(FindCoordinatorRequest[1]("tx", 1), FindCoordinatorResponse[1])
            if found.error_code != 15 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert (found.error_code, found.coordinator_id) == (0, coordinator)
        conn.close()
        producer = transactional_producer(addrs, "tx")
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(10):
            producer.produce(TOPIC, value=b"c%d" % i, partition=i % 2)
        producer.commit_transaction(30)
        producer.begin_transaction()
        for i in range(10):
            producer.produce(TOPIC, value=b"a%d" % i, partition=i % 2)
        producer.flush(30)
        producer.abort_transaction(30)
        producer.begin_transaction()
        producer.produce(TOPIC, value=b"last", partition=0)
        producer.commit_transaction(30)
        got = read_committed(addrs, expect=11)
        assert sorted(got) == sorted([b"c%d" % i for i in range(10)] + [b"last"])
        # kafka-python's admin client: DescribeTransactions goes to the coordinator it finds,
        # ListTransactions to every node (only the coordinator lists any), DescribeProducers to
        # each partition's leader.
        from kafka.admin import KafkaAdminClient
        from kafka import TopicPartition
        from .test_kafka_listener import KAFKA_PYTHON_LOGIN
        admin = KafkaAdminClient(bootstrap_servers=bootstrap(addrs), **KAFKA_PYTHON_LOGIN)
        try:
            described = admin.describe_transactions(["tx"])["tx"]
            assert str(getattr(described.state, "value", described.state)) == "CompleteCommit"
            listed = admin.list_transactions()
            assert {node: [t.transactional_id for t in ts] for node, ts in listed.items()} == {
                i: (["tx"] if i == coordinator else []) for i in nodes}
            producers = admin.describe_producers([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
            epoch = nodes[coordinator].describe()[TXN_KEY]["epoch"]
            assert len(producers) == 2
            for tp, found in producers.items():  # no transaction open; the markers of this coordinator
                assert [(p.current_transaction_start_offset, p.coordinator_epoch) for p in found.active_producers] \
                    == [(-1, epoch)], (tp, found)
        finally:
            admin.close()
    finally:
        stop_all(nodes)


def test_a_consume_transform_produce_loop_commits_its_offsets_with_its_output(tmp_path):
    """send_offsets_to_transaction: the group's offsets (at the group coordinator, which asks
    the transaction coordinator to verify) become visible with the transaction's COMMIT marker
    and not before; an aborted transaction's offsets never do."""
    nodes, addrs = txn_cluster(tmp_path, partitions=2)
    try:
        leader_of(nodes, TXN_KEY)
        leader_of(nodes, OFFSETS_KEY)
        source = confluent_kafka.Producer({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap(addrs), "acks": "all"})
        for i in range(20):
            source.produce(TOPIC, value=b"in%d" % i, partition=0)
        assert source.flush(30) == 0
        consumer = confluent_kafka.Consumer({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap(addrs),
                                             "group.id": "ctp", "enable.auto.commit": False,
                                             "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
        producer = transactional_producer(addrs, "ctp-tx")
        producer.init_transactions(30)
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 10 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                seen.append(msg)
        assert len(seen) == 10
        producer.begin_transaction()
        for msg in seen:
            producer.produce(TOPIC, value=b"out-" + msg.value(), partition=1)
        producer.send_offsets_to_transaction([confluent_kafka.TopicPartition(TOPIC, 0, seen[-1].offset() + 1)],
                                             consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        # a second round, aborted: its offsets are not taken
        producer.begin_transaction()
        producer.produce(TOPIC, value=b"never", partition=1)
        producer.send_offsets_to_transaction([confluent_kafka.TopicPartition(TOPIC, 0, 20)],
                                             consumer.consumer_group_metadata(), 30)
        producer.abort_transaction(30)
        consumer.close()
        check = confluent_kafka.Consumer({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap(addrs),
                                          "group.id": "ctp", "enable.auto.commit": False})
        (committed,) = check.committed([confluent_kafka.TopicPartition(TOPIC, 0)], timeout=30)
        check.close()
        assert committed.offset == seen[-1].offset() + 1
        outputs = [v for v in read_committed(addrs, expect=30) if v.startswith(b"out-") or v == b"never"]
        assert outputs == [b"out-in%d" % i for i in range(10)]
    finally:
        stop_all(nodes)


def test_a_commit_prepared_by_a_coordinator_that_dies_is_completed_by_the_next(tmp_path, monkeypatch):
    """The coordinator's node answers EndTxn once PrepareCommit is held by a majority, then
    dies before any marker is written: read_committed readers see nothing of the transaction
    until the new coordinator (the next leader of __transaction_state-0) loads the state,
    writes the markers with its epoch and completes the commit; then all of it, whole."""
    from concurrent.futures import Future

    from logstore.replica.transactions import ReplicaMarkers

    nodes, addrs = txn_cluster(tmp_path, partitions=2, election_timeout_ms=1000)
    try:
        leader_of(nodes, TXN_KEY)
        real = ReplicaMarkers.__call__
        # Every node's marker writer hangs (whichever node coordinates when the commit comes)...
        monkeypatch.setattr(ReplicaMarkers, "__call__", lambda self, *args: Future())  # never answered
        producer = transactional_producer(addrs, "dies")
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(6):
            producer.produce(TOPIC, value=b"d%d" % i, partition=i % 2)
        producer.commit_transaction(30)  # answered after PrepareCommit
        assert read_committed(addrs, timeout=3) == []  # no marker yet: the LSO holds the transaction back
        # ... until the coordinator's node dies: the next one writes them.
        monkeypatch.setattr(ReplicaMarkers, "__call__", real)
        coordinator = leader_of(nodes, TXN_KEY)
        nodes[coordinator].stop()
        survivors = {i: n for i, n in nodes.items() if i != coordinator}
        leader_of(survivors, TXN_KEY, timeout=20)
        survivor_addrs = {i: a for i, a in addrs.items() if i != coordinator}
        got = read_committed(survivor_addrs, expect=6, timeout=40)
        assert sorted(got) == sorted(b"d%d" % i for i in range(6))

        def closed_everywhere():
            for p in range(2):
                lead = leader_of(survivors, (TOPIC, p))
                if survivors[lead].store.partition(TOPIC, p).producer_transactions():
                    return False
            return True

        wait_for(closed_everywhere, timeout=20)
        # the new coordinator's markers carry its epoch (the state partition's leader epoch)
        new_epoch = survivors[leader_of(survivors, TXN_KEY)].describe()[TXN_KEY]["epoch"]
        for p in range(2):
            lead = leader_of(survivors, (TOPIC, p))
            producers = survivors[lead].store.partition(TOPIC, p).active_producers()
            assert [e.coordinator_epoch for e in producers.values()] == [new_epoch]
        producer2 = transactional_producer(survivor_addrs, "dies")  # the id still works, fencing the first
        producer2.init_transactions(30)
        producer2.begin_transaction()
        producer2.produce(TOPIC, value=b"after", partition=0)
        producer2.commit_transaction(30)
        assert b"after" in read_committed(survivor_addrs, expect=7, timeout=30)
    finally:
        stop_all(nodes)


def test_write_txn_markers_is_a_peers_request_and_fences_older_coordinators(tmp_path, monkeypatch):
    """WriteTxnMarkers (v1) and AddPartitionsToTxn v4 only for the replica user (31 otherwise);
    a marker of an older coordinator epoch is TRANSACTION_COORDINATOR_FENCED; a marker is
    answered only once a majority holds it (REQUEST_TIMED_OUT while the followers are away)."""
    from logstore.kafka.client import Connection, Security
    from logstore.replica import peerapis
    from logstore.replica.client import ADD_PARTITIONS_TO_TXN, WRITE_TXN_MARKERS, NodeConnection

    nodes, addrs = txn_cluster(tmp_path, partitions=1, min_insync_replicas=1,
                               kafka_options={"sasl_credentials": {"alice": "alice-secret"}})
    try:
        leader = leader_of(nodes, (TOPIC, 0))
        marker = {"producer_id": 77, "producer_epoch": 0, "transaction_result": True, "coordinator_epoch": 5,
                  "topics": [{"name": TOPIC, "partition_indexes": [0]}]}
        alice = Connection("127.0.0.1", addrs[leader][1], 5.0, "alice",
                           Security("SASL_PLAINTEXT", "SCRAM-SHA-256", "alice", "alice-secret"))
        try:
            answer = alice.request(WRITE_TXN_MARKERS, {"markers": [marker]}, 1)
            assert answer.markers[0].topics[0].partitions[0].error_code == 31  # CLUSTER_AUTHORIZATION_FAILED
            verify = alice.request(ADD_PARTITIONS_TO_TXN, {"transactions": [
                {"transactional_id": "x", "producer_id": 77, "producer_epoch": 0, "verify_only": True,
                 "topics": [{"name": TOPIC, "partitions": [0]}]}]}, 4)
            assert verify.error_code == 31
        finally:
            alice.close()
        log = nodes[leader].store.partition(TOPIC, 0)
        end = log.log_end_offset
        conn = NodeConnection(addrs[leader], SECRET, -1, 15.0)
        try:
            answer = conn.request(WRITE_TXN_MARKERS, {"markers": [marker]})
            assert answer.markers[0].topics[0].partitions[0].error_code == 0
            assert log.log_end_offset == end + 1
            older = {**marker, "coordinator_epoch": 4}
            answer = conn.request(WRITE_TXN_MARKERS, {"markers": [older]})
            assert answer.markers[0].topics[0].partitions[0].error_code == 52  # TRANSACTION_COORDINATOR_FENCED
            assert log.log_end_offset == end + 1
            # The followers go: the next marker is appended but never answered as written.
            monkeypatch.setattr(peerapis, "MARKER_COMMIT_TIMEOUT_S", 1.0)
            for i, n in nodes.items():
                if i != leader:
                    n.stop()
            answer = conn.request(WRITE_TXN_MARKERS, {"markers": [{**marker, "transaction_result": False}]})
            assert answer.markers[0].topics[0].partitions[0].error_code in (7, 6)  # REQUEST_TIMED_OUT / deposed
        finally:
            conn.close()
    finally:
        stop_all(nodes)


def test_kafka_python_and_aiokafka_transactional_producers_find_the_coordinator(tmp_path):
    """kafka-python and aiokafka (their own protocol code) bootstrapped from a node that does
    not coordinate: they find the coordinator, commit and abort; read_committed sees commits."""
    import asyncio

    kafka = pytest.importorskip("kafka")
    aiokafka = pytest.importorskip("aiokafka")
    from .test_kafka_listener import KAFKA_PYTHON_LOGIN

    nodes, addrs = txn_cluster(tmp_path, partitions=2)
    try:
        coordinator = leader_of(nodes, TXN_KEY)
        other = "%s:%d" % addrs[(coordinator + 1) % 3]
        producer = kafka.KafkaProducer(bootstrap_servers=other, transactional_id="kp-tx", **KAFKA_PYTHON_LOGIN)
        try:
            producer.init_transactions()
            producer.begin_transaction()
            for i in range(4):
                producer.send(TOPIC, value=b"kp%d" % i, partition=i % 2)
            producer.commit_transaction()
            producer.begin_transaction()
            producer.send(TOPIC, value=b"kp-aborted", partition=0)
            producer.flush()
            producer.abort_transaction()
        finally:
            producer.close()

        async def run() -> None:
            aio = aiokafka.AIOKafkaProducer(bootstrap_servers=other, transactional_id="aio-tx",
                                            security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                                            sasl_plain_username="replica", sasl_plain_password=SECRET.decode())
            await aio.start()
            try:
                async with aio.transaction():
                    for i in range(4):
                        await aio.send(TOPIC, value=b"aio%d" % i, partition=i % 2)
                await aio.begin_transaction()
                await aio.send(TOPIC, value=b"aio-aborted", partition=1)
                await aio.abort_transaction()
            finally:
                await aio.stop()

        asyncio.run(run())
        got = read_committed(addrs, expect=8)
        assert sorted(got) == sorted([b"kp%d" % i for i in range(4)] + [b"aio%d" % i for i in range(4)])
    finally:
        stop_all(nodes)


def test_logstore_node_limits_the_transaction_timeout(tmp_path):
    """logstore node takes serve's transaction options: a producer asking for more than
    --transaction-max-timeout-ms is refused at init_transactions (INVALID_TRANSACTION_TIMEOUT),
    one within it is served (a set of one node commits on its own)."""
    import subprocess
    import sys

    (port,) = free_ports(1)
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    proc = subprocess.Popen([sys.executable, "-m", "logstore", "node", "--node-id", "0", "--data-dir",
                             str(tmp_path / "n0"), "--listen", f"127.0.0.1:{port}", "--secret-file", str(secret),
                             "--min-insync-replicas", "1", "--transaction-max-timeout-ms", "2000"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert "serving" in proc.stdout.readline()
        addrs = {0: ("127.0.0.1", port)}
        greedy = transactional_producer(addrs, "greedy", **{"transaction.timeout.ms": 5000})
        with pytest.raises(confluent_kafka.KafkaException) as refused:
            greedy.init_transactions(20)
        assert refused.value.args[0].code() == confluent_kafka.KafkaError.INVALID_TRANSACTION_TIMEOUT
        modest = transactional_producer(addrs, "modest", **{"transaction.timeout.ms": 1500})
        modest.init_transactions(20)
        modest.begin_transaction()
        modest.produce(TOPIC, value=b"one", partition=0)
        modest.commit_transaction(20)
    finally:
        proc.terminate()
        proc.wait(30)
