"""Tiered storage through the Kafka server, over a local directory and a real S3 server
(SeaweedFS): ``logstore serve --remote-storage``, a tiered topic's configs through admin clients
(confluent-kafka, kafka-python, aiokafka) with Kafka's errors for what the store refuses, every
consumer (librdkafka, kafka-python, aiokafka, kcat) reading a tiered topic from offset 0 across
the boundary between remote and local segments, read_committed over an aborted transaction in
the remote part, ListOffsets -2/-4/-3 and a timestamp in the remote part,
``remote.fetch.max.wait.ms`` with a frozen object store, and the object store stopped while the
store tiers: appends and local reads go on, remote reads fail with an error code (the connection
stays up), copies resume when it is back and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from logstore import LogStore
from logstore.errors import RemoteStorageError
from logstore.kafka.server import KafkaServer
from logstore.tiered.storage import RemoteStorageManager

from .conftest import seaweedfs_or_skip

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,  # noqa: E402
                                   NewTopic, OffsetSpec)

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
N = 400
#: a topic whose sealed segments all go to the remote tier (only the active one stays local)
TIERED = {"remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.bytes": "0",
          "retention.ms": "-1"}
NONE, UNKNOWN_SERVER_ERROR = 0, -1


# ---------------------------------------------------------------------- fixtures and helpers
@pytest.fixture(params=["file", "s3"])
def remote(request, tmp_path):
    """(url, options) of an empty object store: a local directory, or a SeaweedFS bucket."""
    if request.param == "file":
        return f"file://{tmp_path}/remote", {}
    server = request.getfixturevalue("s3_server")
    return request.getfixturevalue("s3_bucket"), server.options()


def serve(root, url, options, **store_options):
    return KafkaServer(str(root), ("127.0.0.1", 0), store_options=dict(
        remote_storage=url, remote_storage_options=options, remote_log_manager_task_interval_ms=3_600_000,
        **store_options))


@pytest.fixture
def served(remote, tmp_path):
    url, options = remote
    server = serve(tmp_path / "data", url, options)
    yield server
    server.stop()


def create(server, topic, configs=TIERED, partitions=1):
    admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, partitions, 1, config=dict(configs))]).values():
        future.result(20)


def expected_records(n=N, start=0):
    now = int(time.time() * 1000) - 10 * n
    return [(i, b"key-%d" % i, b"value-%05d-" % i + b"x" * (i % 50), [("h", b"%d" % i)], now + i)
            for i in range(start, start + n)]


def produce(server, topic, records, partition=0):
    producer = Producer({"bootstrap.servers": server.bootstrap_servers, "linger.ms": 0, "acks": "all"})
    for n, (_, key, value, headers, ts) in enumerate(records):
        producer.produce(topic, key=key, value=value, headers=headers, timestamp=ts, partition=partition)
        if n % 20 == 19:
            assert producer.flush(20) == 0  # (many small batches: many segments)
    assert producer.flush(20) == 0


def tier(server, topic, partition=0):
    """Copy the sealed segments to the remote tier and drop them locally: the log's start stays
    0, its local start moves up."""
    done = server.store.run_maintenance()
    log = server.store.partition(topic, partition)
    assert done["remote_errors"] == 0 and done["remote_segments_copied"] > 0
    assert log.log_start_offset == 0 and log.local_log_start_offset > 0
    return log.local_log_start_offset


def tiered_topic(server, topic="tiered"):
    records = expected_records()
    create(server, topic)
    produce(server, topic, records)
    boundary = tier(server, topic)
    assert 0 < boundary < N
    return records


def confluent_read(server, topic, n, start=0, **config):
    consumer = Consumer({"bootstrap.servers": server.bootstrap_servers, "group.id": "confluent",
                         "enable.auto.commit": False, **config})
    consumer.assign([TopicPartition(topic, 0, start)])
    out, deadline = [], time.monotonic() + 60
    try:
        while len(out) < n and time.monotonic() < deadline:
            m = consumer.poll(1)
            if m is None or m.error():
                continue
            out.append((m.offset(), m.key(), m.value(), m.headers() or [], m.timestamp()[1]))
    finally:
        consumer.close()
    return out


def kafka_python_read(server, topic, n):
    kafka = pytest.importorskip("kafka")
    consumer = kafka.KafkaConsumer(bootstrap_servers=server.bootstrap_servers, enable_auto_commit=False,
                                   consumer_timeout_ms=20_000)
    tp = kafka.TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    out = []
    try:
        for m in consumer:
            out.append((m.offset, m.key, m.value, [(k, v) for k, v in m.headers], m.timestamp))
            if len(out) == n:
                break
    finally:
        consumer.close()
    return out


def aiokafka_read(server, topic, n):
    aiokafka = pytest.importorskip("aiokafka")

    async def run():
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=server.bootstrap_servers, enable_auto_commit=False)
        await consumer.start()
        tp = aiokafka.TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        out = []
        try:
            deadline = time.monotonic() + 60
            while len(out) < n and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=1000)).values():
                    out.extend((m.offset, m.key, m.value, [(k, v) for k, v in m.headers], m.timestamp)
                               for m in batch)
        finally:
            await consumer.stop()
        return out
    return asyncio.run(run())


def kcat_read(server, topic, n):
    out = subprocess.run([KCAT, "-C", "-b", server.bootstrap_servers, "-t", topic, "-p", "0", "-o", "0",
                          "-c", str(n), "-e", "-q", "-f", "%o\t%k\t%s\t%h\t%T\n"],
                         capture_output=True, timeout=60, check=True).stdout
    records = []
    for line in out.decode().splitlines():
        offset, key, value, headers, ts = line.split("\t")
        name, _, header = headers.partition("=")
        records.append((int(offset), key.encode(), value.encode(), [(name, header.encode())], int(ts)))
    return records


class Wire:
    """One connection speaking kafka-python's request classes (kept open across requests)."""

    def __init__(self, server):
        self.sock = socket.create_connection(server.address, timeout=30)
        self.correlation = 0

    def call(self, request, response_class):
        self.correlation += 1
        request.with_header(self.correlation, "tiered-tests")
        self.sock.sendall(request.encode(header=True, framed=True))
        (size,) = struct.unpack(">i", self._exactly(4))
        answer = response_class[request.API_VERSION].decode(self._exactly(size), header=True)
        assert answer.header.correlation_id == self.correlation
        return answer

    def _exactly(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "the server closed the connection"
            buf += chunk
        return buf

    def fetch(self, wanted, max_wait_ms=0):
        """{(topic, partition): PartitionData} of one Fetch v11 of ``wanted`` ({(topic, partition): offset})."""
        from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

        topics = {}
        for (topic, partition), offset in wanted.items():
            topics.setdefault(topic, []).append(FetchRequest.FetchTopic.FetchPartition(
                partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20))
        ask = FetchRequest[11](replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 22,
                               isolation_level=0, session_id=0, session_epoch=-1,
                               topics=[FetchRequest.FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()],
                               forgotten_topics_data=[], rack_id="")
        answer = self.call(ask, FetchResponse)
        assert answer.error_code == NONE
        return {(t.topic, p.partition_index): p for t in answer.responses for p in t.partitions}

    def list_offset(self, topic, timestamp, version=8):
        from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse

        T = ListOffsetsRequest.ListOffsetsTopic
        ask = ListOffsetsRequest[version](replica_id=-1, isolation_level=0, topics=[T(name=topic, partitions=[
            T.ListOffsetsPartition(partition_index=0, timestamp=timestamp, current_leader_epoch=-1)])])
        [p] = self.call(ask, ListOffsetsResponse).topics[0].partitions
        return p.error_code, p.offset, p.timestamp

    def close(self):
        self.sock.close()


def offsets_of(records_bytes):
    """The record offsets of a fetch's batches (kafka-python's decoder)."""
    from kafka.record import MemoryRecords

    out = []
    batches = MemoryRecords(bytes(records_bytes or b""))
    while batches.has_next():
        batch = batches.next_batch()
        out.extend(r.offset for r in batch)
    return out


# ---------------------------------------------------------------------- consumers
def test_every_consumer_reads_a_tiered_topic_from_0_across_the_remote_local_boundary(served, remote, tmp_path):
    records = tiered_topic(served)
    assert confluent_read(served, "tiered", N) == records
    assert kafka_python_read(served, "tiered", N) == records
    assert aiokafka_read(served, "tiered", N) == records
    if KCAT:
        assert kcat_read(served, "tiered", N) == records
    log = served.store.partition("tiered", 0)
    assert [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in log.iter()] == records
    # a new server over the same directory (the remote tier remembered, its options given again)
    served.stop()
    url, options = remote
    again = serve(tmp_path / "data", url, options)
    try:
        assert again.store.partition("tiered", 0).local_log_start_offset > 0
        assert confluent_read(again, "tiered", N) == records
    finally:
        again.stop()


def test_read_committed_skips_an_aborted_transaction_in_the_remote_part(served):
    create(served, "txn")
    bs = served.bootstrap_servers
    producer = Producer({"bootstrap.servers": bs, "transactional.id": "tiered-txn", "linger.ms": 0})
    producer.init_transactions(20)
    expected = []
    for round_ in range(6):
        producer.begin_transaction()
        for i in range(30):
            producer.produce("txn", key=b"r%d" % round_, value=b"round-%d-%03d" % (round_, i) + b"y" * 40)
            if i % 10 == 9:
                producer.flush(20)
        if round_ == 2:
            producer.abort_transaction(20)
        else:
            producer.commit_transaction(20)
            expected.extend(b"round-%d-%03d" % (round_, i) + b"y" * 40 for i in range(30))
    plain = Producer({"bootstrap.servers": bs, "linger.ms": 0})
    for i in range(60):  # the transactions' segments sealed and tiered
        plain.produce("txn", value=b"after-%03d" % i + b"z" * 60)
        plain.flush(20)
    expected.extend(b"after-%03d" % i + b"z" * 60 for i in range(60))
    boundary = tier(served, "txn")
    log = served.store.partition("txn", 0)
    [aborted] = log.aborted_transactions(0, log.high_watermark)
    assert aborted.last_offset < boundary  # the aborted transaction is in the remote part
    committed = confluent_read(served, "txn", len(expected), **{"isolation.level": "read_committed"})
    assert [value for _, _, value, _, _ in committed] == expected
    uncommitted = confluent_read(served, "txn", len(expected) + 30, **{"isolation.level": "read_uncommitted"})
    assert sum(1 for _, key, _, _, _ in uncommitted if key == b"r2") == 30
    kafka = pytest.importorskip("kafka")
    consumer = kafka.KafkaConsumer(bootstrap_servers=bs, isolation_level="read_committed",
                                   enable_auto_commit=False, consumer_timeout_ms=20_000)
    consumer.assign([kafka.TopicPartition("txn", 0)])
    consumer.seek_to_beginning()
    try:
        values = []
        for m in consumer:
            values.append(m.value)
            if len(values) == len(expected):
                break
    finally:
        consumer.close()
    assert values == expected


def test_list_offsets_of_a_tiered_topic(served):
    records = tiered_topic(served)
    boundary = served.store.partition("tiered", 0).local_log_start_offset
    admin = AdminClient({"bootstrap.servers": served.bootstrap_servers})
    tp = TopicPartition("tiered", 0)

    def listed(spec):
        return admin.list_offsets({tp: spec})[tp].result(20)

    assert listed(OffsetSpec.earliest()).offset == 0  # -2: the remote tier's start
    assert listed(OffsetSpec.latest()).offset == N
    newest = listed(OffsetSpec.max_timestamp())  # -3
    assert (newest.offset, newest.timestamp) == (N - 1, records[-1][4])
    in_remote = records[7]
    found = listed(OffsetSpec.for_timestamp(in_remote[4]))
    assert (found.offset, found.timestamp) == (7, in_remote[4])
    kafka = pytest.importorskip("kafka")
    consumer = kafka.KafkaConsumer(bootstrap_servers=served.bootstrap_servers)
    try:
        ktp = kafka.TopicPartition("tiered", 0)
        assert consumer.offsets_for_times({ktp: records[11][4]})[ktp].offset == 11
        assert consumer.beginning_offsets([ktp])[ktp] == 0
    finally:
        consumer.close()
    wire = Wire(served)
    try:
        assert wire.list_offset("tiered", -4)[:2] == (NONE, boundary)  # KIP-1005: the local start
        assert wire.list_offset("tiered", -2)[:2] == (NONE, 0)
        assert wire.list_offset("tiered", records[3][4])[:2] == (NONE, 3)
    finally:
        wire.close()


# ---------------------------------------------------------------------- configs through admin clients
def broker_configs(server):
    """The broker's configs by confluent-kafka's DescribeConfigs: {name: value}."""
    admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
    [future] = admin.describe_configs([ConfigResource("broker", str(server.node_id))]).values()
    return {name: entry.value for name, entry in future.result(20).items()}


def test_tiered_topic_configs_through_admin_clients_and_kafkas_errors(tmp_path):
    pytest.importorskip("kafka")
    from kafka.admin import ConfigResource as KPResource, ConfigResourceType, KafkaAdminClient, NewTopic as KPNewTopic
    from kafka.errors import InvalidConfigurationError

    plain = KafkaServer(str(tmp_path / "plain"), ("127.0.0.1", 0))
    try:  # a store without an object store refuses remote.storage.enable: INVALID_CONFIG, the store's message
        admin = AdminClient({"bootstrap.servers": plain.bootstrap_servers})
        for validate_only in (True, False):
            [future] = admin.create_topics([NewTopic("t", 1, 1, config={"remote.storage.enable": "true"})],
                                           validate_only=validate_only).values()
            with pytest.raises(KafkaException) as refused:
                future.result(20)
            assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
            assert "remote_storage" in refused.value.args[0].str()
        assert "t" not in plain.store.topics()
        create(plain, "local", {})
        [future] = admin.incremental_alter_configs([ConfigResource("topic", "local", incremental_configs=[
            ConfigEntry("remote.storage.enable", "true", incremental_operation=AlterConfigOpType.SET)])]).values()
        with pytest.raises(KafkaException) as refused:
            future.result(20)
        assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
        assert broker_configs(plain)["remote.log.storage.system.enable"] == "false"
    finally:
        plain.stop()

    server = serve(tmp_path / "data", f"file://{tmp_path}/remote", {}, remote_fetch_max_wait_ms=700)
    try:
        broker = broker_configs(server)
        assert broker["remote.log.storage.system.enable"] == "true"
        assert broker["remote.fetch.max.wait.ms"] == "700"
        assert broker["remote.log.manager.task.interval.ms"] == "3600000"
        admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
        [future] = admin.create_topics([NewTopic("compacted", 1, 1, config={
            "remote.storage.enable": "true", "cleanup.policy": "compact"})]).values()
        with pytest.raises(KafkaException) as refused:
            future.result(20)
        assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
        assert "cleanup.policy" in refused.value.args[0].str()
        kp = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
        try:
            with pytest.raises(InvalidConfigurationError):  # local retention above the total
                kp.create_topics([KPNewTopic("t", 1, 1, topic_configs={
                    "remote.storage.enable": "true", "retention.ms": "1000", "local.retention.ms": "5000"})])
            create(server, "tiered")
            create(server, "later", {"segment.bytes": "4096", "retention.ms": "-1"})
            # turned on afterwards (kafka-python's AlterConfigs), with a local retention
            kp.alter_configs([KPResource(ConfigResourceType.TOPIC, "later", configs={
                "remote.storage.enable": "true", "segment.bytes": "4096", "retention.ms": "-1",
                "local.retention.bytes": "0"})])
        finally:
            kp.close()
        # turning it off is refused (the older segments are only remote)
        [future] = admin.incremental_alter_configs([ConfigResource("topic", "tiered", incremental_configs=[
            ConfigEntry("remote.storage.enable", "false", incremental_operation=AlterConfigOpType.SET)])]).values()
        with pytest.raises(KafkaException) as refused:
            future.result(20)
        assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
        assert "cannot be turned off" in refused.value.args[0].str()
        [future] = admin.incremental_alter_configs([ConfigResource("topic", "tiered", incremental_configs=[
            ConfigEntry("local.retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)])]).values()
        future.result(20)
        produce(server, "later", expected_records(200))
        tier(server, "later")
        assert len(confluent_read(server, "later", 200)) == 200
    finally:
        server.stop()

    # read back by aiokafka's admin client, from a new server over the same directory
    pytest.importorskip("aiokafka")
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource as AioResource, ConfigResourceType as AioType

    again = serve(tmp_path / "data", f"file://{tmp_path}/remote", {})

    async def described():
        client = AIOKafkaAdminClient(bootstrap_servers=again.bootstrap_servers)
        await client.start()
        try:
            return await client.describe_configs([AioResource(AioType.TOPIC, name) for name in ("tiered", "later")])
        finally:
            await client.close()
    try:
        configs = {}
        for response in asyncio.run(described()):
            for resource in response.to_object()["resources"]:
                configs[resource["resource_name"]] = {e["config_names"]: e["config_value"]
                                                      for e in resource["config_entries"]}
        assert configs["tiered"]["remote.storage.enable"] == "true"
        assert configs["tiered"]["local.retention.ms"] == "60000"
        assert configs["tiered"]["local.retention.bytes"] == "0"
        assert configs["later"]["remote.storage.enable"] == "true"
    finally:
        again.stop()


def test_logstore_serve_tiers_into_the_object_store_its_options_name(s3_server, tmp_path):
    """``logstore serve --remote-storage s3://bucket`` with the endpoint as an option and the
    credentials from the environment (as the AWS tools read them)."""
    kafka = pytest.importorskip("kafka")
    bucket = s3_server.create_bucket()
    root = tmp_path / "store"
    env = dict(os.environ, **s3_server.environment())
    proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", str(root), "--listen", "127.0.0.1:0",
                             "--remote-storage", f"s3://{bucket}", "--remote-storage-option",
                             f"endpoint={s3_server.endpoint}", "--remote-log-manager-task-interval-ms", "200",
                             "--remote-fetch-max-wait-ms", "2000", "--remote-log-index-cache-size-bytes", "1000000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), (line, proc.stderr.read() if proc.poll() is not None else "")
        bootstrap = line.split(" on ")[1].strip()
        from kafka.admin import KafkaAdminClient, NewTopic as KPNewTopic

        kp = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            kp.create_topics([KPNewTopic("served", 1, 1, topic_configs=TIERED)])
        finally:
            kp.close()
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
        try:
            for i in range(300):
                producer.send("served", key=b"k%d" % i, value=b"v%05d" % i * 8)
                if i % 20 == 19:
                    producer.flush()
            producer.flush()
        finally:
            producer.close()
        server = type("Served", (), {"address": ("127.0.0.1", int(bootstrap.rsplit(":", 1)[1]))})()
        wire = Wire(server)
        try:  # the background task copies within a few of its 200 ms rounds
            deadline = time.monotonic() + 60
            while wire.list_offset("served", -4)[1] <= 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert wire.list_offset("served", -4)[1] > 0
        finally:
            wire.close()
        consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                       consumer_timeout_ms=20_000)
        consumer.assign([kafka.TopicPartition("served", 0)])
        consumer.seek_to_beginning()
        try:
            values = [m.value for _, m in zip(range(300), consumer)]
        finally:
            consumer.close()
        assert values == [b"v%05d" % i * 8 for i in range(300)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # the store remembers its object store (not the credentials: those stay in the environment)
    assert f"s3://{bucket}" in (root / ".remote-storage").read_text()
    with LogStore(str(root), remote_storage_options=s3_server.options()) as store:
        log = store.partition("served", 0)
        assert log.local_log_start_offset > 0
        assert [r.value for r in log.iter()] == [b"v%05d" % i * 8 for i in range(300)]


# ---------------------------------------------------------------------- the object store over S3
def test_the_store_round_trip_over_s3_every_library_reader(s3_server, s3_bucket, tmp_path):
    records = expected_records(600)
    with LogStore(str(tmp_path / "data"), maintenance=False, remote_storage=s3_bucket,
                  remote_storage_options=s3_server.options()) as store:
        store.create_topic("t", 1, segment_bytes=4096, remote_storage_enable=True, local_retention_bytes=0,
                           retention_ms=-1)
        log = store.partition("t", 0)
        for offset, key, value, headers, ts in records:
            log.append(value, key=key, headers=headers, timestamp=ts)
        done = store.run_maintenance()
        assert done["remote_errors"] == 0 and done["remote_segments_copied"] > 0
        assert log.local_log_start_offset > 500 and log.log_start_offset == 0

        def as_tuples(found):
            return [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in found]
        assert as_tuples(log.iter()) == records
        assert as_tuples(log.read(0, max_records=10)) == records[:10]
        assert as_tuples(log.read(123, max_records=1)) == [records[123]]
        assert log.offset_for_timestamp(records[42][4]) == 42
        raw = log.read_raw(0, 1 << 20)
        assert offsets_of(raw)[0] == 0
        pyarrow = pytest.importorskip("pyarrow")
        table = log.read_arrow()
        assert isinstance(table, pyarrow.Table) and table.num_rows == 600
        assert table.column("offset").to_pylist() == list(range(600))


def test_a_remote_read_slower_than_remote_fetch_max_wait_leaves_its_partition_empty(tmp_path):
    """SeaweedFS frozen: a fetch of a remote partition and a local one answers after
    ``remote.fetch.max.wait.ms`` with the local records and none of the remote ones, no error;
    once the object store answers again the remote records come."""
    weed = seaweedfs_or_skip(str(tmp_path / "seaweedfs"))
    try:
        server = serve(tmp_path / "data", f"s3://{weed.create_bucket()}", weed.options(),
                       remote_fetch_max_wait_ms=300)
        try:
            tiered_topic(server)
            create(server, "local", {})
            produce(server, "local", expected_records(5))
            weed.pause()
            try:
                wire = Wire(server)
                answer = wire.fetch({("tiered", 0): 0, ("local", 0): 0})
                assert answer["tiered", 0].error_code == NONE and offsets_of(answer["tiered", 0].records) == []
                assert offsets_of(answer["local", 0].records) == [0, 1, 2, 3, 4]
            finally:
                weed.resume()
            deadline = time.monotonic() + 60
            while True:  # the connection stays up; the remote records come once it answers
                answer = wire.fetch({("tiered", 0): 0})
                if offsets_of(answer["tiered", 0].records) or time.monotonic() > deadline:
                    break
            assert offsets_of(answer["tiered", 0].records)[0] == 0
            wire.close()
        finally:
            server.stop()
    finally:
        weed.kill()


def test_the_object_store_stopped_while_the_store_tiers_loses_nothing(tmp_path):
    weed = seaweedfs_or_skip(str(tmp_path / "seaweedfs"))
    try:
        rsm = RemoteStorageManager.from_url(f"s3://{weed.create_bucket()}", weed.options(), request_timeout=1,
                                            max_retries=1)
        server = KafkaServer(str(tmp_path / "data"), ("127.0.0.1", 0), store_options=dict(
            remote_storage=rsm, remote_log_manager_task_interval_ms=3_600_000))
        try:
            first = expected_records(300)
            create(server, "t")
            produce(server, "t", first)
            boundary = tier(server, "t")
            log = server.store.partition("t", 0)
            weed.kill()
            # appends go on, copies fail and keep the local segments
            second = expected_records(300, start=300)
            produce(server, "t", second)
            done = server.store.run_maintenance()
            assert done["remote_errors"] > 0 and done["remote_segments_copied"] == 0
            assert log.local_log_start_offset == boundary and log.log_end_offset == 600
            # local reads go on
            assert confluent_read(server, "t", 600 - boundary, start=boundary) == (first + second)[boundary:]
            # a remote read fails naming the segment; a Kafka fetch gets an error code, its connection stays up
            with pytest.raises(RemoteStorageError) as failure:
                log.read(0, max_records=1)
            assert "remote segment" in str(failure.value) and "[0.." in str(failure.value)
            wire = Wire(server)
            try:
                assert wire.fetch({("t", 0): 0})["t", 0].error_code == UNKNOWN_SERVER_ERROR
                assert offsets_of(wire.fetch({("t", 0): boundary})["t", 0].records)[0] == boundary
                weed.start()
                assert offsets_of(wire.fetch({("t", 0): 0})["t", 0].records)[0] == 0
            finally:
                wire.close()
            # copies resume; nothing acknowledged is lost
            tier(server, "t")
            assert log.local_log_start_offset > boundary
            assert confluent_read(server, "t", 600) == first + second
        finally:
            server.stop()
    finally:
        weed.kill()


def test_a_sequential_remote_read_fetches_each_byte_once_and_reads_the_same(tmp_path):
    """Reads that go on where the last one stopped start from the bytes it fetched past its
    whole batches and the range fetched ahead meanwhile: the object store serves each byte of
    the remote segments once, and the batches are those a fresh read returns."""
    fetched = "kafka.server:type=BrokerTopicMetrics,name=RemoteFetchBytesPerSec"
    with LogStore(str(tmp_path / "data"), maintenance=False, remote_storage=f"file://{tmp_path}/remote") as store:
        store.create_topic("t", 1, segment_bytes=64 << 10, remote_storage_enable=True, local_retention_bytes=0,
                           retention_ms=-1)
        log = store.partition("t", 0)
        for i in range(300):
            log.append_batch([b"%05d-" % i + bytes(40 + i % 200) for _ in range(20)])
        store.run_maintenance()
        boundary = log.local_log_start_offset
        remote_bytes = log.remote_tier.size_in_bytes()
        assert boundary > 0 and remote_bytes > 4 * (64 << 10)
        before = store.metrics()[fetched]
        offset, chunks = 0, []
        while offset < boundary:
            raw = log.read_raw(offset, 10_000)
            chunks.append((offset, raw))
            offset = offsets_of(raw)[-1] + 1
        assert store.metrics()[fetched] - before == remote_bytes
        assert [r.offset for r in log.iter(0, boundary)] == list(range(boundary))
    with LogStore(str(tmp_path / "data"), maintenance=False, remote_storage=f"file://{tmp_path}/remote") as store:
        log = store.partition("t", 0)  # fresh reads, one at a time, by a new store: the same batches
        for at, raw in chunks[::7]:
            fresh = log.read_raw(at, 10_000)  # (whole batches within what its ranged get brought)
            assert fresh and (raw.startswith(fresh) or fresh.startswith(raw))
