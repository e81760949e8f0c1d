"""SASL on raw sockets: every byte written by hand from Kafka's protocol guide and RFC 5802/4616
(not by the server's codec). Before authentication only ApiVersions, SaslHandshake and
SaslAuthenticate are answered; anything else, a short or oversized frame, or an unknown
mechanism closes the connection, and nothing reaches the store. The same requests after
authenticating do reach it (the positive controls)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import struct
import time

import pytest

from logstore.kafka.server import KafkaServer

from .test_wire_edges import api_versions_v0, closed, recv_exactly, request, response

kafka_records = pytest.importorskip("kafka.record.default_records")

USERS = {"alice": "wonderland", "b,o=b": "builder"}
AUTH_FAILED = "kafka.server:type=socket-server-metrics,listener=kafka,name=failed-authentication-total"
AUTH_OK = "kafka.server:type=socket-server-metrics,listener=kafka,name=successful-authentication-total"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = KafkaServer(str(tmp_path_factory.mktemp("sasl-wire")), ("127.0.0.1", 0), sasl_credentials=USERS,
                    failed_authentication_delay_ms=20).start()
    s.store.create_topic("victim", 1)
    yield s
    s.stop()


def connect(server):
    return socket.create_connection(server.address, timeout=5)


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack(">h", len(raw)) + raw


def bytes_field(raw: bytes) -> bytes:
    return struct.pack(">i", len(raw)) + raw


def sasl_handshake(sock, mechanism, version=1, correlation=1):
    """(error code, mechanisms) of a SaslHandshake."""
    sock.sendall(request(17, version, correlation, string(mechanism)))
    payload = response(sock)
    got_correlation, error, count = struct.unpack_from(">ihi", payload, 0)
    assert got_correlation == correlation
    mechanisms, at = [], 10
    for _ in range(count):
        (n,) = struct.unpack_from(">h", payload, at)
        mechanisms.append(payload[at + 2:at + 2 + n].decode())
        at += 2 + n
    return error, mechanisms


def sasl_authenticate(sock, token, version=1, correlation=2):
    """(error code, error message, server token) of a SaslAuthenticate."""
    sock.sendall(request(36, version, correlation, bytes_field(token)))
    payload = response(sock)
    got_correlation, error, n = struct.unpack_from(">ihh", payload, 0)
    assert got_correlation == correlation
    at = 8
    message = None
    if n >= 0:
        message, at = payload[at:at + n].decode(), at + n
    (size,) = struct.unpack_from(">i", payload, at)
    token_out = payload[at + 4:at + 4 + size]
    at += 4 + size
    if version >= 1:
        (lifetime,) = struct.unpack_from(">q", payload, at)
        assert lifetime == 0
        at += 8
    assert at == len(payload)
    return error, message, token_out


def api_versions_v3(sock, correlation, name=b"logstore-test", version=b"1.0"):
    """(correlation id, error code, {api key: (min, max)}) of an ApiVersions v3: request header v2
    (client id, empty tags), a flexible body; the answer's header is v0, its body flexible."""
    header = struct.pack(">hhi", 18, 3, correlation) + string("wire-test") + b"\0"
    body = bytes([len(name) + 1]) + name + bytes([len(version) + 1]) + version + b"\0"
    sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
    payload = response(sock)
    got_correlation, error = struct.unpack_from(">ih", payload, 0)
    count, at = payload[6] - 1, 7  # a compact array's count (under 127 APIs: one byte)
    ranges = {}
    for _ in range(count):
        key, low, high = struct.unpack_from(">hhh", payload, at)
        assert payload[at + 6] == 0  # the entry's empty tagged fields
        ranges[key] = (low, high)
        at += 7
    return got_correlation, error, ranges


# ---------------------------------------------------------------------- a SCRAM client (RFC 5802)
class ScramClient:
    def __init__(self, mechanism, user, password, nonce="fyko+d2lbbFgONRv9qkxdawL"):
        self.hash = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self.password = password.encode()
        self.nonce = nonce
        self.bare = "n=" + user.replace("=", "=3D").replace(",", "=2C") + ",r=" + nonce

    def first(self) -> bytes:
        return ("n,," + self.bare).encode()

    def final(self, server_first: bytes) -> bytes:
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        assert attrs["r"].startswith(self.nonce) and len(attrs["r"]) > len(self.nonce)
        salted = hashlib.pbkdf2_hmac(self.hash, self.password, base64.b64decode(attrs["s"]), int(attrs["i"]))
        client_key = hmac.new(salted, b"Client Key", self.hash).digest()
        stored_key = hashlib.new(self.hash, client_key).digest()
        without_proof = "c=biws,r=" + attrs["r"]
        self.auth_message = f"{self.bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.new(stored_key, self.auth_message, self.hash).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self.server_key = hmac.new(salted, b"Server Key", self.hash).digest()
        return (without_proof + ",p=" + base64.b64encode(proof).decode()).encode()

    def check(self, server_final: bytes) -> None:
        expected = hmac.new(self.server_key, self.auth_message, self.hash).digest()
        assert server_final == b"v=" + base64.b64encode(expected)


def scram_login(sock, mechanism, user, password):
    assert sasl_handshake(sock, mechanism)[0] == 0
    client = ScramClient(mechanism, user, password)
    error, _, server_first = sasl_authenticate(sock, client.first())
    assert error == 0
    error, message, server_final = sasl_authenticate(sock, client.final(server_first), correlation=3)
    assert (error, message) == (0, None)
    client.check(server_final)


def plain_login(sock, user, password, version=1):
    assert sasl_handshake(sock, "PLAIN", version) == (0, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
    token = b"\0" + user.encode() + b"\0" + password.encode()
    if version == 1:
        assert sasl_authenticate(sock, token) == (0, None, b"")
    else:  # raw token, raw (empty) answer
        sock.sendall(struct.pack(">i", len(token)) + token)
        assert recv_exactly(sock, 4) == b"\0\0\0\0"


def metadata_v1(topic: str, correlation=5) -> bytes:
    return request(3, 1, correlation, struct.pack(">i", 1) + string(topic))


def produce_v3(topic: str, value: bytes, correlation=6) -> bytes:
    builder = kafka_records.DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                                      producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                                      batch_size=1 << 20)
    builder.append(0, 1_700_000_000_000, None, value, [])
    batch = bytes(builder.build())
    body = (struct.pack(">hhi", -1, 1, 5000) + struct.pack(">i", 1) + string(topic) + struct.pack(">i", 1)
            + struct.pack(">i", 0) + bytes_field(batch))
    return request(0, 3, correlation, body)


def wait_closed(sock):
    sock.settimeout(2)
    return closed(sock)


# ---------------------------------------------------------------------- before authentication
def test_api_versions_v3_is_answered_before_authentication(server):
    """librdkafka 2.16 sends ApiVersions v4 (v3's layout) first: answered in that version, not
    with error 35 and a retry in v0; an invalid client software name is INVALID_REQUEST (42)."""
    with connect(server) as s:
        correlation, error, ranges = api_versions_v3(s, 21)
        assert (correlation, error) == (21, 0)
        assert ranges[18] == (0, 4) and ranges[17] == (0, 1) and ranges[1][1] == 16 and ranges[3][1] == 12
        plain_login(s, "alice", USERS["alice"])
    with connect(server) as s:
        assert api_versions_v3(s, 22, name=b"-bad name")[:2] == (22, 42)


def test_api_versions_is_answered_before_authentication_and_lists_sasl(server):
    with connect(server) as s:
        s.sendall(request(18, 0, 11))
        correlation, error, ranges = api_versions_v0(response(s))
        assert (correlation, error) == (11, 0)
        assert ranges[17] == (0, 1) and ranges[36] == (0, 1) and ranges[18] == (0, 4)
        s.sendall(request(18, 0, 12))  # again: still answered
        assert api_versions_v0(response(s))[:2] == (12, 0)
        plain_login(s, "alice", USERS["alice"])


@pytest.mark.parametrize("make", [lambda: metadata_v1("sneaky"), lambda: produce_v3("victim", b"sneaked in")],
                         ids=["Metadata", "Produce"])
def test_a_request_before_authentication_closes_and_writes_nothing(server, make, caplog):
    failed = server.metrics()[AUTH_FAILED]
    with connect(server) as s:
        s.sendall(make())
        assert wait_closed(s)
    assert "before authentication" in caplog.text
    assert "sneaky" not in server.store.topics()
    assert server.store.partition("victim", 0).log_end_offset == 0
    assert server.metrics()[AUTH_FAILED] == failed + 1
    with connect(server) as s:  # the same after SaslHandshake, before SaslAuthenticate
        assert sasl_handshake(s, "PLAIN")[0] == 0
        s.sendall(make())
        assert wait_closed(s)
    assert "sneaky" not in server.store.topics()
    assert server.store.partition("victim", 0).log_end_offset == 0


def test_the_same_requests_after_authentication_are_served(server):
    with connect(server) as s:
        scram_login(s, "SCRAM-SHA-256", "alice", USERS["alice"])
        s.sendall(metadata_v1("after-auth"))
        assert struct.unpack_from(">i", response(s))[0] == 5
        s.sendall(produce_v3("after-auth", b"landed"))
        assert struct.unpack_from(">i", response(s))[0] == 6
    assert [r.value for r in server.store.partition("after-auth", 0).iter()] == [b"landed"]


@pytest.mark.parametrize("size", [64 * 1024 + 1, 1 << 20, 2**31 - 1, -1])
def test_an_oversized_frame_before_authentication_closes(server, size):
    with connect(server) as s:
        s.sendall(struct.pack(">i", size) + b"\0" * 64)
        assert wait_closed(s)


def test_a_short_frame_before_authentication_closes(server):
    with connect(server) as s:
        s.sendall(struct.pack(">i", 3) + b"\0\x12\0")
        assert wait_closed(s)


def test_the_pre_authentication_cap_is_not_the_request_cap(server):
    """After authentication a frame may be larger than 64 KiB (a produce of 100 KiB)."""
    with connect(server) as s:
        plain_login(s, "alice", USERS["alice"])
        s.sendall(metadata_v1("big"))
        response(s)
        s.sendall(produce_v3("big", b"x" * 100_000))
        assert struct.unpack_from(">i", response(s))[0] == 6
    assert len(next(server.store.partition("big", 0).iter()).value) == 100_000


@pytest.mark.parametrize("version", [0, 1])
def test_an_unknown_mechanism_gets_error_33_with_the_list_then_closes(server, version):
    with connect(server) as s:
        assert sasl_handshake(s, "GSSAPI", version) == (33, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
        assert wait_closed(s)


def test_sasl_authenticate_before_sasl_handshake_closes(server):
    with connect(server) as s:
        s.sendall(request(36, 1, 1, bytes_field(b"\0alice\0" + USERS["alice"].encode())))
        assert wait_closed(s)


# ---------------------------------------------------------------------- the exchanges
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("user", sorted(USERS))
def test_scram_by_hand(server, mechanism, user):
    ok = server.metrics()[AUTH_OK]
    with connect(server) as s:
        scram_login(s, mechanism, user, USERS[user])
        s.sendall(request(18, 0, 9))
        assert api_versions_v0(response(s))[:2] == (9, 0)
    assert server.metrics()[AUTH_OK] == ok + 1


def test_plain_v0_raw_tokens_by_hand(server):
    with connect(server) as s:
        plain_login(s, "alice", USERS["alice"], version=0)
        s.sendall(request(18, 0, 9))  # requests follow the raw exchange
        assert api_versions_v0(response(s))[:2] == (9, 0)


def test_scram_v0_raw_tokens_by_hand(server):
    with connect(server) as s:
        assert sasl_handshake(s, "SCRAM-SHA-512", 0)[0] == 0
        client = ScramClient("SCRAM-SHA-512", "alice", USERS["alice"])
        s.sendall(bytes_field(client.first()))
        server_first = recv_exactly(s, struct.unpack(">i", recv_exactly(s, 4))[0])
        s.sendall(bytes_field(client.final(server_first)))
        client.check(recv_exactly(s, struct.unpack(">i", recv_exactly(s, 4))[0]))
        s.sendall(request(18, 0, 9))
        assert api_versions_v0(response(s))[:2] == (9, 0)


def test_plain_v0_wrong_password_closes_without_an_answer(server):
    with connect(server) as s:
        assert sasl_handshake(s, "PLAIN", 0)[0] == 0
        token = b"\0alice\0nope"
        s.sendall(struct.pack(">i", len(token)) + token)
        assert wait_closed(s)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("nobody", "wonderland")])
def test_a_failure_gets_error_58_then_closes_and_never_says_the_user_is_unknown(server, mechanism, user, password):
    failed = server.metrics()[AUTH_FAILED]
    with connect(server) as s:
        assert sasl_handshake(s, mechanism)[0] == 0
        if mechanism == "PLAIN":
            error, message, _ = sasl_authenticate(s, b"\0" + user.encode() + b"\0" + password.encode())
        else:
            client = ScramClient(mechanism, user, password)
            error, _, server_first = sasl_authenticate(s, client.first())
            assert error == 0  # an unknown user gets a salt too
            error, message, _ = sasl_authenticate(s, client.final(server_first), correlation=3)
        assert (error, message) == (58, f"Authentication failed: invalid credentials with SASL mechanism {mechanism}")
        started = time.monotonic()
        assert wait_closed(s)
        assert time.monotonic() - started < 1.5
    assert server.metrics()[AUTH_FAILED] == failed + 1


@pytest.mark.parametrize("user", ["alice", "nobody"])
def test_a_user_gets_the_same_salt_and_iterations_every_time(server, user):
    """Known or not: an unknown user's salt does not change between attempts either."""
    seen = set()
    for attempt in range(2):
        with connect(server) as s:
            assert sasl_handshake(s, "SCRAM-SHA-256")[0] == 0
            client = ScramClient("SCRAM-SHA-256", user, "x", nonce=f"nonce{attempt}")
            _, _, server_first = sasl_authenticate(s, client.first())
            attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
            seen.add((attrs["s"], attrs["i"]))
    assert len(seen) == 1 and seen.pop()[1] == "4096"


@pytest.mark.parametrize("final", [
    lambda c, sf: c.final(sf).replace(b"c=biws", b"c=eSws"),          # another channel binding
    lambda c, sf: c.final(sf).replace(b",r=", b",r=x"),               # another nonce
    lambda c, sf: c.final(sf).rpartition(b",p=")[0],                  # no proof
])
def test_a_tampered_client_final_fails(server, final):
    with connect(server) as s:
        assert sasl_handshake(s, "SCRAM-SHA-256")[0] == 0
        client = ScramClient("SCRAM-SHA-256", "alice", USERS["alice"])
        _, _, server_first = sasl_authenticate(s, client.first())
        error, message, _ = sasl_authenticate(s, final(client, server_first), correlation=3)
        assert error == 58 and message.startswith("Authentication failed")
        assert wait_closed(s)


def test_sasl_after_authentication_is_an_illegal_state(server):
    with connect(server) as s:
        plain_login(s, "alice", USERS["alice"])
        assert sasl_handshake(s, "PLAIN", correlation=7) == (34, [])
        error, _, _ = sasl_authenticate(s, b"\0alice\0wonderland", correlation=8)
        assert error == 34


def test_a_listener_without_sasl_answers_sasl_with_an_illegal_state(tmp_path):
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as plain:
        with connect(plain) as s:
            assert sasl_handshake(s, "PLAIN") == (34, [])
            s.sendall(metadata_v1("open"))
            assert struct.unpack_from(">i", response(s))[0] == 5
