"""Group administration and the newest classic group protocol versions through real clients:
confluent-kafka's AdminClient (list with states and types, describe, delete, alter and list
offsets), kafka-python's KafkaAdminClient (delete groups and offsets, list with filters,
several groups' offsets), aiokafka's admin client, kcat's group consumer, and kafka-python's
protocol classes on raw sockets for the versions no admin client sends (JoinGroup v9,
SyncGroup v5, OffsetFetch v8/v9 with several groups, FindCoordinator v4's batched keys). Every
result is read back through another client or the store, and what is deleted stays deleted
after a restart. Kafka's rules are those of its classic group coordinator (GroupMetadataManager,
ClassicGroup)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import struct
import subprocess
import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    Consumer,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaPythonTopicPartition
from kafka import errors as kafka_errors
from kafka.protocol.admin.groups import DescribeGroupsRequest, DescribeGroupsResponse, ListGroupsRequest, \
    ListGroupsResponse
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

from logstore.groups.offsets import offset_store
from logstore.kafka.server import KafkaServer

# Kafka's error codes (org.apache.kafka.common.protocol.Errors), written out here on purpose.
NONE, INVALID_REQUEST, INVALID_GROUP_ID, MEMBER_ID_REQUIRED = 0, 42, 24, 79
INCONSISTENT_GROUP_PROTOCOL, NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND = 23, 68, 69
KCAT = shutil.which("kcat") or shutil.which("kafkacat")


class Served:
    """A server over one directory, restartable on it (what survives a restart is read back)."""

    def __init__(self, root):
        self.root = root
        self.server = KafkaServer(root, ("127.0.0.1", 0), group_min_session_timeout_ms=100).start()
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})  # kept: its futures need it alive

    @property
    def bootstrap(self):
        return self.server.bootstrap_servers

    def restart(self):
        self.server.stop()
        self.server = KafkaServer(self.root, ("127.0.0.1", 0), group_min_session_timeout_ms=100).start()
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})

    def stop(self):
        self.server.stop()


@pytest.fixture
def served(tmp_path):
    s = Served(str(tmp_path))
    s.server.store.create_topic("t", 2)
    s.server.store.create_topic("u", 1)
    yield s
    s.stop()


def admin(served):
    return served.admin


def kafka_python_admin(served):
    return KafkaAdminClient(bootstrap_servers=served.bootstrap)


def consumer(served, group, topics, **extra):
    """A confluent-kafka consumer of ``topics`` in ``group``, polled until it has an assignment."""
    c = Consumer({"bootstrap.servers": served.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "session.timeout.ms": 30000, "heartbeat.interval.ms": 500, **extra})
    c.subscribe(topics)
    deadline = time.monotonic() + 30
    while not c.assignment():
        assert time.monotonic() < deadline, f"{group}: no assignment"
        c.poll(0.1)
    return c


def alter(served, group, *partitions):
    """Commit offsets as an admin (generation -1): confluent-kafka's alter_consumer_group_offsets."""
    done = admin(served).alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, list(partitions))])
    return done[group].result(10)


def listed(served, **filters):
    return {g.group_id: (g.state, g.type) for g in admin(served).list_consumer_groups(**filters).result(10).valid}


def committed(served, group):
    """A group's committed offsets as confluent-kafka lists them: {(topic, partition): (offset, leader epoch)}."""
    found = admin(served).list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    return {(tp.topic, tp.partition): (tp.offset, tp.leader_epoch) for tp in found.topic_partitions}


# ---------------------------------------------------------------------- ListGroups, DescribeGroups
def test_groups_are_listed_with_their_state_and_type_and_filtered(served):
    alter(served, "idle", TopicPartition("t", 0, 1))
    busy = consumer(served, "busy", ["t"])
    try:
        assert listed(served) == {"busy": (ConsumerGroupState.STABLE, ConsumerGroupType.CLASSIC),
                                  "idle": (ConsumerGroupState.EMPTY, ConsumerGroupType.CLASSIC)}
        assert set(listed(served, states={ConsumerGroupState.EMPTY})) == {"idle"}
        assert set(listed(served, states={ConsumerGroupState.STABLE, ConsumerGroupState.DEAD})) == {"busy"}
        assert set(listed(served, types={ConsumerGroupType.CLASSIC})) == {"busy", "idle"}
        assert listed(served, types={ConsumerGroupType.CONSUMER}) == {}
        kp = kafka_python_admin(served)
        try:  # ListGroups v5 read by another client
            groups = kp.list_groups(states_filter=["Stable"], types_filter=["classic"])
            assert [(g["group_id"], g["group_state"], g["group_type"], g["protocol_type"]) for g in groups] == \
                [("busy", "Stable", "classic", "consumer")]
            described = kp.describe_groups(["busy", "idle"])
            assert described["busy"]["group_state"] == "Stable" and len(described["busy"]["members"]) == 1
            assert described["idle"]["group_state"] == "Empty" and described["idle"]["members"] == []
        finally:
            kp.close()

        async def aiokafka_view():
            client = AIOKafkaAdminClient(bootstrap_servers=served.bootstrap)
            await client.start()
            try:
                return await client.list_consumer_groups(), await client.describe_consumer_groups(["busy"])
            finally:
                await client.close()

        groups, descriptions = asyncio.run(aiokafka_view())
        assert sorted(g[0] for g in groups) == ["busy", "idle"]
        assert [g[1:3] for d in descriptions for g in d.groups] == [("busy", "Stable")]  # (error, id, state, ...)
        described = admin(served).describe_consumer_groups(["busy"])["busy"].result(10)
        assert described.state == ConsumerGroupState.STABLE and len(described.members) == 1
    finally:
        busy.close()


def test_describing_an_unknown_group_v5_says_dead_and_v6_group_id_not_found(served):
    for version, error in ((5, NONE), (6, GROUP_ID_NOT_FOUND)):
        answer = exchange(served, DescribeGroupsRequest[version](groups=["nobody"], include_authorized_operations=True),
                          DescribeGroupsResponse)
        (group,) = answer.groups
        assert (group.group_id, group.group_state, group.error_code) == ("nobody", "Dead", error)
        # KIP-430: asked for, a described group (v5's dead one) gets the principal's operations;
        # without an authorizer every group operation (READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS,
        # ALTER_CONFIGS); a group answered with an error gets Kafka's "not asked" (None in kafka-python)
        assert group.authorized_operations == ({3, 6, 8, 10, 11} if error == NONE else None)


# ---------------------------------------------------------------------- DeleteGroups
def test_an_empty_group_is_deleted_with_its_offsets_and_a_restart_does_not_bring_it_back(served):
    c = consumer(served, "doomed", ["t"])
    c.commit(offsets=[TopicPartition("t", 0, 4), TopicPartition("t", 1, 2)], asynchronous=False)
    with pytest.raises(KafkaException) as refused:
        admin(served).delete_consumer_groups(["doomed"])["doomed"].result(10)
    assert refused.value.args[0].code() == NON_EMPTY_GROUP
    c.close()  # LeaveGroup: the group is empty, its offsets stay
    assert committed(served, "doomed") == {("t", 0): (4, None), ("t", 1): (2, None)}
    assert admin(served).delete_consumer_groups(["doomed"])["doomed"].result(10) is None
    with pytest.raises(KafkaException) as again:
        admin(served).delete_consumer_groups(["doomed"])["doomed"].result(10)
    assert again.value.args[0].code() == GROUP_ID_NOT_FOUND
    kp = kafka_python_admin(served)
    try:
        assert kp.list_group_offsets("doomed") == {"doomed": {}}
    finally:
        kp.close()
    served.restart()
    assert "doomed" not in listed(served)
    assert offset_store(served.server.store).group_offsets("doomed") == {}
    assert "doomed" not in offset_store(served.server.store).group_metadata()
    assert committed(served, "doomed") == {}


def test_kafka_python_deletes_groups_with_kafkas_errors(served):
    alter(served, "empty-one", TopicPartition("u", 0, 3))
    busy = consumer(served, "busy", ["u"])
    kp = kafka_python_admin(served)
    try:
        results = kp.delete_groups(["empty-one", "busy", "nobody"])
        assert results == {"empty-one": "OK", "busy": kafka_errors.NonEmptyGroupError.__name__,
                           "nobody": kafka_errors.GroupIdNotFoundError.__name__}
        assert kp.delete_groups([""]) == {"": kafka_errors.InvalidGroupIdError.__name__}
    finally:
        kp.close()
        busy.close()
    assert set(listed(served)) == {"busy"}  # empty now, not deleted
    assert committed(served, "empty-one") == {}


def test_kcat_groups_offsets_are_listed_and_deleted(served):
    if KCAT is None:
        pytest.skip("kcat is not installed (apt-get install kcat)")
    for p in range(2):
        served.server.store.partition("t", p).append_batch([b"%d-%d" % (p, i) for i in range(3)])
    done = subprocess.run([KCAT, "-b", served.bootstrap, "-G", "kcat-group", "t", "-o", "beginning", "-e",
                           "-X", "enable.auto.commit=true", "-X", "auto.commit.interval.ms=100"],
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert len(done.stdout.splitlines()) == 6
    assert listed(served)["kcat-group"] == (ConsumerGroupState.EMPTY, ConsumerGroupType.CLASSIC)
    assert committed(served, "kcat-group") == {("t", 0): (3, None), ("t", 1): (3, None)}
    kp = kafka_python_admin(served)
    try:
        assert kp.delete_groups(["kcat-group"]) == {"kcat-group": "OK"}
    finally:
        kp.close()
    assert offset_store(served.server.store).group_offsets("kcat-group") == {}


# ---------------------------------------------------------------------- OffsetDelete
def test_offsets_of_topics_the_group_does_not_consume_are_deleted_durably(served):
    c = consumer(served, "od", ["t"])
    try:
        c.commit(offsets=[TopicPartition("t", 0, 3), TopicPartition("u", 0, 2)], asynchronous=False)
        kp = kafka_python_admin(served)
        try:
            results = kp.delete_group_offsets("od", [KafkaPythonTopicPartition("t", 0),
                                                     KafkaPythonTopicPartition("u", 0)])
            assert results == {KafkaPythonTopicPartition("t", 0): kafka_errors.GroupSubscribedToTopicError,
                               KafkaPythonTopicPartition("u", 0): kafka_errors.NoError}
            with pytest.raises(kafka_errors.GroupIdNotFoundError):
                kp.delete_group_offsets("nobody", [KafkaPythonTopicPartition("u", 0)])
        finally:
            kp.close()
        assert c.committed([TopicPartition("t", 0), TopicPartition("u", 0)], 10)[0].offset == 3
        assert c.committed([TopicPartition("u", 0)], 10)[0].offset < 0  # none any more
    finally:
        c.close()
    served.restart()
    assert offset_store(served.server.store).group_offsets("od") == {("t", 0): (3, "")}


# ---------------------------------------------------------------------- offsets and leader epochs
def test_committed_leader_epochs_are_returned_by_every_client_and_survive_a_restart(served):
    alter(served, "ga", TopicPartition("t", 0, 5, leader_epoch=7), TopicPartition("t", 1, 6))
    alter(served, "gb", TopicPartition("u", 0, 1, leader_epoch=2))
    c = Consumer({"bootstrap.servers": served.bootstrap, "group.id": "gc", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("t", 0, 9, "meta", 3)], asynchronous=False)
    assert [(tp.offset, tp.leader_epoch) for tp in c.committed([TopicPartition("t", 0)], 10)] == [(9, 3)]
    c.close()
    served.restart()
    assert committed(served, "ga") == {("t", 0): (5, 7), ("t", 1): (6, None)}
    kp = kafka_python_admin(served)
    try:  # OffsetFetch v8: several groups in one request where the broker serves it
        found = kp.list_group_offsets(["ga", "gb", "gc"])
    finally:
        kp.close()
    assert {g: {(tp.topic, tp.partition): (o.offset, o.leader_epoch) for tp, o in parts.items()}
            for g, parts in found.items()} == {"ga": {("t", 0): (5, 7), ("t", 1): (6, -1)},
                                               "gb": {("u", 0): (1, 2)}, "gc": {("t", 0): (9, 3)}}

    async def aiokafka_view():
        client = AIOKafkaAdminClient(bootstrap_servers=served.bootstrap)
        await client.start()
        try:
            return await client.list_consumer_group_offsets("gc")
        finally:
            await client.close()

    got = asyncio.run(aiokafka_view())
    # librdkafka sends the metadata with its C string's terminating NUL
    assert {(tp.topic, tp.partition): (o.offset, o.metadata.rstrip("\x00")) for tp, o in got.items()} == \
        {("t", 0): (9, "meta")}


# ---------------------------------------------------------------------- raw requests of the newest versions
def exchange(served, message, response_class, correlation=5):
    """One kafka-python request on a new connection; its answer decoded by kafka-python."""
    message.with_header(correlation, "group-admin")
    with socket.create_connection(served.server.address, timeout=20) as sock:
        sock.sendall(message.encode(header=True, framed=True))
        (n,) = struct.unpack(">i", _exactly(sock, 4))
        answer = response_class[message.API_VERSION].decode(_exactly(sock, n), header=True)
    assert answer.header.correlation_id == correlation
    return answer


def _exactly(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "closed"
        buf += chunk
    return buf


def test_offset_fetch_v8_and_v9_answer_each_group_of_one_request(served):
    alter(served, "ga", TopicPartition("t", 0, 5, leader_epoch=7))
    alter(served, "gb", TopicPartition("u", 0, 1))
    Group, Topic = OffsetFetchRequest.OffsetFetchRequestGroup, OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics
    for version in (8, 9):
        groups = [Group(group_id="ga", topics=None), Group(group_id="gb", topics=[Topic(name="u", partition_indexes=[0])]),
                  Group(group_id="nobody", topics=[Topic(name="t", partition_indexes=[1])]),
                  Group(group_id="", topics=None)]
        answer = exchange(served, OffsetFetchRequest[version](groups=groups, require_stable=False), OffsetFetchResponse)
        got = {g.group_id: (g.error_code, [(t.name, p.partition_index, p.committed_offset, p.committed_leader_epoch)
                                           for t in g.topics for p in t.partitions]) for g in answer.groups}
        assert got == {"ga": (NONE, [("t", 0, 5, 7)]), "gb": (NONE, [("u", 0, 1, -1)]),
                       "nobody": (NONE, [("t", 1, -1, -1)]), "": (INVALID_GROUP_ID, [])}


def test_find_coordinator_v4_answers_each_key(served):
    for key_type in (0, 1):
        answer = exchange(served, FindCoordinatorRequest[4](key_type=key_type, coordinator_keys=["a", "b"]),
                          FindCoordinatorResponse)
        brokers = admin(served).list_topics(timeout=10).brokers  # Metadata's broker, read by librdkafka
        assert [(c.key, c.node_id, c.port, c.error_code) for c in answer.coordinators] == \
            [(k, b.id, b.port, NONE) for k in ("a", "b") for b in brokers.values()]
    answer = exchange(served, FindCoordinatorRequest[4](key_type=2, coordinator_keys=["s"]), FindCoordinatorResponse)
    assert [(c.key, c.error_code) for c in answer.coordinators] == [("s", INVALID_REQUEST)]


def test_a_group_formed_with_the_newest_classic_versions(served):
    """JoinGroup v9 (KIP-394's member id first, the reason, protocol type and name in the answer),
    SyncGroup v5 (protocol type and name checked and returned), Heartbeat v4, OffsetCommit and
    OffsetFetch v9, ListGroups v5, DescribeGroups v5, LeaveGroup v5 with a reason."""
    subscription = ConsumerProtocolSubscription(topics=["t"], user_data=None, version=0).encode()
    Protocol = JoinGroupRequest.JoinGroupRequestProtocol
    join = dict(group_id="newest", session_timeout_ms=10_000, rebalance_timeout_ms=10_000, group_instance_id=None,
                protocol_type="consumer", protocols=[Protocol(name="range", metadata=subscription)],
                reason="starting")
    first = exchange(served, JoinGroupRequest[9](member_id="", **join), JoinGroupResponse)
    assert first.error_code == MEMBER_ID_REQUIRED and first.member_id
    joined = exchange(served, JoinGroupRequest[9](member_id=first.member_id, **join), JoinGroupResponse)
    assert (joined.error_code, joined.protocol_type, joined.protocol_name, joined.leader, joined.skip_assignment) == \
        (NONE, "consumer", "range", first.member_id, False)
    assert [(m.member_id, m.metadata) for m in joined.members] == [(first.member_id, subscription)]
    member, generation = first.member_id, joined.generation_id
    Assignment = SyncGroupRequest.SyncGroupRequestAssignment
    sync = dict(group_id="newest", generation_id=generation, member_id=member, group_instance_id=None,
                assignments=[Assignment(member_id=member, assignment=b"mine")])
    wrong = exchange(served, SyncGroupRequest[5](protocol_type="consumer", protocol_name="sticky", **sync),
                     SyncGroupResponse)
    assert wrong.error_code == INCONSISTENT_GROUP_PROTOCOL
    synced = exchange(served, SyncGroupRequest[5](protocol_type="consumer", protocol_name="range", **sync),
                      SyncGroupResponse)
    assert (synced.error_code, synced.protocol_type, synced.protocol_name, synced.assignment) == \
        (NONE, "consumer", "range", b"mine")
    beat = exchange(served, HeartbeatRequest[4](group_id="newest", generation_id=generation, member_id=member,
                                                group_instance_id=None), HeartbeatResponse)
    assert beat.error_code == NONE
    CommitTopic = OffsetCommitRequest.OffsetCommitRequestTopic
    commit = exchange(served, OffsetCommitRequest[9](
        group_id="newest", generation_id_or_member_epoch=generation, member_id=member, group_instance_id=None,
        topics=[CommitTopic(name="t", partitions=[CommitTopic.OffsetCommitRequestPartition(
            partition_index=1, committed_offset=12, committed_leader_epoch=4, committed_metadata="m")])]),
        OffsetCommitResponse)
    assert [(p.partition_index, p.error_code) for t in commit.topics for p in t.partitions] == [(1, NONE)]
    Group = OffsetFetchRequest.OffsetFetchRequestGroup
    fetched = exchange(served, OffsetFetchRequest[9](groups=[Group(group_id="newest", member_id=member,
                                                                   member_epoch=-1, topics=None)]),
                       OffsetFetchResponse)
    assert [(p.partition_index, p.committed_offset, p.committed_leader_epoch, p.metadata)
            for g in fetched.groups for t in g.topics for p in t.partitions] == [(1, 12, 4, "m")]
    groups = exchange(served, ListGroupsRequest[5](states_filter=["Stable"], types_filter=["classic"]),
                      ListGroupsResponse)
    assert [(g.group_id, g.group_state, g.group_type) for g in groups.groups] == [("newest", "Stable", "classic")]
    described = exchange(served, DescribeGroupsRequest[5](groups=["newest"], include_authorized_operations=False),
                         DescribeGroupsResponse)
    assert [(g.group_state, [m.member_assignment for m in g.members]) for g in described.groups] == \
        [("Stable", [b"mine"])]
    Identity = LeaveGroupRequest.MemberIdentity
    left = exchange(served, LeaveGroupRequest[5](group_id="newest", members=[
        Identity(member_id=member, group_instance_id=None, reason="done")]), LeaveGroupResponse)
    assert (left.error_code, [m.error_code for m in left.members]) == (NONE, [NONE])
    assert committed(served, "newest") == {("t", 1): (12, 4)}


# ---------------------------------------------------------------------- static members (KIP-345)
def test_a_static_member_closed_without_leaving_gets_its_partitions_back_without_a_rebalance(served):
    """librdkafka's test 0102: a member with group.instance.id closes (a static member sends no
    LeaveGroup) and a new consumer with the same instance id joins within the session timeout:
    it gets the old assignment, the group stays at its generation and the other member sees no
    revocation."""
    served.server.store.create_topic("st", 4)
    events = {"a": [], "b": [], "a2": []}

    def static(name, instance_id):
        c = Consumer({"bootstrap.servers": served.bootstrap, "group.id": "statics",
                      "group.instance.id": instance_id, "session.timeout.ms": 30000,
                      "heartbeat.interval.ms": 300, "enable.auto.commit": False})
        c.subscribe(["st"], on_assign=lambda _, ps: events[name].append(("assign", sorted(p.partition for p in ps))),
                    on_revoke=lambda _, ps: events[name].append(("revoke", sorted(p.partition for p in ps))))
        return c

    a, b = static("a", "instance-a"), static("b", "instance-b")
    deadline = time.monotonic() + 30
    while not (len(a.assignment()) == 2 and len(b.assignment()) == 2):
        assert time.monotonic() < deadline, "no stable generation of two members"
        a.poll(0.1)
        b.poll(0.1)
    held = sorted(p.partition for p in a.assignment())
    generation = served.server._apis.groups.describe("statics")["generation"]
    b_events = list(events["b"])
    a.close()  # a static member: no LeaveGroup
    assert served.server._apis.groups.describe("statics")["state"] == "Stable"
    a2 = static("a2", "instance-a")
    try:
        deadline = time.monotonic() + 30
        while not a2.assignment():
            assert time.monotonic() < deadline, "the restarted static member got no assignment"
            a2.poll(0.1)
            b.poll(0.1)
        for _ in range(20):  # several heartbeats of b: a rebalance would reach it
            a2.poll(0.1)
            b.poll(0.1)
        assert sorted(p.partition for p in a2.assignment()) == held
        assert events["b"] == b_events  # no revocation, no new assignment
        described = admin(served).describe_consumer_groups(["statics"])["statics"].result(10)
        assert described.state == ConsumerGroupState.STABLE
        assert sorted(m.group_instance_id for m in described.members) == ["instance-a", "instance-b"]
        assert served.server._apis.groups.describe("statics")["generation"] == generation
    finally:
        a2.close()
        b.close()


def test_a_transactional_offset_commit_keeps_its_leader_epoch(served):
    """TxnOffsetCommit (confluent-kafka's send_offsets_to_transaction) stores the leader epoch
    with the offset too, applied at the COMMIT marker."""
    from confluent_kafka import Producer

    c = Consumer({"bootstrap.servers": served.bootstrap, "group.id": "txn-group", "enable.auto.commit": False})
    p = Producer({"bootstrap.servers": served.bootstrap, "transactional.id": "txn-epochs"})
    try:
        p.init_transactions(30)
        p.begin_transaction()
        p.produce("u", b"out")
        p.send_offsets_to_transaction([TopicPartition("t", 0, 7, leader_epoch=2)], c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
    finally:
        c.close()
    assert committed(served, "txn-group") == {("t", 0): (7, 2)}
