"""A confluent-kafka transactional producer (``transactional.id`` argv[6]) on bootstrap argv[1],
logged in as the replica user with the secret argv[5] (SCRAM), writing to topic argv[2] of
argv[3] partitions. Transaction n holds the values ``t%06d.%d`` (n, index), 3 per partition;
n % 4 == 3 is aborted on purpose. One line per outcome, flushed, to argv[4]:

- ``C n``: commit_transaction returned (the transaction is committed);
- ``A n``: the deliberate abort_transaction returned (it is aborted);
- ``U n``: anything else (its outcome is unknown to the producer): after a retriable or an
  abortable error the transaction is aborted, and after a fatal one (fenced, ...), or when the
  abort is refused (librdkafka will not abort a commit that timed out: it is still under way),
  the producer is closed and a new one with the same transactional id is initialised (which
  fences the old one); then the next transaction begins.

Lines starting with ``#`` say what went wrong, and when (as the nodes' logs write the time).

Stops before the next transaction once the file argv[7] exists, or after argv[8] seconds; waits
argv[9] seconds between transactions. Used by test_jepsen_kafka."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from confluent_kafka import KafkaError, KafkaException, Producer

#: how long one transactional call may take (commit, abort, init) before it counts as retriable
CALL_TIMEOUT_S = 2.0


def main() -> None:
    bootstrap, topic, partitions, out_path, secret, tid, stop_file, limit, pause = sys.argv[1:10]
    partitions, deadline, pause = int(partitions), time.monotonic() + float(limit), float(pause)
    config = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
              "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "replica", "sasl.password": secret,
              "transactional.id": tid, "transaction.timeout.ms": 10000, "linger.ms": 2,
              "topic.metadata.refresh.interval.ms": 500}

    def stopping() -> bool:
        return os.path.exists(stop_file) or time.monotonic() > deadline

    def new_producer() -> Producer | None:
        """A producer with its transactions initialised (None if told to stop first)."""
        while not stopping():
            producer = Producer(config)
            while not stopping():
                try:
                    producer.init_transactions(CALL_TIMEOUT_S)
                    return producer
                except KafkaException as exc:
                    if exc.args[0].fatal():
                        break  # a new producer
                    time.sleep(0.2)  # retriable (a coordinator moving, a timeout): ask again
            producer.close()
        return None

    producer = new_producer()
    n = 0
    with open(out_path, "a", buffering=1) as out:
        while producer is not None and not stopping():
            try:
                producer.begin_transaction()
                for p in range(partitions):
                    for i in range(3):
                        index = 3 * p + i
                        producer.produce(topic, value=b"t%06d.%d" % (n, index), partition=p)
                if n % 4 == 3:
                    producer.abort_transaction(CALL_TIMEOUT_S)
                    out.write(f"A {n}\n")
                else:
                    producer.commit_transaction(CALL_TIMEOUT_S)
                    out.write(f"C {n}\n")
            except KafkaException as exc:
                out.write(f"U {n}\n")
                error: KafkaError = exc.args[0]
                _note(out, n, error)
                if not error.fatal() and _abort(producer, out, n):
                    out.write(f"# {n} {_now()} aborted\n")
                else:
                    producer.close()
                    producer = new_producer()
                    out.write(f"# {n} {_now()} {'a new producer' if producer else 'closed (stopping)'}\n")
            n += 1
            time.sleep(pause)
        if producer is not None:
            producer.close()


def _now() -> str:
    """The time as the nodes' logs write it."""
    now = time.time()
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now * 1000) % 1000:03d}"


def _note(out: TextIO, n: int, error: KafkaError) -> None:
    """A comment line in the output: what went wrong in transaction n, when."""
    out.write(f"# {n} {_now()} {error.name()} retriable={error.retriable()} abortable="
              f"{error.txn_requires_abort()} fatal={error.fatal()}: {error.str()}\n")


def _abort(producer: Producer, out: TextIO, n: int) -> bool:
    """Abort the current transaction (n) after an error, retrying what is retriable; False if
    this producer should not go on (a fatal or another non-retriable error)."""
    for _ in range(10):
        try:
            producer.abort_transaction(CALL_TIMEOUT_S)
            return True
        except KafkaException as exc:
            _note(out, n, exc.args[0])
            if exc.args[0].code() == KafkaError._CONFLICT:
                return False  # a commit that timed out is still under way (librdkafka resumes it, never aborts it)
            if not exc.args[0].retriable():
                return False  # fatal, or a state the producer should not go on from: a new one fences it
            time.sleep(0.2)
    return False


if __name__ == "__main__":
    main()
