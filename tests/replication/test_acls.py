"""ACLs on a replica set: replicated in ``__acls`` and enforced by every node. A change made
through any node (the leader of ``__acls-0`` makes it, the others forward it) reaches every
node's log below its high watermark, read back from each node's store; a principal is denied
by the node it produces to; the ACLs survive a restart of the whole set."""

from __future__ import annotations

import struct
import time

import pytest

from kafka.protocol.admin import CreateAclsRequest, CreateAclsResponse, DescribeAclsRequest, DescribeAclsResponse

from logstore.kafka.aclfile import decode
from logstore.kafka.acls import AclOperation as Op, ResourceType as RT
from logstore.replica.acls import ACLS_KEY, ACLS_TOPIC, ReplicatedAcls

from .test_inprocess import wait_for
from .test_kafka_listener import Conn, kafka_cluster, leader_of, stop_all

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError  # noqa: E402
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,  # noqa: E402
                                   AdminClient, ResourcePatternType, ResourceType)

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


def create_acl(admin, binding):
    """CreateAcls through confluent-kafka, asked again while the answer is NOT_CONTROLLER (the
    ACLs' new leader commits its first record)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            assert [f.result() for f in admin.create_acls([binding], request_timeout=15).values()] == [None]
            return
        except confluent_kafka.KafkaException as exc:
            if time.monotonic() > deadline or exc.args[0].code() != KafkaError.NOT_CONTROLLER:
                raise
            time.sleep(0.2)


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
        create_acl(admin, AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:alice", "*",
                                     AclOperation.WRITE, AclPermissionType.ALLOW))
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


@pytest.mark.regression
def test_a_forwarded_change_is_authorized_by_the_acls_leader_not_by_a_lagging_follower(tmp_path, monkeypatch):
    """A follower's copy of ``__acls`` may lag (it learns the high watermark from the leader's
    next fetch answer). Here the follower's view is held at the moment carol had ALTER on the
    cluster; the grant is then revoked on the leader. carol's CreateAcls sent to that follower
    is forwarded in an Envelope naming carol, and the leader, which applies it, refuses it:
    before, the follower authorized it with its stale copy and forwarded it as the replica
    user, and carol altered the ACLs after losing the right to."""
    users = {**USERS, "carol": "carol-secret"}
    options = {**OPTIONS, "sasl_credentials": users}
    nodes, addrs = kafka_cluster(tmp_path, min_insync_replicas=2, kafka_options=options)
    try:
        leader = leader_of(nodes, (ACLS_TOPIC, 0))
        follower = next(i for i in nodes if i != leader)
        held: dict[str, object] = {}
        current = ReplicatedAcls.current

        def lagging(self):
            if self.context.node_id != follower:
                return current(self)
            if "hold" not in held:
                held["view"] = current(self)
            return held["view"]

        monkeypatch.setattr(ReplicatedAcls, "current", lagging)
        admin = AdminClient({**login(addrs, "admin"), "bootstrap.servers": "%s:%d" % addrs[leader]})
        create_acl(admin, AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:carol",
                                     "*", AclOperation.ALTER, AclPermissionType.ALLOW))
        wait_for(lambda: committed_acls(nodes[follower]) is not None, timeout=10)
        carol = Conn(addrs[follower], "carol", users["carol"])
        try:
            # with the grant, carol's change through the follower is made (by the leader, as carol)
            before = CreateAclsRequest.AclCreation(resource_type=2, resource_name="before", resource_pattern_type=3,
                                                   principal="User:alice", host="*", operation=3, permission_type=3)
            answer = carol.call(CreateAclsRequest(creations=[before], version=1), CreateAclsResponse)
            assert answer.results[0].error_code == 0, answer
            wait_for(lambda: any(a.name == "before" for a in committed_acls(nodes[follower])), timeout=10)
            # the follower's view (read by its authorizer for carol's DescribeAcls) has both
            described = carol.call(DescribeAclsRequest(resource_type_filter=1, resource_name_filter=None,
                                                       pattern_type_filter=1, principal_filter=None, host_filter=None,
                                                       operation=1, permission_type=1, version=1),
                                   DescribeAclsResponse)
            assert sorted(r.resource_name for r in described.resources) == ["before", "kafka-cluster"], described
            held["hold"] = True
            # the follower's view is held now; the grant is revoked on the leader
            revoke = AclBindingFilter(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                                      "User:carol", "*", AclOperation.ALTER, AclPermissionType.ALLOW)
            deleted = [f.result() for f in admin.delete_acls([revoke], request_timeout=15).values()]
            assert [len(d) for d in deleted] == [1]
            wait_for(lambda: not any(a.principal == "User:carol" for a in committed_acls(nodes[leader])), timeout=10)
            after = CreateAclsRequest.AclCreation(resource_type=2, resource_name="after", resource_pattern_type=3,
                                                  principal="User:alice", host="*", operation=3, permission_type=3)
            refused = carol.call(CreateAclsRequest(creations=[after], version=1), CreateAclsResponse)
            assert refused.results[0].error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED, refused
        finally:
            carol.close()
        assert any(a.principal == "User:carol" for a in held["view"])  # the follower's view still grants it
        assert sorted(a.name for a in committed_acls(nodes[leader])) == ["before"]
    finally:
        stop_all(nodes)


def test_an_envelope_from_a_client_is_refused(tmp_path):
    """The Envelope (API 58) is the peers' alone: a client that sends one, naming a super user
    as its principal, gets CLUSTER_AUTHORIZATION_FAILED and nothing inside it is made. Written
    by hand from Kafka's EnvelopeRequest v0 (flexible: compact bytes, tagged fields)."""
    nodes, addrs = kafka_cluster(tmp_path, min_insync_replicas=2, kafka_options=OPTIONS)
    try:
        leader = leader_of(nodes, (ACLS_TOPIC, 0))
        alice = Conn(addrs[leader], "alice", USERS["alice"])
        try:
            inner = CreateAclsRequest(creations=[CreateAclsRequest.AclCreation(
                resource_type=2, resource_name="smuggled", resource_pattern_type=3, principal="User:alice", host="*",
                operation=2, permission_type=3)], version=1)
            inner.with_header(7, "smuggler")
            inner_bytes = inner.encode(header=True, framed=False)

            def compact(raw):  # (one byte of unsigned varint: under 127 bytes)
                assert len(raw) < 127
                return bytes([len(raw) + 1]) + raw

            body = compact(inner_bytes) + compact(b"User:admin") + compact(bytes([127, 0, 0, 1])) + b"\0"
            header = struct.pack(">hhih", 58, 0, 99, 5) + b"alice" + b"\0"
            alice.sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
            (size,) = struct.unpack(">i", alice._exactly(4))
            answer = alice._exactly(size)
            correlation, tags, data_length = struct.unpack_from(">ibb", answer, 0)
            (error,) = struct.unpack_from(">h", answer, 6)
            assert (correlation, tags, data_length, error) == (99, 0, 0, KafkaError.CLUSTER_AUTHORIZATION_FAILED)
        finally:
            alice.close()
        assert committed_acls(nodes[leader]) is None  # (an ACL made would be committed before the answer)
    finally:
        stop_all(nodes)


@pytest.mark.regression
def test_a_forwarded_topic_change_is_authorized_by_the_metadata_leader(tmp_path, monkeypatch):
    """A topic change sent to a node that leads neither ``__acls`` nor ``__cluster_metadata`` is
    forwarded to the metadata's leader in an Envelope naming the client's principal, and that
    leader authorizes it with its own ACLs: carol, whose ALTER_CONFIGS on the topic was revoked,
    cannot change the topic through a node whose copy of the ACLs still grants it (before, the
    node that received the request authorized it and forwarded it as the replica user)."""
    from kafka.protocol.admin import (DescribeConfigsRequest, DescribeConfigsResponse,
                                      IncrementalAlterConfigsRequest as R, IncrementalAlterConfigsResponse)

    from logstore.replica.metadata import METADATA_TOPIC

    users = {**USERS, "carol": "carol-secret"}
    options = {**OPTIONS, "sasl_credentials": users}
    nodes, addrs = kafka_cluster(tmp_path, min_insync_replicas=2, kafka_options=options)
    try:
        acls_leader = leader_of(nodes, (ACLS_TOPIC, 0))
        metadata_leader = leader_of(nodes, (METADATA_TOPIC, 0))
        other = next(i for i in nodes if i not in (acls_leader, metadata_leader))
        held: dict[str, object] = {}
        current = ReplicatedAcls.current

        def lagging(self):
            if self.context.node_id != other:
                return current(self)
            if "hold" not in held:
                held["view"] = current(self)
            return held["view"]

        monkeypatch.setattr(ReplicatedAcls, "current", lagging)
        admin = AdminClient({**login(addrs, "admin"), "bootstrap.servers": "%s:%d" % addrs[acls_leader]})
        create_acl(admin, AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:carol", "*",
                                     AclOperation.ALTER_CONFIGS, AclPermissionType.ALLOW))
        for i in nodes:
            wait_for(lambda: committed_acls(nodes[i]) is not None, timeout=10)
        D = DescribeConfigsRequest
        describe = D(resources=[D.DescribeConfigsResource(resource_type=2, resource_name=TOPIC,
                                                          configuration_keys=["retention.ms"])],
                     include_synonyms=False, version=1)

        def set_retention(conn, value):
            request = R(resources=[R.AlterConfigsResource(resource_type=2, resource_name=TOPIC, configs=[
                R.AlterConfigsResource.AlterableConfig(name="retention.ms", config_operation=0, value=value)])],
                validate_only=False, version=1)
            deadline = time.monotonic() + 30
            while True:
                code = conn.call(request, IncrementalAlterConfigsResponse).responses[0].error_code
                if code != KafkaError.NOT_CONTROLLER or time.monotonic() > deadline:
                    return code
                time.sleep(0.2)

        carol = Conn(addrs[other], "carol", users["carol"])
        try:
            assert set_retention(carol, "111111") == 0  # granted: made by the metadata's leader, as carol
            for node in nodes.values():
                wait_for(lambda: node.store.partition(TOPIC, 0).config.retention_ms == 111111, timeout=10)
            # this node's authorizer reads its ACLs (ALTER_CONFIGS implies DESCRIBE_CONFIGS), and
            # its view is held from now on; then the grant is revoked
            assert carol.call(describe, DescribeConfigsResponse).results[0].error_code == 0
            held["hold"] = True
            revoke = AclBindingFilter(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:carol", "*",
                                      AclOperation.ALTER_CONFIGS, AclPermissionType.ALLOW)
            assert [len(f.result()) for f in admin.delete_acls([revoke], request_timeout=15).values()] == [1]
            wait_for(lambda: not any(a.principal == "User:carol" for a in committed_acls(nodes[metadata_leader])),
                     timeout=10)
            assert set_retention(carol, "222222") == KafkaError.TOPIC_AUTHORIZATION_FAILED
        finally:
            carol.close()
        assert any(a.principal == "User:carol" for a in held["view"])  # this node's view still grants it
        time.sleep(0.5)  # (a change made would be committed and applied by now)
        assert all(node.store.partition(TOPIC, 0).config.retention_ms == 111111 for node in nodes.values())
    finally:
        stop_all(nodes)
