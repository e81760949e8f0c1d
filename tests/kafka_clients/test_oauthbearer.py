"""SASL/OAUTHBEARER with real clients: confluent-kafka (``oauth_cb``, OIDC's client
credentials, and librdkafka's own unsecured JWT), kcat, kafka-python and aiokafka
(``sasl_oauth_token_provider``) authenticate with JWTs signed here by a test identity provider
whose keys the server reads from a JWKS file or an HTTP URL; expired, not yet valid, wrongly
issued, wrongly addressed, wrongly signed and unknown-kid tokens are refused with an
authentication error and write nothing; the unsecured JWS works only where configured; KIP-368
re-authentication keeps a confluent-kafka and a kafka-python client producing and consuming
across several session lifetimes."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import shutil
import subprocess
import threading
import time

import pytest

from logstore.kafka.server import KafkaServer

from .oauth_tokens import AUDIENCE, ISSUER, IdentityProvider, unsecured_token

kafka = pytest.importorskip("kafka")
ck = pytest.importorskip("confluent_kafka")
aiokafka = pytest.importorskip("aiokafka")
from aiokafka.abc import AbstractTokenProvider as AioTokenProvider  # noqa: E402
from kafka.net.sasl.oauth import AbstractTokenProvider  # noqa: E402

REAUTH_OK = "kafka.server:type=socket-server-metrics,listener=kafka,name=successful-reauthentication-total"
AUTH_FAILED = "kafka.server:type=socket-server-metrics,listener=kafka,name=failed-authentication-total"


@pytest.fixture(scope="module")
def idp():
    return IdentityProvider(kids=("key-1", "key-2"))


def jwt_settings(url):
    return {"sasl.oauthbearer.jwks.endpoint.url": url, "sasl.oauthbearer.expected.issuer": ISSUER,
            "sasl.oauthbearer.expected.audience": AUDIENCE}


@pytest.fixture(scope="module")
def server(tmp_path_factory, idp):
    root = tmp_path_factory.mktemp("oauth")
    url = idp.write_jwks(root / "jwks.json", kids=["key-1"])  # key-2 is the identity provider's, unpublished
    with KafkaServer(str(root / "store"), ("127.0.0.1", 0), sasl_oauthbearer=jwt_settings(url)) as s:
        yield s


def stored(server, topic):
    if topic not in server.store.topics():
        return []
    return [r.value for r in server.store.partition(topic, 0).iter()]


def confluent_config(server, token_of, **extra):
    """``token_of()`` -> a token; librdkafka calls oauth_cb for each token it needs."""
    def oauth_cb(_config):
        token = token_of()
        return token, time.time() + 3600

    return {"bootstrap.servers": server.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "OAUTHBEARER", "oauth_cb": oauth_cb, **extra}


def confluent_round_trip(config, topic, n=3):
    producer = ck.Producer(config)
    delivered = []
    for i in range(n):
        producer.produce(topic, b"%s %d" % (topic.encode(), i),
                         on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(15) == 0
    assert delivered == [(None, i) for i in range(n)]
    consumer = ck.Consumer({**config, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        got, deadline = [], time.monotonic() + 15
        while len(got) < n and time.monotonic() < deadline:
            m = consumer.poll(0.3)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m.value())
    finally:
        consumer.close()
    return got


def test_confluent_produces_and_consumes_with_signed_jwts(server, idp):
    got = confluent_round_trip(confluent_config(server, lambda: idp.token("carol")), "ck-jwt")
    assert got == [b"ck-jwt 0", b"ck-jwt 1", b"ck-jwt 2"] == stored(server, "ck-jwt")


class Tokens(AbstractTokenProvider):
    def __init__(self, make):
        super().__init__()
        self.make = make

    def token(self):
        return self.make()


def test_kafka_python_produces_and_consumes_with_signed_jwts(server, idp):
    config = {"bootstrap_servers": server.bootstrap_servers, "security_protocol": "SASL_PLAINTEXT",
              "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": Tokens(lambda: idp.token("dave")),
              "request_timeout_ms": 10_000}
    producer = kafka.KafkaProducer(**config)
    try:
        offsets = [producer.send("kp-jwt", b"kp %d" % i).get(10).offset for i in range(3)]
    finally:
        producer.close()
    assert offsets == [0, 1, 2]
    # read back by another client
    consumer = ck.Consumer({**confluent_config(server, lambda: idp.token("carol")), "group.id": "g",
                            "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition("kp-jwt", 0, 0)])
        values, deadline = [], time.monotonic() + 15
        while len(values) < 3 and time.monotonic() < deadline:
            m = consumer.poll(0.3)
            if m is not None and m.error() is None:
                values.append(m.value())
    finally:
        consumer.close()
    assert values == [b"kp 0", b"kp 1", b"kp 2"] == stored(server, "kp-jwt")


def test_aiokafka_produces_with_a_signed_jwt(server, idp):
    class AioTokens(AioTokenProvider):
        async def token(self):
            return idp.token("erin")

    async def run():
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=server.bootstrap_servers,
                                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                                             sasl_oauth_token_provider=AioTokens(), request_timeout_ms=10_000)
        await producer.start()
        try:
            return [(await producer.send_and_wait("aio-jwt", b"aio %d" % i)).offset for i in range(2)]
        finally:
            await producer.stop()

    assert asyncio.run(run()) == [0, 1]
    assert stored(server, "aio-jwt") == [b"aio 0", b"aio 1"]


def until_refused(producer, errors) -> None:
    """Serve ``producer`` until error_cb saw an authentication error (at its first connection)
    or 10 s passed, then drop its message (which would wait out message.timeout.ms)."""
    deadline = time.monotonic() + 10
    while not any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        producer.poll(0.05)
    producer.purge()
    producer.flush(1)


def refused_tokens(idp):
    now = int(time.time())
    return {
        "expired": idp.token(lifetime_s=-120),
        "not yet valid": idp.token(nbf=now + 600),
        "issued in the future": idp.token(iat=now + 600, lifetime_s=1200),
        "wrong issuer": idp.token(issuer="https://someone-else.test"),
        "wrong audience": idp.token(audience="another-service"),
        "no expiry": idp.token(lifetime_s=None),
        "wrongly signed": idp.token(key=IdentityProvider().keys["key-1"]),  # kid key-1, another key
        "unknown kid": idp.token(kid="key-2"),
        "unsecured": unsecured_token(),
        "no subject": idp.token(sub=None),
    }


@pytest.mark.parametrize("case", ["expired", "not yet valid", "issued in the future", "wrong issuer",
                                  "wrong audience", "no expiry", "wrongly signed", "unknown kid", "unsecured",
                                  "no subject"])
def test_a_refused_token_fails_the_client_with_an_authentication_error(server, idp, case):
    token = refused_tokens(idp)[case]
    errors = []
    topic = "refused-" + case.replace(" ", "-")
    failed_before = server.metrics()[AUTH_FAILED]
    producer = ck.Producer(confluent_config(server, lambda: token, error_cb=errors.append,
                                            **{"message.timeout.ms": 3000}))
    producer.produce(topic, b"must not be written")
    until_refused(producer, errors)
    assert any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors), errors
    assert any("invalid_token" in e.str() for e in errors), errors
    assert server.metrics()[AUTH_FAILED] > failed_before
    assert topic not in server.store.topics()


def test_kafka_python_with_an_expired_token_gets_an_authentication_error(server, idp, caplog):
    expired = idp.token(lifetime_s=-120)
    caplog.set_level(logging.ERROR, logger="kafka")
    with pytest.raises(kafka.errors.KafkaError):
        producer = kafka.KafkaProducer(bootstrap_servers=server.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                                       sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=Tokens(lambda: expired),
                                       request_timeout_ms=3000, max_block_ms=800, bootstrap_timeout_ms=800)
        try:
            producer.send("kp-expired", b"must not land").get(2)
        finally:
            producer.close(timeout=1)
    assert "SaslAuthenticationFailedError" in caplog.text
    assert "invalid_token" in caplog.text
    assert "kp-expired" not in server.store.topics()


# ---------------------------------------------------------------------- the unsecured JWS
@pytest.fixture(scope="module")
def unsecured_server(tmp_path_factory):
    settings = {"sasl.oauthbearer.unsecured.validator.enable": "true",
                "sasl.oauthbearer.unsecured.validator.required.scope": "logstore.write"}
    with KafkaServer(str(tmp_path_factory.mktemp("unsecured")), ("127.0.0.1", 0), sasl_oauthbearer=settings) as s:
        yield s


def librdkafka_unsecured(server, scope, **extra):
    """librdkafka makes the unsecured JWT itself (its sasl.oauthbearer.config)."""
    return {"bootstrap.servers": server.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": f"principal=frank scope={scope} lifeSeconds=600", **extra}


def test_librdkafka_unsecured_jwt_with_the_required_scope_is_accepted(unsecured_server):
    got = confluent_round_trip(librdkafka_unsecured(unsecured_server, "logstore.write"), "unsecured")
    assert got == [b"unsecured 0", b"unsecured 1", b"unsecured 2"] == stored(unsecured_server, "unsecured")


def test_librdkafka_unsecured_jwt_without_the_required_scope_is_refused(unsecured_server):
    errors = []
    producer = ck.Producer(librdkafka_unsecured(unsecured_server, "logstore.read", error_cb=errors.append,
                                                **{"message.timeout.ms": 3000}))
    producer.produce("no-scope", b"x")
    until_refused(producer, errors)
    assert any(e.code() == ck.KafkaError._AUTHENTICATION and "insufficient_scope" in e.str() for e in errors), errors
    assert "no-scope" not in unsecured_server.store.topics()


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (apt-get install kcat)")
def test_kcat_produces_and_consumes_with_its_unsecured_jwt(unsecured_server):
    auth = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=OAUTHBEARER",
            "-X", "enable.sasl.oauthbearer.unsecure.jwt=true",
            "-X", "sasl.oauthbearer.config=principal=kc scope=logstore.write"]
    kcat = [shutil.which("kcat"), "-b", unsecured_server.bootstrap_servers, *auth]
    done = subprocess.run([*kcat, "-P", "-t", "kcat-oauth"], input=b"one\ntwo\n", capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([*kcat, "-C", "-t", "kcat-oauth", "-o", "beginning", "-e", "-q"], capture_output=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [b"one", b"two"] == stored(unsecured_server, "kcat-oauth")


def test_a_signed_jwt_is_not_what_the_unsecured_validator_takes(unsecured_server, idp):
    errors = []
    producer = ck.Producer(confluent_config(unsecured_server, lambda: idp.token(scope="logstore.write"),
                                            error_cb=errors.append, **{"message.timeout.ms": 3000}))
    producer.produce("signed", b"x")
    until_refused(producer, errors)
    assert any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors), errors


# ---------------------------------------------------------------------- a JWKS over HTTP
class _Jwks(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the http.server API
        body = json.dumps(self.server.jwks).encode()
        self.server.fetches += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def jwks_http(idp):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Jwks)
    httpd.jwks, httpd.fetches = idp.jwks(["key-1"]), 0
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_a_jwks_url_is_fetched_and_a_new_kid_refreshes_it(tmp_path, idp, jwks_http):
    """A key rotated in at the identity provider: the first token naming it is refused and asks
    for an early refresh; once fetched, the new key's tokens are accepted."""
    url = f"http://127.0.0.1:{jwks_http.server_address[1]}/jwks"
    settings = {**jwt_settings(url), "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms": "50",
                "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms": "200"}
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), sasl_oauthbearer=settings) as server:
        assert jwks_http.fetches == 1
        assert confluent_round_trip(confluent_config(server, lambda: idp.token()), "http-jwks", n=1) == \
            [b"http-jwks 0"]
        jwks_http.jwks = idp.jwks(["key-1", "key-2"])
        errors = []
        producer = ck.Producer(confluent_config(server, lambda: idp.token(kid="key-2"), error_cb=errors.append,
                                                **{"message.timeout.ms": 3000}))
        producer.produce("rotated", b"x")
        until_refused(producer, errors)
        assert any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors), errors
        deadline = time.monotonic() + 10
        while jwks_http.fetches < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert jwks_http.fetches >= 2
        assert confluent_round_trip(confluent_config(server, lambda: idp.token(kid="key-2")), "rotated-ok", n=1) == \
            [b"rotated-ok 0"]


class _TokenEndpoint(http.server.BaseHTTPRequestHandler):
    """An OAuth 2 token endpoint (client credentials grant) that signs with the test provider."""

    def do_POST(self):  # noqa: N802 - the http.server API
        form = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        self.server.requests.append((form, self.headers.get("Authorization")))
        token = self.server.idp.token("oidc-client", lifetime_s=600)
        body = json.dumps({"access_token": token, "token_type": "bearer", "expires_in": 600}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_confluent_oidc_client_credentials(server, idp):
    """librdkafka's ``sasl.oauthbearer.method=oidc``: it gets a JWT from the token endpoint with
    its client id and secret, and the server validates that JWT against the JWKS."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TokenEndpoint)
    httpd.idp, httpd.requests = idp, []
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        config = {"bootstrap.servers": server.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
                  "sasl.mechanisms": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                  "sasl.oauthbearer.client.id": "cid", "sasl.oauthbearer.client.secret": "csecret",
                  "sasl.oauthbearer.scope": "kafka",
                  "sasl.oauthbearer.token.endpoint.url": f"http://127.0.0.1:{httpd.server_address[1]}/token"}
        assert confluent_round_trip(config, "oidc", n=2) == [b"oidc 0", b"oidc 1"] == stored(server, "oidc")
        assert ("grant_type=client_credentials&scope=kafka", "Basic Y2lkOmNzZWNyZXQ=") in httpd.requests
    finally:
        httpd.shutdown()
        httpd.server_close()


# ---------------------------------------------------------------------- KIP-368
def test_confluent_re_authenticates_across_several_session_lifetimes(tmp_path, idp):
    """connections.max.reauth.ms 1500: librdkafka re-authenticates each connection before its
    session ends (from the lifetime in SaslAuthenticate v1), with fresh tokens, and a producer
    and a consumer keep working for over four lifetimes: every record produced is consumed."""
    url = idp.write_jwks(tmp_path / "jwks.json", kids=["key-1"])
    with KafkaServer(str(tmp_path / "store"), ("127.0.0.1", 0), sasl_oauthbearer=jwt_settings(url),
                     connections_max_reauth_ms=1500) as server:
        config = confluent_config(server, lambda: idp.token("grace"))
        producer = ck.Producer(config)
        consumer = ck.Consumer({**config, "group.id": "reauth", "enable.auto.commit": False})
        consumer.assign([ck.TopicPartition("reauth", 0, 0)])
        sent, got, errors = [], [], []
        try:
            started = time.monotonic()
            i = 0
            while time.monotonic() - started < 6.5:
                producer.produce("reauth", b"r %d" % i,
                                 on_delivery=lambda err, msg: errors.append(err) if err else None)
                sent.append(b"r %d" % i)
                i += 1
                producer.poll(0)
                m = consumer.poll(0.1)
                if m is not None:
                    assert m.error() is None, m.error()
                    got.append(m.value())
            assert producer.flush(10) == 0
            deadline = time.monotonic() + 10
            while len(got) < len(sent) and time.monotonic() < deadline:
                m = consumer.poll(0.2)
                if m is not None and m.error() is None:
                    got.append(m.value())
        finally:
            consumer.close()
        assert errors == []
        assert got == sent == stored(server, "reauth")
        assert server.metrics()[REAUTH_OK] >= 4  # two connections, each at least twice
        killed = server.metrics()["kafka.server:type=socket-server-metrics,listener=kafka,"
                                  "name=expired-connections-killed-count"]
        assert killed == 0


def test_kafka_python_re_authenticates_with_scram(tmp_path):
    """kafka-python 3 re-authenticates (KIP-368) with SCRAM as the server's lifetime asks."""
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), sasl_credentials={"heidi": "h3idi"},
                     connections_max_reauth_ms=1200) as server:
        producer = kafka.KafkaProducer(bootstrap_servers=server.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                                       sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="heidi",
                                       sasl_plain_password="h3idi", request_timeout_ms=10_000)
        try:
            offsets = []
            started = time.monotonic()
            while time.monotonic() - started < 4:
                offsets.append(producer.send("kp-reauth", b"x").get(10).offset)
                time.sleep(0.1)
        finally:
            producer.close()
        assert offsets == list(range(len(offsets)))
        assert len(stored(server, "kp-reauth")) == len(offsets)
        assert server.metrics()[REAUTH_OK] >= 2

