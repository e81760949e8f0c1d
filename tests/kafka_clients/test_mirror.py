"""``logstore mirror``: a store's topics copied to a Kafka-protocol cluster exactly once.

The target is a second store behind ``KafkaServer`` (no Apache Kafka broker runs here). What
arrived is read back with confluent-kafka (an independent client) and from the target's files;
crashes are simulated in-process (a lost Produce answer, a stop before the commit) and for real
(``kill -9`` of ``logstore mirror`` halfway through a million records)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from logstore import KafkaServer, LogStore
from logstore.kafka.client import KafkaClient, KafkaClientError
from logstore.mirror import Mirror, MirrorError, main

confluent_kafka = pytest.importorskip("confluent_kafka")


@pytest.fixture
def target(tmp_path):
    with KafkaServer(str(tmp_path / "target"), ("127.0.0.1", 0)) as server:
        yield server


@pytest.fixture
def source(tmp_path):
    with LogStore(str(tmp_path / "source")) as store:
        yield store


def _fill(store, topic="events", partitions=3, per_partition=300, start=0, **config):
    if topic not in store.topics():
        store.create_topic(topic, partitions, **config)
    for p in range(partitions):
        log = store.partition(topic, p)
        values = [b"%s-%d-%d" % (topic.encode(), p, start + i) if i % 17 != 5 else None for i in range(per_partition)]
        keys = [b"k%d" % (i % 11) if i % 3 else None for i in range(per_partition)]
        headers = [[("n", b"%d" % i), ("empty", None)] if i % 4 == 0 else None for i in range(per_partition)]
        timestamps = [1_700_000_000_000 + start + i for i in range(per_partition)]
        log.append_batch(values, keys, headers, timestamps)


def _content(records):
    return [(r.key, r.value, list(r.headers), r.timestamp) for r in records]


def _same(source, target_store, topic):
    for p in range(source.partitions_for(topic)):
        assert _content(target_store.partition(topic, p).iter()) == _content(source.partition(topic, p).iter()), \
            f"{topic}-{p} differs"


def test_topics_are_copied_with_keys_values_headers_and_timestamps(source, target):
    _fill(source)
    _fill(source, "zipped", partitions=2, per_partition=500, **{"compression.type": "zstd"})
    mirror = Mirror(source, target.bootstrap_servers)
    try:
        stats = mirror.run()
    finally:
        mirror.close()
    assert stats.done and stats.records == 3 * 300 + 2 * 500 and stats.skipped == 0
    assert target.store.partitions_for("events") == 3 and target.store.partitions_for("zipped") == 2
    _same(source, target.store, "events")
    _same(source, target.store, "zipped")
    from logstore.records.batch import parse_header

    def first_codec(topic):
        path = os.path.join(target.store.partition(topic, 0).path, "00000000000000000000.log")
        with open(path, "rb") as f:
            return parse_header(f.read(4096), 0).compression
    assert (first_codec("events"), first_codec("zipped")) == (0, 4)  # as the source topics say
    # An independent reader of the target: confluent-kafka, partition 1 of events.
    consumer = confluent_kafka.Consumer({"bootstrap.servers": target.bootstrap_servers, "group.id": "check",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition("events", 1, 0)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 300 and time.monotonic() < deadline:
        m = consumer.poll(1.0)
        if m is not None and m.error() is None:
            got.append((m.key(), m.value(), [(k, v) for k, v in (m.headers() or [])], m.timestamp()[1]))
    consumer.close()
    assert got == _content(source.partition("events", 1).iter())


def test_a_second_run_copies_only_what_is_new_and_follow_stops_when_asked(source, target):
    _fill(source, partitions=2, per_partition=100)
    with Mirror(source, target.bootstrap_servers) as mirror:
        assert mirror.run().records == 200
        _fill(source, partitions=2, per_partition=50, start=100)
        assert mirror.run().records == 100
    with Mirror(source, target.bootstrap_servers, batch_records=7) as mirror:  # a restart
        stats = mirror.run()
    assert stats.records == 0 and stats.skipped == 0 and stats.done
    _same(source, target.store, "events")

    import threading
    stop = threading.Event()
    with Mirror(source, target.bootstrap_servers, commit_interval=0.05) as mirror:
        runner = threading.Thread(target=mirror.run, kwargs={"follow": True, "stop": stop, "poll": 0.05})
        runner.start()
        _fill(source, partitions=2, per_partition=30, start=150)
        deadline = time.monotonic() + 20
        while target.store.partition("events", 1).log_end_offset < 180 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        runner.join(10)
        assert not runner.is_alive()
    _same(source, target.store, "events")


def _commit_only_the_start(monkeypatch):
    """Let a Mirror commit its starting point and nothing after (as if killed before the next
    commit); monkeypatch.undo() lifts it."""
    commits = []
    original = Mirror._commit

    def only_the_first(self, force=False):
        if not commits:
            commits.append(force)
            original(self, force)

    monkeypatch.setattr(Mirror, "_commit", only_the_first)


def test_records_written_after_the_last_commit_are_not_sent_again(source, target, monkeypatch):
    _fill(source, partitions=2, per_partition=400)
    _commit_only_the_start(monkeypatch)  # a crash after the produces, before any later commit
    with Mirror(source, target.bootstrap_servers, batch_records=64) as mirror:
        assert mirror.run().records == 800
    monkeypatch.undo()
    _fill(source, partitions=2, per_partition=10, start=400)
    with Mirror(source, target.bootstrap_servers) as mirror:
        stats = mirror.run()
    assert stats.skipped == 800 and stats.records == 20
    _same(source, target.store, "events")


def test_records_deleted_between_the_last_commit_and_a_restart_stop_the_mirror(source, target, monkeypatch):
    _fill(source, partitions=1, per_partition=300)
    _commit_only_the_start(monkeypatch)
    with Mirror(source, target.bootstrap_servers, batch_records=50) as mirror:
        mirror.run()
    monkeypatch.undo()
    source.partition("events", 0).delete_records_before(120)  # written, not committed, now gone
    with pytest.raises(MirrorError, match="were deleted after the last commit"):
        Mirror(source, target.bootstrap_servers).run()


def test_a_produce_whose_answer_is_lost_is_not_sent_twice(source, target, monkeypatch):
    _fill(source, partitions=1, per_partition=500)
    calls = []
    original = KafkaClient.produce

    def loses_answers(self, topic, partition, batch, acks=-1):
        calls.append(partition)
        base = original(self, topic, partition, batch, acks)
        if len(calls) in (2, 5):
            raise KafkaClientError("the connection was closed (injected after the append)")
        return base

    monkeypatch.setattr(KafkaClient, "produce", loses_answers)
    with Mirror(source, target.bootstrap_servers, batch_records=50) as mirror:
        stats = mirror.run()
    assert stats.records == 500 and len(calls) == 10  # no batch was sent a second time
    _same(source, target.store, "events")


def test_what_would_lose_or_duplicate_records_is_refused(source, target, tmp_path):
    _fill(source, partitions=2, per_partition=20)
    target.store.create_topic("events", 1)
    with pytest.raises(MirrorError, match="has 1 partitions, the source 2"):
        Mirror(source, target.bootstrap_servers).run()
    with KafkaServer(str(tmp_path / "other"), ("127.0.0.1", 0)) as other:
        with Mirror(source, other.bootstrap_servers) as mirror:
            mirror.run()
        other.store.delete_topic("events")
        other.store.create_topic("events", 2)  # the target lost what it acknowledged
        with pytest.raises(MirrorError, match="lost acknowledged records"):
            Mirror(source, other.bootstrap_servers).run()
        target.store.delete_topic("events")
        with pytest.raises(MirrorError, match="mirrors to cluster"):
            Mirror(source, target.bootstrap_servers).run()  # the same group, another target
    with pytest.raises(KafkaClientError, match="cannot connect"):
        Mirror(source, "127.0.0.1:1")
    with pytest.raises(ValueError):
        Mirror(source, target.bootstrap_servers, batch_records=0)


def test_the_command_copies_and_reports(source, target, capsys):
    _fill(source, partitions=1, per_partition=30)
    _fill(source, "other", partitions=1, per_partition=5)
    root = source.root
    source.close()
    assert main([root, "--to", target.bootstrap_servers, "--topic", "events", "--compression", "gzip"]) == 0
    assert "30 records copied" in capsys.readouterr().err
    with open(os.path.join(target.store.partition("events", 0).path, "00000000000000000000.log"), "rb") as f:
        from logstore.records.batch import parse_header
        assert parse_header(f.read(4096), 0).compression == 1  # gzip, as asked
    assert "other" not in target.store.topics()
    assert main([root, "--to", "127.0.0.1:1"]) == 1
    assert "cannot connect" in capsys.readouterr().err
    assert main([root]) == 2


def test_kill_9_halfway_through_a_million_records_then_resume(tmp_path, target):
    root = str(tmp_path / "big")
    total, partitions = 1_000_000, 2
    with LogStore(root) as store:
        store.create_topic("big", partitions)
        for p in range(partitions):
            log = store.partition("big", p)
            for b in range(total // partitions // 1000):
                log.append_batch([b"%d" % (b * 1000 + i) for i in range(1000)])
    command = [sys.executable, "-m", "logstore", "mirror", root, "--to", target.bootstrap_servers, "-q"]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ends = lambda: sum(target.store.partition("big", p).log_end_offset  # noqa: E731
                       for p in range(partitions)) if "big" in target.store.topics() else 0
    deadline = time.monotonic() + 120
    while ends() < total // 3 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.poll() is None, f"the mirror ended before it could be killed: {child.stderr.read()!r}"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert 0 < ends() < total
    done = subprocess.run(command, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for p in range(partitions):
        values = [r.value for r in target.store.partition("big", p).iter()]
        assert values == [b"%d" % i for i in range(total // partitions)], f"big-{p}: not each record once, in order"


# ---------------------------------------------------------------------- TLS and SASL targets
@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A SASL_SSL and a SASL_PLAINTEXT target, user alice with every mechanism."""
    import io

    from logstore.cli import main as cli_main
    from logstore.net.protocol import TLSConfig

    from .tls_certs import make_certs

    base = tmp_path_factory.mktemp("secured")
    users = base / "kafka-users"
    argv = ["kafka-user", "add", str(users), "alice"] + [a for m in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
                                                         for a in ("--mechanism", m)]
    assert cli_main(argv, stdin=io.StringIO("alice's secret\n")) == 0
    certs = make_certs(base / "certs")
    with KafkaServer(str(base / "ssl"), ("127.0.0.1", 0), sasl_credentials=users,
                     tls=TLSConfig(certs.server_cert, certs.server_key)) as sasl_ssl, \
            KafkaServer(str(base / "plain"), ("127.0.0.1", 0), sasl_credentials=users) as sasl_plaintext:
        yield {"SASL_SSL": sasl_ssl, "SASL_PLAINTEXT": sasl_plaintext, "ca": certs.ca}


@pytest.mark.parametrize("protocol,mechanism", [("SASL_PLAINTEXT", "PLAIN"), ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
                                                ("SASL_SSL", "SCRAM-SHA-512")])
def test_a_target_behind_tls_and_sasl(source, secured, protocol, mechanism):
    from logstore.kafka.client import Security

    server = secured[protocol]
    topic = f"secure-{mechanism}".lower()
    _fill(source, topic, partitions=2, per_partition=40)
    security = Security(protocol, mechanism, "alice", "alice's secret", ca_file=secured["ca"])
    with Mirror(source, server.bootstrap_servers, [topic], security=security, group=f"m-{topic}") as mirror:
        assert mirror.run().records == 80
    _same(source, server.store, topic)
    wrong = Security(protocol, mechanism, "alice", "not it", ca_file=secured["ca"])
    with pytest.raises(KafkaClientError, match="authentication with .* failed"):
        Mirror(source, server.bootstrap_servers, [topic], security=wrong)
    if protocol == "SASL_SSL":
        with pytest.raises(KafkaClientError, match="cannot connect"):  # the system's CAs do not know ours
            Mirror(source, server.bootstrap_servers, [topic], security=Security(protocol, mechanism, "alice", "x"))


def test_the_command_reads_kafka_client_properties(source, secured, tmp_path, capsys):
    _fill(source, "props", partitions=1, per_partition=25)
    root = source.root
    source.close()
    config = tmp_path / "client.properties"
    config.write_text("# as for kafka-console-producer --producer.config\n"
                      "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                      'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required '
                      'username="alice" password="alice\'s secret";\n'
                      f"ssl.ca.location={secured['ca']}\n")
    server = secured["SASL_SSL"]
    assert main([root, "--to", server.bootstrap_servers, "--topic", "props", "--config-file", str(config)]) == 0
    assert "25 records copied" in capsys.readouterr().err
    assert [r.value for r in server.store.partition("props", 0).iter()] == \
        [b"props-0-%d" % i if i % 17 != 5 else None for i in range(25)]
    assert main([root, "--to", server.bootstrap_servers, "--config", "security.protocol=SASL_SSL", "--config",
                 "sasl.mechanism=PLAIN"]) == 1
    assert "needs sasl.username and sasl.password" in capsys.readouterr().err
    assert main([root, "--to", server.bootstrap_servers, "--config", "oops"]) == 1
    assert "not a KEY=VALUE property" in capsys.readouterr().err
