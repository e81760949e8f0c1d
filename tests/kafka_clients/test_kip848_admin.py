"""DeleteGroups and OffsetDelete of KIP-848 consumer groups through real clients: confluent-kafka's
AdminClient and kafka-python's KafkaAdminClient against a group of confluent-kafka consumers with
``group.protocol=consumer``. As Kafka's group coordinator: a consumer group with members is
NON_EMPTY_GROUP, an empty one is deleted with its records and offsets (and stays deleted after a
restart); OffsetDelete keeps the offsets of topics a member subscribes to (GROUP_SUBSCRIBED_TO_TOPIC)
and deletes the others."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, ConsumerGroupType, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaPythonTopicPartition
from kafka import errors as kafka_errors

from logstore.groups import consumerrecords
from logstore.groups.offsets import offset_store
from logstore.kafka.server import KafkaServer

# Kafka's error codes (org.apache.kafka.common.protocol.Errors), written out here on purpose.
NON_EMPTY_GROUP = 68


@pytest.fixture
def server(tmp_path):
    s = KafkaServer(str(tmp_path), ("127.0.0.1", 0)).start()
    s.store.create_topic("t", 2)
    s.store.create_topic("u", 1)
    yield s
    s.stop()


def member(server, group):
    """A confluent-kafka consumer of the consumer protocol subscribed to ``t``, polled until assigned."""
    c = Consumer({"bootstrap.servers": server.bootstrap_servers, "group.id": group, "group.protocol": "consumer",
                  "enable.auto.commit": False})
    c.subscribe(["t"])
    deadline = time.monotonic() + 30
    while not c.assignment():
        assert time.monotonic() < deadline, f"{group}: no assignment"
        c.poll(0.1)
    return c


def committed(admin, group):
    found = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    return {(tp.topic, tp.partition): tp.offset for tp in found.topic_partitions}


def consumer_records(store, group):
    """The live consumer group records of ``group`` in the store's ``__consumer_offsets``."""
    return [k for k in offset_store(store).consumer_group_records()
            if (consumerrecords.decode_key(k) or (0, None))[1] == group]


def test_a_consumer_group_is_deleted_only_when_empty_and_stays_deleted(server, tmp_path):
    admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
    c = member(server, "doomed")
    c.commit(offsets=[TopicPartition("t", 0, 4), TopicPartition("u", 0, 2)], asynchronous=False)
    with pytest.raises(KafkaException) as refused:
        admin.delete_consumer_groups(["doomed"])["doomed"].result(10)
    assert refused.value.args[0].code() == NON_EMPTY_GROUP
    c.close()  # the last member leaves: the group is empty, its records and offsets stay
    listed = {g.group_id: g.type for g in admin.list_consumer_groups().result(10).valid}
    assert listed["doomed"] == ConsumerGroupType.CONSUMER
    assert committed(admin, "doomed") == {("t", 0): 4, ("u", 0): 2}
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
    try:
        assert kp.delete_groups(["doomed"]) == {"doomed": "OK"}
        assert kp.delete_groups(["doomed"]) == {"doomed": kafka_errors.GroupIdNotFoundError.__name__}
    finally:
        kp.close()
    assert "doomed" not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    assert consumer_records(server.store, "doomed") == []
    server.stop()
    again = KafkaServer(str(tmp_path), ("127.0.0.1", 0)).start()
    try:
        admin = AdminClient({"bootstrap.servers": again.bootstrap_servers})
        assert "doomed" not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}
        assert committed(admin, "doomed") == {}
        assert consumer_records(again.store, "doomed") == []
        c = member(again, "doomed")  # the id starts a new group, from epoch 1
        c.close()
    finally:
        again.stop()


def test_offset_delete_keeps_the_subscribed_topics_offsets_and_deletes_the_others(server, tmp_path):
    admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
    c = member(server, "od")
    try:
        c.commit(offsets=[TopicPartition("t", 0, 3), TopicPartition("u", 0, 2)], asynchronous=False)
        kp = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
        try:
            results = kp.delete_group_offsets("od", [KafkaPythonTopicPartition("t", 0),
                                                     KafkaPythonTopicPartition("u", 0)])
            assert results == {KafkaPythonTopicPartition("t", 0): kafka_errors.GroupSubscribedToTopicError,
                               KafkaPythonTopicPartition("u", 0): kafka_errors.NoError}
        finally:
            kp.close()
        assert committed(admin, "od") == {("t", 0): 3}
    finally:
        c.close()
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
    try:  # the group is empty: nothing is subscribed any more
        assert kp.delete_group_offsets("od", [KafkaPythonTopicPartition("t", 0)]) == \
            {KafkaPythonTopicPartition("t", 0): kafka_errors.NoError}
    finally:
        kp.close()
    assert committed(admin, "od") == {}
    server.stop()
    again = KafkaServer(str(tmp_path), ("127.0.0.1", 0)).start()
    try:
        assert offset_store(again.store).group_offsets("od") == {}
        assert consumer_records(again.store, "od")  # the (empty) group itself stays
    finally:
        again.stop()
