"""``logstore mirror``: a store's topics copied to a Kafka-protocol cluster, exactly once.

The way out of logstore: every record of the chosen topics (key, value, headers, timestamp) is
produced to the topic of the same name and partition on any cluster that speaks Kafka's protocol
(Apache Kafka, or another logstore behind ``logstore serve``), in order per partition. A missing
target topic is created with the source's partition count; one with fewer partitions is refused.

**Exactly once, across crashes.** The mirror is the only writer of its target partitions, and
each Produce request carries one batch, which a broker appends whole or not at all. Progress is
committed in the *source* store, as the consumer group ``group`` (``logstore-mirror`` by
default) over ``__consumer_offsets``: per partition, the next source offset to copy and, in the
commit's metadata, the target cluster's id and the target's log end offset at that point. On
start, and after any failed Produce, the mirror asks the target for its log end offset; the
records past the committed end are ones it wrote after its last commit, so it skips that many
source records instead of sending them again. A first start commits its starting point before
producing anything, so even a crash before the first regular commit resumes exactly. Killed at
any instant (``kill -9``) and restarted, the target holds each source record once.

What it needs: acks=all answers (the end offset must not go backwards: a target that lost
acknowledged records is detected and refused, naming the partition), and no other writer of the
target partitions. Records are re-encoded in batches of up to ``batch_records`` records and
``batch_bytes`` bytes (before compression), compressed with the source topic's codec unless
``compression`` names another; LogAppendTime records arrive as CreateTime with the same
timestamp. Transaction control records are not copied (the store's reads skip them).

Not thread-safe: one :class:`Mirror` runs in one thread (``--follow`` until stopped).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from .records.compression import codec_from_name
from .groups.offsets import offset_store
from .errorcodes import ErrorCode
from .errors import LogstoreError, OffsetOutOfRangeError
from .kafka.client import KafkaClient, KafkaClientError, KafkaErrorResponse, Security
from .records.batch import BatchBuilder, Record

__all__ = ["Mirror", "MirrorError", "MirrorStats", "DEFAULT_GROUP"]

logger = logging.getLogger(__name__)

DEFAULT_GROUP = "logstore-mirror"
_RETRIES = 5
#: Kafka's errors that a later attempt (after metadata is learnt again) can pass
_RETRIABLE = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available, ErrorCode.request_timed_out,
                        ErrorCode.not_enough_replicas, ErrorCode.not_enough_replicas_after_append,
                        ErrorCode.network_exception, ErrorCode.unknown_topic_or_partition,
                        ErrorCode.coordinator_load_in_progress})
_BACKOFF_S = 0.2


class MirrorError(LogstoreError):
    """The mirror cannot go on without losing or duplicating records (the message says why)."""


@dataclass
class MirrorStats:
    """What one :meth:`Mirror.run` did."""
    records: int = 0       # produced by this run
    skipped: int = 0       # found already written (after a crash) and not sent again
    batches: int = 0
    done: bool = False     # everything up to each partition's end was copied (not stopped first)
    partitions: dict[tuple[str, int], int] = field(default_factory=dict)  # next source offset


@dataclass
class _Partition:
    topic: str
    partition: int
    log: Any
    next_offset: int   # the next source offset to copy
    target_end: int    # the target's log end offset after everything produced so far
    committed: tuple[int, int] = (-1, -1)


class Mirror:
    """Copies topics of ``store`` to the cluster at ``bootstrap`` (see the module docstring).

    Args:
        store: the source LogStore (its ``__consumer_offsets`` keeps the progress).
        bootstrap: the target's ``host:port[,...]``.
        topics: the topics to copy (default: every non-internal topic of the store).
        group: the group whose committed offsets are the mirror's progress; one per target.
        batch_records, batch_bytes: the most records and bytes per Produce.
        commit_interval: seconds between progress commits (also committed at the end).
        client: a connected KafkaClient to use instead of one made from ``bootstrap``.
        security: TLS and SASL for the target (:class:`~logstore.kafka.client.Security`).
        compression: the codec of the batches sent ("none", "gzip", "snappy", "lz4", "zstd");
            default: each source topic's ``compression.type`` when it names one, else none.

    Durability: progress is committed with an fsync; what the target acknowledged is as
    durable as the target makes it. Not thread-safe: one thread runs a Mirror (another may
    set the ``stop`` event given to :meth:`run`).
    """

    def __init__(self, store: Any, bootstrap: str, topics: Iterable[str] | None = None, *,
                 group: str = DEFAULT_GROUP, batch_records: int = 1000, batch_bytes: int = 512 << 10,
                 commit_interval: float = 1.0, client: KafkaClient | None = None,
                 security: Security | None = None, compression: str | None = None) -> None:
        if batch_records < 1 or batch_bytes < 1:
            raise ValueError("batch_records and batch_bytes must be >= 1")
        self.store = store
        self.topics = sorted(store.topics()) if topics is None else list(dict.fromkeys(topics))
        self._codecs: dict[str, int] = {}
        for topic in self.topics:
            store.partitions_for(topic)  # raises for an unknown topic
            name = compression if compression is not None else store.describe(topic).config.compression_type
            self._codecs[topic] = codec_from_name("none" if name == "producer" else name)
        self.group = group
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.commit_interval = commit_interval
        self.client = client if client is not None else KafkaClient(bootstrap, security=security)
        self._offsets = offset_store(store)
        self._builder = BatchBuilder()
        self._partitions: list[_Partition] = []
        self._last_commit = 0.0

    # ------------------------------------------------------------------ the run
    def run(self, follow: bool = False, stop: threading.Event | None = None, poll: float = 0.5) -> MirrorStats:
        """Copy everything up to each partition's end (with ``follow``: keep copying new
        records) until ``stop`` is set. Returns what was done; commits the progress last.

        Raises:
            MirrorError: the target cannot be written without loss or duplicates.
            KafkaClientError: the target stays unreachable or refuses (after retries).
        """
        stats = MirrorStats()
        self._start(stats)
        stop = stop if stop is not None else threading.Event()  # never set: run until done
        stopped = stop.is_set
        try:
            while not stopped():
                moved = False
                for part in self._partitions:
                    if stopped():
                        break
                    moved |= self._copy(part, stats)
                    if time.monotonic() - self._last_commit >= self.commit_interval:
                        self._commit()
                if moved:
                    continue
                if not follow:
                    stats.done = True
                    break
                stop.wait(poll)
        finally:
            self._commit()
        stats.partitions = {(p.topic, p.partition): p.next_offset for p in self._partitions}
        return stats

    def _start(self, stats: MirrorStats) -> None:
        client = self.client
        client.refresh(self.topics)
        cluster = client.cluster_id or ""
        for topic in self.topics:
            count = self.store.partitions_for(topic)
            have = client.partitions.get(topic)
            if have is None:
                client.create_topic(topic, count)
                have = client.partitions.get(topic, 0)
            if have < count:
                raise MirrorError(f"the target's topic {topic!r} has {have} partitions, the source {count}")
        self._partitions = []
        for topic in self.topics:
            for partition in range(self.store.partitions_for(topic)):
                log = self.store.partition(topic, partition)
                end = self._with_retries(lambda: client.end_offset(topic, partition))
                part = self._resume(topic, partition, log, end, cluster, stats)
                self._partitions.append(part)
        self._commit(force=True)  # a first start's point is durable before anything is sent

    def _resume(self, topic: str, partition: int, log: Any, end: int, cluster: str, stats: MirrorStats) -> _Partition:
        found = self._offsets.committed_with_metadata(self.group, topic, partition)
        if found is None:
            return _Partition(topic, partition, log, log.log_start_offset, end)
        offset, metadata = found
        try:
            meta = json.loads(metadata)
            committed_end, committed_cluster = int(meta["end"]), str(meta["to"])
        except (ValueError, KeyError, TypeError):
            raise MirrorError(f"group {self.group!r} has a commit for {topic}-{partition} that is not the mirror's "
                              f"({metadata!r}): use another group") from None
        if committed_cluster != cluster:
            raise MirrorError(f"group {self.group!r} mirrors to cluster {committed_cluster!r}, not {cluster!r}: "
                              "use one group per target")
        if end < committed_end:
            raise MirrorError(f"the target's {topic}-{partition} ends at {end}, below the {committed_end} the mirror "
                              "committed: it lost acknowledged records")
        part = _Partition(topic, partition, log, offset, committed_end, (offset, committed_end))
        written = end - committed_end
        if written:
            skipped = self._skip(part, written)
            stats.skipped += skipped
            logger.info("%s-%d: %d records were written before the last stop; resuming at %d",
                        topic, partition, skipped, part.next_offset)
        return part

    def _skip(self, part: _Partition, count: int) -> int:
        """Advance past ``count`` source records (already on the target)."""
        left = count
        while left:
            start = part.log.log_start_offset
            if part.next_offset < start:
                raise MirrorError(f"{part.topic}-{part.partition}: records from {part.next_offset} to {start - 1} were "
                                  f"deleted after the last commit; which of them the target holds cannot be told")
            records = self._read(part, left)
            if not records:
                raise MirrorError(f"the target's {part.topic}-{part.partition} holds {left} records more than the "
                                  "source has to give: another writer, or a different source")
            part.next_offset = records[-1].offset + 1
            part.target_end += len(records)
            left -= len(records)
        return count

    def _read(self, part: _Partition, max_records: int) -> list[Record]:
        log = part.log
        while True:
            try:
                return log.read(part.next_offset, max_bytes=self.batch_bytes, max_records=max_records)
            except OffsetOutOfRangeError as exc:
                if exc.log_start_offset <= part.next_offset:
                    raise
                # Retention or DeleteRecords moved the source's start past us: those records are gone.
                logger.warning("%s-%d: records %d to %d were deleted before they were mirrored",
                               part.topic, part.partition, part.next_offset, exc.log_start_offset - 1)
                part.next_offset = exc.log_start_offset

    # ------------------------------------------------------------------ copying
    def _copy(self, part: _Partition, stats: MirrorStats) -> bool:
        """Produce the next batch of ``part``; False when it has nothing new."""
        records = self._read(part, self.batch_records)
        if not records:
            return False
        batch = bytes(self._builder.build([r.value for r in records], [r.key for r in records],
                                          [r.headers or None for r in records], [r.timestamp for r in records],
                                          codec=self._codecs[part.topic]))
        before = part.target_end
        self._produce(part, batch, len(records), before)
        part.next_offset = records[-1].offset + 1
        part.target_end = before + len(records)
        stats.records += len(records)
        stats.batches += 1
        return True

    def _produce(self, part: _Partition, batch: bytes, count: int, before: int) -> None:
        client = self.client
        for attempt in range(_RETRIES + 1):
            try:
                base = client.produce(part.topic, part.partition, batch)
            except KafkaClientError as exc:
                if isinstance(exc, KafkaErrorResponse) and exc.code not in _RETRIABLE:
                    raise
                if attempt == _RETRIES:
                    raise
                time.sleep(_BACKOFF_S * (attempt + 1))
                # Did it land? The batch is appended whole or not at all.
                end = self._with_retries(lambda: client.end_offset(part.topic, part.partition))
                if end == before + count:
                    return
                if end != before:
                    raise MirrorError(f"the target's {part.topic}-{part.partition} ends at {end}, expected {before} "
                                      f"or {before + count}: another writer?") from exc
                continue
            if base != before:
                raise MirrorError(f"the target appended {part.topic}-{part.partition}'s batch at {base}, expected "
                                  f"{before}: another writer?")
            return

    def _with_retries(self, call: Any) -> Any:
        for attempt in range(_RETRIES + 1):
            try:
                return call()
            except KafkaClientError as exc:
                if attempt == _RETRIES or (isinstance(exc, KafkaErrorResponse) and exc.code not in _RETRIABLE):
                    raise
                time.sleep(_BACKOFF_S * (attempt + 1))

    def _commit(self, force: bool = False) -> None:
        """Commit each partition's (next source offset, target end) that moved (all with ``force``)."""
        cluster = self.client.cluster_id or ""
        offsets = {}
        for part in self._partitions:
            now = (part.next_offset, part.target_end)
            if force or now != part.committed:
                offsets[(part.topic, part.partition)] = (part.next_offset,
                                                          json.dumps({"to": cluster, "end": part.target_end}))
        if offsets:
            self._offsets.commit(self.group, offsets)
            for part in self._partitions:
                part.committed = (part.next_offset, part.target_end)
        self._last_commit = time.monotonic()

    def close(self) -> None:
        """Close the connections to the target."""
        self.client.close()

    def __enter__(self) -> "Mirror":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None, prog: str = "logstore mirror") -> int:
    """``logstore mirror ROOT --to BOOTSTRAP [--topic T ...] [--group G] [--follow]``; returns
    the exit status (0 done, 1 failed, 2 bad arguments, 130 interrupted)."""
    import argparse
    import signal
    import sys

    from .store.store import LogStore

    parser = argparse.ArgumentParser(prog=prog, description="Copy a store's topics to a Kafka-protocol cluster "
                                     "(Apache Kafka, or another logstore serve), exactly once, resumable: "
                                     "progress is committed in the store as a consumer group.")
    parser.add_argument("root", help="the store to copy from")
    parser.add_argument("--to", required=True, metavar="BOOTSTRAP", help="the target's host:port[,host:port...]")
    parser.add_argument("--topic", action="append", dest="topics", metavar="TOPIC",
                        help="a topic to copy (repeat; default: every topic)")
    parser.add_argument("--group", default=DEFAULT_GROUP, help=f"the progress's group (default {DEFAULT_GROUP}; "
                        "one per target)")
    parser.add_argument("--follow", "-f", action="store_true", help="keep copying new records until interrupted")
    parser.add_argument("--batch-records", type=int, default=1000, help="records per Produce (default 1000)")
    parser.add_argument("--compression", choices=["none", "gzip", "snappy", "lz4", "zstd"],
                        help="the codec of the batches sent (default: each topic's compression.type)")
    parser.add_argument("--config-file", metavar="FILE", help="Kafka client properties for the target: "
                        "security.protocol, sasl.mechanism, sasl.username/sasl.password or sasl.jaas.config, "
                        "ssl.ca.location, ssl.endpoint.identification.algorithm")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="one such property (repeat; after --config-file)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no summary on standard error")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    stop = threading.Event()

    def interrupted(signum: int, frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGINT, signal.SIGTERM)} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        properties = _properties(args.config_file, args.config)
        security = Security.from_properties(properties)
        with LogStore(args.root, maintenance=False) as store:
            mirror = Mirror(store, args.to, args.topics, group=args.group, batch_records=args.batch_records,
                            security=security, compression=args.compression)
            try:
                stats = mirror.run(follow=args.follow, stop=stop)
            finally:
                mirror.close()
    except (LogstoreError, OSError, ValueError) as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if not args.quiet:
        sys.stderr.write(f"{prog}: {stats.records} records copied in {stats.batches} batches"
                         f"{f', {stats.skipped} found already on the target' if stats.skipped else ''}"
                         f" ({len(stats.partitions)} partitions)\n")
    return 130 if not args.follow and not stats.done else 0


def _properties(path: str | None, items: list[str]) -> dict[str, str]:
    """Java-style properties: ``key=value`` (or ``key: value``) lines of ``path``, ``#`` and ``!``
    comments, then ``items`` of ``KEY=VALUE``. Raises ValueError for a line without a key."""
    lines: list[str] = []
    if path is not None:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    out = {}
    for line in [*lines, *items]:
        text = line.strip()
        if not text or text[0] in "#!":
            continue
        key, sep, value = text.partition("=")
        if not sep:
            key, sep, value = text.partition(":")
        if not sep or not key.strip():
            raise ValueError(f"not a KEY=VALUE property: {text!r}")
        out[key.strip()] = value.strip()
    return out
