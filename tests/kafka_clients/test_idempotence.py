"""An idempotent producer's batches on the raw wire: a retry gets the base offset its batch
already has and is stored once, a gap in the sequence is OUT_OF_ORDER_SEQUENCE_NUMBER (45), an
older epoch INVALID_PRODUCER_EPOCH (47), and the producer state outlives a server restart and a
kill -9 of ``logstore serve``.

The requests are written by hand from Kafka's protocol guide (Produce v3) and the record batches
by kafka-python's own builder, not by logstore's codec.
"""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from logstore import LogStore
from logstore.kafka.server import KafkaServer

from .test_wire_edges import connect, request, response

pytest.importorskip("kafka.record")
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
TOPIC = "idem"


def kafka_batch(values: list[bytes], producer_id: int, epoch: int, sequence: int) -> bytes:
    """A v2 record batch as kafka-python's idempotent producer builds it (no compression)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
                                        producer_epoch=epoch, base_sequence=sequence, batch_size=1 << 20)
    now = int(time.time() * 1000)
    for i, value in enumerate(values):
        builder.append(i, timestamp=now, key=None, value=value, headers=[])
    return bytes(builder.build())


def produce(sock, batch: bytes, correlation: int, topic: str = TOPIC) -> tuple[int, int]:
    """Send a Produce v3 (acks=1) of ``batch`` to partition 0; (error code, base offset)."""
    name = topic.encode()
    body = (struct.pack(">hhi", -1, 1, 5000) + struct.pack(">ih", 1, len(name)) + name
            + struct.pack(">iii", 1, 0, len(batch)) + batch)
    sock.sendall(request(0, 3, correlation, body))
    payload = response(sock)
    # correlation, [topic [partition error base_offset log_append_time]], throttle
    got_correlation, topics, name_len = struct.unpack_from(">iih", payload, 0)
    position = 10 + name_len
    partitions, partition, error, base, _ = struct.unpack_from(">iihqq", payload, position)
    assert (got_correlation, topics, partitions, partition) == (correlation, 1, 1, 0)
    return error, base


def start(root) -> KafkaServer:
    server = KafkaServer(str(root), ("127.0.0.1", 0)).start()
    server.store.create_topic(TOPIC, exist_ok=True)
    return server


@pytest.fixture
def server(tmp_path):
    s = start(tmp_path)
    yield s
    s.stop()


def stored(server) -> list[bytes]:
    return [r.value for r in server.store.partition(TOPIC, 0).iter()]


def test_a_retried_batch_gets_its_original_base_offset_and_is_stored_once(server):
    first = kafka_batch([b"a", b"b", b"c"], producer_id=1000, epoch=0, sequence=0)
    second = kafka_batch([b"d"], producer_id=1000, epoch=0, sequence=3)
    with connect(server) as s:
        assert produce(s, kafka_batch([b"other"], 2000, 0, 0), 1) == (0, 0)
        assert produce(s, first, 2) == (0, 1)
        assert produce(s, second, 3) == (0, 4)
        assert produce(s, first, 4) == (0, 1)    # a retry of an earlier in-flight batch
        assert produce(s, second, 5) == (0, 4)   # and of the latest
    assert stored(server) == [b"other", b"a", b"b", b"c", b"d"]


def test_a_gap_in_the_sequence_is_out_of_order_sequence_number(server):
    with connect(server) as s:
        assert produce(s, kafka_batch([b"a"], 1000, 0, 0), 1) == (0, 0)
        assert produce(s, kafka_batch([b"c"], 1000, 0, 2), 2) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
        assert produce(s, kafka_batch([b"b"], 1000, 1, 5), 3) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)  # new epoch, not 0
        assert produce(s, kafka_batch([b"b"], 1000, 0, 1), 4) == (0, 1)
    assert stored(server) == [b"a", b"b"]


def test_an_older_epoch_is_invalid_producer_epoch(server):
    with connect(server) as s:
        assert produce(s, kafka_batch([b"a"], 1000, 3, 0), 1) == (0, 0)
        assert produce(s, kafka_batch([b"b"], 1000, 4, 0), 2) == (0, 1)   # the producer bumped its epoch
        assert produce(s, kafka_batch([b"z"], 1000, 3, 1), 3) == (INVALID_PRODUCER_EPOCH, -1)
        assert produce(s, kafka_batch([b"a"], 1000, 3, 0), 4) == (INVALID_PRODUCER_EPOCH, -1)  # fenced: no duplicate
    assert stored(server) == [b"a", b"b"]


def test_a_retry_after_the_server_restarts_is_still_recognised(tmp_path):
    batches = [kafka_batch([b"v%d" % i] * 2, 1000, 0, 2 * i) for i in range(4)]
    server = start(tmp_path)
    try:
        with connect(server) as s:
            for i, batch in enumerate(batches):
                assert produce(s, batch, i) == (0, 2 * i)
    finally:
        server.stop()
    assert sorted(n for n in (tmp_path / f"{TOPIC}-0").iterdir() if n.suffix == ".snapshot")
    server = start(tmp_path)
    try:
        with connect(server) as s:
            assert produce(s, batches[-1], 10) == (0, 6)
            assert produce(s, kafka_batch([b"next"], 1000, 0, 9), 11) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
            assert produce(s, kafka_batch([b"next"], 1000, 0, 8), 12) == (0, 8)
        assert len(stored(server)) == 9
    finally:
        server.stop()


def test_a_retry_on_a_new_connection_after_kill_9_of_the_server_is_still_recognised(tmp_path):
    """``logstore serve`` killed with SIGKILL after acknowledging batches (no clean close, no
    snapshot written at exit): after a restart, a producer replaying its last batch on a new
    connection gets the batch's original offset and nothing is stored twice; the producer state
    is rebuilt from the log."""

    def serve():
        proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", str(tmp_path), "--listen", "127.0.0.1:0"],
                                stdout=subprocess.PIPE, text=True)
        host, port = proc.stdout.readline().rsplit(" ", 1)[1].strip().rsplit(":", 1)
        return proc, (host, int(port))

    with LogStore(str(tmp_path)) as store:
        store.create_topic(TOPIC)
    batches = [kafka_batch([b"k%d" % i] * 3, 2000, 0, 3 * i) for i in range(5)]
    proc, address = serve()
    try:
        with socket.create_connection(address, timeout=10) as s:
            for i, batch in enumerate(batches):
                assert produce(s, batch, i) == (0, 3 * i)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    proc, address = serve()
    try:
        with socket.create_connection(address, timeout=10) as s:  # the producer reconnects and retries its last batch
            assert produce(s, batches[-1], 20) == (0, 12)
            assert produce(s, batches[2], 21) == (0, 6)  # one of its last five batches
            assert produce(s, kafka_batch([b"next"], 2000, 0, 16), 22) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
            assert produce(s, kafka_batch([b"next"], 2000, 0, 15), 23) == (0, 15)
    finally:
        proc.terminate()
        proc.wait(30)
    with LogStore(str(tmp_path)) as store:
        values = [r.value for r in store.partition(TOPIC, 0).iter()]
    assert values == [b"k%d" % i for i in range(5) for _ in range(3)] + [b"next"]
