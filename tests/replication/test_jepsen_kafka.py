"""Jepsen-style, with real Kafka clients: three `logstore node` processes with Kafka listeners,
replication links through fault-injecting proxies; a confluent-kafka idempotent producer with
acks=all and a kafka-python consumer group of two processes, while partition leaders (and the
group coordinator's node) are SIGKILLed and restarted and replication links are cut.

Checks: every acknowledged record is consumed; the log holds each produced value at most once
(no retry of the producer appended twice); the group's committed offsets, in the order the
replicated __consumer_offsets log holds them, never go backwards; the replicas agree on the
committed prefix of every partition."""

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

from .kafkanodes import KafkaNodes

confluent_kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")

SECRET = b"jepsen-secret"
TOPIC, PARTITIONS, GROUP = "jepsen", 2, "jg"
KILLS = int(os.environ.get("LOGSTORE_JEPSEN_KILLS", "20"))
WORKER = Path(__file__).with_name("_kafka_group_worker.py")


def _consumed(outs):
    got = []
    for out in outs:
        if out.exists():
            got += [line.split()[3] for line in out.read_text().splitlines() if line.startswith("R ")]
    return got


def test_jepsen_kafka_clients_through_kills_and_cut_links(tmp_path):
    _jepsen(tmp_path, KILLS)


@pytest.mark.slow
def test_jepsen_kafka_soak(tmp_path):
    """make soak: five times the kills."""
    _jepsen(tmp_path, 5 * KILLS)


def _jepsen(tmp_path, kills_wanted):
    rng = random.Random(int(os.environ.get("LOGSTORE_JEPSEN_SEED", "1834")))
    cluster = KafkaNodes(tmp_path, SECRET, topics=f"{TOPIC}:{PARTITIONS}", proxies=True)
    for i in range(3):
        cluster.start(i)
    outs = [tmp_path / f"consumer{i}.txt" for i in range(2)]
    consumers = [subprocess.Popen([sys.executable, str(WORKER), cluster.bootstrap, GROUP, TOPIC, str(out),
                                   SECRET.decode()])
                 for out in outs]
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
            target = rng.choice([(TOPIC, 0), (TOPIC, 1), ("__consumer_offsets", 0)])
            victim = cluster.leader(*target)
            assert victim is not None, f"no leader of {target}"
            cluster.kill(victim)
            kills += 1
            time.sleep(rng.uniform(0.1, 0.6))
            cluster.start(victim)
            time.sleep(rng.uniform(0.2, 0.6))
        stop.set()
        producer.join(150)
        assert not producer.is_alive() and failed == []
        wanted = {value for _, _, value in acked}
        deadline = time.monotonic() + 120
        while not wanted <= set(_consumed(outs)) and time.monotonic() < deadline:
            time.sleep(0.2)
        missing = wanted - set(_consumed(outs))
        assert not missing, f"{len(missing)} acknowledged records never consumed, e.g. {sorted(missing)[:5]}"
        for proc in consumers:
            proc.send_signal(signal.SIGTERM)
        for proc in consumers:
            assert proc.wait(30) == 0
    finally:
        stop.set()
        for proc in consumers:
            if proc.poll() is None:
                proc.kill()
        cluster.stop_all()
    print(f"{len(acked)} records acknowledged, {kills} kills, {cuts} cut links")
    assert kills >= kills_wanted and len(acked) > 100

    # The replicas agree on each partition's committed prefix, and the log holds each value once.
    committed = {}
    logs = {}
    for i in range(3):
        hws = OffsetCheckpoints(str(tmp_path / f"n{i}"), REPLICATION_OFFSET_CHECKPOINT).read()
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
        if offset < min(committed[(i, partition)] for i in range(3)):
            assert logs[partition].get(offset) == value, (partition, offset, value)

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
