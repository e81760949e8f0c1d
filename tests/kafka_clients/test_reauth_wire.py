"""KIP-368 re-authentication and OAUTHBEARER on raw sockets, every byte written by hand from
Kafka's protocol guide and RFC 7628 (not by the server's codec): SaslAuthenticate v1 carries the
session lifetime (``connections.max.reauth.ms``, or less: an OAUTHBEARER token's remaining
life); SaslHandshake + SaslAuthenticate re-authenticate the open connection between other
requests; a connection that lets its session end is closed at its next request, unanswered;
a re-authentication as another principal or with another mechanism is refused and closes; a
session without a lifetime cannot re-authenticate (ILLEGAL_SASL_STATE); a refused token gets
the JSON step, and the client's ``\\x01`` the failure."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from logstore.kafka.server import KafkaServer

from .oauth_tokens import unsecured_token
from .test_sasl_wire import ScramClient, bytes_field, metadata_v1, produce_v3, sasl_handshake, wait_closed
from .test_wire_edges import request, response

USERS = {"alice": "wonderland", "bob": "builder"}
METRIC = "kafka.server:type=socket-server-metrics,listener=kafka,name="
LIFETIME_MS = 600


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = KafkaServer(str(tmp_path_factory.mktemp("reauth-wire")), ("127.0.0.1", 0), sasl_credentials=USERS,
                    sasl_oauthbearer={"sasl.oauthbearer.unsecured.validator.enable": "true"},
                    connections_max_reauth_ms=LIFETIME_MS, failed_authentication_delay_ms=20)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def no_lifetime(tmp_path_factory):
    s = KafkaServer(str(tmp_path_factory.mktemp("no-lifetime")), ("127.0.0.1", 0), sasl_credentials=USERS)
    yield s
    s.stop()


def connect(server):
    return socket.create_connection(server.address, timeout=5)


def authenticate(sock, token, correlation=2):
    """(error code, error message, server token, session lifetime ms) of a SaslAuthenticate v1."""
    sock.sendall(request(36, 1, correlation, bytes_field(token)))
    payload = response(sock)
    got, error, n = struct.unpack_from(">ihh", payload, 0)
    assert got == correlation
    at, message = 8, None
    if n >= 0:
        message, at = payload[at:at + n].decode(), at + n
    (size,) = struct.unpack_from(">i", payload, at)
    token_out = payload[at + 4:at + 4 + size]
    (lifetime,) = struct.unpack_from(">q", payload, at + 4 + size)
    assert at + 4 + size + 8 == len(payload)
    return error, message, token_out, lifetime


def plain(sock, user, password=None):
    assert sasl_handshake(sock, "PLAIN")[0] == 0
    return authenticate(sock, b"\0" + user.encode() + b"\0" + (password or USERS[user]).encode())


def scram(sock, user):
    assert sasl_handshake(sock, "SCRAM-SHA-256")[0] == 0
    client = ScramClient("SCRAM-SHA-256", user, USERS[user])
    error, _, server_first, lifetime = authenticate(sock, client.first())
    assert (error, lifetime) == (0, 0)  # not done yet: no lifetime
    error, message, server_final, lifetime = authenticate(sock, client.final(server_first), correlation=3)
    assert (error, message) == (0, None)
    client.check(server_final)
    return lifetime


def oauthbearer_message(token, authzid=""):
    gs2 = f"n,a={authzid}," if authzid else "n,,"
    return f"{gs2}\x01auth=Bearer {token}\x01\x01".encode()


def metadata_answered(sock, correlation=5):
    sock.sendall(metadata_v1("reauth-topic", correlation))
    return struct.unpack_from(">i", response(sock))[0] == correlation


def test_the_session_lifetime_is_connections_max_reauth_ms(server):
    with connect(server) as s:
        assert plain(s, "alice") == (0, None, b"", LIFETIME_MS)
    with connect(server) as s:
        assert scram(s, "bob") == LIFETIME_MS


def test_an_oauthbearer_session_ends_with_its_token(server):
    with connect(server) as s:
        assert sasl_handshake(s, "OAUTHBEARER")[0] == 0
        error, message, answer, lifetime = authenticate(s, oauthbearer_message(unsecured_token("carol", 10**6)))
        assert (error, message, answer, lifetime) == (0, None, b"", LIFETIME_MS)  # the smaller bound
    with connect(server) as s:  # a token with at most 2 s left (exp is in whole seconds)
        assert sasl_handshake(s, "OAUTHBEARER")[0] == 0
        error, _, _, lifetime = authenticate(s, oauthbearer_message(unsecured_token("carol", 2)))
        assert error == 0 and 0 < lifetime <= 2000


def test_re_authentication_between_requests_keeps_the_connection(server):
    """Three re-authentications between requests, the first within the session, the next two
    (a second apart: Kafka allows one a second) after its end, which a SaslHandshake may still
    follow: every request in between is answered, and the record produced lands."""
    before = server.metrics()[METRIC + "successful-reauthentication-total"]
    with connect(server) as s:
        assert plain(s, "alice")[3] == LIFETIME_MS
        assert metadata_answered(s)
        for round_, pause in enumerate((0.3, 1.05, 1.05)):
            time.sleep(pause)
            assert plain(s, "alice") == (0, None, b"", LIFETIME_MS)
            assert metadata_answered(s, 10 + round_)
        s.sendall(produce_v3("reauth-topic", b"after three re-authentications", 20))
        assert struct.unpack_from(">i", response(s))[0] == 20
    assert server.metrics()[METRIC + "successful-reauthentication-total"] == before + 3
    assert [r.value for r in server.store.partition("reauth-topic", 0).iter()] == [b"after three re-authentications"]


def test_a_connection_that_does_not_re_authenticate_is_closed_at_its_next_request(server):
    killed = server.metrics()[METRIC + "expired-connections-killed-count"]
    with connect(server) as s:
        plain(s, "alice")
        assert metadata_answered(s)
        time.sleep(LIFETIME_MS / 1000 + 0.2)
        s.sendall(produce_v3("expired-session", b"must not land"))
        assert wait_closed(s)
    assert server.metrics()[METRIC + "expired-connections-killed-count"] == killed + 1
    assert "expired-session" not in server.store.topics()


def test_re_authenticating_as_another_principal_is_refused_and_closes(server):
    failed = server.metrics()[METRIC + "failed-reauthentication-total"]
    with connect(server) as s:
        plain(s, "alice")
        time.sleep(1.0)
        error, message, _, lifetime = plain(s, "bob")
        assert (error, lifetime) == (58, 0)
        assert message == "Cannot change principals during re-authentication from User.alice: User.bob"
        assert wait_closed(s)
    assert server.metrics()[METRIC + "failed-reauthentication-total"] == failed + 1


def test_re_authenticating_with_another_mechanism_is_refused_and_closes(server):
    with connect(server) as s:
        plain(s, "alice")
        time.sleep(1.0)
        assert sasl_handshake(s, "SCRAM-SHA-256")[0] == 0  # as Kafka: the first token fails
        client = ScramClient("SCRAM-SHA-256", "alice", USERS["alice"])
        error, message, _, _ = authenticate(s, client.first())
        assert error == 58
        assert message == ("SASL mechanism 'SCRAM-SHA-256' requested by client is not supported for "
                           "re-authentication of mechanism 'PLAIN'")
        assert wait_closed(s)


def test_a_second_re_authentication_within_a_second_is_an_illegal_sasl_state(server):
    with connect(server) as s:
        plain(s, "alice")
        time.sleep(1.0)
        assert plain(s, "alice")[0] == 0
        s.sendall(request(17, 1, 7, struct.pack(">h", 5) + b"PLAIN"))  # at once again
        assert struct.unpack_from(">ih", response(s)) == (7, 34)
        assert metadata_answered(s)  # the connection goes on


def test_without_a_session_lifetime_sasl_handshake_is_an_illegal_sasl_state(no_lifetime):
    with connect(no_lifetime) as s:
        assert plain(s, "alice") == (0, None, b"", 0)
        s.sendall(request(17, 1, 7, struct.pack(">h", 5) + b"PLAIN"))
        assert struct.unpack_from(">ih", response(s)) == (7, 34)
        assert metadata_answered(s)


def test_a_refused_oauthbearer_token_gets_the_json_step_then_fails(server):
    with connect(server) as s:
        assert sasl_handshake(s, "OAUTHBEARER")[0] == 0
        error, message, answer, _ = authenticate(s, oauthbearer_message(unsecured_token("dan", -60)))
        assert (error, message, answer) == (0, None, b'{"status":"invalid_token"}')
        error, message, _, _ = authenticate(s, b"\x01", correlation=3)
        assert (error, message) == (58, '{"status":"invalid_token"}')
        assert wait_closed(s)


def test_an_oauthbearer_authzid_must_be_the_token_principal(server):
    with connect(server) as s:
        assert sasl_handshake(s, "OAUTHBEARER")[0] == 0
        error, message, _, _ = authenticate(s, oauthbearer_message(unsecured_token("dan"), authzid="root"))
        assert error == 58 and "authorization id (root)" in message
        assert wait_closed(s)
    with connect(server) as s:
        assert sasl_handshake(s, "OAUTHBEARER")[0] == 0
        assert authenticate(s, oauthbearer_message(unsecured_token("dan"), authzid="dan"))[0] == 0
        assert metadata_answered(s)
