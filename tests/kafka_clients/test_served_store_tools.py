"""The CLI on a store while it is served: what Kafka clients wrote and committed is what
``logstore stats`` and ``logstore consume`` report (the server keeps the store shared)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

kafka = pytest.importorskip("kafka")


def cli(*args):
    done = subprocess.run([sys.executable, "-m", "logstore", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_stats_reports_the_lag_of_a_group_that_kafka_clients_committed(kafka_server):
    kafka_server.store.create_topic("lagged", 2)
    producer = kafka.KafkaProducer(bootstrap_servers=kafka_server.bootstrap_servers)
    for i in range(30):
        producer.send("lagged", value=b"%d" % i, partition=i % 2)
    producer.flush(10)
    producer.close()
    consumer = kafka.KafkaConsumer(bootstrap_servers=kafka_server.bootstrap_servers, group_id="billing",
                                   enable_auto_commit=False)
    try:
        consumer.commit({kafka.TopicPartition("lagged", 0): kafka.OffsetAndMetadata(4, "", -1),
                         kafka.TopicPartition("lagged", 1): kafka.OffsetAndMetadata(15, "", -1)})
    finally:
        consumer.close()
    rows = {(r["topic"], r["partition"]): r for r in json.loads(cli("stats", kafka_server.store.root, "--json"))}
    assert rows[("lagged", 0)]["log_end_offset"] == 15 and rows[("lagged", 1)]["log_end_offset"] == 15
    assert rows[("lagged", 0)]["group_lag"] == {"billing": 11}
    assert rows[("lagged", 1)]["group_lag"] == {"billing": 0}
    # The CLI's group consumer resumes where the Kafka client committed.
    out = cli("consume", kafka_server.store.root, "lagged", "--group", "billing", "--max-records", "11")
    assert sorted(out.split()) == sorted(b"%d".decode() % i for i in range(8, 30, 2))
