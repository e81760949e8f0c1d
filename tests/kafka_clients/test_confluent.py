"""confluent-kafka (librdkafka) against a served store: idempotent and plain produce with every
codec and acks 0, 1 and all, consumption by assignment and seek, offsets for times, admin
create/delete."""

from __future__ import annotations

import time

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


def consume(server, topic, count, partition=0, start=0, timeout_s=15.0):
    c = Consumer({"bootstrap.servers": server.bootstrap_servers, "group.id": "unused", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, partition, start)])
        out = []
        deadline = time.monotonic() + timeout_s
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            out.append(m)
        return out
    finally:
        c.close()


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
@pytest.mark.parametrize("idempotent", [False, True])
def test_produce_and_consume_with_every_codec(kafka_server, codec, idempotent):
    p = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "compression.type": codec,
                  "enable.idempotence": idempotent, "acks": "all", "linger.ms": 5})
    delivered = []
    for i in range(300):
        p.produce("events", key=b"k%d" % (i % 7), value=b"event %d" % i, headers={"n": b"%d" % i},
                  on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert p.flush(15) == 0
    assert [err for err, _ in delivered if err is not None] == []
    assert sorted(o for _, o in delivered) == list(range(300))
    got = consume(kafka_server, "events", 300)
    assert [(m.offset(), m.key(), m.value()) for m in got] == [(i, b"k%d" % (i % 7), b"event %d" % i)
                                                                for i in range(300)]
    assert got[5].headers() == [("n", b"5")]
    log = kafka_server.store.partition("events", 0)
    assert [r.value for r in log.iter()] == [b"event %d" % i for i in range(300)]


@pytest.mark.parametrize("acks", [0, 1])
def test_plain_produce_with_acks_0_and_1(kafka_server, acks):
    """acks=0 gets no answer (no offsets reported back) but the records still arrive; acks=1
    reports each record's offset. Keys, headers and CreateTime timestamps are kept either way."""
    topic = f"acks-{acks}"
    kafka_server.store.create_topic(topic, 1)
    p = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "acks": acks, "enable.idempotence": False,
                  "linger.ms": 5})
    delivered = []
    for i in range(40):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"%d" % i)], timestamp=1_600_000_000_000 + i,
                  on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert p.flush(10) == 0
    assert [err for err, _ in delivered] == [None] * 40
    assert [o for _, o in delivered] == ([None] * 40 if acks == 0 else list(range(40)))
    log = kafka_server.store.partition(topic, 0)
    assert log.wait_for_append(39, timeout=10)  # acks=0: flush() returns once sent, not once stored
    assert [(r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in log.iter()] == \
        [(i, b"k%d" % i, b"v%d" % i, 1_600_000_000_000 + i, [("h", b"%d" % i)]) for i in range(40)]


def test_consume_from_an_assigned_offset_and_after_seek_with_the_produced_timestamps(kafka_server):
    p = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "linger.ms": 5})
    for i in range(30):
        p.produce("seeked", value=b"%d" % i, timestamp=1_650_000_000_000 + i * 1000)
    assert p.flush(10) == 0
    got = consume(kafka_server, "seeked", 5, start=12)
    assert [(m.offset(), m.value(), m.timestamp()) for m in got] == \
        [(i, b"%d" % i, (ck.TIMESTAMP_CREATE_TIME, 1_650_000_000_000 + i * 1000)) for i in range(12, 17)]
    c = Consumer({"bootstrap.servers": kafka_server.bootstrap_servers, "group.id": "unused",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition("seeked", 0, 0)])
        first = None
        deadline = time.monotonic() + 15
        while first is None and time.monotonic() < deadline:
            first = c.poll(0.5)
        assert first is not None and first.error() is None and first.offset() == 0
        c.seek(TopicPartition("seeked", 0, 25))  # back and forth on an assigned partition
        after = []
        deadline = time.monotonic() + 15
        while len(after) < 5 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                after.append(m)
        assert [(m.offset(), m.timestamp()) for m in after] == \
            [(i, (ck.TIMESTAMP_CREATE_TIME, 1_650_000_000_000 + i * 1000)) for i in range(25, 30)]
        assert c.position([TopicPartition("seeked", 0)])[0].offset == 30
    finally:
        c.close()


def test_unknown_partition_is_refused_and_nothing_is_written(kafka_server):
    kafka_server.store.create_topic("two", 2)
    p = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "message.timeout.ms": 3000})
    errors = []
    p.produce("two", value=b"x", partition=5, on_delivery=lambda err, msg: errors.append(err))
    p.flush(10)
    assert errors and errors[0] is not None and errors[0].code() == KafkaError._UNKNOWN_PARTITION
    assert [kafka_server.store.partition("two", i).log_end_offset for i in range(2)] == [0, 0]


def test_a_compacted_topic_refuses_the_keyless_records_of_a_batch_and_the_rest_may_be_sent_again(kafka_server):
    """A batch with keyless records to a compacted topic (made by AdminClient): librdkafka fails
    the keyless ones with INVALID_RECORD and, reading the answer's record_errors, the others
    with INVALID_DIFFERENT_RECORD; those, produced again, are written (read back by the store)."""
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap_servers})
    admin.create_topics([NewTopic("compacted", 1, 1, config={"cleanup.policy": "compact"})])["compacted"].result(10)
    p = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "linger.ms": 500, "retries": 0})
    outcomes = {}
    for i, key in enumerate([b"a", None, b"c", None]):
        p.produce("compacted", key=key, value=b"v%d" % i, partition=0,
                  on_delivery=lambda err, msg: outcomes.__setitem__(msg.value(), err and err.code()))
    p.flush(10)
    assert outcomes == {b"v0": KafkaError._INVALID_DIFFERENT_RECORD, b"v1": KafkaError.INVALID_RECORD,
                        b"v2": KafkaError._INVALID_DIFFERENT_RECORD, b"v3": KafkaError.INVALID_RECORD}
    assert kafka_server.store.partition("compacted", 0).log_end_offset == 0
    for value, key in [(b"v0", b"a"), (b"v2", b"c")]:
        p.produce("compacted", key=key, value=value, partition=0)
    assert p.flush(10) == 0
    assert [(r.key, r.value) for r in kafka_server.store.partition("compacted", 0).iter()] == \
        [(b"a", b"v0"), (b"c", b"v2")]


def test_offsets_for_times_and_watermarks(kafka_server):
    p = Producer({"bootstrap.servers": kafka_server.bootstrap_servers})
    for i in range(10):
        p.produce("ts", value=b"%d" % i, timestamp=5_000 + i * 100)
    p.flush(10)
    c = Consumer({"bootstrap.servers": kafka_server.bootstrap_servers, "group.id": "unused"})
    try:
        assert c.get_watermark_offsets(TopicPartition("ts", 0), timeout=10) == (0, 10)
        (found,) = c.offsets_for_times([TopicPartition("ts", 0, 5_450)], timeout=10)
        assert found.offset == 5
    finally:
        c.close()


def test_admin_create_and_delete(kafka_server):
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap_servers})
    admin.create_topics([NewTopic("admin-made", 4, 1)])["admin-made"].result(10)
    assert kafka_server.store.partitions_for("admin-made") == 4
    with pytest.raises(ck.KafkaException) as info:
        admin.create_topics([NewTopic("admin-made", 1, 1)])["admin-made"].result(10)
    assert info.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    with pytest.raises(ck.KafkaException) as info:
        admin.create_topics([NewTopic("replicated", 1, 3)])["replicated"].result(10)
    assert info.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
    admin.delete_topics(["admin-made"])["admin-made"].result(10)
    assert "admin-made" not in kafka_server.store.topics()


def test_a_group_consumer_commits_what_the_library_reads_and_resumes_from_the_librarys_commits(kafka_server):
    store = kafka_server.store
    store.create_topic("grouped", 2)
    for p in range(2):
        store.partition("grouped", p).append_batch([b"first %d-%d" % (p, i) for i in range(5)])
    config = {"bootstrap.servers": kafka_server.bootstrap_servers, "group.id": "cg", "enable.auto.commit": False,
              "auto.offset.reset": "earliest", "session.timeout.ms": 6000}
    c = Consumer(config)
    c.subscribe(["grouped"])
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 10 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.commit(asynchronous=False)
    c.close()  # LeaveGroup
    assert sorted(got) == sorted(b"first %d-%d" % (p, i) for p in range(2) for i in range(5))
    library = store.consumer("cg", ["grouped"], enable_auto_commit=False)
    assert [library.committed("grouped", p) for p in range(2)] == [5, 5]
    for p in range(2):
        store.partition("grouped", p).append(b"second %d" % p)
    seen = []
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        seen += [r.value for r in library.poll(timeout=0.5)]
    assert sorted(seen) == [b"second 0", b"second 1"]  # resumed where the Kafka client committed
    library.commit()
    library.close()
    c = Consumer(config)
    c.subscribe(["grouped"])
    store.partition("grouped", 0).append(b"third")
    deadline = time.monotonic() + 20
    m = None
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            break
    c.close()
    assert m is not None and m.value() == b"third"  # not "second 0": resumed from the library's commit


def test_admin_lists_and_describes_groups(kafka_server):
    kafka_server.store.create_topic("listed", 1)
    c = Consumer({"bootstrap.servers": kafka_server.bootstrap_servers, "group.id": "described",
                  "session.timeout.ms": 6000})
    c.subscribe(["listed"])
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap_servers})
    try:
        deadline = time.monotonic() + 20
        while not c.assignment() and time.monotonic() < deadline:
            c.poll(0.2)
        listed = admin.list_consumer_groups().result(timeout=10)
        assert "described" in {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups(["described"])["described"].result(timeout=10)
        assert str(described.state).endswith("STABLE") and len(described.members) == 1
        assert [tp.partition for tp in described.members[0].assignment.topic_partitions] == [0]
    finally:
        c.close()


def test_describe_configs_marks_the_topics_own_settings_and_kafkas_defaults(kafka_server):
    from confluent_kafka.admin import ConfigResource, ConfigSource

    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap_servers})
    created = admin.create_topics([NewTopic("configured", 1, 1, config={"retention.ms": "1234",
                                                                         "cleanup.policy": "compact"})])
    created["configured"].result(timeout=10)
    resource = ConfigResource("topic", "configured")
    entries = admin.describe_configs([resource])[resource].result(timeout=10)
    assert (entries["retention.ms"].value, entries["retention.ms"].source) == \
        ("1234", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert entries["cleanup.policy"].value == "compact" and not entries["cleanup.policy"].is_default
    assert (entries["segment.bytes"].value, entries["segment.bytes"].is_default) == ("1073741824", True)
    assert entries["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries["max.message.bytes"].value == "1048588"
    missing = ConfigResource("topic", "no-such-topic")
    with pytest.raises(ck.KafkaException) as failure:
        admin.describe_configs([missing])[missing].result(timeout=10)
    assert failure.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    broker = ConfigResource("broker", "0")
    settings = admin.describe_configs([broker])[broker].result(timeout=10)
    assert settings["num.partitions"].value == "1" and settings["auto.create.topics.enable"].value == "true"


def test_the_cli_reads_what_confluent_kafka_produced(kafka_server):
    import json
    import subprocess
    import sys

    p = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "compression.type": "lz4", "linger.ms": 10})
    for i in range(50):
        p.produce("cli-read", key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"x")])
    assert p.flush(10) == 0
    done = subprocess.run([sys.executable, "-m", "logstore", "consume", kafka_server.store.root, "cli-read",
                           "--from-beginning", "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["offset"], r["key"], r["value"]) for r in records] == [(i, f"k{i}", f"v{i}") for i in range(50)]
