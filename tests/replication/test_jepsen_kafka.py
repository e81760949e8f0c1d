"""Jepsen-style, with real Kafka clients: three `logstore node` processes with Kafka listeners,
replication links through fault-injecting proxies; a confluent-kafka idempotent producer with
acks=all and a kafka-python consumer group of two processes, and beside them a confluent-kafka
transactional producer (a process of its own) and a read_committed kafka-python group of two
processes on a second topic, while partition leaders (and the group and transaction
coordinators' nodes) are SIGKILLed and restarted and replication links are cut.

Checks: every acknowledged record is consumed; the log holds each produced value at most once
(no retry of the producer appended twice); the group's committed offsets, in the order the
replicated __consumer_offsets log holds them, never go backwards; the replicas agree on the
committed prefix of every partition.

Transactions are atomic: the read_committed group consumes every value of each committed
transaction, none of a deliberately aborted one, and of every transaction (those whose outcome
the producer never learned included) all its values or none; once the faults stop, no
transaction stays open (each partition's last stable offset reaches its high watermark), no
replica's log holds an open transaction, the replicas agree on the committed prefix control
batches included, and a read_committed read of node 0's log sees each transaction whole or not
at all."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from logstore import Log
from logstore.checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpoints
from logstore.groups.offsets import decode_offset_key, decode_offset_value
from logstore.records.batch import batch_headers

from .kafkanodes import KafkaNodes

confluent_kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")

SECRET = b"jepsen-secret"
TOPIC, PARTITIONS, GROUP = "jepsen", 2, "jg"
KILLS = int(os.environ.get("LOGSTORE_JEPSEN_KILLS", "10"))
WORKER = Path(__file__).with_name("_kafka_group_worker.py")
TXN_TOPIC, TXN_GROUP, TXN_ID = "jepsen_txn", "jtx", "jepsen-txn"
TXN_WORKER = Path(__file__).with_name("_kafka_txn_worker.py")
#: seconds the transactional producer waits between transactions (its rate: the normal run stays
#: within make test's budget)
TXN_PAUSE_S = float(os.environ.get("LOGSTORE_JEPSEN_TXN_PAUSE", "0.2"))
KILL_TARGETS = [(TOPIC, 0), (TOPIC, 1), ("__consumer_offsets", 0), ("__transaction_state", 0)]


def _consumed(outs):
    got = []
    for out in outs:
        if out.exists():  # (a last line without its newline is still being written)
            got += [line.split()[3] for line in out.read_text().split("\n")[:-1] if line.startswith("R ")]
    return got


def _txn_values(n: int) -> set[str]:
    """The values of transaction n (_kafka_txn_worker's)."""
    return {"t%06d.%d" % (n, i) for i in range(3 * PARTITIONS)}


def _txn_outcomes(out: Path) -> dict[int, str]:
    """Transaction number -> "C", "A" or "U", from _kafka_txn_worker's output."""
    outcomes = {}
    for line in out.read_text().splitlines():
        kind, _, n = line.partition(" ")
        if kind in ("C", "A", "U"):
            assert int(n) not in outcomes, f"transaction {n} has two outcomes"
            outcomes[int(n)] = kind
    return outcomes


def _high_watermarks(tmp_path: Path, node: int) -> dict[tuple[str, int], int]:
    """The high watermarks node ``node`` last wrote down (its replication-offset-checkpoint)."""
    return OffsetCheckpoints(str(tmp_path / f"n{node}"), REPLICATION_OFFSET_CHECKPOINT).read()


def _batches_below(log: Log, stop: int) -> list[tuple[int, bytes]]:
    """(base offset, bytes) of each batch of ``log`` (control batches included) below ``stop``."""
    out, offset = [], log.log_start_offset
    while offset < stop:
        raw = log.read_raw(offset)
        headers = list(batch_headers(raw))
        if not headers:
            break
        out += [(h.base_offset, bytes(raw[position:position + h.size])) for position, h in headers
                if h.base_offset < stop]
        offset = headers[-1][1].last_offset + 1
    return out


def _stable_lag(cluster: KafkaNodes) -> dict[int, tuple[int, int]] | None:
    """Partition -> (read_committed end, latest offset) of TXN_TOPIC, by ListOffsets (None if a
    partition did not answer)."""
    from confluent_kafka.admin import AdminClient, OffsetSpec
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **cluster.client_config})
    ends: dict[int, list[int]] = {}
    try:
        for level in (confluent_kafka.IsolationLevel.READ_COMMITTED, confluent_kafka.IsolationLevel.READ_UNCOMMITTED):
            asked = {confluent_kafka.TopicPartition(TXN_TOPIC, p): OffsetSpec.latest() for p in range(PARTITIONS)}
            for tp, future in admin.list_offsets(asked, isolation_level=level, request_timeout=5).items():
                ends.setdefault(tp.partition, []).append(future.result(10).offset)
    except Exception:  # noqa: BLE001 - a leader moving: ask again
        return None
    return {p: (rc, latest) for p, (rc, latest) in ends.items()}


def _read_committed_values(cluster: KafkaNodes, timeout: float = 60.0) -> set[str]:
    """Every value of TXN_TOPIC a read_committed confluent-kafka consumer reads from the start to
    the end of each partition."""
    consumer = confluent_kafka.Consumer({**cluster.client_config, "bootstrap.servers": cluster.bootstrap,
                                         "group.id": "jtx-check", "enable.auto.commit": False,
                                         "isolation.level": "read_committed", "enable.partition.eof": True})
    consumer.assign([confluent_kafka.TopicPartition(TXN_TOPIC, p, confluent_kafka.OFFSET_BEGINNING)
                     for p in range(PARTITIONS)])
    got: set[str] = set()
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(at_end) < PARTITIONS:
            assert time.monotonic() < deadline, f"a read_committed read did not reach the end of {TXN_TOPIC}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                continue
            at_end.discard(msg.partition())
            got.add(msg.value().decode())
    finally:
        consumer.close()
    return got


def test_jepsen_kafka_clients_through_kills_and_cut_links(tmp_path):
    _jepsen(tmp_path, KILLS)


@pytest.mark.slow
def test_jepsen_kafka_soak(tmp_path):
    """make soak: a hundred kills (make test: ten)."""
    _jepsen(tmp_path, int(os.environ.get("LOGSTORE_JEPSEN_SOAK_KILLS", "100")))


def _jepsen(tmp_path, kills_wanted):
    rng = random.Random(int(os.environ.get("LOGSTORE_JEPSEN_SEED", "1834")))
    cluster = KafkaNodes(tmp_path, SECRET, topics=f"{TOPIC}:{PARTITIONS},{TXN_TOPIC}:{PARTITIONS}", proxies=True)
    for i in range(3):
        cluster.start(i)
    outs = [tmp_path / f"consumer{i}.txt" for i in range(2)]
    txn_outs = [tmp_path / f"txn-consumer{i}.txt" for i in range(2)]
    consumers = [subprocess.Popen([sys.executable, str(WORKER), cluster.bootstrap, GROUP, TOPIC, str(out),
                                   SECRET.decode()])
                 for out in outs]
    consumers += [subprocess.Popen([sys.executable, str(WORKER), cluster.bootstrap, TXN_GROUP, TXN_TOPIC, str(out),
                                    SECRET.decode(), "read_committed"])
                  for out in txn_outs]
    txn_out, txn_stop = tmp_path / "txn-producer.txt", tmp_path / "txn-stop"
    txn_producer = subprocess.Popen([sys.executable, str(TXN_WORKER), cluster.bootstrap, TXN_TOPIC, str(PARTITIONS),
                                     str(txn_out), SECRET.decode(), TXN_ID, str(txn_stop), "1800", str(TXN_PAUSE_S)],
                                    stderr=open(tmp_path / "txn-producer.log", "wb"))
    acked: list[tuple[int, int, str]] = []
    failed: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        p = confluent_kafka.Producer({**cluster.client_config, "bootstrap.servers": cluster.bootstrap,
                                      "enable.idempotence": True,
                                      "acks": "all", "linger.ms": 2, "message.timeout.ms": 120000,
                                      "topic.metadata.refresh.interval.ms": 500})

        def report(err, msg):
            if err is None:
                acked.append((msg.partition(), msg.offset(), msg.value().decode()))
            else:
                failed.append(str(err))

        n = 0
        while not stop.is_set():
            p.produce(TOPIC, value=b"p%06d" % n, partition=n % PARTITIONS, on_delivery=report)
            n += 1
            p.poll(0.002)
        assert p.flush(120) == 0

    producer = threading.Thread(target=produce, daemon=True)
    kills = cuts = 0
    started = time.monotonic()
    try:
        producer.start()
        time.sleep(1.0)
        while kills < kills_wanted:
            if kills % 4 == 3:  # a cut link: the leader of a partition loses a follower for a moment
                leader = cluster.leader(TOPIC, rng.randrange(PARTITIONS))
                if leader is not None:
                    other = rng.choice([j for j in cluster.addrs if j != leader])
                    for link in ((leader, other), (other, leader)):
                        cluster.proxies[link].block()
                    time.sleep(rng.uniform(0.3, 1.0))
                    for link in ((leader, other), (other, leader)):
                        cluster.proxies[link].unblock()
                    cuts += 1
            target = rng.choice(KILL_TARGETS)
            victim = cluster.leader(*target)
            assert victim is not None, f"no leader of {target}"
            cluster.kill(victim)
            kills += 1
            time.sleep(rng.uniform(0.1, 0.6))
            cluster.start(victim)
            time.sleep(rng.uniform(0.2, 0.6))
        stop.set()
        txn_stop.touch()
        phases = {"faults": time.monotonic() - started}
        producer.join(150)
        assert not producer.is_alive() and failed == []
        assert txn_producer.wait(120) == 0
        phases["producers stopped"] = time.monotonic() - started
        wanted = {value for _, _, value in acked}
        deadline = time.monotonic() + 120
        while not wanted <= set(_consumed(outs)) and time.monotonic() < deadline:
            time.sleep(0.2)
        missing = wanted - set(_consumed(outs))
        assert not missing, f"{len(missing)} acknowledged records never consumed, e.g. {sorted(missing)[:5]}"
        phases["jg consumed"] = time.monotonic() - started

        # Quiesced: no transaction stays open (each partition's LSO reaches its high watermark).
        deadline = time.monotonic() + 90
        lag = _stable_lag(cluster)
        while (lag is None or any(rc != latest for rc, latest in lag.values())) and time.monotonic() < deadline:
            time.sleep(0.5)
            lag = _stable_lag(cluster)
        assert lag is not None and all(rc == latest for rc, latest in lag.values()), \
            f"a transaction stays open 90 s after the faults: (read_committed end, latest) {lag}"
        phases["quiesced"] = time.monotonic() - started
        visible = _read_committed_values(cluster)
        deadline = time.monotonic() + 120
        while not visible <= set(_consumed(txn_outs)) and time.monotonic() < deadline:
            time.sleep(0.2)
        txn_consumed = set(_consumed(txn_outs))
        assert visible <= txn_consumed, f"the {TXN_GROUP} group never consumed {sorted(visible - txn_consumed)[:5]}"
        assert txn_consumed <= visible, f"the {TXN_GROUP} group consumed {sorted(txn_consumed - visible)[:5]}, " \
            "which a later read_committed read does not see"
        phases["jtx consumed"] = time.monotonic() - started
        # Every replica holds the whole of each partition (its high watermark, as it last wrote
        # it down, reached the end): what the checks of the stopped nodes' logs below assume.
        deadline = time.monotonic() + 30
        while not all(_high_watermarks(tmp_path, i).get((TXN_TOPIC, p), 0) >= latest
                      for i in range(3) for p, (_, latest) in lag.items()) and time.monotonic() < deadline:
            time.sleep(0.2)
        behind = {(i, p): hw for i in range(3) for p, (_, latest) in lag.items()
                  if (hw := _high_watermarks(tmp_path, i).get((TXN_TOPIC, p), 0)) < latest}
        assert not behind, f"(node, partition) -> high watermark still behind the end {lag} after 30 s: {behind}"
        for proc in consumers:
            proc.send_signal(signal.SIGTERM)
        for proc in consumers:
            assert proc.wait(30) == 0
    finally:
        stop.set()
        txn_stop.touch()
        for proc in [*consumers, txn_producer]:
            if proc.poll() is None:
                proc.kill()
        cluster.stop_all()
    outcomes = _txn_outcomes(txn_out)
    counts = {kind: sum(1 for k in outcomes.values() if k == kind) for kind in "CAU"}
    print(f"{len(acked)} records acknowledged, {kills} kills, {cuts} cut links; transactions: "
          f"{counts['C']} committed, {counts['A']} aborted, {counts['U']} unknown; seconds at the end of each "
          f"phase: {', '.join(f'{k} {v:.1f}' for k, v in phases.items())}")
    assert kills >= kills_wanted and len(acked) > 100
    assert counts["C"] > 10 and counts["A"] > 2, counts

    # Atomicity, as the read_committed group saw it.
    for n, kind in sorted(outcomes.items()):
        values = _txn_values(n)
        seen = values & txn_consumed
        if kind == "C":
            assert seen == values, f"committed transaction {n}: {sorted(values - seen)} never consumed"
        elif kind == "A":
            assert not seen, f"aborted transaction {n}: {sorted(seen)} consumed"
        else:
            assert seen in (set(), values), f"transaction {n} (outcome unknown) consumed in part: {sorted(seen)}"
    strays = {v for v in txn_consumed if int(v[1:7]) not in outcomes}
    assert not strays, f"consumed values of no transaction the producer began: {sorted(strays)[:5]}"

    # The replicas agree on each partition's committed prefix, and the log holds each value once.
    committed = {}
    logs = {}
    for i in range(3):
        hws = _high_watermarks(tmp_path, i)
        for p in range(PARTITIONS):
            committed[(i, p)] = hws.get((TOPIC, p), 0)
    for p in range(PARTITIONS):
        prefix = min(committed[(i, p)] for i in range(3))
        seqs = []
        for i in range(3):
            log = Log.open(str(tmp_path / f"n{i}" / f"{TOPIC}-{p}"))
            try:
                seqs.append([(r.offset, r.value) for r in log.iter() if r.offset < prefix])
                if i == 0:
                    logs[p] = {r.offset: r.value.decode() for r in log.iter() if r.value is not None}
            finally:
                log.close()
        assert seqs[0] == seqs[1] == seqs[2], f"replicas disagree below the committed offset {prefix} of {TOPIC}-{p}"
    for p, values in logs.items():  # node 0's log holds each value at most once
        assert len(values) == len(set(values.values())), f"{TOPIC}-{p}: a value appended twice"
    for partition, offset, value in acked:  # every acknowledged value sits where its ack said
        if offset is None:  # librdkafka acknowledged it without an offset (an idempotent retry's
            continue        # batch confirmed by a later one's ack); consumed above like the rest
        if offset < min(committed[(i, partition)] for i in range(3)):
            assert logs[partition].get(offset) == value, (partition, offset, value)

    # Transactions on disk: none open on any replica; the replicas agree on the committed prefix,
    # markers (control batches) included; node 0's read_committed view holds each transaction
    # whole or not at all, and is what the consumers saw.
    node0_committed: set[str] = set()
    for p in range(PARTITIONS):
        prefix = min(_high_watermarks(tmp_path, i).get((TXN_TOPIC, p), 0) for i in range(3))
        batches = []
        for i in range(3):
            log = Log.open(str(tmp_path / f"n{i}" / f"{TXN_TOPIC}-{p}"))
            try:
                assert log.producer_transactions() == {}, \
                    f"node {i}: {TXN_TOPIC}-{p} holds open transactions {log.producer_transactions()}"
                batches.append(_batches_below(log, prefix))
                if i == 0:
                    node0_committed |= {r.value.decode() for r in log.iter(isolation_level="read_committed")}
            finally:
                log.close()
        assert batches[0] == batches[1] == batches[2], \
            f"replicas disagree below the committed offset {prefix} of {TXN_TOPIC}-{p} (control batches included)"
    for n, kind in sorted(outcomes.items()):
        seen = _txn_values(n) & node0_committed
        assert seen in (set(), _txn_values(n)), f"transaction {n} ({kind}) is in part in node 0's log: {sorted(seen)}"
        assert seen or kind != "C", f"committed transaction {n} is not in node 0's log"
        assert not seen or kind != "A", f"aborted transaction {n} is committed in node 0's log"
    assert node0_committed == visible, "node 0's read_committed view is not what the consumers read"

    # The group's commits never go backwards, in the replicated log's order.
    offsets_log = Log.open(str(tmp_path / "n0" / "__consumer_offsets-0"))
    try:
        last: dict[int, int] = {}
        for r in offsets_log.iter():
            key = decode_offset_key(r.key) if r.key is not None else None
            if key is None or key[0] != GROUP or r.value is None:
                continue
            offset = decode_offset_value(r.value)[0]
            assert offset >= last.get(key[2], -1), f"the commit of {key} went back from {last[key[2]]} to {offset}"
            last[key[2]] = offset
    finally:
        offsets_log.close()
    assert last, "the group committed nothing"
