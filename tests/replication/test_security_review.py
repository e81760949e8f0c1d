"""Regressions of the security review of issue 29, on a replica set with an authorizer: a
client's produce to an internal topic (``__acls``, ``__consumer_offsets``) is refused whatever
its ACLs, so WRITE on ``Topic:*`` cannot rewrite the ACLs; reading ``__acls`` needs
CLUSTER_ACTION (the peers'), whatever READ on ``Topic:*`` says; an OAUTHBEARER token whose
principal is the peer user ``replica`` is refused (the peer principal comes only from SCRAM
with the set's secret). Read back through confluent-kafka, raw requests and every node's
store."""

from __future__ import annotations

import time

import pytest

from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

from logstore.kafka.acls import ACLS_TOPIC

from .test_acls import committed_acls
from .test_inprocess import wait_for
from .test_kafka_listener import Conn, kafka_cluster, leader_of, stop_all

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError  # noqa: E402
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,  # noqa: E402
                                   ResourcePatternType, ResourceType)

pytestmark = pytest.mark.regression

USERS = {"alice": "alice-secret", "admin": "admin-secret"}
OPTIONS = {"sasl_credentials": USERS, "authorizer": True, "super_users": ["User:admin"],
           "sasl_mechanisms": ["SCRAM-SHA-256", "OAUTHBEARER"],
           "sasl_oauthbearer": {"sasl.oauthbearer.unsecured.validator.enable": "true"}}


def bootstrap(addrs):
    return ",".join(f"{h}:{p}" for h, p in addrs.values())


def login(addrs, user):
    return {"bootstrap.servers": bootstrap(addrs), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": USERS[user]}


def produce_error(addrs, user, topic):
    producer = ck.Producer({**login(addrs, user), "message.timeout.ms": 10_000, "retries": 0})
    errors = []
    producer.produce(topic, b"forged", key=b"acls", partition=0, on_delivery=lambda err, msg: errors.append(err))
    producer.flush(15)
    return errors[0] if errors else "undelivered"


def grant_all_topics(addrs, *operations):
    admin = AdminClient(login(addrs, "admin"))
    grants = [AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:alice", "*", op,
                         AclPermissionType.ALLOW) for op in operations]
    deadline = time.monotonic() + 30
    while True:  # (NOT_CONTROLLER while the ACLs' new leader commits its first record)
        try:
            assert [f.result() for f in admin.create_acls(grants, request_timeout=15).values()] == [None] * len(grants)
            return
        except ck.KafkaException as exc:
            if time.monotonic() > deadline or exc.args[0].code() != KafkaError.NOT_CONTROLLER:
                raise
            time.sleep(0.2)


def fetch_acls(address, user):
    """A consumer's Fetch of ``__acls-0`` from offset 0 as ``user``: (error, records)."""
    conn = Conn(address, user, USERS[user])
    try:
        F = FetchRequest.FetchTopic
        part = F.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                log_start_offset=-1, partition_max_bytes=1 << 20)
        answer = conn.call(FetchRequest(version=12, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                                        isolation_level=0, session_id=0, session_epoch=-1,
                                        topics=[F(topic=ACLS_TOPIC, partitions=[part])], forgotten_topics_data=[],
                                        rack_id=""), FetchResponse)
    finally:
        conn.close()
    ((p,),) = [t.partitions for t in answer.responses]
    return p.error_code, p.records


def test_internal_topics_and_the_peer_principal_on_a_replica_set(tmp_path):
    nodes, addrs = kafka_cluster(tmp_path, min_insync_replicas=2, kafka_options=OPTIONS)
    try:
        acls_leader = leader_of(nodes, (ACLS_TOPIC, 0))
        leader_of(nodes, ("__consumer_offsets", 0))
        grant_all_topics(addrs, AclOperation.WRITE, AclOperation.READ, AclOperation.DESCRIBE)
        wait_for(lambda: all(len(committed_acls(n) or ()) == 3 for n in nodes.values()))
        ends = {i: n.store.partition(ACLS_TOPIC, 0).log_end_offset for i, n in nodes.items()}
        # WRITE on Topic:* does not reach __acls (it needs CLUSTER_ACTION) ...
        assert produce_error(addrs, "alice", ACLS_TOPIC).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        # ... and no client appends to an internal topic, a super user neither
        assert produce_error(addrs, "admin", ACLS_TOPIC).code() == KafkaError.TOPIC_EXCEPTION
        assert produce_error(addrs, "alice", "__consumer_offsets").code() == KafkaError.TOPIC_EXCEPTION
        assert {i: n.store.partition(ACLS_TOPIC, 0).log_end_offset for i, n in nodes.items()} == ends
        # READ on Topic:* does not read __acls; the super user does
        error, records = fetch_acls(addrs[acls_leader], "alice")
        assert error == 29 and not records
        error, records = fetch_acls(addrs[acls_leader], "admin")
        assert error == 0 and records

        def token_admin(principal):
            return AdminClient({"bootstrap.servers": bootstrap(addrs), "security.protocol": "SASL_PLAINTEXT",
                                "sasl.mechanisms": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
                                "sasl.oauthbearer.config": f"principal={principal} lifeSeconds=600",
                                "socket.timeout.ms": 5000})

        with pytest.raises(ck.KafkaException):  # sub=replica: refused at authentication
            token_admin("replica").list_topics(timeout=8)
        assert ACLS_TOPIC not in token_admin("olivia").list_topics(timeout=8).topics
    finally:
        stop_all(nodes)
