"""SASL/OAUTHBEARER's token validation (KIP-255, KIP-768), configured with Kafka's names; the
mechanism's exchange is :class:`~logstore.kafka.auth.OAuthBearerServer`.

A token is validated by one of:

- :class:`UnsecuredJwsValidator`, Kafka's unsecured JWS for development
  (``OAuthBearerUnsecuredValidatorCallbackHandler``): an ``alg: none`` token with an empty
  signature, its principal claim (``sub``) a non-empty string, ``exp`` required, ``iat`` if
  present not in the future, both within the allowable clock skew, and every required scope in
  its scope claim. Anyone can make such a token: it is refused unless configured
  (``sasl.oauthbearer.unsecured.validator.enable``, a logstore name for what Kafka's default
  server callback handler does silently).
- :class:`JwtValidator`, Kafka's ``BrokerJwtValidator``: a signed JWT (RS, PS, ES or EdDSA: no
  ``none``, no shared-secret HS) verified with a key of a JWKS (:class:`JwksSource`, a file:// or
  http(s):// URL), ``exp`` required, ``nbf`` and ``iat`` checked, all within
  ``sasl.oauthbearer.clock.skew.seconds``; ``iss`` and ``aud`` checked when expected; the
  principal is the ``sub`` claim (``sasl.oauthbearer.sub.claim.name``). Signatures are checked by
  PyJWT with ``cryptography`` (the ``oauth`` extra), imported when such a validator is made:
  PyJWT is the most used JOSE library in Python, small, and its JWK set and algorithm
  whitelist are what this needs; ``cryptography`` does the signatures.

:func:`oauthbearer_validator` makes either from a mapping of Kafka's configuration names
(:data:`CONFIG_NAMES`). The principal a validated token yields is ``User:<principal claim>``
(:mod:`~logstore.kafka.auth`), and the token's expiry bounds the session (KIP-368).

Thread-safety: validators and :class:`JwksSource` are thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping, Union

from .. import _fileio
from ..errors import LogstoreError

__all__ = ["OAUTHBEARER", "CONFIG_NAMES", "OAuthBearerValidationError", "OAuthBearerToken", "UnsecuredJwsValidator",
           "JwksSource", "JwtValidator", "OAuthBearerValidator", "oauthbearer_validator"]

logger = logging.getLogger("logstore.kafka")

OAUTHBEARER = "OAUTHBEARER"

#: Kafka's configuration names this module reads, with their defaults (None: unset).
CONFIG_NAMES: dict[str, Any] = {
    "sasl.oauthbearer.jwks.endpoint.url": None,
    "sasl.oauthbearer.jwks.endpoint.refresh.ms": 3_600_000,
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms": 100,
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms": 10_000,
    "sasl.oauthbearer.expected.issuer": None,
    "sasl.oauthbearer.expected.audience": None,
    "sasl.oauthbearer.clock.skew.seconds": 30,
    "sasl.oauthbearer.scope.claim.name": "scope",
    "sasl.oauthbearer.sub.claim.name": "sub",
    # Kafka's unsecured validator's JAAS options (unsecuredValidator...), under configuration names.
    "sasl.oauthbearer.unsecured.validator.enable": False,
    "sasl.oauthbearer.unsecured.validator.principal.claim.name": "sub",
    "sasl.oauthbearer.unsecured.validator.scope.claim.name": "scope",
    "sasl.oauthbearer.unsecured.validator.required.scope": None,
    "sasl.oauthbearer.unsecured.validator.allowable.clock.skew.ms": 0,
}

#: The signature algorithms a JWT may use (asymmetric only: the JWKS holds public keys).
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
#: The JWK key type (kty) each algorithm family verifies with.
_KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
_MAX_JWKS_BYTES = 1 << 20


class OAuthBearerValidationError(LogstoreError):
    """A token that is not accepted: ``status`` is RFC 7628's (``invalid_token``,
    ``insufficient_scope``), ``scope`` the scope required (or None); the message says why (logged
    by the server, never sent to the client)."""

    def __init__(self, message: str, status: str = "invalid_token", scope: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.scope = scope

    def json(self) -> str:
        """The JSON step the client is answered with (as Kafka writes it)."""
        text = f'{{"status":"{self.status}"'
        if self.scope is not None:
            text += f', "scope":"{self.scope}"'
        return text + "}"


@dataclass(frozen=True)
class OAuthBearerToken:
    """A validated token: its text, principal name, scopes, and its expiry and start in
    milliseconds since the epoch (Kafka's ``OAuthBearerToken``). Immutable."""

    value: str
    principal: str
    scope: frozenset[str]
    lifetime_ms: int
    start_ms: int | None


def _b64url_json(part: str, what: str) -> Any:
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        value = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise OAuthBearerValidationError(f"the token's {what} is not base64url-encoded JSON") from None
    if not isinstance(value, dict):
        raise OAuthBearerValidationError(f"the token's {what} is not a JSON object")
    return value


def _number(claims: Mapping[str, Any], name: str, required: bool) -> float | None:
    value = claims.get(name)
    if value is None:
        if required:
            raise OAuthBearerValidationError(f"the token has no {name!r} claim")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OAuthBearerValidationError(f"the token's {name!r} claim is not a number")
    return float(value)


def _scopes(claims: Mapping[str, Any], name: str) -> frozenset[str]:
    value = claims.get(name)
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    raise OAuthBearerValidationError(f"the token's {name!r} claim is neither a string nor a list of strings")


def _principal(claims: Mapping[str, Any], name: str) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not value.strip():
        raise OAuthBearerValidationError(f"the token's principal claim {name!r} is missing or not a non-empty string")
    return value


class UnsecuredJwsValidator:
    """Kafka's unsecured JWS (``alg: none``) validation, for development (see the module
    docstring). Args are Kafka's unsecured validator options: ``principal_claim_name``
    (``sub``), ``scope_claim_name`` (``scope``), ``required_scope`` (scopes every token must
    hold), ``allowable_clock_skew_ms`` (0). Immutable; thread-safe."""

    def __init__(self, principal_claim_name: str = "sub", scope_claim_name: str = "scope",
                 required_scope: tuple[str, ...] | list[str] = (), allowable_clock_skew_ms: int = 0) -> None:
        if allowable_clock_skew_ms < 0:
            raise ValueError(f"the allowable clock skew must be >= 0 ms, got {allowable_clock_skew_ms}")
        self.principal_claim_name = principal_claim_name
        self.scope_claim_name = scope_claim_name
        self.required_scope = tuple(required_scope)
        self.allowable_clock_skew_ms = allowable_clock_skew_ms

    def validate(self, token: str, now_ms: int | None = None) -> OAuthBearerToken:
        """The token's principal, scopes and lifetime.

        Raises:
            OAuthBearerValidationError: malformed, signed, expired, issued in the future, or
                without a required scope (status ``insufficient_scope``).
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        parts = token.split(".")
        if len(parts) != 3:
            raise OAuthBearerValidationError(f"an unsecured JWS has 3 dot-separated parts, this token {len(parts)}")
        header = _b64url_json(parts[0], "header")
        if header.get("alg") != "none":
            raise OAuthBearerValidationError(f"an unsecured JWS has \"alg\": \"none\", not {header.get('alg')!r}")
        if parts[2]:
            raise OAuthBearerValidationError("an unsecured JWS has an empty signature")
        claims = _b64url_json(parts[1], "claims")
        principal = _principal(claims, self.principal_claim_name)
        exp = _number(claims, "exp", True)
        iat = _number(claims, "iat", False)
        skew = self.allowable_clock_skew_ms
        assert exp is not None
        exp_ms = int(exp * 1000)
        iat_ms = None if iat is None else int(iat * 1000)
        if iat_ms is not None and iat_ms > now_ms + skew:
            raise OAuthBearerValidationError(f"the token was issued in the future (iat {iat_ms} ms, now {now_ms} ms, "
                                             f"clock skew {skew} ms)")
        if now_ms >= exp_ms + skew:
            raise OAuthBearerValidationError(f"the token expired (exp {exp_ms} ms, now {now_ms} ms, clock skew "
                                             f"{skew} ms)")
        if iat_ms is not None and exp_ms <= iat_ms:
            raise OAuthBearerValidationError(f"the token expires (exp {exp_ms} ms) before it was issued (iat "
                                             f"{iat_ms} ms)")
        scope = _scopes(claims, self.scope_claim_name)
        missing = [s for s in self.required_scope if s not in scope]
        if missing:
            raise OAuthBearerValidationError(f"the token lacks the required scope {' '.join(missing)}",
                                             "insufficient_scope", " ".join(self.required_scope))
        return OAuthBearerToken(token, principal, scope, exp_ms, iat_ms)

    def close(self) -> None:
        """Nothing to release."""


def _jwt() -> Any:
    try:
        import jwt  # PyJWT, with cryptography (the "oauth" extra)
        from cryptography.hazmat.primitives.asymmetric import rsa  # PyJWT verifies RS/PS/ES/EdDSA with it
        del rsa
    except ImportError:
        raise LogstoreError("JWT validation (sasl.oauthbearer.jwks.endpoint.url) needs PyJWT and cryptography: "
                            "pip install 'logstore[oauth]'") from None
    return jwt


class JwksSource:
    """The JSON Web Key Set a :class:`JwtValidator` verifies signatures with, from ``url``
    (Kafka's ``sasl.oauthbearer.jwks.endpoint.url``).

    A ``file://`` URL is read at construction and again when the file changes (checked at most
    once a second, on use). An ``http://`` or ``https://`` URL is fetched at construction and
    then every ``refresh_ms`` by the thread ``logstore-jwks``, retrying a failed fetch after
    ``retry_backoff_ms``, doubling up to ``retry_backoff_max_ms`` (Kafka's
    ``...jwks.endpoint.refresh.ms``, ``...retry.backoff.ms``, ``...retry.backoff.max.ms``); a
    key id not in the set asks for an early refresh (at most once per ``retry_backoff_max_ms``),
    and the token that named it is refused meanwhile, as Kafka does. A set that cannot be read
    leaves the last good one in use (logged). Thread-safe; :meth:`close` stops the thread.
    """

    def __init__(self, url: str, refresh_ms: int = 3_600_000, retry_backoff_ms: int = 100,
                 retry_backoff_max_ms: int = 10_000, timeout_s: float = 10.0) -> None:
        self._jwt = _jwt()
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("file", "http", "https"):
            raise ValueError(f"sasl.oauthbearer.jwks.endpoint.url must be a file://, http:// or https:// URL, "
                             f"not {url!r}")
        if refresh_ms <= 0 or retry_backoff_ms <= 0 or retry_backoff_max_ms < retry_backoff_ms:
            raise ValueError("the JWKS refresh and retry backoff must be > 0 ms (and the maximum >= the backoff)")
        self.url = url
        self.refresh_ms = refresh_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.timeout_s = timeout_s
        self._path = urllib.request.url2pathname(parsed.path) if parsed.scheme == "file" else None
        self._lock = threading.Lock()
        self._keys: dict[str | None, Any] = {}
        self._stamp: Any = None
        self._checked = 0.0
        self._expedited = 0.0
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        if self._path is not None:
            self._keys = self._parse(_fileio.ops.read_file(self._path))
            self._stamp = self._file_stamp()
            self._checked = time.monotonic()
        else:
            try:
                self._keys = self._parse(self._fetch())
            except (OSError, ValueError, LogstoreError) as exc:
                logger.warning("cannot fetch the JWKS from %s yet (retrying): %s", url, exc)
            self._thread = threading.Thread(target=self._refresh_loop, name="logstore-jwks", daemon=True)
            self._thread.start()

    def _file_stamp(self) -> Any:
        assert self._path is not None
        identity = _fileio.ops.path_identity(self._path)
        return None if identity is None else (*identity, _fileio.ops.size(self._path))

    def _fetch(self) -> bytes:
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as answer:  # noqa: S310 - the scheme is checked
            data = answer.read(_MAX_JWKS_BYTES + 1)
        if len(data) > _MAX_JWKS_BYTES:
            raise ValueError(f"the JWKS at {self.url} is larger than {_MAX_JWKS_BYTES} bytes")
        return bytes(data)

    def _parse(self, data: bytes) -> dict[str | None, Any]:
        try:
            document = json.loads(data.decode("utf-8"))
            keys = self._jwt.PyJWKSet.from_dict(document).keys
        except (ValueError, UnicodeDecodeError, self._jwt.exceptions.PyJWKSetError) as exc:
            raise ValueError(f"{self.url} is not a usable JSON Web Key Set: {exc}") from None
        declared = {entry.get("kid"): entry.get("alg") for entry in document.get("keys", ())
                    if isinstance(entry, dict)}
        out: dict[str | None, Any] = {}
        for key in keys:
            if getattr(key, "public_key_use", None) not in (None, "sig"):
                continue
            out[key.key_id] = (key, declared.get(key.key_id))  # (PyJWK's algorithm_name defaults when alg is absent)
        return out

    def _refresh_loop(self) -> None:
        backoff = self.retry_backoff_ms
        wait = self.refresh_ms if self._keys else backoff
        while not self._closed.is_set():
            self._wake.wait(wait / 1000)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                keys = self._parse(self._fetch())
            except (OSError, ValueError) as exc:
                logger.warning("cannot refresh the JWKS from %s (retrying in %d ms): %s", self.url, backoff, exc)
                wait, backoff = backoff, min(backoff * 2, self.retry_backoff_max_ms)
                continue
            with self._lock:
                self._keys = keys
            logger.debug("refreshed the JWKS from %s: %d keys", self.url, len(keys))
            wait, backoff = self.refresh_ms, self.retry_backoff_ms

    def _maybe_reread(self) -> None:
        now = time.monotonic()
        if self._path is None or now - self._checked < 1.0:
            return
        with self._lock:
            if now - self._checked < 1.0:
                return
            self._checked = now
            try:
                stamp = self._file_stamp()
                if stamp == self._stamp:
                    return
                self._stamp = stamp
                self._keys = self._parse(_fileio.ops.read_file(self._path))
                logger.info("re-read the JWKS in %s (%d keys)", self._path, len(self._keys))
            except (OSError, ValueError) as exc:
                logger.error("keeping the JWKS read before: %s", exc)

    def key(self, kid: str | None, algorithm: str) -> Any:
        """The PyJWK of key id ``kid`` (None: the set's only key of ``algorithm``'s type) that
        verifies ``algorithm``.

        Raises:
            OAuthBearerValidationError: no such key (an early refresh is asked for).
        """
        self._maybe_reread()
        with self._lock:
            keys = self._keys
        kty = _KEY_TYPES[algorithm[:2]]
        if kid is not None:
            entry = keys.get(kid)
        else:
            usable = [e for e in keys.values() if e[0].key_type == kty]
            entry = usable[0] if len(usable) == 1 else None
        if entry is None:
            self._expedite()
            raise OAuthBearerValidationError(f"no key with id {kid!r} in the JWKS of {self.url}")
        key, declared = entry
        if key.key_type != kty or (declared is not None and declared != algorithm):
            raise OAuthBearerValidationError(f"the key {kid!r} ({key.key_type}, alg {declared}) is not for {algorithm}")
        return key

    def _expedite(self) -> None:
        if self._thread is None:
            return
        now = time.monotonic()
        if now - self._expedited >= self.retry_backoff_max_ms / 1000:
            self._expedited = now
            self._wake.set()

    def close(self) -> None:
        """Stop the refresh thread (idempotent)."""
        self._closed.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)


class JwtValidator:
    """Signed JWT validation against a :class:`JwksSource` (see the module docstring). Args are
    Kafka's: ``expected_issuer``, ``expected_audience`` (a token must name one of them),
    ``clock_skew_s``, ``scope_claim_name``, ``sub_claim_name``. Thread-safe; :meth:`close`
    closes the key source."""

    def __init__(self, jwks: JwksSource, expected_issuer: str | None = None,
                 expected_audience: tuple[str, ...] | list[str] = (), clock_skew_s: int = 30,
                 scope_claim_name: str = "scope", sub_claim_name: str = "sub") -> None:
        if clock_skew_s < 0:
            raise ValueError(f"sasl.oauthbearer.clock.skew.seconds must be >= 0, got {clock_skew_s}")
        self._jwt = _jwt()
        self.jwks = jwks
        self.expected_issuer = expected_issuer
        self.expected_audience = tuple(expected_audience)
        self.clock_skew_s = clock_skew_s
        self.scope_claim_name = scope_claim_name
        self.sub_claim_name = sub_claim_name

    def validate(self, token: str, now_ms: int | None = None) -> OAuthBearerToken:
        """The token's principal (the sub claim), scopes and lifetime.

        Raises:
            OAuthBearerValidationError: malformed, not signed by a key of the set (or with an
                algorithm not allowed), expired or not yet valid, the wrong issuer or audience,
                or without its principal claim.
        """
        jwt = self._jwt
        try:
            header = jwt.get_unverified_header(token)
        except jwt.exceptions.PyJWTError as exc:
            raise OAuthBearerValidationError(f"malformed JWT: {exc}") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise OAuthBearerValidationError(f"the JWT's algorithm {alg!r} is not allowed (one of "
                                             f"{', '.join(ALGORITHMS)})")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise OAuthBearerValidationError("the JWT's kid is not a string")
        key = self.jwks.key(kid, alg)
        options = {"require": ["exp"], "verify_aud": bool(self.expected_audience),
                   "verify_iss": self.expected_issuer is not None}
        try:
            claims = jwt.decode(token, key.key, algorithms=[alg], audience=list(self.expected_audience) or None,
                                issuer=self.expected_issuer, leeway=self.clock_skew_s, options=options)
        except jwt.exceptions.PyJWTError as exc:
            raise OAuthBearerValidationError(f"JWT refused: {type(exc).__name__}: {exc}") from None
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        iat = _number(claims, "iat", False)
        if iat is not None and iat * 1000 > now_ms + self.clock_skew_s * 1000:
            raise OAuthBearerValidationError("the JWT was issued in the future (iat)")
        principal = _principal(claims, self.sub_claim_name)
        exp = _number(claims, "exp", True)
        assert exp is not None
        return OAuthBearerToken(token, principal, _scopes(claims, self.scope_claim_name), int(exp * 1000),
                                None if iat is None else int(iat * 1000))

    def close(self) -> None:
        """Close the key source (its refresh thread)."""
        self.jwks.close()


OAuthBearerValidator = Union[UnsecuredJwsValidator, JwtValidator]


def _get(config: Mapping[str, Any], name: str) -> Any:
    value = config.get(name)
    return CONFIG_NAMES[name] if value is None else value


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"{name} must be true or false, not {value!r}")
    return text == "true"


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, not {value!r}") from None


def _list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.replace(",", " ").split() if v.strip())
    return tuple(str(v) for v in value)


def oauthbearer_validator(config: Mapping[str, Any]) -> OAuthBearerValidator:
    """The validator Kafka's configuration names (:data:`CONFIG_NAMES`) describe: a
    :class:`JwtValidator` when ``sasl.oauthbearer.jwks.endpoint.url`` is set, the unsecured one
    when ``sasl.oauthbearer.unsecured.validator.enable`` is true (not both).

    Raises:
        ValueError: an unknown name, a bad value, neither or both validators.
    """
    unknown = sorted(set(config) - set(CONFIG_NAMES))
    if unknown:
        raise ValueError(f"unknown OAUTHBEARER setting {', '.join(unknown)} (known: {', '.join(CONFIG_NAMES)})")
    url = _get(config, "sasl.oauthbearer.jwks.endpoint.url")
    unsecured = _flag(_get(config, "sasl.oauthbearer.unsecured.validator.enable"),
                      "sasl.oauthbearer.unsecured.validator.enable")
    if bool(url) == unsecured:
        raise ValueError("OAUTHBEARER needs exactly one of sasl.oauthbearer.jwks.endpoint.url (signed JWTs) and "
                         "sasl.oauthbearer.unsecured.validator.enable=true (unsigned tokens, for development)")
    if unsecured:
        return UnsecuredJwsValidator(
            _get(config, "sasl.oauthbearer.unsecured.validator.principal.claim.name"),
            _get(config, "sasl.oauthbearer.unsecured.validator.scope.claim.name"),
            _list(_get(config, "sasl.oauthbearer.unsecured.validator.required.scope")),
            _int(_get(config, "sasl.oauthbearer.unsecured.validator.allowable.clock.skew.ms"),
                 "sasl.oauthbearer.unsecured.validator.allowable.clock.skew.ms"))
    names = ("refresh.ms", "retry.backoff.ms", "retry.backoff.max.ms")
    refresh, backoff, backoff_max = (_int(_get(config, f"sasl.oauthbearer.jwks.endpoint.{n}"),
                                          f"sasl.oauthbearer.jwks.endpoint.{n}") for n in names)
    jwks = JwksSource(str(url), refresh, backoff, backoff_max)
    try:
        return JwtValidator(jwks, _get(config, "sasl.oauthbearer.expected.issuer"),
                            _list(_get(config, "sasl.oauthbearer.expected.audience")),
                            _int(_get(config, "sasl.oauthbearer.clock.skew.seconds"),
                                 "sasl.oauthbearer.clock.skew.seconds"),
                            _get(config, "sasl.oauthbearer.scope.claim.name"),
                            _get(config, "sasl.oauthbearer.sub.claim.name"))
    except BaseException:
        jwks.close()
        raise
