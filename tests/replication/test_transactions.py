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
        found = conn.call(FindCoordinatorRequest[1]("tx", 1), FindCoordinatorResponse[1])
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
    finally:
        stop_all(nodes)
