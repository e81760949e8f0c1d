"""Producer and consumer group on a LogStore.

A producer sends keyed events to a 4-partition topic (keys land where a Kafka client would put
them); two consumers of one group split the partitions, process everything and commit; a third
consumer started later in the same group resumes from the committed offsets and finds nothing
left. Run: ``python examples/producer_consumer.py`` (``make demo`` runs it).
"""

from __future__ import annotations

import json
import tempfile
import threading

import logstore


def main() -> None:
    root = tempfile.mkdtemp(prefix="logstore-pc-")
    with logstore.LogStore(root) as store:
        store.create_topic("orders", partitions=4, retention_ms=7 * 24 * 3600 * 1000)
        print(store.describe("orders").overrides)

        with store.producer(linger_ms=2, compression="zstd") as producer:
            futures = [producer.send("orders", json.dumps({"order": i}).encode(), key=f"customer-{i % 10}".encode())
                       for i in range(1000)]
            producer.flush()
        first = futures[0].result()
        print(f"order 0 went to partition {first.partition} at offset {first.offset}")

        seen: dict[int, list[int]] = {}
        lock = threading.Lock()

        def work(consumer: logstore.Consumer) -> None:
            while records := consumer.poll(timeout=0.5):
                with lock:
                    for r in records:
                        seen.setdefault(r.partition, []).append(r.offset)
            consumer.commit()

        a = store.consumer("billing", "orders")
        b = store.consumer("billing", "orders")
        print("assignment:", sorted(p for _, p in a.assignment()), sorted(p for _, p in b.assignment()))
        threads = [threading.Thread(target=work, args=(c,)) for c in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = sum(len(v) for v in seen.values())
        print(f"consumed {total} records; lag {sum(a.lag().values()) + sum(b.lag().values())}")
        assert total == 1000
        a.close()
        b.close()

        late = store.consumer("billing", "orders")
        assert late.poll(timeout=0.2) == []
        print("a new member resumes at", {p: late.committed("orders", p) for p in range(4)})
        late.close()


if __name__ == "__main__":
    main()
