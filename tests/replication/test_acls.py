"""ACLs on a replica set: replicated in ``__acls`` and enforced by every node. A change made
through any node (the leader of ``__acls-0`` makes it, the others forward it) reaches every
node's log below its high watermark, read back from each node's store; a principal is denied
by the node it produces to; the ACLs survive a restart of the whole set."""

from __future__ import annotations

import time

import pytest

from kafka.protocol.admin import CreateAclsRequest, CreateAclsResponse

from logstore.kafka.aclfile import decode
from logstore.kafka.acls import AclOperation as Op, ResourceType as RT
from logstore.replica.acls import ACLS_KEY, ACLS_TOPIC

from .test_inprocess import wait_for
from .test_kafka_listener import Conn, kafka_cluster, leader_of, stop_all

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError  # noqa: E402
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,  # noqa: E402
                                   ResourcePatternType, ResourceType)

TOPIC = "replicated"
USERS = {"alice": "alice-secret", "admin": "admin-secret"}
OPTIONS = {"sasl_credentials": USERS, "authorizer": True, "super_users": ["User:admin"]}


def login(addrs, user):
    return {"bootstrap.servers": ",".join(f"{h}:{p}" for h, p in addrs.values()),
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
            "sasl.password": USERS[user]}


def committed_acls(node):
    """The newest ACLs below the node's high watermark, read from its store."""
    log = node.store.partition(ACLS_TOPIC, 0)
    values = [r.value for r in log.read(log.log_start_offset, max_offset=log.high_watermark) if r.key == ACLS_KEY]
    return decode(values[-1], "test") if values else None


def produce_error(addrs, user, topic):
    producer = confluent_kafka.Producer({**login(addrs, user), "message.timeout.ms": 15000})
    errors = []
    producer.produce(topic, b"v", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(20)
    return errors[0] if errors else "undelivered"


def test_acls_replicated_to_every_node_and_enforced_by_the_leader(tmp_path):
    nodes, addrs = kafka_cluster(tmp_path, min_insync_replicas=2, kafka_options=OPTIONS)
    try:
        leader_of(nodes, (ACLS_TOPIC, 0))
        leader_of(nodes, (TOPIC, 0))
        # no ACLs: alice may not write; the set's own replica user still replicates
        assert produce_error(addrs, "alice", TOPIC).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        admin = AdminClient(login(addrs, "admin"))
        grant = AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:alice", "*",
                           AclOperation.WRITE, AclPermissionType.ALLOW)
        deadline = time.monotonic() + 30
        while True:  # (NOT_CONTROLLER while the ACLs' new leader commits its first record)
            try:
                assert [f.result() for f in admin.create_acls([grant], request_timeout=15).values()] == [None]
                break
            except confluent_kafka.KafkaException as exc:
                if time.monotonic() > deadline or exc.args[0].code() != KafkaError.NOT_CONTROLLER:
                    raise
                time.sleep(0.2)
        for node in nodes.values():  # every node holds it below its high watermark
            wait_for(lambda: committed_acls(node) is not None, timeout=10)
            assert [(a.resource_type, a.name, a.principal, a.operation) for a in committed_acls(node)] == [
                (RT.TOPIC, TOPIC, "User:alice", Op.WRITE)]
        assert produce_error(addrs, "alice", TOPIC) is None
        leader = leader_of(nodes, (TOPIC, 0))
        log = nodes[leader].store.partition(TOPIC, 0)
        wait_for(lambda: [r.value for r in log.read(log.log_start_offset, max_offset=log.high_watermark)] == [b"v"])
    finally:
        stop_all(nodes)
    # the whole set restarted on its directories: the ACLs are its log's
    nodes, addrs = kafka_cluster(tmp_path, min_insync_replicas=2, kafka_options=OPTIONS)
    try:
        leader_of(nodes, (TOPIC, 0))
        for node in nodes.values():
            wait_for(lambda: committed_acls(node) is not None, timeout=15)
        assert produce_error(addrs, "alice", TOPIC) is None
        assert produce_error(addrs, "alice", "__consumer_offsets").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        stop_all(nodes)


def test_a_change_sent_to_a_follower_is_forwarded_to_the_acls_leader(tmp_path):
    nodes, addrs = kafka_cluster(tmp_path, min_insync_replicas=2, kafka_options=OPTIONS)
    try:
        leader = leader_of(nodes, (ACLS_TOPIC, 0))
        follower = next(i for i in nodes if i != leader)
        creation = CreateAclsRequest.AclCreation(resource_type=2, resource_name="fwd", resource_pattern_type=3,
                                                 principal="User:alice", host="*", operation=3, permission_type=3)
        conn = Conn(addrs[follower], "admin", USERS["admin"])
        try:
            deadline = time.monotonic() + 30
            while True:
                answer = conn.call(CreateAclsRequest(creations=[creation], version=1), CreateAclsResponse)
                code = answer.results[0].error_code
                if code != KafkaError.NOT_CONTROLLER or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert code == 0, answer
            # a principal without ALTER on the cluster is refused where it asks
            alice = Conn(addrs[follower], "alice", USERS["alice"])
            try:
                refused = alice.call(CreateAclsRequest(creations=[creation], version=1), CreateAclsResponse)
                assert refused.results[0].error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED
            finally:
                alice.close()
        finally:
            conn.close()
        wait_for(lambda: committed_acls(nodes[follower]) is not None, timeout=10)
        assert [a.name for a in committed_acls(nodes[follower])] == ["fwd"]
        assert [a.name for a in committed_acls(nodes[leader])] == ["fwd"]
    finally:
        stop_all(nodes)
