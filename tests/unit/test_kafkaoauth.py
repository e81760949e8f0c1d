"""OAUTHBEARER's token validation (logstore.kafka.oauth) and the mechanism's messages
(logstore.kafka.auth.OAuthBearerServer): Kafka's unsecured JWS rules (expiry, issued-at and
clock skew, scope, principal claim), JWT validation against a JWKS with tokens signed here by
PyJWT (issuer, audience, expiry, not-before, key ids, algorithms), the configuration by Kafka's
names, RFC 7628's client message and the JSON error step, and the session lifetime of KIP-368."""

from __future__ import annotations

import base64
import json
import time

import pytest

from logstore.errors import LogstoreError
from logstore.kafka.auth import OAuthBearerServer, SaslAuthenticationError, SaslAuthenticator
from logstore.kafka.oauth import (
    JwksSource,
    JwtValidator,
    OAuthBearerValidationError,
    UnsecuredJwsValidator,
    oauthbearer_validator,
)

jwt = pytest.importorskip("jwt")
rsa = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.rsa")

NOW_S = 1_800_000_000
NOW_MS = NOW_S * 1000


def b64(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def unsecured(claims, header=None, signature=""):
    return f"{b64(header or {'alg': 'none'})}.{b64(claims)}.{signature}"


# ---------------------------------------------------------------------- the unsecured JWS
def test_an_unsecured_token_gives_its_principal_scope_and_lifetime():
    token = unsecured({"sub": "alice", "exp": NOW_S + 60, "iat": NOW_S, "scope": "a b"})
    got = UnsecuredJwsValidator().validate(token, NOW_MS)
    assert (got.principal, got.scope, got.lifetime_ms, got.start_ms) == ("alice", {"a", "b"}, NOW_MS + 60_000,
                                                                         NOW_MS)


@pytest.mark.parametrize("claims,why", [
    ({"sub": "alice", "exp": NOW_S}, "expired"),                                # exp == now: expired
    ({"sub": "alice", "exp": NOW_S - 1}, "expired"),
    ({"sub": "alice", "exp": NOW_S + 60, "iat": NOW_S + 1}, "in the future"),
    ({"sub": "alice", "exp": NOW_S + 60, "iat": NOW_S + 61}, "in the future"),
    ({"sub": "alice"}, "no 'exp'"),
    ({"sub": "alice", "exp": "soon"}, "not a number"),
    ({"exp": NOW_S + 60}, "principal claim"),
    ({"sub": "", "exp": NOW_S + 60}, "principal claim"),
    ({"sub": "alice", "exp": NOW_S + 60, "scope": 7}, "neither a string"),
])
def test_unsecured_tokens_refused(claims, why):
    with pytest.raises(OAuthBearerValidationError, match=why) as info:
        UnsecuredJwsValidator().validate(unsecured(claims), NOW_MS)
    assert info.value.json() == '{"status":"invalid_token"}'


def test_unsecured_clock_skew_accepts_a_slightly_early_or_late_token():
    validator = UnsecuredJwsValidator(allowable_clock_skew_ms=2000)
    validator.validate(unsecured({"sub": "a", "exp": NOW_S - 1, "iat": NOW_S - 60}), NOW_MS)
    validator.validate(unsecured({"sub": "a", "exp": NOW_S + 60, "iat": NOW_S + 1}), NOW_MS)
    with pytest.raises(OAuthBearerValidationError):
        validator.validate(unsecured({"sub": "a", "exp": NOW_S - 2}), NOW_MS)


def test_unsecured_signed_or_not_none_tokens_are_refused():
    claims = {"sub": "alice", "exp": NOW_S + 60}
    with pytest.raises(OAuthBearerValidationError, match="empty signature"):
        UnsecuredJwsValidator().validate(unsecured(claims, signature="c2ln"), NOW_MS)
    with pytest.raises(OAuthBearerValidationError, match="alg"):
        UnsecuredJwsValidator().validate(unsecured(claims, header={"alg": "HS256"}), NOW_MS)
    with pytest.raises(OAuthBearerValidationError, match="3 dot-separated parts"):
        UnsecuredJwsValidator().validate("abc.def", NOW_MS)
    with pytest.raises(OAuthBearerValidationError, match="base64url-encoded JSON"):
        UnsecuredJwsValidator().validate("!!!.???.", NOW_MS)


def test_unsecured_required_scope_and_claim_names():
    validator = UnsecuredJwsValidator(principal_claim_name="client_id", scope_claim_name="scp",
                                      required_scope=["read", "write"])
    ok = unsecured({"client_id": "svc", "exp": NOW_S + 60, "scp": ["read", "write", "admin"]})
    assert validator.validate(ok, NOW_MS).principal == "svc"
    with pytest.raises(OAuthBearerValidationError) as info:
        validator.validate(unsecured({"client_id": "svc", "exp": NOW_S + 60, "scp": "read"}), NOW_MS)
    assert info.value.json() == '{"status":"insufficient_scope", "scope":"read write"}'


# ---------------------------------------------------------------------- JWTs against a JWKS
@pytest.fixture(scope="module")
def keys():
    return {kid: rsa.generate_private_key(public_exponent=65537, key_size=2048) for kid in ("k1", "k2")}


@pytest.fixture
def jwks_file(tmp_path, keys):
    def write(kids=("k1",)):
        doc = {"keys": []}
        for kid in kids:
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(keys[kid].public_key()))
            doc["keys"].append({**jwk, "kid": kid, "use": "sig"})
        path.write_text(json.dumps(doc))
        return f"file://{path}"

    path = tmp_path / "jwks.json"
    return write


def sign(keys, kid="k1", alg="RS256", **claims):
    now = int(time.time())
    body = {"sub": "alice", "iss": "https://idp", "aud": "kafka", "iat": now, "exp": now + 300, **claims}
    body = {k: v for k, v in body.items() if v is not None}
    return jwt.encode(body, keys[kid or "k1"], algorithm=alg, headers={"kid": kid} if kid else {})


@pytest.fixture
def validator(jwks_file):
    v = JwtValidator(JwksSource(jwks_file()), "https://idp", ["kafka", "other"], clock_skew_s=5)
    yield v
    v.close()


def test_a_signed_jwt_is_accepted(validator, keys):
    token = sign(keys, scope="produce consume")
    got = validator.validate(token)
    assert got.principal == "alice" and got.scope == {"produce", "consume"}
    assert got.lifetime_ms == jwt.decode(token, options={"verify_signature": False})["exp"] * 1000


def test_the_audience_may_be_any_expected_one_and_a_list(validator, keys):
    assert validator.validate(sign(keys, aud=["unrelated", "other"])).principal == "alice"


#: a claim given as ("now", seconds) is that many seconds from when the test runs (not from
#: when the tests were collected, which may be minutes earlier)
@pytest.mark.parametrize("claims,why", [
    ({"exp": ("now", -60)}, "ExpiredSignature"),
    ({"exp": None}, "MissingRequiredClaim"),
    ({"nbf": ("now", 60)}, "ImmatureSignature"),
    ({"iss": "https://evil"}, "InvalidIssuer"),
    ({"iss": None}, "MissingRequiredClaim|InvalidIssuer"),
    ({"aud": "elsewhere"}, "InvalidAudience"),
    ({"aud": None}, "MissingRequiredClaim|InvalidAudience"),
    ({"sub": None}, "principal claim"),
])
def test_jwts_refused(validator, keys, claims, why):
    now = int(time.time())
    claims = {k: now + v[1] if isinstance(v, tuple) else v for k, v in claims.items()}
    with pytest.raises(OAuthBearerValidationError, match=why):
        validator.validate(sign(keys, **claims))


def test_a_jwt_within_the_clock_skew_is_accepted(validator, keys):
    validator.validate(sign(keys, exp=int(time.time()) - 2))
    validator.validate(sign(keys, nbf=int(time.time()) + 2))


def test_a_wrong_signature_an_unknown_kid_and_disallowed_algorithms_are_refused(validator, keys):
    with pytest.raises(OAuthBearerValidationError, match="InvalidSignature"):
        validator.validate(jwt.encode({"sub": "a", "exp": int(time.time()) + 60, "iss": "https://idp", "aud": "kafka"},
                                      keys["k2"], algorithm="RS256", headers={"kid": "k1"}))
    with pytest.raises(OAuthBearerValidationError, match="no key with id 'k2'"):
        validator.validate(sign(keys, kid="k2"))
    with pytest.raises(OAuthBearerValidationError, match="not allowed"):
        validator.validate(jwt.encode({"sub": "a", "exp": int(time.time()) + 60}, "s" * 32, algorithm="HS256",
                                      headers={"kid": "k1"}))
    with pytest.raises(OAuthBearerValidationError, match="not allowed"):
        validator.validate(unsecured({"sub": "a", "exp": int(time.time()) + 60}, {"alg": "none", "kid": "k1"}))
    with pytest.raises(OAuthBearerValidationError, match="malformed"):
        validator.validate("not a jwt")


def test_a_token_without_kid_uses_the_only_key(validator, keys):
    assert validator.validate(sign(keys, kid=None)).principal == "alice"


def test_a_jwks_file_is_re_read_when_it_changes(jwks_file, keys, monkeypatch):
    source = JwksSource(jwks_file(["k1"]))
    validator = JwtValidator(source, sub_claim_name="client")
    with pytest.raises(OAuthBearerValidationError, match="no key"):
        validator.validate(sign(keys, kid="k2", client="svc"))
    jwks_file(["k1", "k2"])
    monkeypatch.setattr(time, "monotonic", lambda real=time.monotonic: real() + 2)  # past the once-a-second check
    assert validator.validate(sign(keys, kid="k2", client="svc")).principal == "svc"


def test_a_bad_jwks_is_refused_at_configuration(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"keys": "no"}')
    with pytest.raises(ValueError, match="not a usable JSON Web Key Set"):
        JwksSource(f"file://{bad}")
    with pytest.raises(ValueError, match="file://, http:// or https://"):
        JwksSource("ftp://example/jwks")


# ---------------------------------------------------------------------- configuration by Kafka's names
def test_the_configuration_picks_one_validator(jwks_file):
    v = oauthbearer_validator({"sasl.oauthbearer.unsecured.validator.enable": "true",
                               "sasl.oauthbearer.unsecured.validator.required.scope": "a,b",
                               "sasl.oauthbearer.unsecured.validator.allowable.clock.skew.ms": "1000"})
    assert isinstance(v, UnsecuredJwsValidator)
    assert (v.required_scope, v.allowable_clock_skew_ms) == (("a", "b"), 1000)
    v = oauthbearer_validator({"sasl.oauthbearer.jwks.endpoint.url": jwks_file(),
                               "sasl.oauthbearer.expected.audience": "x, y", "sasl.oauthbearer.clock.skew.seconds": 7,
                               "sasl.oauthbearer.sub.claim.name": "azp"})
    try:
        assert isinstance(v, JwtValidator)
        assert (v.expected_audience, v.clock_skew_s, v.sub_claim_name) == (("x", "y"), 7, "azp")
    finally:
        v.close()
    for bad in ({}, {"sasl.oauthbearer.unsecured.validator.enable": "false"},
                {"sasl.oauthbearer.unsecured.validator.enable": "true",
                 "sasl.oauthbearer.jwks.endpoint.url": "file:///x"},
                {"sasl.oauthbearer.unsecured.validator.enable": "yes"},
                {"sasl.oauthbearer.typo": "1", "sasl.oauthbearer.unsecured.validator.enable": "true"}):
        with pytest.raises(ValueError):
            oauthbearer_validator(bad)


def test_the_authenticator_needs_what_each_mechanism_checks():
    with pytest.raises(ValueError, match="OAUTHBEARER needs"):
        SaslAuthenticator({"a": "b"}, ["OAUTHBEARER"])
    with pytest.raises(ValueError, match="need SASL credentials"):
        SaslAuthenticator(None, ["PLAIN"], oauthbearer=UnsecuredJwsValidator())
    assert SaslAuthenticator(oauthbearer=UnsecuredJwsValidator()).mechanisms == ("OAUTHBEARER",)
    assert SaslAuthenticator({"a": "b"}, oauthbearer=UnsecuredJwsValidator()).mechanisms == (
        "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


def test_the_session_lifetime_is_the_least_of_the_two_bounds():
    never = SaslAuthenticator({"a": "b"})
    assert never.session_lifetime_ms(None) is None
    now_ms = int(time.time() * 1000)
    assert 50_000 <= never.session_lifetime_ms(now_ms + 60_000) <= 60_000  # the token's remaining life
    assert never.session_lifetime_ms(now_ms - 5_000) == 0
    capped = SaslAuthenticator({"a": "b"}, connections_max_reauth_ms=10_000)
    assert capped.session_lifetime_ms(None) == 10_000
    assert capped.session_lifetime_ms(now_ms + 60_000) == 10_000
    assert 0 < capped.session_lifetime_ms(now_ms + 3_000) <= 3_000


# ---------------------------------------------------------------------- RFC 7628's messages
def message(token, authzid="", extensions=""):
    return f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}\x01{extensions}\x01".encode()


def good_token(sub="alice"):
    return unsecured({"sub": sub, "exp": int(time.time()) + 60})


def test_a_valid_token_completes_the_exchange_with_extensions():
    server = OAuthBearerServer(UnsecuredJwsValidator())
    assert server.step(message(good_token(), extensions="traceId=abc 123\x01cluster=x\x01")) == b""
    assert server.done and server.user == "alice" and server.lifetime_ms is not None
    assert server.extensions == {"traceId": "abc 123", "cluster": "x"}
    with pytest.raises(SaslAuthenticationError):
        server.step(b"\x01")


def test_an_invalid_token_gets_the_json_step_and_the_client_s_kvsep_fails():
    server = OAuthBearerServer(UnsecuredJwsValidator())
    expired = unsecured({"sub": "alice", "exp": int(time.time()) - 60})
    assert server.step(message(expired)) == b'{"status":"invalid_token"}'
    assert not server.done
    with pytest.raises(SaslAuthenticationError, match='^{"status":"invalid_token"}$'):
        server.step(b"\x01")


@pytest.mark.parametrize("raw", [
    b"y,,\x01auth=Bearer abc\x01\x01",             # channel binding flag
    b"n,,auth=Bearer abc\x01\x01",                 # no kvsep after the gs2 header
    b"n,,\x01auth=Bearer abc\x01",                 # not ended by two kvseps
    b"n,,\x01auth=Basic abc\x01\x01",
    b"n,,\x01\x01",                                # no auth
    b"n,,\x01auth=Bearer abc\x01key 1=v\x01\x01",   # an extension key with a space
    b"n,,\x01auth=Bearer abc\x01auth=Bearer d\x01\x01",
    b"n,x=y,\x01auth=Bearer abc\x01\x01",
    b"\xff\xfe",
])
def test_malformed_client_messages_fail(raw):
    with pytest.raises(SaslAuthenticationError, match="Authentication failed"):
        OAuthBearerServer(UnsecuredJwsValidator()).step(raw)


def test_the_authzid_must_be_the_principal():
    with pytest.raises(SaslAuthenticationError, match=r"authorization id \(bob\)"):
        OAuthBearerServer(UnsecuredJwsValidator()).step(message(good_token("alice"), authzid="bob"))
    server = OAuthBearerServer(UnsecuredJwsValidator())
    server.step(message(good_token("alice"), authzid="alice"))
    assert server.done


def test_jwt_validation_without_pyjwt_says_what_to_install(monkeypatch, jwks_file):
    import builtins

    real = builtins.__import__

    def no_jwt(name, *args, **kwargs):
        if name == "jwt":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_jwt)
    with pytest.raises(LogstoreError, match=r"logstore\[oauth\]"):
        JwksSource(jwks_file())


def test_a_key_verifies_only_its_own_type_and_declared_algorithm(tmp_path, keys):
    ec = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ec")
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(keys["k1"].public_key()))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**jwk, "kid": "any-rsa"}, {**jwk, "kid": "rs256-only", "alg": "RS256"}]}))
    validator = JwtValidator(JwksSource(f"file://{path}"))
    claims = {"sub": "a", "exp": int(time.time()) + 60}
    assert validator.validate(jwt.encode(claims, keys["k1"], algorithm="PS256", headers={"kid": "any-rsa"})).principal \
        == "a"
    with pytest.raises(OAuthBearerValidationError, match="not for PS256"):
        validator.validate(jwt.encode(claims, keys["k1"], algorithm="PS256", headers={"kid": "rs256-only"}))
    with pytest.raises(OAuthBearerValidationError, match="not for ES256"):
        validator.validate(jwt.encode(claims, ec.generate_private_key(ec.SECP256R1()), algorithm="ES256",
                                      headers={"kid": "any-rsa"}))
