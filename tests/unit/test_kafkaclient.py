"""KafkaClient against brokers that misbehave: every bad answer is a KafkaClientError naming the
request and the broker, never a hang, a crash or an allocation from a hostile size."""

from __future__ import annotations

import socket
import struct
import threading

import pytest
from logstore.kafka.client import KafkaClient, KafkaClientError, VERSIONS
from logstore.kafka.wire import encode


def _fake_broker(answer, linger=True):
    """A one-connection server on loopback: reads one request, sends answer(correlation_id),
    then waits for the client to go (or, without ``linger``, closes at once)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn:
            size = struct.unpack(">i", conn.recv(4))[0]
            request = b""
            while len(request) < size:
                request += conn.recv(size - len(request))
            correlation_id = struct.unpack(">i", request[4:8])[0]
            conn.sendall(answer(correlation_id))
            if linger:
                conn.recv(1)
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}"


def _api_versions(correlation_id, without=()):
    keys = [{"api_key": k, "min_version": 0, "max_version": 12} for k in VERSIONS if k not in without]
    return b"".join(bytes(b) for b in encode(correlation_id, 18, 0, {"error_code": 0, "api_keys": keys,
                                                                     "throttle_time_ms": 0}))


def test_a_cluster_lacking_a_version_is_refused():
    address = _fake_broker(lambda cid: _api_versions(cid, without=(0,)))
    with pytest.raises(KafkaClientError, match="does not speak Produce v8"):
        KafkaClient(address, timeout=5)


@pytest.mark.parametrize("answer, message", [
    (lambda cid: struct.pack(">i", 1 << 30), "a response of 1073741824 bytes"),
    (lambda cid: struct.pack(">i", -5), "a response of -5 bytes"),
    (lambda cid: struct.pack(">ii", 6, cid) + b"\x00\x00", "malformed response"),
    (lambda cid: _api_versions(cid + 1), "does not answer the request"),
    (lambda cid: _api_versions(cid) + b"", None),
])
def test_bad_answers_are_errors(answer, message):
    address = _fake_broker(answer)
    if message is None:
        KafkaClient(address, timeout=5).close()  # the control: a good answer
        return
    with pytest.raises(KafkaClientError, match=message):
        KafkaClient(address, timeout=5)


def test_a_broker_closing_mid_answer_is_an_error():
    address = _fake_broker(lambda cid: struct.pack(">ii", 8, cid) + b"\xff\xff", linger=False)
    with pytest.raises(KafkaClientError, match="the connection was closed") as info:
        KafkaClient(address, timeout=5)
    # A ConnectionError underneath: a replica's fetcher takes it for its leader's death.
    assert isinstance(info.value.__cause__, ConnectionError)


def test_a_silent_broker_times_out_and_bad_addresses_are_named():
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(KafkaClientError, match="timed out"):
            KafkaClient(f"127.0.0.1:{listener.getsockname()[1]}", timeout=0.3)
    finally:
        listener.close()
    with pytest.raises(KafkaClientError, match="is not host:port"):
        KafkaClient("localhost")
    with pytest.raises(KafkaClientError, match="cannot connect"):
        KafkaClient("127.0.0.1:1,127.0.0.1:2", timeout=1)


def test_security_settings_are_checked_and_read_from_kafka_properties():
    from logstore.kafka.client import Security

    assert Security().protocol == "PLAINTEXT" and not Security().sasl and not Security().tls
    with pytest.raises(ValueError, match="security.protocol must be one of"):
        Security("SASL")
    with pytest.raises(ValueError, match="sasl.mechanism must be one of"):
        Security("SASL_SSL", "GSSAPI", "u", "p")
    with pytest.raises(ValueError, match="needs sasl.username and sasl.password"):
        Security("SASL_PLAINTEXT", "PLAIN", "u")
    librdkafka = Security.from_properties({"security.protocol": "sasl_plaintext", "sasl.mechanisms": "SCRAM-SHA-256",
                                           "sasl.username": "u", "sasl.password": "p", "linger.ms": "5"})
    assert (librdkafka.protocol, librdkafka.mechanism, librdkafka.username, librdkafka.password) == \
        ("SASL_PLAINTEXT", "SCRAM-SHA-256", "u", "p")
    java = Security.from_properties({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "ssl.truststore.location": "/ca.pem",
        "ssl.endpoint.identification.algorithm": "",
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                            'username="a\\"b" password="p=w;";'})
    assert (java.username, java.password, java.ca_file, java.check_hostname) == ('a"b', "p=w;", "/ca.pem", False)
    assert "p=w" not in repr(java)  # the password stays out of logs
