"""PLAIN's PBKDF2 runs off the network loop: while one connection's password check is under
way (held here until the test lets it finish), other clients of the same listener connect,
authenticate and are answered, and the held connection then completes its handshake in order
(its SaslAuthenticate answered, then its requests). Before, the check ran on the loop thread,
and a few clients sending bad PLAIN passwords stalled every connection of the listener."""

from __future__ import annotations

import socket
import threading

import pytest

from logstore.kafka.credentials import PlainCredential, plain_credential
from logstore.kafka.server import KafkaServer

from .test_sasl_wire import bytes_field, request, sasl_authenticate, sasl_handshake

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

pytestmark = pytest.mark.regression

STARTED = threading.Event()
RELEASE = threading.Event()


class HeldPlainCredential(PlainCredential):
    """A PLAIN credential whose check waits until the test releases it (a slow PBKDF2, made
    as slow as the test needs without timing anything)."""

    def check(self, password: bytes) -> bool:
        STARTED.set()
        assert RELEASE.wait(30)
        return super().check(password)


def test_a_slow_plain_check_does_not_stall_other_connections(tmp_path):
    real = plain_credential("slow-password")
    held = HeldPlainCredential(real.salt, real.iterations, real.hash)
    users = {"slow": {"PLAIN": held}, "bob": "bob-secret"}
    STARTED.clear()
    RELEASE.clear()
    with KafkaServer(str(tmp_path / "store"), ("127.0.0.1", 0), sasl_credentials=users) as server:
        server.store.create_topic("served", 1)
        held_sock = socket.create_connection(server.address, timeout=30)
        outcome: list[tuple] = []
        try:
            assert sasl_handshake(held_sock, "PLAIN")[0] == 0
            waiter = threading.Thread(target=lambda: outcome.append(
                sasl_authenticate(held_sock, b"\0slow\0slow-password")))
            waiter.start()
            assert STARTED.wait(10)
            # the held check is under way: another client authenticates (SCRAM) and is answered
            admin = AdminClient({"bootstrap.servers": server.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
                                 "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "bob",
                                 "sasl.password": "bob-secret"})
            topics = admin.list_topics(timeout=10).topics
            assert "served" in topics
            # and a PLAIN client too (its own check runs beside the held one)
            plain = AdminClient({"bootstrap.servers": server.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
                                 "sasl.mechanisms": "PLAIN", "sasl.username": "bob", "sasl.password": "bob-secret"})
            assert "served" in plain.list_topics(timeout=10).topics
            assert not outcome  # the held connection is still waiting for its answer
            RELEASE.set()
            waiter.join(10)
            assert outcome == [(0, None, b"")]
        finally:
            RELEASE.set()
            held_sock.close()


def test_a_wrong_password_after_a_slow_check_is_refused_and_closed(tmp_path):
    STARTED.clear()
    RELEASE.set()
    real = plain_credential("right")
    users = {"slow": {"PLAIN": HeldPlainCredential(real.salt, real.iterations, real.hash)}}
    with KafkaServer(str(tmp_path / "store"), ("127.0.0.1", 0), sasl_credentials=users,
                     failed_authentication_delay_ms=10) as server:
        with socket.create_connection(server.address, timeout=10) as sock:
            assert sasl_handshake(sock, "PLAIN")[0] == 0
            error, message, _ = sasl_authenticate(sock, b"\0slow\0wrong")
            assert error == 58 and "invalid credentials" in message
            assert sock.recv(1) == b""  # closed after the answer
        failed = server.metrics()["kafka.server:type=socket-server-metrics,listener=kafka,"
                                  "name=failed-authentication-total"]
        assert failed == 1


def test_a_slow_check_that_outlives_the_handshake_deadline_closes_its_connection(tmp_path):
    """The handshake deadline is not enforced while a slow step runs (nothing is read then);
    a connection past it when the step ends is closed unanswered, as one that did not finish
    its handshake in time. Before, the check finished, the connection opened, and its requests
    were served."""
    from logstore.net import server as net

    STARTED.clear()
    RELEASE.clear()
    real = plain_credential("right")
    users = {"slow": {"PLAIN": HeldPlainCredential(real.salt, real.iterations, real.hash)}}
    limits = net.Limits(max_connections=16, handshake_timeout_s=0.2)
    with KafkaServer(str(tmp_path / "store"), ("127.0.0.1", 0), sasl_credentials=users, limits=limits) as server:
        with socket.create_connection(server.address, timeout=10) as sock:
            assert sasl_handshake(sock, "PLAIN")[0] == 0
            closed: list[bytes] = []
            reader = threading.Thread(target=lambda: closed.append(sock.recv(1)))
            sock.sendall(request(36, 1, 2, bytes_field(b"\0slow\0right")))
            assert STARTED.wait(10)
            threading.Event().wait(0.5)  # past the handshake deadline while the check is held
            RELEASE.set()
            reader.start()
            reader.join(15)
            assert closed == [b""]  # closed, and nothing answered
        expired = server.metrics()["logstore:type=socket-server-metrics,listener=kafka,name=connection-expired-total"]
        assert expired == 1
