"""Tokens for the OAUTHBEARER tests, made here with PyJWT and cryptography (never with the
server's validator): an identity provider's RSA signing keys, its JWKS file, signed JWTs, and
Kafka's unsecured (alg "none") JWS."""

from __future__ import annotations

import base64
import json
import time

import pytest

jwt = pytest.importorskip("jwt")
rsa = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.rsa")

ISSUER = "https://idp.example.test"
AUDIENCE = "logstore-kafka"


class IdentityProvider:
    """RSA keys by kid; :meth:`jwks` publishes the public ones, :meth:`token` signs."""

    def __init__(self, kids=("key-1",)):
        self.keys = {kid: rsa.generate_private_key(public_exponent=65537, key_size=2048) for kid in kids}

    def jwks(self, kids=None):
        keys = []
        for kid in kids or self.keys:
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.keys[kid].public_key()))
            jwk.update(kid=kid, alg="RS256", use="sig")
            keys.append(jwk)
        return {"keys": keys}

    def write_jwks(self, path, kids=None):
        path.write_text(json.dumps(self.jwks(kids)))
        return f"file://{path}"

    def token(self, sub="alice", lifetime_s=3600, kid="key-1", key=None, issuer=ISSUER, audience=AUDIENCE,
              **claims):
        now = int(time.time())
        exp = None if lifetime_s is None else now + lifetime_s
        body = {"sub": sub, "iat": now, "exp": exp, "iss": issuer, "aud": audience, **claims}
        body = {k: v for k, v in body.items() if v is not None}
        headers = {"kid": kid} if kid is not None else {}
        return jwt.encode(body, key or self.keys[kid or "key-1"], algorithm="RS256", headers=headers)


def unsecured_token(sub="alice", lifetime_s=3600, **claims):
    """Kafka's unsecured JWS: header {"alg":"none"}, claims, an empty signature."""
    def part(obj):
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    now = int(time.time())
    body = {"sub": sub, "iat": now, "exp": now + lifetime_s, **claims}
    return f"{part({'alg': 'none'})}.{part({k: v for k, v in body.items() if v is not None})}."
