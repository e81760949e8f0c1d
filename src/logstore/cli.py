"""The ``logstore`` command (also ``python -m logstore``): inspect, repair and use a store.

::

    logstore topics create ROOT NAME [--partitions N] [--config key=value ...]
    logstore topics list|describe|delete ROOT [NAME]
    logstore produce ROOT TOPIC [--key-separator SEP] [--partition N]     (lines from stdin)
    logstore consume ROOT TOPIC [--from-beginning | --offset N | --timestamp MS | --group G]
                     [--partition N] [--max-records N] [--follow] [--print-key]
                     [--isolation-level read_uncommitted|read_committed]
    logstore dump FILES... [--print-data] [--deep] [--json] [--remote]    (like kafka-dump-log)
    logstore verify PATH [--json] [--remote] (full scrub; exit status 1 when anything is wrong)
    logstore recover PATH [--json]         (run crash recovery now; report what it did)
    logstore stats PATH [--json]           (offsets, bytes, records, ratios, consumer lag; read only)
    logstore compact ROOT [TOPIC ...]      (one cleaner pass over compacted topics)
    logstore retention ROOT [TOPIC ...]    (delete segments past retention now)
    logstore tier ROOT [TOPIC ...] [--remote-storage URL]  (tiered storage: copy and expire now)
    logstore node ...                      (one replication node: logstore node --help)
    logstore serve ROOT [--listen H:P]     (serve a store to Kafka clients: logstore serve --help)
    logstore kafka-user add FILE USER --mechanism M   (SASL credentials for serve; password on stdin)
    logstore acls list|add|remove ROOT ... (the ACLs of serve --authorizer: logstore acls --help)
    logstore mirror ROOT --to BOOTSTRAP    (copy topics to a Kafka cluster: logstore mirror --help)

Read-only commands (``topics list``/``describe``, ``dump``, ``verify``, ``stats``) also take a
Kafka log directory — a broker's ``log.dirs`` entry, or a copy of it — whose partition
directories they adopt in memory (:mod:`logstore.store.kafkadirs`) without writing anything into it;
``topics list`` and ``stats`` also take a single partition directory. The other commands open
the store for writing, and a LogStore opened on a Kafka log directory adopts its partitions for
good (it writes ``.topics/``; see :class:`logstore.LogStore`).

Topic settings use Kafka's names (``retention.ms``, ``cleanup.policy``, ...). Long work shows a
progress bar on a terminal (standard error) and nothing when output is piped or with
``--quiet``. ``--json`` prints one JSON document (dump: one JSON object per line). Exit status:
0 success, 1 a problem found (verify) or an operation failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, TextIO

from .errors import LogstoreError

if TYPE_CHECKING:
    from .tools.progress import Progress

__all__ = ["main"]

# Each command imports what it uses when it runs: ``logstore --help`` loads no wing, and
# ``logstore stats`` only the read-only tools (tests/unit/test_import_cost.py measures them).


def _progress(args: argparse.Namespace, label: str = "") -> Progress:
    from .tools.progress import Progress

    return Progress(label, enabled=False if args.quiet else None)


def _print_json(out: TextIO, value: Any) -> None:
    out.write(json.dumps(value, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _open_store(root: str, **kw: Any) -> Any:
    from .store.store import LogStore

    if not os.path.isdir(root):
        raise LogstoreError(f"{root}: no such store directory (create one with 'logstore topics create')")
    return LogStore(root, maintenance=False, **kw)


def _config_pairs(pairs: Iterable[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise LogstoreError(f"--config needs key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


# ---------------------------------------------------------------------- topics
def _topics(args: argparse.Namespace, out: TextIO) -> int:
    from .store.store import LogStore

    if args.action in ("list", "describe"):
        return _topics_read(args, out)
    if args.action == "create":
        if not args.name:
            raise LogstoreError("topics create needs a NAME")
        config: dict[str, Any] = dict(_config_pairs(args.config))
        with LogStore(args.root, maintenance=False) as store:
            store.create_topic(args.name, args.partitions, **config)
            out.write(f"created topic {args.name} with {args.partitions} partition(s)\n")
        return 0
    if not args.name:
        raise LogstoreError(f"topics {args.action} needs a NAME")
    with _open_store(args.root) as store:
        store.delete_topic(args.name)
        out.write(f"deleted topic {args.name}\n")
    return 0


def _topics_read(args: argparse.Namespace, out: TextIO) -> int:
    """topics list / describe: read-only, through StoreView (a Kafka log directory stays as it
    is), or on a single partition directory."""
    from .log.config import LogConfig
    from .store.topicids import topic_id_text
    from .store.kafkadirs import is_internal_topic
    from .store.views import StoreView
    from .tools.dump import is_partition_dir
    from .tools.stats import partition_key

    root = os.path.abspath(args.root)
    if not os.path.isdir(root):
        raise LogstoreError(f"{args.root}: no such store directory (create one with 'logstore topics create')")
    if is_partition_dir(root):
        topic = partition_key(root)[0]
        if args.action == "list":
            names = [topic] if args.internal or not is_internal_topic(topic) else []
            _print_names(args, out, names)
            return 0
        root = os.path.dirname(root)  # describe: the topic as the enclosing store knows it
    view = StoreView(root)
    if args.action == "list":
        _print_names(args, out, view.topics(internal=args.internal))
        return 0
    if not args.name:
        raise LogstoreError(f"topics {args.action} needs a NAME")
    partitions, overrides = view.partitions(args.name), view.overrides(args.name)
    defaults = LogConfig.build(None)
    config = LogConfig.from_kafka({**defaults.to_kafka(), **overrides}) if overrides else defaults
    internal = is_internal_topic(args.name)
    found_id = view.topic_id(args.name)
    topic_id = None if found_id is None else topic_id_text(found_id)
    if args.json:
        _print_json(out, {"name": args.name, "topic_id": topic_id, "partitions": partitions, "internal": internal,
                          "overrides": overrides, "config": config.to_kafka()})
        return 0
    out.write(f"topic {args.name}: {partitions} partition(s){' (internal)' if internal else ''}\n")
    out.write(f"  topic id: {topic_id if topic_id is not None else '(none yet)'}\n")
    for key, value in sorted(config.to_kafka().items()):
        mark = " *" if key in overrides else ""
        out.write(f"  {key} = {value}{mark}\n")
    return 0


def _print_names(args: argparse.Namespace, out: TextIO, names: list[str]) -> None:
    if args.json:
        _print_json(out, names)
    else:
        out.writelines(name + "\n" for name in names)


# ---------------------------------------------------------------------- produce / consume
def _produce(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    count = 0
    with _open_store(args.root) as store:
        partitions = store.partitions_for(args.topic)
        if args.partition is not None and not 0 <= args.partition < partitions:
            raise LogstoreError(f"topic {args.topic} has partitions 0..{partitions - 1}, not {args.partition}")
        with store.producer(durability=args.durability, linger_ms=5) as producer:
            for line in stdin:
                line = line.rstrip("\n")
                key = None
                if args.key_separator is not None:
                    k, sep, v = line.partition(args.key_separator)
                    if not sep:
                        raise LogstoreError(f"line {count + 1} has no key separator {args.key_separator!r}")
                    key, line = k.encode(), v
                producer.send(args.topic, line.encode(), key=key, partition=args.partition)
                count += 1
            producer.flush()
    if not args.quiet:
        sys.stderr.write(f"produced {count} record(s) to {args.topic}\n")
    return 0


def _consume(args: argparse.Namespace, out: TextIO) -> int:
    starts = [x is not None for x in (args.offset, args.timestamp, args.group)].count(True) + args.from_beginning
    if starts > 1:
        raise LogstoreError("give at most one of --from-beginning, --offset, --timestamp and --group")
    if args.offset is not None and args.partition is None:
        raise LogstoreError("--offset needs --partition")
    with _open_store(args.root) as store:
        group = args.group or f"logstore-cli-{os.getpid()}"
        reset = "earliest" if args.from_beginning or args.offset is not None or args.timestamp is not None else "latest"
        if args.group and not args.from_beginning:
            reset = "earliest"
        with store.consumer(group, args.topic, auto_offset_reset=reset, enable_auto_commit=False,
                            isolation_level=args.isolation_level) as consumer:
            parts = sorted(consumer.assignment())
            if args.partition is not None:
                chosen = [tp for tp in parts if tp[1] == args.partition]
                if not chosen:
                    raise LogstoreError(f"topic {args.topic} has no partition {args.partition}")
                for tp in parts:
                    if tp[1] != args.partition:
                        consumer.seek_to_end((tp[0], tp[1]))
                if args.offset is not None:
                    consumer.seek(args.topic, args.partition, args.offset)
            if args.from_beginning:
                consumer.seek_to_beginning()
            if args.timestamp is not None:
                consumer.seek_to_timestamp(args.timestamp)
            count = 0
            idle_timeout = 3600.0 if args.follow else 0.2
            while args.max_records is None or count < args.max_records:
                records = consumer.poll(idle_timeout, max_records=None if args.max_records is None
                                        else args.max_records - count)
                if not records:
                    if args.follow:
                        continue
                    break
                for r in records:
                    if args.partition is not None and r.partition != args.partition:
                        continue
                    _print_record(out, r, args)
                    count += 1
            if args.group:
                consumer.commit()
    return 0


def _print_record(out: TextIO, r: Any, args: argparse.Namespace) -> None:
    from .tools.dump import text_or_hex

    if args.json:
        _print_json(out, {"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp,
                          "key": text_or_hex(r.key), "value": text_or_hex(r.value),
                          "headers": [[k, text_or_hex(v)] for k, v in r.headers]})
        return
    value = "" if r.value is None else (text_or_hex(r.value) or "")
    if args.print_key:
        out.write(f"{'' if r.key is None else text_or_hex(r.key)}{args.key_separator}{value}\n")
    else:
        out.write(value + "\n")
    out.flush()


# ---------------------------------------------------------------------- inspection
def _dump(args: argparse.Namespace, out: TextIO) -> int:
    from .tools.dump import dump_file, dump_remote

    for path in args.files:
        if not args.json:
            out.write(f"Dumping {path}{' (remote segments)' if args.remote else ''}\n")
        items = dump_remote(path, print_data=args.print_data, deep=args.deep, remote_storage=args.remote_storage,
                            progress=_progress(args)) if args.remote else \
            dump_file(path, print_data=args.print_data, deep=args.deep, progress=_progress(args))
        for item in items:
            if args.json:
                _print_json(out, {"file": path, **item})
            else:
                out.write(_describe(item) + "\n")
    return 0


def _describe(item: dict[str, Any]) -> str:
    kind = item["kind"]
    if kind == "batch":
        head = (f"baseOffset: {item['base_offset']} lastOffset: {item['last_offset']} count: {item['count']} "
                f"position: {item['position']} size: {item['size']} magic: 2 compresscodec: {item['codec']} "
                f"crc: {item['crc']} isvalid: true CreateTime: {item['max_timestamp']} "
                f"producerId: {item['producer_id']} producerEpoch: {item['producer_epoch']} "
                f"baseSequence: {item['base_sequence']} partitionLeaderEpoch: {item['partition_leader_epoch']} "
                f"isTransactional: {str(item['is_transactional']).lower()} isControl: {str(item['is_control']).lower()}")
        if item.get("control_type") is not None:  # as kafka-dump-log prints a marker
            head += f" controlType: {item['control_type']}"
            if "coordinator_epoch" in item:
                head += f" coordinatorEpoch: {item['coordinator_epoch']}"
        if item["timestamp_type"] != "CreateTime":
            head = head.replace("CreateTime:", "LogAppendTime:")
        lines = [head]
        for r in item.get("records", []):
            line = (f"| offset: {r['offset']} timestamp: {r['timestamp']} keySize: {r['key_size']} "
                    f"valueSize: {r['value_size']} headers: {r['headers']}")
            if "value" in r:
                line += f" key: {r['key']} payload: {r['value']}"
                if r["header_list"]:
                    line += " headerKeys: " + ",".join(f"{h['key']}={h['value']}" for h in r["header_list"])
            lines.append(line)
        return "\n".join(lines)
    if kind == "remote-segment":
        return (f"remote segment {item['segment_id']} offsets: {item['start_offset']}..{item['end_offset']} "
                f"size: {item['size']} maxTimestamp: {item['max_timestamp']} leaderEpochs: {item['leader_epochs']} "
                f"state: {item['state']} object: {item['object']}")
    if kind == "index":
        return f"offset: {item['offset']} position: {item['position']}"
    if kind == "timeindex":
        return f"timestamp: {item['timestamp']} offset: {item['offset']}"
    if kind == "txnindex":  # as kafka-dump-log prints an aborted transaction
        return (f"version: {item['version']} producerId: {item['producer_id']} firstOffset: {item['first_offset']} "
                f"lastOffset: {item['last_offset']} lastStableOffset: {item['last_stable_offset']}")
    if kind == "checkpoint":
        return f"{item['topic']} {item['partition']} {item['offset']}"
    if kind == "leader-epoch":
        return f"epoch: {item['epoch']} startOffset: {item['start_offset']}"
    if kind == "producer":  # as kafka-dump-log prints a producer snapshot's entries
        txn_first = item["current_txn_first_offset"]
        return (f"producerId: {item['producer_id']} producerEpoch: {item['epoch']} "
                f"coordinatorEpoch: {item['coordinator_epoch']} "
                f"currentTxnFirstOffset: {txn_first if txn_first >= 0 else 'None'} lastTimestamp: {item['last_timestamp']} "
                f"firstSequence: {item['first_sequence']} lastSequence: {item['last_sequence']} "
                f"lastOffset: {item['last_offset']} offsetDelta: {item['offset_delta']} timestamp: "
                f"{item['last_timestamp']}")
    if kind == "zero-tail":
        return f"position: {item['position']}: {item['bytes']} zero bytes (the unwritten end of an active segment)"
    return f"position: {item['position']}: invalid batch ({item['error']}); {item['bytes']} bytes not shown"


def _verify(args: argparse.Namespace, out: TextIO) -> int:
    from .tools.verify import verify

    started = time.monotonic()
    report = verify(args.path, progress=_progress(args), remote=args.remote, remote_storage=args.remote_storage)
    if args.json:
        _print_json(out, {**report.as_dict(), "seconds": round(time.monotonic() - started, 3)})
    else:
        out.write(f"checked {report.partitions} partition(s), {report.segments} segment(s), {report.batches} batch(es), "
                  f"{report.records} record(s), {report.bytes} bytes\n")
        for problem in report.problems:
            out.write(f"PROBLEM {problem}\n")
        out.write("OK\n" if report.ok else f"{len(report.problems)} problem(s) found\n")
    return 0 if report.ok else 1


def _recover(args: argparse.Namespace, out: TextIO) -> int:
    from .log.log import Log
    from .store.layout import TOPICS_DIR
    from .store.store import LogStore

    from .store.kafkadirs import looks_like_log_dir
    from .tools.dump import is_partition_dir

    path = os.path.abspath(args.path)
    parent = os.path.dirname(path)
    if os.path.isdir(os.path.join(path, TOPICS_DIR)) or (
            os.path.isdir(path) and not is_partition_dir(path) and looks_like_log_dir(path)):
        root, only = path, None  # a store, or a Kafka log directory (adopted by opening it)
    elif os.path.isdir(path) and os.path.isdir(os.path.join(parent, TOPICS_DIR)):
        root, only = parent, os.path.basename(path)  # a partition of a store: its topic's config
    elif os.path.isdir(path):
        root, only = None, None
    else:
        raise LogstoreError(f"{path}: not a store or a partition directory")
    reports = []
    progress = _progress(args)
    if root is None:
        started = time.monotonic()
        with Log.open(path) as log:
            reports.append(_recovery(os.path.basename(path), log, started))
    else:
        # shared=False: recovery needs the store to itself (LogLockedError while it is in use).
        with LogStore(root, maintenance=False, shared=False) as store:
            targets = [(t, p) for t in store.topics(internal=True) for p in range(store.partitions_for(t))
                       if only is None or f"{t}-{p}" == only]
            progress.start("recover", len(targets))
            try:
                for topic, p in targets:
                    started = time.monotonic()
                    reports.append(_recovery(f"{topic}-{p}", store.partition(topic, p), started))
                    progress.advance(1)
            finally:
                progress.finish()
    if args.json:
        _print_json(out, reports)
    else:
        for r in reports:
            out.write(f"{r['partition']}: {'clean shutdown' if r['clean_shutdown'] else 'recovered'}, "
                      f"{r['segments_recovered']} segment(s) scanned, {r['bytes_truncated']} bytes truncated, "
                      f"{r['indexes_rebuilt']} index(es) rebuilt, {r['segments_deleted']} segment(s) deleted "
                      f"in {r['seconds']:.3f} s\n")
        out.write(f"recovered {len(reports)} partition(s), {sum(r['bytes_truncated'] for r in reports)} bytes truncated\n")
    return 0


def _recovery(name: str, log: Any, started: float) -> dict[str, Any]:
    from dataclasses import asdict

    report = log.recovery_report
    return {"partition": name, "seconds": round(time.monotonic() - started, 6), **asdict(report)}


def _stats(args: argparse.Namespace, out: TextIO) -> int:
    from .tools.stats import stats

    rows = stats(args.path, progress=_progress(args))
    if args.json:
        _print_json(out, rows)
        return 0
    out.write(f"{'partition':<28} {'start':>10} {'end':>10} {'segs':>5} {'bytes':>12} {'records':>10} "
              f"{'ratio':>6} {'dirty':>6}  lag\n")
    for s in rows:
        dirty = "" if s.dirty_ratio is None else f"{s.dirty_ratio:.2f}"
        lag = " ".join(f"{g}={n}" for g, n in s.group_lag.items())
        out.write(f"{s.topic + '-' + str(s.partition):<28} {s.log_start_offset:>10} {s.log_end_offset:>10} "
                  f"{s.segments:>5} {s.bytes:>12} {s.records:>10} {s.compression_ratio:>6.2f} {dirty:>6}  {lag}\n")
        if s.remote_segments is not None:
            out.write(f"{'':<4}remote tier: {s.remote_segments} segments, {s.remote_bytes} bytes; local log from "
                      f"{s.local_log_start_offset}; {s.copy_lag_bytes} bytes to copy\n")
    return 0


def _maintain(args: argparse.Namespace, out: TextIO) -> int:
    with _open_store(args.root) as store:
        topics = args.topics or store.topics(internal=True)
        total = 0
        for topic in topics:
            for p in range(store.partitions_for(topic)):
                log = store.partition(topic, p)
                if args.command == "retention":
                    deleted = log.enforce_retention()
                    total += deleted
                    if deleted:
                        out.write(f"{topic}-{p}: deleted {deleted} segment(s)\n")
                elif log.config.compacted:
                    report = log.compact()
                    total += 1
                    out.write(f"{topic}-{p}: kept {report.records_kept} record(s), dropped {report.records_dropped}, "
                              f"{report.bytes_read} bytes read, {report.bytes_written} written\n")
                elif args.topics:
                    raise LogstoreError(f"topic {topic} is not compacted (cleanup.policy={log.config.cleanup_policy})")
        what = "segment(s) deleted" if args.command == "retention" else "partition(s) compacted"
        out.write(f"{total} {what}\n")
    return 0


def _tier(args: argparse.Namespace, out: TextIO) -> int:
    """``logstore tier``: copy the tiered topics' sealed segments now, with progress, then
    apply local retention (copied segments leave the local disk) and the remote tier's total
    retention."""
    from .tiered.objectstore import parse_options

    try:
        options = parse_options(args.remote_storage_option)
    except ValueError as exc:
        raise LogstoreError(str(exc)) from None
    with _open_store(args.root, remote_storage=args.remote_storage, remote_storage_options=options or None) as store:
        manager = store.remote_log_manager
        if manager is None:
            raise LogstoreError(f"{args.root}: no remote tier: give --remote-storage URL (the store remembers it)")
        if not manager.leading():
            raise LogstoreError(f"{args.root}: another process of this store copies to the remote tier "
                                "(it holds .lock-remote-log-manager); it tiers these topics already")
        topics = args.topics or [t for t in store.topics() if store.describe(t).config.remote_storage_enable]
        logs = []
        for topic in topics:
            if not store.describe(topic).config.remote_storage_enable:
                raise LogstoreError(f"topic {topic} does not enable remote storage (remote.storage.enable=false)")
            logs.extend((f"{topic}-{p}", store.partition(topic, p)) for p in range(store.partitions_for(topic)))
        waiting = [(name, log, manager.waiting(log)) for name, log in logs]
        progress = _progress(args)
        progress.start("copy", sum(s.size for _, _, segments in waiting for s in segments))
        rows = []
        try:
            for name, log, _ in waiting:
                copied_bytes = [0]

                def advance(segment: Any, counter: list[int] = copied_bytes) -> None:
                    counter[0] += segment.size
                    progress.advance(segment.size)

                copied = manager.copy_segments(log, on_copied=advance)
                local = log.enforce_retention()
                expired = manager.expire_segments(log)
                rows.append({"partition": name, "segments_copied": copied, "bytes_copied": copied_bytes[0],
                             "local_segments_deleted": local, "remote_segments_deleted": expired,
                             "log_start_offset": log.log_start_offset,
                             "local_log_start_offset": log.local_log_start_offset})
        finally:
            progress.finish()
    if args.json:
        _print_json(out, rows)
    else:
        for r in rows:
            out.write(f"{r['partition']}: copied {r['segments_copied']} segment(s) ({r['bytes_copied']} bytes), "
                      f"{r['local_segments_deleted']} left the local disk, {r['remote_segments_deleted']} remote "
                      f"deleted; log start {r['log_start_offset']}, local log start {r['local_log_start_offset']}\n")
        out.write(f"copied {sum(r['segments_copied'] for r in rows)} segment(s) of {len(rows)} partition(s)\n")
    return 0


# ---------------------------------------------------------------------- parser
class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that prints help to the ``stdout`` given to :func:`main` (argparse
    writes to ``sys.stdout`` itself, so a caller's stream got nothing and the help landed
    wherever ``sys.stdout`` was, in the middle of the caller's own output)."""

    out: TextIO | None = None

    def print_help(self, file: Any = None) -> None:
        super().print_help(file if file is not None else (self.out or sys.stdout))


_EPILOG = """\
'logstore serve --help' describes serving a store to Kafka clients (logstore serve ROOT ...).
'logstore mirror --help' describes copying topics to a Kafka cluster (mirror ROOT --to ...).
'logstore kafka-user --help' describes the SASL users of logstore serve (add, delete, list).
'logstore acls --help' describes the ACLs of logstore serve --authorizer (list, add, remove).
'logstore COMMAND --help' describes a command and its options.
'logstore node --help' describes the replication node (logstore node ...).
"""


def _parser(out: TextIO | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="logstore", description="Inspect, repair and use a logstore data directory "
                     "(or a Kafka log directory).", epilog=_EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.out = out
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.out = out
        p.add_argument("--quiet", "-q", action="store_true", help="no progress bars or summaries on standard error")
        return p

    p = command("topics", "create, list, describe or delete topics")
    p.add_argument("action", choices=["create", "list", "describe", "delete"])
    p.add_argument("root", help="the store's directory (list and describe, which only read: also a Kafka log "
                                "directory; list: also a partition directory)")
    p.add_argument("name", nargs="?", help="the topic (create, describe, delete)")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="a topic setting by Kafka's name, e.g. retention.ms=3600000 (repeat)")
    p.add_argument("--internal", action="store_true", help="list internal topics too")
    p.add_argument("--json", action="store_true")

    p = command("produce", "append the lines of standard input to a topic")
    p.add_argument("root")
    p.add_argument("topic")
    p.add_argument("--key-separator", help="split each line into key SEP value")
    p.add_argument("--partition", type=int, help="write every line to this partition")
    p.add_argument("--durability", choices=["written", "fsynced"], default="fsynced")

    p = command("consume", "print a topic's records")
    p.add_argument("root")
    p.add_argument("topic")
    p.add_argument("--from-beginning", action="store_true")
    p.add_argument("--offset", type=int, help="start at this offset (needs --partition)")
    p.add_argument("--timestamp", type=int, help="start at the first record at or after this time (ms)")
    p.add_argument("--group", help="resume from (and commit to) this consumer group")
    p.add_argument("--partition", type=int)
    p.add_argument("--max-records", type=int)
    p.add_argument("--follow", "-f", action="store_true", help="keep waiting for new records")
    p.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"), default="read_uncommitted",
                   help="read_committed: only records of committed transactions, up to the last stable offset")
    p.add_argument("--print-key", action="store_true")
    p.add_argument("--key-separator", default="\t")
    p.add_argument("--json", action="store_true")

    p = command("dump", "print the batches and records of segment, index, producer snapshot and checkpoint files")
    p.add_argument("files", nargs="+")
    p.add_argument("--print-data", action="store_true", help="print keys, values and headers")
    p.add_argument("--deep", action="store_true", help="list the records of every batch")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--remote", action="store_true",
                   help="tiered storage: FILES are partition directories of a store; print their remote segments "
                        "and their batches, read from the object store")
    p.add_argument("--remote-storage", metavar="URL",
                   help="the object store of the remote segments, instead of the one the store remembers")

    p = command("verify", "check every CRC, record, offset and index entry; exit 1 on any problem")
    p.add_argument("path", help="a store, a partition directory or a .log file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--remote", action="store_true",
                   help="tiered storage: read and check the remote segments' batches too (from the object store)")
    p.add_argument("--remote-storage", metavar="URL",
                   help="the object store of the remote segments, instead of the one the store remembers")

    p = command("recover", "run crash recovery now (truncate torn tails, rebuild indexes) and report it")
    p.add_argument("path", help="a store or a partition directory (not in use)")
    p.add_argument("--json", action="store_true")

    p = command("stats", "offsets, sizes, records, compression and dirty ratios and consumer lag per partition")
    p.add_argument("path", help="a store, a Kafka log directory or a partition directory (read only)")
    p.add_argument("--json", action="store_true")

    for name, help in (("compact", "run the cleaner once on compacted topics"),
                       ("retention", "delete segments past their retention now")):
        p = command(name, help)
        p.add_argument("root")
        p.add_argument("topics", nargs="*")

    p = command("tier", "tiered storage: copy the sealed segments of topics with remote.storage.enable to the "
                        "remote tier now (with progress), then apply local and total retention")
    p.add_argument("root")
    p.add_argument("topics", nargs="*", help="only these topics (default: every tiered topic)")
    p.add_argument("--remote-storage", metavar="URL",
                   help="the object store, when the store does not remember one (file:///path, s3://bucket/prefix)")
    p.add_argument("--remote-storage-option", action="append", default=[], metavar="NAME=VALUE",
                   help="an object store setting (obstore's names: endpoint, region, allow_http, ...; repeat)")
    p.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None, stdout: TextIO | None = None, stdin: TextIO | None = None) -> int:
    """Entry point of the ``logstore`` console script; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    out = stdout or sys.stdout
    if args_list and args_list[0] == "node":
        from .replication import main as node_main

        return node_main(args_list[1:], prog="logstore node")
    if args_list and args_list[0] == "serve":
        from .kafka.server import main as serve_main

        return serve_main(args_list[1:], prog="logstore serve")
    if args_list and args_list[0] == "mirror":
        from .mirror import main as mirror_main

        return mirror_main(args_list[1:], prog="logstore mirror")
    if args_list and args_list[0] == "acls":
        from .kafka.aclcommand import main as acls_main

        return acls_main(args_list[1:], prog="logstore acls")
    if args_list and args_list[0] == "kafka-user":
        from .kafka.credentials import main as kafka_user_main

        return kafka_user_main(args_list[1:], prog="logstore kafka-user", stdin=stdin)
    parser = _parser(out)
    if not args_list:
        parser.print_usage(sys.stderr)
        sys.stderr.write("logstore: a COMMAND is required (logstore --help lists them)\n")
        return 2
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    if args.command is None:
        parser.print_usage(sys.stderr)
        return 2
    handlers: dict[str, Callable[[], int]] = {
        "topics": lambda: _topics(args, out),
        "produce": lambda: _produce(args, out, stdin or sys.stdin),
        "consume": lambda: _consume(args, out),
        "dump": lambda: _dump(args, out),
        "verify": lambda: _verify(args, out),
        "recover": lambda: _recover(args, out),
        "stats": lambda: _stats(args, out),
        "compact": lambda: _maintain(args, out),
        "retention": lambda: _maintain(args, out),
        "tier": lambda: _tier(args, out),
    }
    # Warnings of the library (e.g. directories of a Kafka log directory that are not adopted)
    # reach standard error as "logstore COMMAND: warning: ...", unless the caller set up logging.
    library = logging.getLogger("logstore")
    handler = None
    if not logging.getLogger().handlers and not library.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter(f"logstore {args.command}: warning: %(message)s"))
        library.addHandler(handler)
    try:
        return handlers[args.command]()
    except BrokenPipeError:  # pragma: no cover - e.g. piped into head (an OSError: caught first)
        return 0
    except (LogstoreError, OSError, ValueError) as exc:
        sys.stderr.write(f"logstore {args.command}: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if handler is not None:
            library.removeHandler(handler)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
