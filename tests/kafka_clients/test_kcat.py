"""kcat (Debian's package: librdkafka 2.0, older than 2.11.1) against a served store. That
librdkafka enables a feature only when single versions lie in the advertised ranges (Produce 3
and Fetch 4 for v2 batches, FindCoordinator 0 for groups, InitProducerId 0 for idempotence) and
compresses only when Produce's minimum version is 0: each test here fails if a range is wrong.
Skipped where kcat is not installed (``apt-get install kcat``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from logstore.client.consumer import offset_store
from logstore.records.batch import batch_headers, parse_header

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (apt-get install kcat)")

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def kcat(server, *args, stdin=None, timeout=30):
    done = subprocess.run([KCAT, "-b", server.bootstrap_servers, *args], input=stdin, capture_output=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode()


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_kcat_produces_compressed_keyed_batches_that_the_library_reads(kafka_server, codec):
    topic = f"kcat-{codec}"
    value = "compressible " * 40  # librdkafka sends a batch uncompressed when that is smaller
    lines = "".join(f"key{i}:{value}{i}\n" for i in range(20)).encode()
    kcat(kafka_server, "-P", "-t", topic, "-K:", "-z", codec, "-X", "linger.ms=50", stdin=lines)
    log = kafka_server.store.partition(topic, 0)
    assert [(r.key, r.value) for r in log.iter()] == [(b"key%d" % i, b"%s%d" % (value.encode(), i))
                                                      for i in range(20)]
    codecs = {h.attributes & 0x7 for _, h in batch_headers(log.read_raw(0, 1 << 20))}
    assert codecs == {CODECS[codec]}  # compressed as asked: Produce's minimum version is 0


def test_kcat_idempotent_produce_and_consume_from_offsets(kafka_server):
    kcat(kafka_server, "-P", "-t", "kcat-idem", "-X", "enable.idempotence=true",
         stdin=b"".join(b"m%d\n" % i for i in range(10)))
    header = parse_header(kafka_server.store.partition("kcat-idem", 0).read_raw(0, 1 << 20))
    assert header.producer_id >= 0 and header.base_sequence == 0  # InitProducerId 0 was usable
    out = kcat(kafka_server, "-C", "-t", "kcat-idem", "-o", "4", "-e", "-f", "%o:%s\n")
    assert out.splitlines() == [f"{i}:m{i}" for i in range(4, 10)]
    out = kcat(kafka_server, "-C", "-t", "kcat-idem", "-o", "-3", "-e", "-f", "%s\n")
    assert out.splitlines() == ["m7", "m8", "m9"]


def test_kcat_lists_metadata(kafka_server):
    kafka_server.store.create_topic("kcat-listed", 3)
    out = kcat(kafka_server, "-L")
    assert "1 brokers:" in out and 'topic "kcat-listed" with 3 partitions' in out


def test_kcat_group_consumer_commits_what_the_library_reads(kafka_server):
    store = kafka_server.store
    store.create_topic("kcat-group", 2)
    for p in range(2):
        store.partition("kcat-group", p).append_batch([b"%d-%d" % (p, i) for i in range(5)])
    out = kcat(kafka_server, "-G", "kcat-readers", "kcat-group", "-o", "beginning", "-e", "-f", "%p %s\n",
               "-X", "enable.auto.commit=true", "-X", "auto.commit.interval.ms=100")
    assert sorted(out.splitlines()) == sorted(f"{p} {p}-{i}" for p in range(2) for i in range(5))
    offsets = offset_store(store)
    assert [offsets.committed("kcat-readers", "kcat-group", p) for p in range(2)] == [5, 5]


def test_kcat_transactional_produce_commits_and_read_committed_consume(kafka_server):
    """kcat -X transactional.id: its producer wraps the lines in one transaction, committed at
    the end; a read_committed kcat consumer sees them, and the log holds the COMMIT marker."""
    kcat(kafka_server, "-P", "-t", "kcat-txn", "-X", "transactional.id=kcat-tx",
         stdin=b"".join(b"t%d\n" % i for i in range(8)))
    log = kafka_server.store.partition("kcat-txn", 0)
    assert [r.value for r in log.iter(isolation_level="read_committed")] == [b"t%d" % i for i in range(8)]
    headers = [h for _, h in batch_headers(log.read_raw(0, 1 << 20))]
    assert headers[0].attributes & 0x10 and headers[-1].attributes & 0x30 == 0x30  # transactional data, a marker
    out = kcat(kafka_server, "-C", "-t", "kcat-txn", "-e", "-X", "isolation.level=read_committed", "-f", "%s\n")
    assert out.splitlines() == [f"t{i}" for i in range(8)]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kcat_authenticates_with_scram_despite_its_doubled_nonce(tmp_path, mechanism):
    """Debian's kcat (librdkafka 2.0.2) sends back its SCRAM nonce with its own part doubled
    (librdkafka#4895, fixed in 2.6.1): accepted as Kafka 3.8.1-3.9 accept it, and the wrong
    password still fails."""
    from logstore.kafka.server import KafkaServer

    with KafkaServer(str(tmp_path / "store"), ("127.0.0.1", 0), sasl_credentials={"kc": "s3cret"}) as server:
        def run(password, *args):
            return subprocess.run([KCAT, "-b", server.bootstrap_servers, "-X", "security.protocol=SASL_PLAINTEXT",
                                   "-X", f"sasl.mechanisms={mechanism}", "-X", "sasl.username=kc",
                                   "-X", f"sasl.password={password}", *args], input=b"a\nb\n", capture_output=True,
                                  timeout=30)
        produced = run("s3cret", "-P", "-t", "kcat-scram")
        assert produced.returncode == 0, produced.stderr.decode(errors="replace")
        assert [r.value for r in server.store.partition("kcat-scram", 0).iter()] == [b"a", b"b"]
        refused = run("wrong", "-L")
        assert refused.returncode != 0 and b"Authentication failed" in refused.stderr
