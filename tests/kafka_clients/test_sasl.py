"""SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and TLS on the Kafka listener, with the three
client libraries: each produces and consumes through SASL_PLAINTEXT and SASL_SSL listeners; a
wrong password and an unknown user fail with an authentication error on the client and write
nothing; the credentials file is made by ``logstore kafka-user add`` and holds no password; an
SSL listener with and without client certificates."""

from __future__ import annotations

import asyncio
import io
import logging
import time

import pytest

from logstore.cli import main as cli_main
from logstore.kafka.credentials import CredentialsFile
from logstore.kafka.server import KafkaServer
from logstore.net.protocol import TLSConfig

from .tls_certs import make_certs

kafka = pytest.importorskip("kafka")
ck = pytest.importorskip("confluent_kafka")
aiokafka = pytest.importorskip("aiokafka")
from aiokafka.helpers import create_ssl_context  # noqa: E402

USERS = {"alice": "alice's secret", "bob": "pa:ss,w=rd é"}
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
AUTH_OK = "kafka.server:type=socket-server-metrics,listener=kafka,name=successful-authentication-total"
AUTH_FAILED = "kafka.server:type=socket-server-metrics,listener=kafka,name=failed-authentication-total"


@pytest.fixture(scope="module")
def credentials_file(tmp_path_factory):
    """Made with the CLI, password on standard input."""
    path = tmp_path_factory.mktemp("sasl") / "kafka-users"
    for user, password in USERS.items():
        argv = ["kafka-user", "add", str(path), user] + [a for m in MECHANISMS for a in ("--mechanism", m)]
        assert cli_main(argv, stdin=io.StringIO(password + "\n")) == 0
    return path


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def sasl_plaintext(tmp_path_factory, credentials_file):
    with KafkaServer(str(tmp_path_factory.mktemp("sasl-plaintext")), ("127.0.0.1", 0),
                     sasl_credentials=credentials_file) as server:
        assert server.security_protocol == "SASL_PLAINTEXT"
        yield server


@pytest.fixture(scope="module")
def sasl_ssl(tmp_path_factory, credentials_file, certs):
    with KafkaServer(str(tmp_path_factory.mktemp("sasl-ssl")), ("127.0.0.1", 0), sasl_credentials=credentials_file,
                     tls=TLSConfig(certs.server_cert, certs.server_key)) as server:
        assert server.security_protocol == "SASL_SSL"
        server.ca = certs.ca  # what clients verify it with
        yield server


@pytest.fixture(params=["SASL_PLAINTEXT", "SASL_SSL"])
def listener(request):
    return request.getfixturevalue(request.param.lower())


def kafka_python_config(server, mechanism, user, password):
    config = {"bootstrap_servers": server.bootstrap_servers, "security_protocol": server.security_protocol,
              "request_timeout_ms": 10_000}
    if mechanism is not None:
        config.update(sasl_mechanism=mechanism, sasl_plain_username=user, sasl_plain_password=password)
    if server.security_protocol.endswith("SSL"):
        config.update(ssl_cafile=server.ca)
    return config


def confluent_config(server, mechanism, user, password):
    config = {"bootstrap.servers": server.bootstrap_servers, "security.protocol": server.security_protocol,
              "sasl.mechanisms": mechanism, "sasl.username": user, "sasl.password": password}
    if server.security_protocol == "SASL_SSL":
        config["ssl.ca.location"] = server.ca
    return config


def aiokafka_config(server, mechanism, user, password):
    config = {"bootstrap_servers": server.bootstrap_servers, "security_protocol": server.security_protocol,
              "sasl_mechanism": mechanism, "sasl_plain_username": user, "sasl_plain_password": password,
              "request_timeout_ms": 10_000}
    if server.security_protocol == "SASL_SSL":
        config["ssl_context"] = create_ssl_context(cafile=server.ca)
    return config


def every_mechanism_then_ssl_with(mechanism):
    """Each mechanism over SASL_PLAINTEXT, and ``mechanism`` over SASL_SSL (each client takes
    another one there, so that every mechanism runs over TLS too)."""
    return pytest.mark.parametrize("listener,mechanism", [("SASL_PLAINTEXT", m) for m in MECHANISMS]
                                   + [("SASL_SSL", mechanism)], indirect=["listener"])


def stored(server, topic):
    if topic not in server.store.topics():
        return []
    return [r.value for r in server.store.partition(topic, 0).iter()]


# ---------------------------------------------------------------------- each client, each mechanism
@every_mechanism_then_ssl_with("SCRAM-SHA-512")
def test_kafka_python_produces_and_consumes(listener, mechanism):
    topic = f"kp-{mechanism}-{listener.security_protocol}"
    config = kafka_python_config(listener, mechanism, "alice", USERS["alice"])
    producer = kafka.KafkaProducer(**config)
    try:
        offsets = [producer.send(topic, b"kp %d" % i).get(10).offset for i in range(3)]
    finally:
        producer.close()
    assert offsets == [0, 1, 2]
    consumer = kafka.KafkaConsumer(**config, enable_auto_commit=False, consumer_timeout_ms=1000)
    try:
        tp = kafka.TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            got += [r.value for records in consumer.poll(timeout_ms=300).values() for r in records]
    finally:
        consumer.close()
    assert got == [b"kp 0", b"kp 1", b"kp 2"] == stored(listener, topic)


@every_mechanism_then_ssl_with("SCRAM-SHA-256")
def test_confluent_produces_and_consumes(listener, mechanism):
    topic = f"ck-{mechanism}-{listener.security_protocol}"
    config = confluent_config(listener, mechanism, "bob", USERS["bob"])
    producer = ck.Producer(config)
    delivered = []
    for i in range(3):
        producer.produce(topic, b"ck %d" % i, on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(10) == 0
    assert delivered == [(None, 0), (None, 1), (None, 2)]
    consumer = ck.Consumer({**config, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            m = consumer.poll(0.3)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m.value())
    finally:
        consumer.close()
    assert got == [b"ck 0", b"ck 1", b"ck 2"] == stored(listener, topic)


@every_mechanism_then_ssl_with("PLAIN")
def test_aiokafka_produces_and_consumes(listener, mechanism):
    topic = f"aio-{mechanism}-{listener.security_protocol}"

    async def run():
        producer = aiokafka.AIOKafkaProducer(**aiokafka_config(listener, mechanism, "alice", USERS["alice"]))
        await producer.start()
        try:
            sent = [(await producer.send_and_wait(topic, b"aio %d" % i)).offset for i in range(3)]
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(**aiokafka_config(listener, mechanism, "alice", USERS["alice"]),
                                             enable_auto_commit=False)
        await consumer.start()
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got = []
            while len(got) < 3:
                batch = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=300), 10)
                got += [m.value for m in batch.get(tp, [])]
            return sent, got
        finally:
            await consumer.stop()

    sent, got = asyncio.run(run())
    assert sent == [0, 1, 2]
    assert got == [b"aio 0", b"aio 1", b"aio 2"] == stored(listener, topic)


def test_kafka_python_with_sasl_handshake_v0_raw_tokens(sasl_plaintext):
    """An 0.11 client (api_version pinned) sends SaslHandshake v0, then bare tokens."""
    for mechanism in ("PLAIN", "SCRAM-SHA-256"):
        topic = f"v0-{mechanism}"
        config = kafka_python_config(sasl_plaintext, mechanism, "alice", USERS["alice"])
        producer = kafka.KafkaProducer(**config, api_version=(0, 11))
        try:
            assert producer.send(topic, b"old client").get(10).offset == 0
        finally:
            producer.close()
        assert stored(sasl_plaintext, topic) == [b"old client"]


# ---------------------------------------------------------------------- refusals
@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("mallory", "anything")], ids=["wrong-password",
                                                                                              "unknown-user"])
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_kafka_python_refused(sasl_plaintext, caplog, mechanism, user, password):
    topic = f"kp-refused-{mechanism}-{user}"
    failed = sasl_plaintext.metrics()[AUTH_FAILED]
    caplog.set_level(logging.ERROR, logger="kafka")
    with pytest.raises(kafka.errors.KafkaError):
        producer = kafka.KafkaProducer(**kafka_python_config(sasl_plaintext, mechanism, user, password),
                                       max_block_ms=800, bootstrap_timeout_ms=800)
        try:
            producer.send(topic, b"must not land").get(2)
        finally:
            producer.close(timeout=1)
    assert "SaslAuthenticationFailedError" in caplog.text
    assert f"invalid credentials with SASL mechanism {mechanism}" in caplog.text
    assert stored(sasl_plaintext, topic) == []
    assert sasl_plaintext.metrics()[AUTH_FAILED] > failed


@pytest.mark.parametrize("user,password", [("bob", "wrong"), ("mallory", "anything")], ids=["wrong-password",
                                                                                            "unknown-user"])
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_confluent_refused(listener, mechanism, user, password):
    topic = f"ck-refused-{mechanism}-{user}"
    errors = []
    producer = ck.Producer({**confluent_config(listener, mechanism, user, password), "error_cb": errors.append,
                            "message.timeout.ms": 1000})
    delivered = []
    producer.produce(topic, b"must not land", on_delivery=lambda err, msg: delivered.append(err))
    deadline = time.monotonic() + 10
    while not any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        producer.poll(0.1)
    producer.purge()
    producer.flush(1)
    auth = [e for e in errors if e.code() == ck.KafkaError._AUTHENTICATION]
    assert auth, errors
    assert f"invalid credentials with SASL mechanism {mechanism}" in auth[0].str()
    assert delivered and delivered[0] is not None
    assert stored(listener, topic) == []


@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("mallory", "anything")], ids=["wrong-password",
                                                                                              "unknown-user"])
def test_aiokafka_refused(listener, caplog, user, password):
    topic = f"aio-refused-{user}"
    caplog.set_level(logging.ERROR, logger="aiokafka")

    async def run():
        producer = aiokafka.AIOKafkaProducer(**aiokafka_config(listener, "SCRAM-SHA-256", user, password))
        try:
            await producer.start()
            await producer.send_and_wait(topic, b"must not land")
        finally:
            await producer.stop()

    with pytest.raises(aiokafka.errors.KafkaConnectionError):
        asyncio.run(run())
    assert "SaslAuthenticationFailed: Authentication failed: invalid credentials with SASL mechanism SCRAM-SHA-256" \
        in caplog.text
    assert stored(listener, topic) == []


def test_the_credentials_file_holds_no_password(credentials_file):
    text = credentials_file.read_text()
    assert (credentials_file.stat().st_mode & 0o777) == 0o600
    for password in USERS.values():
        assert password not in text
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert sorted(line.split(":")[:2] for line in lines) == sorted([u, m] for u in USERS for m in MECHANISMS)
    assert all("stored_key=" in line and "server_key=" in line for line in lines if ":SCRAM-" in line)
    assert all("hash=" in line for line in lines if ":PLAIN:" in line)


def test_a_user_added_to_the_file_can_authenticate_soon_after(tmp_path, credentials_file):
    path = tmp_path / "users"
    path.write_bytes(credentials_file.read_bytes())
    # (A file path is checked at most once a second; this one at every connection.)
    users = CredentialsFile(path, check_interval_s=0.0)
    with KafkaServer(str(tmp_path / "store"), ("127.0.0.1", 0), sasl_credentials=users) as server:
        assert cli_main(["kafka-user", "add", str(path), "carol", "--mechanism", "SCRAM-SHA-256"],
                        stdin=io.StringIO("carol-pw\n")) == 0
        producer = kafka.KafkaProducer(**kafka_python_config(server, "SCRAM-SHA-256", "carol", "carol-pw"))
        try:
            assert producer.send("carol", b"new user").get(10).offset == 0
        finally:
            producer.close()


# ---------------------------------------------------------------------- TLS without SASL
def test_ssl_listener_without_client_certificates(tmp_path, certs):
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), tls=TLSConfig(certs.server_cert, certs.server_key)) as server:
        assert server.security_protocol == "SSL"
        producer = ck.Producer({"bootstrap.servers": server.bootstrap_servers, "security.protocol": "SSL",
                                "ssl.ca.location": certs.ca})
        delivered = []
        producer.produce("tls", b"over tls", on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
        assert producer.flush(10) == 0
        assert delivered == [(None, 0)]
        assert stored(server, "tls") == [b"over tls"]


def test_ssl_listener_requiring_client_certificates(tmp_path, certs):
    tls = TLSConfig(certs.server_cert, certs.server_key, certs.ca)
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), tls=tls) as server:
        config = {"bootstrap_servers": server.bootstrap_servers, "security_protocol": "SSL",
                  "ssl_cafile": certs.ca, "request_timeout_ms": 10_000}
        producer = kafka.KafkaProducer(**config, ssl_certfile=certs.client_cert, ssl_keyfile=certs.client_key)
        try:
            assert producer.send("mtls", b"with a certificate").get(10).offset == 0
        finally:
            producer.close()
        with pytest.raises(kafka.errors.KafkaError):
            producer = kafka.KafkaProducer(**config, max_block_ms=800, bootstrap_timeout_ms=800)
            producer.close()
        assert stored(server, "mtls") == [b"with a certificate"]


def test_a_non_loopback_bind_needs_authentication(tmp_path, credentials_file, certs):
    from logstore import LogstoreError

    with pytest.raises(LogstoreError, match="without authentication"):
        KafkaServer(str(tmp_path / "a"), ("0.0.0.0", 0))
    with pytest.raises(LogstoreError, match="without authentication"):  # TLS alone identifies no one
        KafkaServer(str(tmp_path / "b"), ("0.0.0.0", 0), tls=TLSConfig(certs.server_cert, certs.server_key))
    for kwargs in ({"sasl_credentials": credentials_file},
                   {"tls": TLSConfig(certs.server_cert, certs.server_key, certs.ca)}):
        KafkaServer(str(tmp_path / "c"), ("0.0.0.0", 0), **kwargs).stop()


def test_metrics_count_sasl_outcomes(tmp_path):
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), sasl_credentials={"dave": "dave-pw"}) as server:
        before = server.metrics()
        producer = kafka.KafkaProducer(**kafka_python_config(server, "SCRAM-SHA-256", "dave", "dave-pw"))
        try:
            producer.send("m", b"x").get(10)
        finally:
            producer.close()
        after = server.metrics()
        assert after[AUTH_OK] > before[AUTH_OK]
        assert after[AUTH_FAILED] == before[AUTH_FAILED]
