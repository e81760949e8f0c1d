"""A compaction pass over what Kafka clients wrote: confluent-kafka (librdkafka) produces keyed
records and tombstones to a compacted topic made by its AdminClient, in batches of every codec
the store reads; after a pass, kafka-python reads the partition back from the start and sees
exactly the latest record of each key below the cleaned end, at their original offsets, and
everything from the end on."""

from __future__ import annotations

import pytest

from logstore.records import compression

ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

CODECS = [compression.codec_name(c) for c in sorted(compression.available_codecs())]


def test_a_pass_over_a_topic_that_librdkafka_wrote_reads_back_through_kafka_python(kafka_server):
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap_servers})
    admin.create_topics([NewTopic("compacted", 1, 1, config={"cleanup.policy": "compact", "segment.bytes": "4096"})
                         ])["compacted"].result(10)
    written = []
    for round_, codec in enumerate(CODECS * 2):
        producer = ck.Producer({"bootstrap.servers": kafka_server.bootstrap_servers, "compression.type": codec,
                                "linger.ms": 20})
        for i in range(40):
            key = b"k%d" % ((i * 7 + round_) % 13)
            value = None if i % 9 == 4 else b"%s-%d-%d" % (codec.encode(), round_, i) * 3
            producer.produce("compacted", key=key, value=value, partition=0)
            written.append((key, value))
        assert producer.flush(10) == 0
    log = kafka_server.store.partition("compacted", 0)
    assert log.log_end_offset == len(written)
    log.roll()
    report = log.compact()
    end = report.cleaned_up_to
    assert end == len(written) and report.records_dropped > 0
    last = {key: offset for offset, (key, _) in enumerate(written)}
    expected = [(offset, key, value) for offset, (key, value) in enumerate(written)
                if offset >= end or last[key] == offset]

    consumer = kafka.KafkaConsumer(bootstrap_servers=kafka_server.bootstrap_servers, enable_auto_commit=False,
                                   auto_offset_reset="earliest", consumer_timeout_ms=3000)
    try:
        partition = kafka.TopicPartition("compacted", 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        got = [(m.offset, m.key, m.value) for m in consumer]
    finally:
        consumer.close()
    assert got == expected
