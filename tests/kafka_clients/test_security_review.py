"""Regressions of the security review of issue 29, on ``logstore serve --authorizer``: a client's
produce to an internal topic is INVALID_TOPIC_EXCEPTION whatever its ACLs; DescribeTopicPartitions
lists only the topics the principal may describe (an empty list is "all" as sent, never after
the guard's filter); a reserved user name (a replica set's peer user) only from SCRAM, never
from OAUTHBEARER's token; CreateTopics v5+ without DESCRIBE_CONFIGS answers no configs; a Fetch
v15+ with a follower's replica id needs CLUSTER_ACTION; FindCoordinator v0 is a group's. Read
back through confluent-kafka, kafka-python and the store."""

from __future__ import annotations

import uuid

import pytest

from logstore.kafka.server import KafkaServer

from .test_acls import MECHANISM, USERS, admin, binding, ck_config, grant, kp_config, serve
from .test_sasl_wire import scram_login

kafka = pytest.importorskip("kafka")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError, TopicPartition  # noqa: E402
from confluent_kafka.admin import AclOperation, ResourceType  # noqa: E402
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse  # noqa: E402
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse  # noqa: E402
from kafka.protocol.old.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse  # noqa: E402
from .wire_conn import RequestConnection  # noqa: E402

pytestmark = pytest.mark.regression

INVALID_TOPIC = 17
TOPIC_AUTHORIZATION_FAILED = 29
ZERO_ID = uuid.UUID(int=0)
NO_ID = (None, ZERO_ID)  # (kafka-python reads the zero id as None)


def Conn(address, user, password):
    """kafka-python's request classes over a socket logged in with SCRAM."""
    return RequestConnection(address, "security-review",
                             login=lambda sock: scram_login(sock, MECHANISM, user, password))


@pytest.fixture
def server(tmp_path):
    with serve(tmp_path / "store") as srv:
        yield srv


def produce_errors(server, user, topic, key=b"k", value=b"forged"):
    producer = ck.Producer({**ck_config(server, user), "message.timeout.ms": 10_000, "retries": 0})
    errors = []
    producer.produce(topic, value, key=key, partition=0, on_delivery=lambda err, msg: errors.append(err))
    producer.flush(15)
    return errors


def test_a_produce_to_an_internal_topic_is_invalid_topic_whatever_the_acls(server):
    grant(server, binding(ResourceType.TOPIC, "*", "User:bob", AclOperation.WRITE))
    server.store.create_topic("secret", 1)
    committer = ck.Consumer({**ck_config(server, "admin"), "group.id": "victim", "enable.auto.commit": False})
    try:
        committer.commit(offsets=[TopicPartition("secret", 0, 1)], asynchronous=False)
        offsets = server.store.partition("__consumer_offsets", 0)
        end = offsets.log_end_offset
        for user in ("bob", "admin"):  # WRITE on Topic:*, and a super user: refused the same
            (error,) = produce_errors(server, user, "__consumer_offsets")
            assert error is not None and error.code() == KafkaError.TOPIC_EXCEPTION  # 17
        assert offsets.log_end_offset == end  # nothing appended
        (committed,) = committer.committed([TopicPartition("secret", 0)], timeout=10)
        assert committed.offset == 1
    finally:
        committer.close()


def test_a_produce_request_to_the_transaction_log_is_refused_with_17(server):
    grant(server, binding(ResourceType.TOPIC, "*", "User:bob", AclOperation.WRITE))
    server.store.create_topic("__transaction_state", 1, internal=True)
    (error,) = produce_errors(server, "bob", "__transaction_state")
    assert error is not None and error.code() == KafkaError.TOPIC_EXCEPTION
    assert server.store.partition("__transaction_state", 0).log_end_offset == 0


def kp_admin(server, user):
    return kafka.KafkaAdminClient(**kp_config(server, user))


def test_describe_topic_partitions_lists_only_the_topics_the_principal_may_describe(server):
    for name in ("alice-topic", "secret", "zz-secret"):
        server.store.create_topic(name, 2)
    grant(server, binding(ResourceType.TOPIC, "alice-topic", "User:alice", AclOperation.DESCRIBE))
    client = kp_admin(server, "alice")
    try:
        every = client.describe_topic_partitions([])
        assert [(t["name"], t["error_code"]) for t in every["topics"]] == [("alice-topic", 0)]
        assert every["next_cursor"] is None
        # one partition a page: the pages and their cursors name only the described topic
        page = client.describe_topic_partitions([], response_partition_limit=1)
        assert [t["name"] for t in page["topics"]] == ["alice-topic"]
        assert page["next_cursor"] == {"topic_name": "alice-topic", "partition_index": 1}
        page = client.describe_topic_partitions([], response_partition_limit=1, cursor=page["next_cursor"])
        assert [t["name"] for t in page["topics"]] == ["alice-topic"] and page["next_cursor"] is None
        named = client.describe_topic_partitions(["secret"])  # denied: 29, zero id, no partitions
        assert [(t["name"], t["error_code"], t["topic_id"] in NO_ID, t["partitions"]) for t in named["topics"]] == [
            ("secret", TOPIC_AUTHORIZATION_FAILED, True, [])]
        missing = client.describe_topic_partitions(["no-such-topic"])  # the same, exists or not
        assert [(t["error_code"], t["topic_id"] in NO_ID) for t in missing["topics"]] == [
            (TOPIC_AUTHORIZATION_FAILED, True)]
        mixed = client.describe_topic_partitions(["secret", "alice-topic"])
        assert sorted((t["name"], t["error_code"], len(t["partitions"])) for t in mixed["topics"]) == [
            ("alice-topic", 0, 2), ("secret", TOPIC_AUTHORIZATION_FAILED, 0)]
    finally:
        client.close()
    everything = kp_admin(server, "admin")  # the super user: every topic
    try:
        assert [t["name"] for t in everything.describe_topic_partitions([])["topics"]] == [
            "alice-topic", "secret", "zz-secret"]
    finally:
        everything.close()


def test_create_topics_v5_answers_configs_only_with_describe_configs(server):
    grant(server, binding(ResourceType.TOPIC, "alice-", "User:alice", AclOperation.CREATE,
                          pattern=ck.admin.ResourcePatternType.PREFIXED),
          binding(ResourceType.TOPIC, "alice-seen", "User:alice", AclOperation.DESCRIBE_CONFIGS))
    conn = Conn(server.address, "alice", USERS["alice"])
    try:
        T = CreateTopicsRequest.CreatableTopic
        answer = conn.call(CreateTopicsRequest(version=5, timeout_ms=10_000, validate_only=False, topics=[
            T(name=name, num_partitions=2, replication_factor=1, assignments=[],
              configs=[T.CreatableTopicConfig(name="retention.ms", value="12345")])
            for name in ("alice-hidden", "alice-seen")]), CreateTopicsResponse)
    finally:
        conn.close()
    by_name = {t.name: t for t in answer.topics}
    hidden, seen = by_name["alice-hidden"], by_name["alice-seen"]
    assert (hidden.error_code, hidden.topic_config_error_code, hidden.num_partitions, list(hidden.configs)) == (
        0, TOPIC_AUTHORIZATION_FAILED, -1, [])
    assert (seen.error_code, seen.topic_config_error_code, seen.num_partitions) == (0, 0, 2)
    assert {c.name: c.value for c in seen.configs}["retention.ms"] == "12345"
    # both were created, with their configs: the admin's client reads them back
    described = admin(server).describe_configs([ck.admin.ConfigResource("topic", "alice-hidden")])
    (future,) = described.values()
    assert future.result(timeout=10)["retention.ms"].value == "12345"


def test_a_fetch_v15_with_a_replica_id_needs_cluster_action(server):
    server.store.create_topic("t", 1)
    server.store.partition("t", 0).append(b"secret record")
    grant(server, binding(ResourceType.TOPIC, "t", "User:alice", AclOperation.READ))
    conn = Conn(server.address, "alice", USERS["alice"])
    try:
        F = FetchRequest.FetchTopic
        part = F.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                log_start_offset=-1, partition_max_bytes=1 << 20)
        topic_id = server.store.topic_id("t")
        state = FetchRequest.ReplicaState(replica_id=1, replica_epoch=-1)
        follower = conn.call(FetchRequest(version=15, replica_state=state, max_wait_ms=0, min_bytes=0,
                                          max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                                          topics=[F(topic_id=topic_id, partitions=[part])],
                                          forgotten_topics_data=[], rack_id=""), FetchResponse)
        consumer = conn.call(FetchRequest(version=15, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                                          isolation_level=0, session_id=0, session_epoch=-1,
                                          topics=[F(topic_id=topic_id, partitions=[part])],
                                          forgotten_topics_data=[], rack_id=""), FetchResponse)
    finally:
        conn.close()
    ((p,),) = [t.partitions for t in follower.responses]
    assert p.error_code == TOPIC_AUTHORIZATION_FAILED and not p.records
    ((p,),) = [t.partitions for t in consumer.responses]
    assert p.error_code == 0 and b"secret record" in bytes(p.records)


def test_find_coordinator_v0_under_an_authorizer_is_a_groups(server):
    grant(server, binding(ResourceType.GROUP, "alice-group", "User:alice", AclOperation.DESCRIBE))
    conn = Conn(server.address, "alice", USERS["alice"])
    try:
        allowed = conn.call(FindCoordinatorRequest[0]("alice-group"), FindCoordinatorResponse[0])
        denied = conn.call(FindCoordinatorRequest[0]("other-group"), FindCoordinatorResponse[0])
    finally:
        conn.close()
    assert (allowed.error_code, allowed.port) == (0, server.address[1])
    assert denied.error_code == 30  # GROUP_AUTHORIZATION_FAILED


def test_a_reserved_user_is_only_scram_never_an_oauthbearer_token(tmp_path):
    users = {"replica": "peer-secret", "alice": "alice-secret"}
    with KafkaServer(str(tmp_path / "store"), ("127.0.0.1", 0), sasl_credentials=users,
                     sasl_mechanisms=["SCRAM-SHA-256", "PLAIN", "OAUTHBEARER"],
                     sasl_oauthbearer={"sasl.oauthbearer.unsecured.validator.enable": "true"},
                     sasl_reserved_users=["replica"], authorizer=True, super_users=["User:replica"]) as srv:
        srv.store.create_topic("t", 1)

        def token_login(principal, timeout=8):
            client = ck.admin.AdminClient({
                "bootstrap.servers": srv.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
                "sasl.oauthbearer.config": f"principal={principal} lifeSeconds=600", "socket.timeout.ms": 5000})
            return client.list_topics(timeout=timeout)

        with pytest.raises(ck.KafkaException) as refused:
            token_login("replica", timeout=3)  # (a refused login waits out the timeout)
        assert refused.value.args[0].code() in (KafkaError._AUTHENTICATION, KafkaError._TRANSPORT,
                                                KafkaError._TIMED_OUT)
        assert token_login("olivia").topics == {}  # another principal logs in (and may describe nothing)

        def password_login(mechanism, timeout=8):
            client = ck.admin.AdminClient({
                "bootstrap.servers": srv.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": mechanism, "sasl.username": "replica", "sasl.password": users["replica"],
                "socket.timeout.ms": 5000})
            return client.list_topics(timeout=timeout)

        assert "t" in password_login("SCRAM-SHA-256").topics  # the reserved user, by SCRAM: a super user
        with pytest.raises(ck.KafkaException):
            password_login("PLAIN", timeout=3)


def kip848_server(tmp_path):
    from logstore.groups.consumergroup import ConsumerGroupConfig
    return serve(tmp_path / "store", consumer_group_config=ConsumerGroupConfig(heartbeat_interval_ms=500))


def consume_until(consumer, want, timeout=30.0):
    """(topic, partition) pairs read until ``want`` records or the timeout; the errors seen."""
    import time
    got, errors = [], []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            errors.append(msg.error())
            if msg.error().fatal() or msg.error().code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                break
        else:
            got.append((msg.topic(), msg.partition()))
    return got, errors


def test_a_kip848_regex_resolves_only_to_the_topics_the_member_may_describe(tmp_path):
    with kip848_server(tmp_path) as server:
        for name in ("work-a", "work-b", "secret-work"):
            server.store.create_topic(name, 1)
            server.store.partition(name, 0).append_batch([b"x"])
        grant(server, binding(ResourceType.GROUP, "g", "User:alice", AclOperation.READ),
              binding(ResourceType.TOPIC, "work-", "User:alice", AclOperation.READ,
                      pattern=ck.admin.ResourcePatternType.PREFIXED),
              binding(ResourceType.GROUP, "g", "User:bob", AclOperation.DESCRIBE),
              binding(ResourceType.TOPIC, "work-a", "User:bob", AclOperation.DESCRIBE))
        consumer = ck.Consumer({**ck_config(server, "alice"), "group.id": "g", "group.protocol": "consumer",
                                "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe(["^.*work.*"])
            got, errors = consume_until(consumer, 2)
            assert sorted(got) == [("work-a", 0), ("work-b", 0)], errors
            # the group as the super user sees it: only the topics alice may describe
            (future,) = admin(server).describe_consumer_groups(["g"]).values()
            described = future.result(timeout=10)
            assigned = {tp.topic for m in described.members for tp in m.assignment.topic_partitions}
            assert assigned == {"work-a", "work-b"}
            # bob may describe the group but not work-b, which it names: TOPIC_AUTHORIZATION_FAILED
            (future,) = admin(server, "bob").describe_consumer_groups(["g"]).values()
            with pytest.raises(ck.KafkaException) as refused:
                future.result(timeout=10)
            assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
            # granted later: the regex resolves to it at the member's next heartbeat
            grant(server, binding(ResourceType.TOPIC, "secret-work", "User:alice", AclOperation.READ))
            got, errors = consume_until(consumer, 1)
            assert got == [("secret-work", 0)], errors
        finally:
            consumer.close()


def test_a_kip848_subscription_naming_an_undescribable_topic_is_topic_authorization_failed(tmp_path):
    with kip848_server(tmp_path) as server:
        server.store.create_topic("secret", 1)
        server.store.partition("secret", 0).append_batch([b"hidden"])
        grant(server, binding(ResourceType.GROUP, "g", "User:alice", AclOperation.READ))
        consumer = ck.Consumer({**ck_config(server, "alice"), "group.id": "g", "group.protocol": "consumer",
                                "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe(["secret"])
            got, errors = consume_until(consumer, 1, timeout=15)
            assert got == []
            assert KafkaError.TOPIC_AUTHORIZATION_FAILED in [e.code() for e in errors]
        finally:
            consumer.close()
        # the coordinator gave no one the topic: the group has no assignment of it
        (future,) = admin(server).describe_consumer_groups(["g"]).values()
        described = future.result(timeout=10)
        assert not [tp for m in described.members for tp in m.assignment.topic_partitions]
