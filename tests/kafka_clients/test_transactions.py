"""Transactional producers of confluent-kafka, kafka-python and aiokafka against a served store:
commit and abort, read_committed consumers of each library, a consume-transform-produce loop
with send_offsets_to_transaction, fencing by a second producer with the same transactional id,
and a transaction left open past its timeout. The clients run Kafka's transaction protocol
themselves, so they check the server's coordinator and markers; the store's logs are read
back through the library too."""

from __future__ import annotations

import asyncio
import time

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402

from logstore.kafka.server import KafkaServer  # noqa: E402
from logstore.txn.coordinator import TxnConfig  # noqa: E402


def read_committed_confluent(server, topic, partitions, count, group="rc", timeout_s=15.0) -> list[bytes]:
    c = Consumer({"bootstrap.servers": server.bootstrap_servers, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(out) < count:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                out.append(m.value())
        settle = time.monotonic() + 1.0
        while time.monotonic() < settle:
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                out.append(m.value())
        return out
    finally:
        c.close()


def committed_values(store, topic, partitions) -> list[bytes]:
    return [r.value for p in range(partitions) for r in store.partition(topic, p).iter(isolation_level="read_committed")]


def test_confluent_commit_and_abort_across_partitions(kafka_server):
    kafka_server.store.create_topic("out", 3)
    p = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "transactional.id": "tx-commit-abort",
                  "linger.ms": 5})
    p.init_transactions(15)
    expected = []
    for round_ in range(6):
        p.begin_transaction()
        values = [b"r%d-%d" % (round_, i) for i in range(20)]
        for i, value in enumerate(values):
            p.produce("out", value=value, partition=i % 3)
        if round_ % 3 == 1:
            p.flush(10)
            p.abort_transaction(15)
        else:
            p.commit_transaction(15)
            expected += values
    got = read_committed_confluent(kafka_server, "out", 3, len(expected))
    assert sorted(got) == sorted(expected)
    assert sorted(committed_values(kafka_server.store, "out", 3)) == sorted(expected)
    for part in range(3):  # per partition, the committed records come in the order produced
        vals = [r.value for r in kafka_server.store.partition("out", part).iter(isolation_level="read_committed")]
        assert vals == [v for v in expected if int(v.split(b"-")[1]) % 3 == part]
    # Every transaction is complete: nothing holds the LSO back, and the aborts are indexed.
    for part in range(3):
        log = kafka_server.store.partition("out", part)
        assert log.last_stable_offset == log.log_end_offset
        assert len(log.aborted_transactions(0, log.log_end_offset)) == 2
    p.flush(5)


def test_consume_transform_produce_with_send_offsets_to_transaction(kafka_server):
    store = kafka_server.store
    store.create_topic("in", 2)
    store.create_topic("doubled", 2)
    for i in range(120):
        store.partition("in", i % 2).append(b"%d" % i)
    consumer = Consumer({"bootstrap.servers": kafka_server.bootstrap_servers, "group.id": "eos",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "transactional.id": "eos-1"})
    producer.init_transactions(15)
    consumer.subscribe(["in"])
    seen = 0
    aborted_once = False
    deadline = time.monotonic() + 40
    try:
        while seen < 120 and time.monotonic() < deadline:
            batch = consumer.consume(25, 0.5)
            batch = [m for m in batch if m.error() is None]
            if not batch:
                continue
            producer.begin_transaction()
            for m in batch:
                producer.produce("doubled", value=b"%d" % (2 * int(m.value())), partition=m.partition())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 15)
            if not aborted_once:
                # Abort the first batch: its output never shows, and its input is read again.
                producer.abort_transaction(15)
                aborted_once = True
                for tp in consumer.assignment():
                    committed = consumer.committed([tp], 10)[0].offset
                    consumer.seek(TopicPartition(tp.topic, tp.partition, max(committed, 0)))
                continue
            producer.commit_transaction(15)
            seen += len(batch)
    finally:
        consumer.close()
    assert seen == 120
    out = committed_values(store, "doubled", 2)
    assert sorted(int(v) for v in out) == sorted(2 * i for i in range(120))  # each exactly once
    # The group's committed offsets came with the transactions: the end of each partition.
    from logstore.groups.offsets import offset_store
    offsets = offset_store(store)
    assert offsets.committed("eos", "in", 0) == 60 and offsets.committed("eos", "in", 1) == 60


def test_a_second_producer_with_the_same_id_fences_the_first(kafka_server):
    kafka_server.store.create_topic("fenced", 1)
    first = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "transactional.id": "shared-id"})
    first.init_transactions(15)
    first.begin_transaction()
    first.produce("fenced", value=b"from the zombie")
    first.flush(10)
    second = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "transactional.id": "shared-id"})
    second.init_transactions(15)  # bumps the epoch, aborting the first one's transaction
    second.begin_transaction()
    second.produce("fenced", value=b"from the new producer")
    second.commit_transaction(15)
    with pytest.raises(KafkaException) as raised:
        first.produce("fenced", value=b"late")
        first.commit_transaction(15)
    error = raised.value.args[0]
    assert error.fatal() or error.txn_requires_abort() or error.code() in (
        ck.KafkaError._FENCED, ck.KafkaError.PRODUCER_FENCED, ck.KafkaError.INVALID_PRODUCER_EPOCH)
    # EndTxn is answered once PrepareCommit is durable; the markers follow (as Kafka's), so a
    # read_committed view shows the commit once its marker is written
    deadline = time.monotonic() + 15
    while committed_values(kafka_server.store, "fenced", 1) == [] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert committed_values(kafka_server.store, "fenced", 1) == [b"from the new producer"]


def test_a_transaction_left_open_past_its_timeout_is_aborted(tmp_path):
    config = TxnConfig(abort_timed_out_interval_ms=100)
    with KafkaServer(str(tmp_path / "store"), ("127.0.0.1", 0), txn_config=config) as server:
        server.store.create_topic("slow", 1)
        p = Producer({"bootstrap.servers": server.bootstrap_servers, "transactional.id": "slowpoke",
                      "transaction.timeout.ms": 1000})
        p.init_transactions(15)
        p.begin_transaction()
        p.produce("slow", value=b"never committed")
        p.flush(10)
        log = server.store.partition("slow", 0)
        assert log.last_stable_offset == 0
        deadline = time.monotonic() + 10
        while log.last_stable_offset != log.log_end_offset and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log.log_end_offset == 2 and log.last_stable_offset == 2  # the coordinator's ABORT marker
        assert committed_values(server.store, "slow", 1) == []
        with pytest.raises(KafkaException):
            p.commit_transaction(10)


def test_a_transactional_produce_to_a_partition_not_added_is_refused(kafka_server):
    """A client that skips AddPartitionsToTxn (written here by hand with the library's own client
    bytes) gets INVALID_TXN_STATE and nothing is written."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from logstore.kafka.client import KafkaClient, KafkaErrorResponse

    store = kafka_server.store
    store.create_topic("unadded", 1)
    p = Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "transactional.id": "rogue"})
    p.init_transactions(15)
    described = kafka_server._apis.txn.describe(["rogue"])[0]
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                        producer_id=described.producer_id, producer_epoch=described.producer_epoch,
                                        base_sequence=0, batch_size=1 << 20)
    builder.append(0, timestamp=1_700_000_000_000, key=None, value=b"sneaky", headers=[])
    with KafkaClient(kafka_server.bootstrap_servers) as client, pytest.raises(KafkaErrorResponse) as refused:
        client.produce("unadded", 0, bytes(builder.build()), transactional_id="rogue")
    assert refused.value.code == 48  # INVALID_TXN_STATE
    assert store.partition("unadded", 0).log_end_offset == 0


def test_kafka_python_transactional_producer(kafka_server):
    kafka = pytest.importorskip("kafka")
    kafka_server.store.create_topic("kp", 1)
    producer = kafka.KafkaProducer(bootstrap_servers=kafka_server.bootstrap_servers, transactional_id="kp-tx")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(5):
            producer.send("kp", value=b"kept %d" % i, partition=0)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("kp", value=b"dropped", partition=0)
        producer.flush()
        producer.abort_transaction()
    finally:
        producer.close()
    expected = [b"kept %d" % i for i in range(5)]
    assert committed_values(kafka_server.store, "kp", 1) == expected
    consumer = kafka.KafkaConsumer(bootstrap_servers=kafka_server.bootstrap_servers, isolation_level="read_committed",
                                   enable_auto_commit=False, consumer_timeout_ms=3000, auto_offset_reset="earliest")
    try:
        consumer.assign([kafka.TopicPartition("kp", 0)])
        assert [m.value for m in consumer] == expected
    finally:
        consumer.close()


def test_aiokafka_transactional_producer(kafka_server):
    aiokafka = pytest.importorskip("aiokafka")
    kafka_server.store.create_topic("aio", 1)

    async def run() -> None:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=kafka_server.bootstrap_servers,
                                             transactional_id="aio-tx")
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(4):
                    await producer.send("aio", value=b"aio %d" % i, partition=0)
            await producer.begin_transaction()
            await producer.send("aio", value=b"aborted", partition=0)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())
    assert committed_values(kafka_server.store, "aio", 1) == [b"aio %d" % i for i in range(4)]
    assert read_committed_confluent(kafka_server, "aio", 1, 4) == [b"aio %d" % i for i in range(4)]


def test_serve_limits_the_transaction_timeout(tmp_path):
    """logstore serve --transaction-max-timeout-ms: a producer asking for more is refused at
    init_transactions (INVALID_TRANSACTION_TIMEOUT), one within it is served."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", str(tmp_path / "s"), "--listen", "127.0.0.1:0",
                             "--transaction-max-timeout-ms", "2000"], stdout=subprocess.PIPE, text=True)
    try:
        bootstrap = proc.stdout.readline().rsplit(" ", 1)[1].strip()
        greedy = Producer({"bootstrap.servers": bootstrap, "transactional.id": "greedy", "transaction.timeout.ms": 5000})
        with pytest.raises(KafkaException) as refused:
            greedy.init_transactions(10)
        assert refused.value.args[0].code() == ck.KafkaError.INVALID_TRANSACTION_TIMEOUT
        modest = Producer({"bootstrap.servers": bootstrap, "transactional.id": "modest", "transaction.timeout.ms": 1500})
        modest.init_transactions(10)
    finally:
        proc.terminate()
        proc.wait(30)
