"""Kafka clients on a served store.

A store is served with ``logstore.KafkaServer`` (as ``logstore serve`` does); confluent-kafka
(librdkafka) produces to it with an idempotent producer, a kafka-python consumer reads them as a
member of a consumer group and commits, and the library itself reads the very same records from
the files and sees the offsets the group committed. Needs confluent-kafka and kafka-python
(``pip install confluent-kafka kafka-python``; the test extra has them). Run:
``python examples/kafka_clients.py`` (``make demo`` runs it).
"""

from __future__ import annotations

import tempfile
import time

from confluent_kafka import Producer
from kafka import KafkaConsumer

import logstore


def main() -> None:
    root = tempfile.mkdtemp(prefix="logstore-kafka-")
    with logstore.KafkaServer(root, listen=("127.0.0.1", 0)) as server:
        print(f"serving {root} on {server.bootstrap_servers}")
        server.store.create_topic("clicks", partitions=4)

        producer = Producer({"bootstrap.servers": server.bootstrap_servers, "enable.idempotence": True,
                             "compression.type": "zstd", "linger.ms": 5})
        for i in range(1000):
            producer.produce("clicks", key=f"user-{i % 50}".encode(), value=f"click {i}".encode())
        producer.flush(10)
        del producer  # closes its connections before the server stops
        print("confluent-kafka produced 1000 records")

        consumer = KafkaConsumer("clicks", bootstrap_servers=server.bootstrap_servers, group_id="dashboard",
                                 auto_offset_reset="earliest", enable_auto_commit=False)
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 1000 and time.monotonic() < deadline:
            # A poll long enough to finish a rebalance within it: kafka-python 3.0 can lose the
            # outcome of a join that a shorter poll gave up waiting for (the consumer then owns
            # nothing until the next rebalance).
            seen += sum(len(records) for records in consumer.poll(timeout_ms=1000).values())
        consumer.commit()
        owned = sorted(tp.partition for tp in consumer.assignment())
        consumer.close()  # leaves the group
        print(f"kafka-python, a member of group 'dashboard', owned partitions {owned} and read {seen} records")

        store = server.store  # the same files, read by the library
        total = sum(len(list(store.partition("clicks", p).iter())) for p in range(4))
        library = store.consumer("dashboard", ["clicks"])
        committed = [library.committed("clicks", p) for p in range(4)]
        library.close()
        print(f"the library reads {total} records; the group committed {committed} (sum {sum(committed)})")


if __name__ == "__main__":
    main()
