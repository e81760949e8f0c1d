"""kafka-python (a pure-Python Kafka client, independent of the server's codec) against a served
store: produce with every acks setting and codec, idempotent by default, consume with
assign/seek and offsets_for_times, admin create/delete, and the records as the library reads
them."""

from __future__ import annotations

import threading
import time

import pytest

from logstore import LogStore

kafka = pytest.importorskip("kafka")
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402
from kafka.admin import NewTopic  # noqa: E402
from kafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError  # noqa: E402


def producer(server, **options):
    return KafkaProducer(bootstrap_servers=server.bootstrap_servers, request_timeout_ms=10_000, **options)


def consume(server, topic, partition=0, start=0, count=None, timeout_s=10.0):
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap_servers, enable_auto_commit=False,
                             consumer_timeout_ms=1000)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        out = []
        deadline = time.monotonic() + timeout_s
        while (count is None or len(out) < count) and time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=500)
            for records in batch.values():
                out.extend(records)
            if count is None and not batch:
                break
        return out
    finally:
        consumer.close()


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_produce_with_every_acks_setting_and_consume(kafka_server, acks):
    p = producer(kafka_server, acks=acks)
    try:
        futures = [p.send("orders", key=b"k%d" % i, value=b"order-%d" % i, headers=[("h", b"%d" % i)],
                          timestamp_ms=1_700_000_000_000 + i) for i in range(50)]
        p.flush(10)
        if acks != 0:
            offsets = [f.get(10).offset for f in futures]
            assert offsets == list(range(50))
    finally:
        p.close()
    records = consume(kafka_server, "orders", count=50)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in records] == [
        (i, b"k%d" % i, b"order-%d" % i, 1_700_000_000_000 + i) for i in range(50)]
    assert [list(r.headers) for r in records][:2] == [[("h", b"0")], [("h", b"1")]]
    # The same records as the library reads them from the files.
    log = kafka_server.store.partition("orders", 0)
    assert [(r.offset, r.key, r.value) for r in log.iter()] == [(i, b"k%d" % i, b"order-%d" % i) for i in range(50)]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_every_codec_is_stored_as_sent_and_read_back(kafka_server, codec):
    p = producer(kafka_server, compression_type=codec, linger_ms=50)
    try:
        for i in range(200):
            p.send("compressed", value=b"value %d " % i * 10)
        p.flush(10)
    finally:
        p.close()
    records = consume(kafka_server, "compressed", count=200)
    assert [r.value for r in records] == [b"value %d " % i * 10 for i in range(200)]
    log = kafka_server.store.partition("compressed", 0)
    assert [r.value for r in log.iter()] == [b"value %d " % i * 10 for i in range(200)]


def test_records_appended_by_the_library_are_consumed_by_kafka_python(kafka_server):
    kafka_server.store.create_topic("from-library", 2)
    log = kafka_server.store.partition("from-library", 1)
    log.append_batch([b"a", b"b", b"c"], keys=[b"1", b"2", b"3"])
    records = consume(kafka_server, "from-library", partition=1, count=3)
    assert [(r.offset, r.key, r.value) for r in records] == [(0, b"1", b"a"), (1, b"2", b"b"), (2, b"3", b"c")]


def test_consume_from_an_offset_and_a_timestamp(kafka_server):
    p = producer(kafka_server)
    try:
        for i in range(20):
            p.send("timed", value=b"%d" % i, timestamp_ms=1_000_000 + i * 1000)
        p.flush(10)
    finally:
        p.close()
    assert [r.value for r in consume(kafka_server, "timed", start=15, count=5)] == [b"%d" % i for i in range(15, 20)]
    consumer = KafkaConsumer(bootstrap_servers=kafka_server.bootstrap_servers)
    try:
        tp = TopicPartition("timed", 0)
        found = consumer.offsets_for_times({tp: 1_000_000 + 7_500})
        assert (found[tp].offset, found[tp].timestamp) == (8, 1_008_000)  # the found record's own timestamp
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 20}
        assert consumer.offsets_for_times({tp: 10**13})[tp] is None
    finally:
        consumer.close()


def stored_batch_headers(log):
    """(baseOffset, producerId, producerEpoch, baseSequence, recordCount) of each stored batch, read
    from the raw bytes by Kafka's v2 batch layout (not through the server's own decoder)."""
    import struct

    raw = log.read_raw(0, 1 << 20)
    out, position = [], 0
    while position < len(raw):
        base_offset, length = struct.unpack_from(">qi", raw, position)
        assert raw[position + 16] == 2  # magic
        out.append((base_offset, *struct.unpack_from(">qhii", raw, position + 43)))
        position += 12 + length
    assert position == len(raw)
    return out


def test_a_default_producer_guesses_a_recent_broker_and_writes_idempotent_batches(kafka_server):
    """kafka-python 3.x guesses the broker version from the ApiVersions ranges: at least 2.1 or it
    would refuse zstd, at least 0.11 or it would quietly turn idempotence (on by default) off."""
    from kafka.net.compat import KafkaNetClient

    client = KafkaNetClient(bootstrap_servers=kafka_server.bootstrap_servers)
    try:
        assert client.check_version(node_id=0) >= (2, 1)
    finally:
        client.close()
    kafka_server.store.create_topic("idem-default", 1)
    producers = [producer(kafka_server), producer(kafka_server)]
    try:
        assert [(p.config["api_version"] >= (2, 1), p.config["enable_idempotence"], p.config["acks"])
                for p in producers] == [(True, True, -1)] * 2
        for i in range(3):
            for n, p in enumerate(producers):  # one batch per send: each waits for its answer
                assert p.send("idem-default", value=b"p%d-%d" % (n, i)).get(10).offset == 2 * i + n
    finally:
        for p in producers:
            p.close()
    headers = stored_batch_headers(kafka_server.store.partition("idem-default", 0))
    assert [h[0] for h in headers] == list(range(6)) and [h[4] for h in headers] == [1] * 6
    first, second = headers[0][1], headers[1][1]
    assert first >= 0 and second >= 0 and first != second  # a producer id each, never -1 (not idempotent)
    assert [h[1:4] for h in headers] == [(pid, 0, seq) for seq in range(3) for pid in (first, second)]


def test_the_session_scoped_server_fixture(kafka_server_session):
    """The shared server: a unique topic keeps this test apart from any other using it."""
    import uuid

    topic = f"session-{uuid.uuid4().hex}"
    p = producer(kafka_server_session)
    try:
        sent = p.send(topic, key=b"k", value=b"shared", timestamp_ms=1_700_000_000_000).get(10)
    finally:
        p.close()
    assert (sent.topic, sent.partition, sent.offset) == (topic, 0, 0)
    records = consume(kafka_server_session, topic, count=1)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in records] == [(0, b"k", b"shared", 1_700_000_000_000)]
    assert [r.value for r in kafka_server_session.store.partition(topic, 0).iter()] == [b"shared"]


def test_admin_creates_lists_and_deletes_topics_with_kafkas_errors(kafka_server):
    admin = KafkaAdminClient(bootstrap_servers=kafka_server.bootstrap_servers, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic("created", num_partitions=3, replication_factor=1,
                                      topic_configs={"retention.ms": "3600000"})])
        assert kafka_server.store.partitions_for("created") == 3
        assert kafka_server.store.partition("created", 0).config.retention_ms == 3_600_000
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("created", num_partitions=1, replication_factor=1)])
        assert "created" in admin.list_topics()
        admin.delete_topics(["created"])
        assert "created" not in kafka_server.store.topics()
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topics(["created"])
    finally:
        admin.close()


def test_a_store_served_while_the_library_uses_it(tmp_path):
    """The store stays usable by the library (another LogStore on the same directory) while served."""
    from logstore import KafkaServer

    with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as server:
        p = producer(server)
        try:
            p.send("shared", value=b"from kafka").get(10)
        finally:
            p.close()
        with LogStore(str(tmp_path)) as store:
            assert [r.value for r in store.partition("shared", 0).iter()] == [b"from kafka"]


def test_two_group_members_split_the_partitions_and_the_admin_sees_their_offsets(kafka_server):
    """A kafka-python member and a confluent-kafka one (two kafka-python consumers in one
    process sometimes stall in kafka-python 3.0.12 after a rebalance, with every answer sent)."""
    ck = pytest.importorskip("confluent_kafka")
    store = kafka_server.store
    store.create_topic("split", 4)
    got: dict[int, list[bytes]] = {0: [], 1: []}
    a = KafkaConsumer("split", bootstrap_servers=kafka_server.bootstrap_servers, group_id="pair",
                      enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=6000,
                      heartbeat_interval_ms=200)
    b = ck.Consumer({"bootstrap.servers": kafka_server.bootstrap_servers, "group.id": "pair",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                     "heartbeat.interval.ms": 200, "partition.assignment.strategy": "range"})
    b.subscribe(["split"])
    owned = {0: set(), 1: set()}
    split, done = threading.Event(), threading.Event()

    def settle():
        if len(owned[0]) == len(owned[1]) == 2 and not owned[0] & owned[1]:
            split.set()
        if sum(map(len, got.values())) >= 12:
            done.set()

    def run_a():  # each member polls on its own thread, as a service would
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not done.is_set():
            for records in a.poll(timeout_ms=1000).values():  # (a shorter poll: see examples/kafka_clients.py)
                got[0] += [r.value for r in records]
            owned[0] = {tp.partition for tp in a.assignment()}
            settle()
        a.commit()

    def run_b():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not done.is_set():
            m = b.poll(0.1)
            if m is not None and m.error() is None:
                got[1].append(m.value())
            owned[1] = {tp.partition for tp in b.assignment()}
            settle()
        b.commit(asynchronous=False)

    threads = [threading.Thread(target=run_a), threading.Thread(target=run_b)]
    try:
        for t in threads:
            t.start()
        assert split.wait(30), f"the two members never split the partitions: {owned}"
        for p in range(4):  # appended once the group is stable: no rebalance re-reads them
            store.partition("split", p).append_batch([b"%d-%d" % (p, i) for i in range(3)])
        for t in threads:
            t.join()
        assert owned[0] | owned[1] == {0, 1, 2, 3} and not owned[0] & owned[1]
        assert sorted(got[0] + got[1]) == sorted(b"%d-%d" % (p, i) for p in range(4) for i in range(3))
        admin = KafkaAdminClient(bootstrap_servers=kafka_server.bootstrap_servers)
        try:
            assert {"group_id": "pair", "protocol_type": "consumer", "group_state": "Stable",
                    "group_type": "classic"} in admin.list_groups()  # ListGroups v5
            described = admin.describe_groups(["pair"])["pair"]
            assert (described["error"], described["group_state"], described["protocol_data"]) == \
                (None, "Stable", "range")
            assignments = sorted(p for m in described["members"] for t in m["member_assignment"]["assigned_partitions"]
                                 for p in t["partitions"])
            assert assignments == [0, 1, 2, 3]
            assert {m["client_host"] for m in described["members"]} == {"/127.0.0.1"}
            assert len({m["client_id"] for m in described["members"]}) == 2
            offsets = admin.list_group_offsets({"pair": None})["pair"]
            assert {tp.partition: meta.offset for tp, meta in offsets.items()} == {0: 3, 1: 3, 2: 3, 3: 3}
        finally:
            admin.close()
    finally:
        a.close()
        b.close()
    assert [store.consumer("pair", ["split"]).committed("split", p) for p in range(4)] == [3, 3, 3, 3]


def test_describe_configs_with_synonyms(tmp_path):
    from kafka.admin import ConfigResource, ConfigResourceType

    from logstore.kafka.server import KafkaServer

    with LogStore(str(tmp_path), retention_ms=3_600_000) as store, KafkaServer(store, ("127.0.0.1", 0)) as server:
        store.create_topic("syn", 1, segment_bytes=1 << 20)
        admin = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
        try:
            found = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "syn")], include_synonyms=True,
                                           config_filter="all")
        finally:
            admin.close()
    configs = found["topic"]["syn"]
    assert configs["segment.bytes"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert [(s["name"], s["value"], s["source"]) for s in configs["segment.bytes"]["synonyms"]] == \
        [("segment.bytes", "1048576", "DYNAMIC_TOPIC_CONFIG"), ("log.segment.bytes", "1073741824", "DEFAULT_CONFIG")]
    assert configs["retention.ms"]["config_source"] == "STATIC_BROKER_CONFIG"  # the store's default
    assert [s["value"] for s in configs["retention.ms"]["synonyms"]] == ["3600000", "604800000"]
    assert configs["compression.zstd.level"]["value"] == "3" and configs["cleanup.policy"]["config_type"] == "LIST"
    assert "log.cleaner.dedupe.buffer.size" not in configs  # a broker setting in Kafka, not a topic's


def test_metrics_by_kafkas_names_and_as_prometheus_text(kafka_server):
    from logstore.metrics import prometheus_text

    p = producer(kafka_server)
    for i in range(5):
        p.send("metered", b"m%d" % i)
    p.flush()
    p.close()
    assert len(consume(kafka_server, "metered", count=5)) == 5
    metrics = kafka_server.metrics()
    assert metrics["kafka.network:type=RequestMetrics,name=RequestsPerSec,request=Produce"] >= 1
    assert metrics["kafka.network:type=RequestMetrics,name=RequestsPerSec,request=Fetch"] >= 1
    times = metrics["kafka.network:type=RequestMetrics,name=TotalTimeMs,request=Produce"]
    assert times.count >= 1 and times.sum >= 0
    assert metrics["kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec"][("metered", 0)] == 5
    assert metrics["kafka.server:type=socket-server-metrics,listener=kafka,name=request-total"] >= 4
    text = prometheus_text(metrics)
    assert '\nkafka_network_requestmetrics_requests_total{request="Produce"} ' in text
    assert 'kafka_network_requestmetrics_totaltimems_bucket{request="Fetch",le="+Inf"}' in text
    assert 'kafka_server_socket_server_metrics_request_total{listener="kafka"}' in text
    assert text.count("# TYPE kafka_network_requestmetrics_requests_total counter") == 1


@pytest.mark.parametrize("fsync_acks_all", [False, True])
def test_acks_all_means_fsynced_when_asked(tmp_path, fsync_acks_all):
    from logstore.kafka.server import KafkaServer

    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), fsync_acks_all=fsync_acks_all) as server:
        server.store.create_topic("durable", 1)
        p = producer(server, acks="all")
        for i in range(3):
            p.send("durable", b"d%d" % i).get(timeout=10)
        p.close()
        log = server.store.partition("durable", 0)
        assert log.log_end_offset == 3
        assert (log.recovery_point == 3) is fsync_acks_all  # fsynced before each answer, or left to the policy


def test_a_failed_fsync_is_a_storage_error_for_acks_all(tmp_path):
    from kafka.errors import KafkaError

    from logstore import _fileio
    from logstore._fileio import FileOps
    from logstore.kafka.server import KafkaServer

    class FailingSync(FileOps):
        def fsync(self, fd):
            raise OSError(5, "injected EIO")

        fdatasync = fsync

    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), fsync_acks_all=True) as server:
        server.store.create_topic("doomed", 1)
        p = producer(server, acks="all", retries=0, enable_idempotence=False)
        with _fileio.install(FailingSync()):
            with pytest.raises(KafkaError) as failure:
                p.send("doomed", b"x").get(timeout=10)
        p.close()
    assert "storage" in type(failure.value).__name__.lower() or "56" in str(failure.value)


def test_fetched_records_go_from_the_segment_file_to_the_socket_with_sendfile(kafka_server):
    from logstore import _fileio
    from logstore._fileio import FileOps

    kafka_server.store.create_topic("zero-copy", 1)
    log = kafka_server.store.partition("zero-copy", 0)
    log.append_batch([b"z" * 1000] * 500)
    stored = len(log.read_raw(0, 1 << 30))
    sent = []

    class Counting(FileOps):
        def sendfile(self, out_fd, in_fd, position, count):
            n = super().sendfile(out_fd, in_fd, position, count)
            sent.append(n)
            return n

    with _fileio.install(Counting()):
        got = consume(kafka_server, "zero-copy", count=500)
    assert [r.value for r in got] == [b"z" * 1000] * 500
    assert sum(sent) >= stored  # every batch byte went through sendfile


def test_a_long_poll_is_woken_by_appends_from_the_library_and_other_processes(tmp_path):
    """fetch_max_wait_ms of 10 s: records appended meanwhile by the library, in this process or
    in another one sharing the store, reach the consumer at once, not at the end of the wait."""
    import subprocess
    import sys

    from logstore.kafka.server import KafkaServer

    with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as server:
        server.store.create_topic("woken", 1)
        consumer = KafkaConsumer(bootstrap_servers=server.bootstrap_servers, enable_auto_commit=False,
                                 fetch_max_wait_ms=10_000, request_timeout_ms=30_000)
        tp = TopicPartition("woken", 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        try:
            consumer.poll(timeout_ms=300)  # the first fetch is now waiting on the server
            script = ("import sys; from logstore import LogStore\n"
                      "with LogStore(sys.argv[1], shared=True) as s: s.partition('woken', 0).append(b'from afar')")
            started = time.monotonic()
            subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=60)
            got = []
            while not got and time.monotonic() - started < 8:
                got = [r.value for records in consumer.poll(timeout_ms=200).values() for r in records]
            assert got == [b"from afar"] and time.monotonic() - started < 8
            started = time.monotonic()
            server.store.partition("woken", 0).append(b"from here")
            got = []
            while not got and time.monotonic() - started < 8:
                got = [r.value for records in consumer.poll(timeout_ms=200).values() for r in records]
            assert got == [b"from here"] and time.monotonic() - started < 2
        finally:
            consumer.close()
