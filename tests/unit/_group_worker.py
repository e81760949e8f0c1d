"""A process of a consumer group for test_consumer_groups: consumes ``t`` from the store at
argv[1] in group argv[2] (session timeout argv[4] ms, argv[5] seconds of "processing" per poll),
writing each record it is given as ``R partition offset`` and each commit
that returned as ``C partition offset`` (the next offset) to argv[3], flushed line by line; stops
on SIGTERM (closing the consumer: a clean leave)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from logstore import CommitFailedError, LogStore


def main() -> None:
    root, group, out_path = sys.argv[1:4]
    session_ms = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    processing_s = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    stop = threading.Event()
    logging.basicConfig(filename=out_path + ".log", level=logging.INFO,
                        format="%(asctime)s %(threadName)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open(out_path, "a", buffering=1) as out, LogStore(root, maintenance=False) as store:
        consumer = store.consumer(group, "t", enable_auto_commit=False, session_timeout_ms=session_ms,
                                  heartbeat_interval_ms=max(50, session_ms // 10), max_poll_records=50)
        out.write(f"S {os.getpid()}\n")
        while not stop.is_set():
            records = consumer.poll(0.1)
            for r in records:
                out.write(f"R {r.partition} {r.offset}\n")
            if records:
                time.sleep(processing_s)  # the work done between being given records and committing
                positions = {(r.topic, r.partition): r.offset + 1 for r in records}
                try:
                    consumer.commit(positions)
                except CommitFailedError:
                    out.write("F\n")  # these records stay uncommitted: their next owner reads them again
                    continue
                for (_, p), off in sorted(positions.items()):
                    out.write(f"C {p} {off}\n")
        consumer.close()


if __name__ == "__main__":
    main()
