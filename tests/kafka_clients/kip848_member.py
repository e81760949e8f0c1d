"""A consumer of the KIP-848 group protocol in its own process, for test_kip848.py.

    python kip848_member.py BOOTSTRAP TOPIC GROUP [INSTANCE_ID]

A confluent-kafka (librdkafka) consumer with ``group.protocol=consumer`` subscribes to TOPIC in
GROUP (as a static member when INSTANCE_ID is given). For every record it commits the offset
after it (synchronously) and then prints ``R <partition> <offset> <value>`` (a record whose commit
fails is read again while its partition stays with the member); it prints
``A <partitions>`` whenever its assignment changes. It runs until killed or until its stdin
closes, then closes the consumer (a static member leaves with epoch -2). The environment's
``KIP848_CONFIG`` (JSON) adds librdkafka settings (a replica set's login); ``KIP848_DEBUG_DIR``
(a directory) has the member write librdkafka's debug log (``cgrp,consumer,fetch,topic``) and
its own lines, timestamped, to ``member-<pid>.log`` there (for reading a failure's sequence).
"""

from __future__ import annotations

import json
import os
import select
import sys
import time


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def stdin_closed() -> bool:
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(ready) and not os.read(sys.stdin.fileno(), 1)


def main() -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    bootstrap, topic, group = sys.argv[1:4]
    config = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
              "enable.auto.commit": False, "auto.offset.reset": "earliest", "client.id": "kip848-member"}
    config.update(json.loads(os.environ.get("KIP848_CONFIG", "{}")))
    if len(sys.argv) > 4:
        config["group.instance.id"] = sys.argv[4]
    log_dir = os.environ.get("KIP848_DEBUG_DIR")
    if log_dir:  # librdkafka logs to stderr: this process's stderr becomes the file
        os.dup2(os.open(os.path.join(log_dir, f"member-{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                        0o644), 2)
        config["debug"] = "cgrp,consumer,fetch,topic"

    def tell(line: str) -> None:
        if log_dir:
            os.write(2, f"APP {time.time():.3f} {line}\n".encode())
        say(line)

    consumer = Consumer(config)
    consumer.subscribe([topic])
    shown = None
    while not stdin_closed():
        msg = consumer.poll(0.1)
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != shown:
            shown = now
            tell("A " + ",".join(str(p) for p in now))
        if msg is None or msg.error():
            continue
        try:
            consumer.commit(message=msg, asynchronous=False)
        except KafkaException as exc:  # a stale epoch, fenced, or moved meanwhile: not committed
            if log_dir:
                os.write(2, f"APP {time.time():.3f} commit of {msg.partition()} {msg.offset()} failed: {exc}\n".encode())
            try:  # read it again while the partition is still this member's
                consumer.seek(TopicPartition(msg.topic(), msg.partition(), msg.offset()))
            except KafkaException:
                pass  # moved: its next owner reads it again from the last commit
            continue
        tell(f"R {msg.partition()} {msg.offset()} {msg.value().decode()}")
    consumer.close()


if __name__ == "__main__":
    main()
