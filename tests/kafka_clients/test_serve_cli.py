"""``logstore serve``: prints the bound address once it accepts, serves, stops cleanly on SIGTERM
or SIGINT; its listener and TLS/SASL flags."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time

import pytest

kafka = pytest.importorskip("kafka")


def test_serve_prints_its_address_serves_and_stops_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", str(tmp_path / "store"),
                             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving ") and " on 127.0.0.1:" in line, line
        bootstrap = line.split(" on ")[1].strip()
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        try:
            assert producer.send("cli", value=b"hello").get(10).offset == 0
        finally:
            producer.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    from logstore import LogStore

    with LogStore(str(tmp_path / "store")) as store:
        assert [r.value for r in store.partition("cli", 0).iter()] == [b"hello"]


def test_serve_with_sasl_and_tls(tmp_path):
    """``logstore serve --sasl-credentials FILE --tls-cert F --tls-key F``: a SASL_SSL listener; the
    users come from ``logstore kafka-user add``."""
    from .tls_certs import make_certs

    certs = make_certs(tmp_path / "certs")
    users = tmp_path / "users"
    added = subprocess.run([sys.executable, "-m", "logstore", "kafka-user", "add", str(users), "alice",
                            "--mechanism", "SCRAM-SHA-512"], input="alice-pw\n", capture_output=True, text=True)
    assert added.returncode == 0, added.stderr
    proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", str(tmp_path / "store"), "--listen",
                             "127.0.0.1:0", "--sasl-credentials", str(users), "--tls-cert", certs.server_cert,
                             "--tls-key", certs.server_key], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), (line, proc.stderr.read() if proc.poll() is not None else "")
        producer = kafka.KafkaProducer(bootstrap_servers=line.split(" on ")[1].strip(), security_protocol="SASL_SSL",
                                       ssl_cafile=certs.ca, sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
                                       sasl_plain_password="alice-pw", request_timeout_ms=10_000)
        try:
            assert producer.send("secure", value=b"hello").get(10).offset == 0
        finally:
            producer.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_refuses_half_a_tls_configuration_and_a_bad_credentials_file(tmp_path):
    half = subprocess.run([sys.executable, "-m", "logstore", "serve", str(tmp_path / "s"), "--tls-key", "k.pem"],
                          capture_output=True, text=True, timeout=30)
    assert half.returncode == 2 and "--tls-cert and --tls-key go together" in half.stderr
    (tmp_path / "users").write_text("alice:PLAIN:salt=AA==\n")
    bad = subprocess.run([sys.executable, "-m", "logstore", "serve", str(tmp_path / "s"), "--sasl-credentials",
                          str(tmp_path / "users")], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "users, line 1: PLAIN needs salt, iterations, hash" in bad.stderr


@contextlib.contextmanager
def served(root, *args, stop=signal.SIGTERM):
    """``logstore serve ROOT --listen 127.0.0.1:0 ARGS`` in a process: yields its bootstrap
    address once it prints it; on leaving, sends ``stop`` and checks a clean exit."""
    proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", str(root), "--listen", "127.0.0.1:0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), (line, proc.stderr.read() if proc.poll() is not None else "")
        yield line.split(" on ")[1].strip()
        proc.send_signal(stop)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_names_its_advertised_listener_and_node_id(tmp_path):
    """Metadata names the broker as ``--advertised-listener`` and ``--node-id`` say (read by
    confluent-kafka from the bootstrap connection; the advertised name need not resolve)."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient

    from logstore import LogStore

    with LogStore(str(tmp_path / "store")) as store:
        store.create_topic("t", 2)
    with served(tmp_path / "store", "--advertised-listener", "broker.example:19092", "--node-id", "7") as bootstrap:
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    assert metadata.controller_id == 7
    assert {(b.id, b.host, b.port) for b in metadata.brokers.values()} == {(7, "broker.example", 19092)}
    assert sorted((p.id, p.leader, p.replicas, p.isrs) for p in metadata.topics["t"].partitions.values()) == \
        [(0, 7, [7], [7]), (1, 7, [7], [7])]


def test_serve_stops_cleanly_on_sigint(tmp_path):
    """SIGINT closes the store as SIGTERM does: the partition a client wrote to is closed with
    Kafka's clean-shutdown marker (absent while it is open)."""
    marker = tmp_path / "store" / "cli-0" / ".kafka_cleanshutdown"
    with served(tmp_path / "store", stop=signal.SIGINT) as bootstrap:
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        try:
            assert producer.send("cli", value=b"hello").get(10).offset == 0
        finally:
            producer.close()
        assert (tmp_path / "store" / "cli-0").is_dir() and not marker.exists()
    assert marker.exists()


def test_serve_with_oauthbearer_and_re_authentication(tmp_path):
    """``logstore serve --sasl-oauthbearer NAME=VALUE --connections-max-reauth-ms MS``: Kafka's
    settings on the command line; librdkafka's unsecured JWT with the required scope logs in and
    re-authenticates; a JWKS file with both a password user: both mechanisms enabled."""
    ck = pytest.importorskip("confluent_kafka")
    settings = ["--sasl-oauthbearer", "sasl.oauthbearer.unsecured.validator.enable=true",
                "--sasl-oauthbearer", "sasl.oauthbearer.unsecured.validator.required.scope=write",
                "--connections-max-reauth-ms", "1200"]
    with served(tmp_path / "store", *settings) as bootstrap:
        producer = ck.Producer({"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                                "sasl.mechanisms": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
                                "sasl.oauthbearer.config": "principal=cli scope=write"})
        delivered = []
        for i in range(3):
            producer.produce("cli-oauth", b"%d" % i, on_delivery=lambda err, msg: delivered.append(err))
            producer.flush(10)
            if i < 2:
                time.sleep(1.1)  # past a session lifetime: librdkafka re-authenticated meanwhile
        assert delivered == [None, None, None]


def test_serve_refuses_unknown_or_incomplete_oauthbearer_settings(tmp_path):
    added = subprocess.run([sys.executable, "-m", "logstore", "kafka-user", "add", str(tmp_path / "users"), "u",
                            "--mechanism", "PLAIN"], input="pw\n", capture_output=True, text=True)
    assert added.returncode == 0, added.stderr
    for args, message in ((["--sasl-oauthbearer", "sasl.oauthbearer.nope=1"], "expected NAME=VALUE"),
                          (["--sasl-oauthbearer", "sasl.oauthbearer.expected.issuer=x"], "exactly one of"),
                          (["--sasl-mechanisms", "OAUTHBEARER"], "OAUTHBEARER needs"),
                          (["--sasl-credentials", str(tmp_path / "users"), "--sasl-mechanisms", "OAUTHBEARER"],
                           "OAUTHBEARER needs")):
        run = subprocess.run([sys.executable, "-m", "logstore", "serve", str(tmp_path / "s"), *args],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode in (1, 2) and message in run.stderr, run.stderr


def test_serve_takes_the_initial_rebalance_delay(tmp_path):
    """``--group-initial-rebalance-delay-ms`` is Kafka's ``group.initial.rebalance.delay.ms``,
    as DescribeConfigs of the broker shows it (confluent-kafka's AdminClient); 0 by default."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, ConfigResource

    def delay(*args):
        with served(tmp_path / "store", *args) as bootstrap:
            admin = AdminClient({"bootstrap.servers": bootstrap})
            broker = ConfigResource("broker", "0")
            [future] = admin.describe_configs([broker]).values()
            return future.result(timeout=10)["group.initial.rebalance.delay.ms"].value

    assert delay("--group-initial-rebalance-delay-ms", "3000") == "3000"
    assert delay() == "0"
    refused = subprocess.run([sys.executable, "-m", "logstore", "serve", str(tmp_path / "s"),
                              "--group-initial-rebalance-delay-ms", "-1"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "rebalance-delay" in refused.stderr
