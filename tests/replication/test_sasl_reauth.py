"""A replica set with KIP-368's ``connections.max.reauth.ms`` and OAUTHBEARER: its peers (the
replica user's connections) and :class:`~logstore.replication.Client` re-authenticate as the
session lifetime asks, so replication and acks=all produces go on across several lifetimes with
no connection closed for an expired session; a confluent-kafka client logs in with librdkafka's
unsecured JWT; AlterUserScramCredentials is refused (each node's users are its own file) and
DescribeUserScramCredentials describes the node's."""

from __future__ import annotations

import time

import pytest

from logstore.replication import Client

from .test_inprocess import SECRET, cluster, leader_of, wait_for

ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

METRIC = "kafka.server:type=socket-server-metrics,listener=kafka,name="
OPTIONS = {"connections_max_reauth_ms": 1200,
           "sasl_oauthbearer": {"sasl.oauthbearer.unsecured.validator.enable": "true"}}


def test_replication_re_authenticates_across_session_lifetimes(tmp_path):
    nodes, addrs = cluster(tmp_path, kafka_options=dict(OPTIONS))
    client = Client(list(addrs.values()), SECRET)
    try:
        leader_of(nodes)
        offsets, started = [], time.monotonic()
        while time.monotonic() - started < 4.0:  # over three session lifetimes
            offsets += client.produce("replicated", 0, [b"v%d" % len(offsets)], acks="all")
            time.sleep(0.05)
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
        end = offsets[-1] + 1
        wait_for(lambda: all(n.store.partition("replicated", 0).log_end_offset == end for n in nodes.values()))
        metrics = [n.kafka.metrics() for n in nodes.values()]
        assert sum(m[METRIC + "successful-reauthentication-total"] for m in metrics) >= 3
        assert sum(m[METRIC + "expired-connections-killed-count"] for m in metrics) == 0
        assert sum(m[METRIC + "failed-reauthentication-total"] for m in metrics) == 0
    finally:
        client.close()
        for n in nodes.values():
            n.stop()


def test_oauthbearer_clients_and_scram_users_on_a_replica_set(tmp_path):
    nodes, addrs = cluster(tmp_path, kafka_options=dict(OPTIONS))
    try:
        leader_of(nodes)
        bootstrap = ",".join(f"{h}:{p}" for h, p in addrs.values())
        producer = ck.Producer({"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                                "sasl.mechanisms": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
                                "sasl.oauthbearer.config": "principal=olivia lifeSeconds=600", "acks": "all"})
        delivered = []
        producer.produce("replicated", b"from olivia", partition=0,
                         on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(20) == 0 and delivered == [None]
        admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap, security_protocol="SASL_PLAINTEXT",
                                       sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="replica",
                                       sasl_plain_password=SECRET.decode(), request_timeout_ms=10_000)
        try:
            from kafka.admin._users import ScramMechanism, UserScramCredentialUpsertion
            answer = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
                "paul", ScramMechanism.SCRAM_SHA_256, "pw")])
            assert "not replicated" in answer["paul"]
            described = admin.describe_user_scram_credentials(["paul"])
            assert described["paul"]["error"].startswith("Attempt to describe a user credential that does not exist")
        finally:
            admin.close()
        wait_for(lambda: all(b"from olivia" in [r.value for r in n.store.partition("replicated", 0).iter()]
                             for n in nodes.values()))
    finally:
        for n in nodes.values():
            n.stop()


def test_logstore_node_takes_the_sasl_options(tmp_path):
    """``logstore node --sasl-oauthbearer NAME=VALUE --connections-max-reauth-ms MS``: a one-node
    set a librdkafka client logs in to with its unsecured JWT; a bad setting is a usage error."""
    import subprocess
    import sys

    from .test_inprocess import free_ports

    (port,) = free_ports(1)
    (tmp_path / "secret").write_bytes(SECRET)
    base = [sys.executable, "-m", "logstore", "node", "--node-id=0", f"--data-dir={tmp_path / 'n0'}",
            f"--listen=127.0.0.1:{port}", f"--secret-file={tmp_path / 'secret'}", "--min-insync-replicas=1"]
    bad = subprocess.run([*base, "--sasl-oauthbearer", "sasl.oauthbearer.nope=1"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "expected NAME=VALUE" in bad.stderr
    proc = subprocess.Popen([*base, "--sasl-oauthbearer", "sasl.oauthbearer.unsecured.validator.enable=true",
                             "--connections-max-reauth-ms", "60000"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert f"serving on 127.0.0.1:{port}" in proc.stdout.readline()
        producer = ck.Producer({"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
                                "sasl.mechanisms": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
                                "sasl.oauthbearer.config": "principal=quinn"})
        delivered = []
        producer.produce("replicated", b"from quinn", partition=0, on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(20) == 0 and delivered == [None]
    finally:
        proc.terminate()
        proc.wait(15)
