"""A consumer-group member in its own process, for test_group_processes.py.

    python group_member.py CLIENT BOOTSTRAP TOPIC GROUP

CLIENT is confluent, kafka-python or aiokafka. The member subscribes to TOPIC in GROUP, and for
every record commits the offset after it (synchronously) and then prints one line
``R <partition> <offset> <value>``; it prints ``A <partitions>`` whenever its assignment changes.
It runs until killed or until its stdin closes.
"""

from __future__ import annotations

import asyncio
import os
import select
import sys
import threading

#: the environment's GROUP_MEMBER_SESSION_MS may lengthen the session (a test that kills no member)
SESSION_MS = int(os.environ.get("GROUP_MEMBER_SESSION_MS", "2000"))
HEARTBEAT_MS = 300


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def stdin_closed() -> bool:
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(ready) and not os.read(sys.stdin.fileno(), 1)


def run_confluent(bootstrap: str, topic: str, group: str) -> None:
    from confluent_kafka import Consumer, KafkaException

    def on_assign(consumer, partitions):
        say("A " + ",".join(str(p.partition) for p in partitions))

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS,
                         "heartbeat.interval.ms": HEARTBEAT_MS, "client.id": "confluent-member"})
    consumer.subscribe([topic], on_assign=on_assign)
    while not stdin_closed():
        msg = consumer.poll(0.2)
        if msg is None or msg.error():
            continue
        try:
            consumer.commit(message=msg, asynchronous=False)
        except KafkaException:
            continue  # the partition moved meanwhile: its next owner reads this record again
        say(f"R {msg.partition()} {msg.offset()} {msg.value().decode()}")
    consumer.close()


def run_kafka_python(bootstrap: str, topic: str, group: str) -> None:
    from kafka import ConsumerRebalanceListener, KafkaConsumer, OffsetAndMetadata
    from kafka.errors import CommitFailedError, KafkaError

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                             heartbeat_interval_ms=HEARTBEAT_MS, client_id="kafka-python-member")

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            pass

        def on_partitions_assigned(self, assigned):
            say("A " + ",".join(str(tp.partition) for tp in assigned))

    consumer.subscribe([topic], listener=Listener())
    while not stdin_closed():
        for tp, records in consumer.poll(200).items():
            for r in records:
                try:
                    consumer.commit({tp: OffsetAndMetadata(r.offset + 1, "", -1)})
                except (CommitFailedError, KafkaError):
                    break
                say(f"R {tp.partition} {r.offset} {r.value.decode()}")
    consumer.close()


def run_aiokafka(bootstrap: str, topic: str, group: str) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.errors import CommitFailedError, KafkaError

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):
            pass

        async def on_partitions_assigned(self, assigned):
            say("A " + ",".join(str(tp.partition) for tp in assigned))

    async def main() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                    auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                                    heartbeat_interval_ms=HEARTBEAT_MS, client_id="aiokafka-member")
        await consumer.start()
        consumer.subscribe([topic], listener=Listener())
        try:
            while not stdin_closed():
                batches = await consumer.getmany(timeout_ms=200)
                for tp, records in batches.items():
                    for r in records:
                        try:
                            await consumer.commit({tp: r.offset + 1})
                        except (CommitFailedError, KafkaError):
                            break
                        say(f"R {tp.partition} {r.offset} {r.value.decode()}")
        finally:
            await consumer.stop()

    asyncio.run(main())


if __name__ == "__main__":
    client, bootstrap, topic, group = sys.argv[1:5]
    threading.current_thread().name = client
    {"confluent": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}[client](
        bootstrap, topic, group)
