"""A kafka-python consumer of group argv[2] on bootstrap argv[1] (comma-separated), topic
argv[3], logged in as the replica user with the secret argv[5] (SCRAM): writes ``R partition offset value`` for each record it is given and ``C`` after each
commit that returned, flushed line by line, to argv[4]; stops on SIGTERM (closing: a clean
leave). With argv[6] ``read_committed`` it reads as a read_committed consumer (committed
transactions only). Used by test_jepsen_kafka."""

from __future__ import annotations

import signal
import sys
import threading

from kafka import KafkaConsumer
from kafka.errors import CommitFailedError, KafkaError


def main() -> None:
    bootstrap, group, topic, out_path, secret = sys.argv[1:6]
    isolation_level = sys.argv[6] if len(sys.argv) > 6 else "read_uncommitted"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = KafkaConsumer(topic, group_id=group, bootstrap_servers=bootstrap.split(","), enable_auto_commit=False,
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                             sasl_plain_username="replica", sasl_plain_password=secret,
                             auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=500,
                             request_timeout_ms=10000, retry_backoff_ms=50, isolation_level=isolation_level)
    with open(out_path, "a", buffering=1) as out:
        out.write("S\n")
        while not stop.is_set():
            try:
                batches = consumer.poll(timeout_ms=200)
            except KafkaError as exc:  # (kafka-python 3 raises a refused connection to a killed node)
                out.write(f"E {type(exc).__name__}\n")
                stop.wait(0.1)
                continue
            for tp, records in batches.items():
                for r in records:
                    out.write(f"R {tp.partition} {r.offset} {r.value.decode()}\n")
            if batches:
                try:
                    consumer.commit()
                    out.write("C\n")
                except (CommitFailedError, KafkaError) as exc:
                    out.write(f"F {type(exc).__name__}\n")
        consumer.close()


if __name__ == "__main__":
    main()
