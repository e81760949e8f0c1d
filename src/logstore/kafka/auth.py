"""SASL on the Kafka listener: the PLAIN, SCRAM and OAUTHBEARER servers and the connection's
handshake, with KIP-368's re-authentication.

Kafka's flow (KIP-43, KIP-152), which :class:`SaslHandshake` runs on the network loop, one frame
at a time, before any request reaches the handlers:

1. ApiVersions (any number, answered as after authentication, so a client learns that
   SaslHandshake 0-1 and SaslAuthenticate 0-1 are served).
2. SaslHandshake v0 or v1 naming a mechanism. One that is not enabled gets
   UNSUPPORTED_SASL_MECHANISM (33) with the enabled list, then the connection is closed.
3. The mechanism's exchange: after SaslHandshake v1, each client token comes in a
   SaslAuthenticate request (v0 or v1) and each server token goes back in its response; after
   v0, tokens travel raw, framed only by their 4-byte size (Kafka before 1.0). A failure gets
   SASL_AUTHENTICATION_FAILED (58) with a message (v1; after v0 the connection simply closes),
   then the connection is closed.

After a refusal that has an answer (33, 58) the connection is closed
``failed_authentication_delay_s`` after the answer is written (Kafka's
``connection.failed.authentication.delay.ms``, 100 ms): kafka-python drops what it read with
the peer's close, and a guesser is slowed down.

Any other request before authentication closes the connection (logged), and frames are capped
(``KafkaProtocol``'s pre-authentication cap) until it succeeds. The principal is
``User:<name>`` (for OAUTHBEARER, the token's principal claim, ``sub`` by default).

Sessions (KIP-368, as Kafka's SaslServerAuthenticator): a session lasts the least of
``connections.max.reauth.ms`` (when set) and, for OAUTHBEARER, its token's remaining life;
SaslAuthenticate v1 answers that lifetime (0: none). Within or after it, a SaslHandshake on the
open connection starts a re-authentication (:meth:`SaslHandshake.reauthenticate`; not within a
second of the last, and never for a session without a lifetime: those get ILLEGAL_SASL_STATE
from the handlers), with the same mechanism and principal, or the exchange fails and the
connection closes; the network loop closes a connection whose session ended at its next other
request.

Mechanisms (:class:`PlainServer`, :class:`ScramServer`) check what the client sends against
:mod:`~logstore.kafka.credentials`; :class:`OAuthBearerServer` has the token validated by
:mod:`~logstore.kafka.oauth`. An unknown user goes through the same exchange as a known
one: SCRAM answers with a salt derived from the user name under a per-process secret and the
default iteration count, PLAIN runs PBKDF2 against a dummy credential; both fail with the same
message as a wrong password.

Cost on the network loop: PLAIN's PBKDF2 (up to 16384 iterations, 10 ms and more) runs off it,
on the listener's verification threads (:class:`~logstore.net.protocol.SlowStep`), so that
clients sending bad passwords delay only their own connections and the other handshakes
waiting for those threads. SCRAM's server side never runs PBKDF2 (the client does): a step is
a few HMACs and hashes, microseconds, and stays on the loop, an unknown user's included. PLAIN and SCRAM use only the standard library's hashlib, hmac and
secrets.

Thread-safety: :class:`SaslAuthenticator` is thread-safe (one per listener); the mechanism
servers and :class:`SaslHandshake` belong to one connection and the loop thread.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import secrets
import struct
import time
from typing import Any, Callable, Collection, Mapping, Sequence, Union

from ..net import server as net
from ..errors import LogstoreError
from ..errorcodes import ErrorCode
from .apikeys import API_VERSIONS, SASL_AUTHENTICATE, SASL_HANDSHAKE
from .credentials import (
    DEFAULT_ITERATIONS,
    MECHANISMS,
    SALT_BYTES,
    SCRAM_HASHES,
    Credentials,
    CredentialsFile,
    PlainCredential,
    ScramCredential,
)
from .oauth import OAUTHBEARER, OAuthBearerValidationError, OAuthBearerValidator, oauthbearer_validator
from .wire import API_NAMES, KafkaProtocolError, encode, parse_request

__all__ = ["SASL_MECHANISMS", "SaslAuthenticationError", "PlainServer", "ScramServer", "OAuthBearerServer",
           "SaslAuthenticator", "SaslHandshake"]

logger = logging.getLogger("logstore.kafka")

_HEADER = struct.Struct(">hh")
_I32 = struct.Struct(">i")
#: Every SASL mechanism served: the password ones (:data:`~logstore.kafka.credentials.MECHANISMS`)
#: and OAUTHBEARER.
SASL_MECHANISMS = MECHANISMS + (OAUTHBEARER,)
_KEY = re.compile(r"[A-Za-z]+")
_VALUE = re.compile(r"[\x21-\x7E \t\r\n]+")
_BEARER = re.compile(r"[Bb]earer +([-_.a-zA-Z0-9~+/]+=*)")
#: Kafka's shortest time between two re-authentications of one connection (KafkaChannel).
MIN_REAUTH_INTERVAL_S = 1.0


class SaslAuthenticationError(LogstoreError):
    """A client failed SASL authentication; the message is what the client is told (it never
    says whether the user exists)."""


def _failed(mechanism: str) -> SaslAuthenticationError:
    return SaslAuthenticationError(f"Authentication failed: invalid credentials with SASL mechanism {mechanism}")


class PlainServer:
    """The server's side of SASL PLAIN (RFC 4616): one token ``[authzid] NUL authcid NUL
    passwd``; an empty answer on success. Not thread-safe (one connection's)."""

    mechanism = "PLAIN"
    #: a password's credential does not expire (KIP-368: only OAUTHBEARER's tokens do)
    lifetime_ms: int | None = None
    #: a step runs PBKDF2 (milliseconds): off the network loop (:class:`~logstore.net.protocol.SlowStep`)
    slow = True

    def __init__(self, lookup: Callable[[str, str], Any]) -> None:
        self._lookup = lookup
        self.done = False
        self.user: str | None = None

    def step(self, token: bytes) -> bytes:
        """Check the client's token; returns the answer (empty).

        Raises:
            SaslAuthenticationError: malformed, unknown user, or wrong password (one message).
        """
        if self.done:
            raise SaslAuthenticationError("PLAIN takes one token")
        parts = bytes(token).split(b"\0")
        if len(parts) != 3:
            raise SaslAuthenticationError("Authentication failed: PLAIN expects [authzid] NUL authcid NUL passwd")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise SaslAuthenticationError("Authentication failed: PLAIN credentials are not UTF-8") from None
        if not user or not password:
            raise SaslAuthenticationError("Authentication failed: PLAIN needs a user name and a password")
        if authzid and authzid != user:
            raise SaslAuthenticationError("Authentication failed: Client requested an authorization id that is "
                                          "different from username")
        credential = self._lookup(user, self.mechanism)
        if not isinstance(credential, PlainCredential):
            _DUMMY_PLAIN.check(parts[2])  # the same work as for a known user
            raise _failed(self.mechanism)
        if not credential.check(parts[2]):
            raise _failed(self.mechanism)
        self.done, self.user = True, user
        return b""


#: What an unknown PLAIN user's password is checked against (never matches: a random hash).
_DUMMY_PLAIN = PlainCredential(secrets.token_bytes(SALT_BYTES), DEFAULT_ITERATIONS, secrets.token_bytes(32))


class ScramServer:
    """The server's side of SCRAM-SHA-256 or SCRAM-SHA-512 as Kafka speaks it (RFC 5802 without
    channel binding, RFC 7677): client-first -> server-first -> client-final -> server-final
    (``v=<ServerSignature>``). Not thread-safe (one connection's).

    Args:
        mechanism: "SCRAM-SHA-256" or "SCRAM-SHA-512".
        lookup: (user, mechanism) -> credential or None.
        fake_secret: the key that derives an unknown user's salt (stable for a user name, so
            two attempts cannot tell a known user from an unknown one).
        server_nonce: the server's part of the nonce (tests; default: 24 random characters).
    """

    lifetime_ms: int | None = None
    #: a step is a few HMACs and hashes (microseconds): on the loop
    slow = False

    def __init__(self, mechanism: str, lookup: Callable[[str, str], Any], fake_secret: bytes,
                 server_nonce: str | None = None) -> None:
        self.mechanism = mechanism
        self._hash = SCRAM_HASHES[mechanism]
        self._lookup = lookup
        self._fake_secret = fake_secret
        self._server_nonce = server_nonce or secrets.token_urlsafe(18)
        self._credential: ScramCredential | None = None
        self._known = False
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2_header = ""
        self._nonce = ""
        #: the nonce librdkafka before 2.6.1 sends back: its own part again before the whole
        #: (librdkafka#4895); Kafka 3.8.1 to 3.9 accept it, and so does this server (the proof
        #: is over the message as sent, so it binds that nonce all the same)
        self._doubled_nonce = ""
        self.done = False
        self.user: str | None = None

    def step(self, token: bytes) -> bytes:
        """The answer to the client's next message.

        Raises:
            SaslAuthenticationError: a malformed message, a bad nonce or channel binding, an
                unknown user or a wrong password (the last two with one message).
        """
        if self.done:
            raise SaslAuthenticationError("SCRAM exchange already complete")
        try:
            text = bytes(token).decode("utf-8")
        except UnicodeDecodeError:
            raise SaslAuthenticationError("Authentication failed: a SCRAM message is not UTF-8") from None
        if not self._server_first:
            return self._first(text).encode("utf-8")
        return self._final(text).encode("utf-8")

    def _first(self, message: str) -> str:
        # gs2-header: "n" or "y" (no channel binding), an optional authzid, then the bare message.
        flag, sep1, rest = message.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep1 or not sep2 or flag not in ("n", "y"):
            raise SaslAuthenticationError("Authentication failed: invalid SCRAM client-first message "
                                          "(channel binding is not supported)")
        if authzid and not authzid.startswith("a="):
            raise SaslAuthenticationError("Authentication failed: invalid SCRAM authzid")
        attrs = bare.split(",")
        if len(attrs) < 2 or not attrs[0].startswith("n=") or not attrs[1].startswith("r="):
            raise SaslAuthenticationError("Authentication failed: invalid SCRAM client-first message")
        user = _saslname(attrs[0][2:])
        client_nonce = attrs[1][2:]
        if not client_nonce or not _printable(client_nonce):
            raise SaslAuthenticationError("Authentication failed: invalid SCRAM nonce")
        if authzid and _saslname(authzid[2:]) != user:
            raise SaslAuthenticationError("Authentication failed: Client requested an authorization id that is "
                                          "different from username")
        if any(a.startswith("tokenauth=") and a[10:].lower() == "true" for a in attrs[2:]):
            raise SaslAuthenticationError("Authentication failed: delegation tokens are not supported")
        credential = self._lookup(user, self.mechanism)
        self._known = isinstance(credential, ScramCredential)
        if not self._known:
            salt = hmac.digest(self._fake_secret, f"{self.mechanism}\0{user}".encode("utf-8"), "sha256")[:SALT_BYTES]
            size = hashlib.new(self._hash).digest_size
            credential = ScramCredential(salt, DEFAULT_ITERATIONS, os.urandom(size), os.urandom(size))
        self._credential = credential
        self._gs2_header = message[:len(flag) + len(authzid) + 2]
        self._client_first_bare = bare
        self._nonce = client_nonce + self._server_nonce
        self._doubled_nonce = client_nonce + self._nonce
        self.user = user
        self._server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode('ascii')},"
                              f"i={credential.iterations}")
        return self._server_first

    def _final(self, message: str) -> str:
        without_proof, sep, proof_b64 = message.rpartition(",p=")
        attrs = without_proof.split(",")
        if not sep or len(attrs) < 2 or not attrs[0].startswith("c=") or not attrs[1].startswith("r="):
            raise SaslAuthenticationError("Authentication failed: invalid SCRAM client-final message")
        try:
            binding = base64.b64decode(attrs[0][2:], validate=True)
            proof = base64.b64decode(proof_b64, validate=True)
        except (binascii.Error, ValueError):
            raise SaslAuthenticationError("Authentication failed: invalid SCRAM client-final message") from None
        if binding != self._gs2_header.encode("utf-8"):
            raise SaslAuthenticationError("Authentication failed: invalid SCRAM channel binding")
        if attrs[1][2:] != self._nonce and attrs[1][2:] != self._doubled_nonce:
            raise SaslAuthenticationError("Authentication failed: invalid nonce in the SCRAM client-final message")
        credential = self._credential
        assert credential is not None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode("utf-8")
        client_signature = hmac.digest(credential.stored_key, auth_message, self._hash)
        if len(proof) != len(client_signature):
            raise _failed(self.mechanism)
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature))
        stored_key = hashlib.new(self._hash, client_key).digest()
        if not hmac.compare_digest(stored_key, credential.stored_key) or not self._known:
            raise _failed(self.mechanism)
        self.done = True
        self._credential = None
        server_signature = hmac.digest(credential.server_key, auth_message, self._hash)
        return "v=" + base64.b64encode(server_signature).decode("ascii")


def _saslname(name: str) -> str:
    """RFC 5802's saslname: "=2C" is ",", "=3D" is "=", any other "=" is an error."""
    out, i = [], 0
    while i < len(name):
        if name[i] == "=":
            code = name[i + 1:i + 3]
            if code not in ("2C", "3D"):
                raise SaslAuthenticationError("Authentication failed: invalid SCRAM user name")
            out.append("," if code == "2C" else "=")
            i += 3
        else:
            out.append(name[i])
            i += 1
    user = "".join(out)
    if not user:
        raise SaslAuthenticationError("Authentication failed: an empty SCRAM user name")
    return user


def _printable(text: str) -> bool:
    return all(0x21 <= ord(c) <= 0x7E and c != "," for c in text)


class OAuthBearerServer:
    """The server's side of SASL OAUTHBEARER (RFC 7628, as Kafka's ``OAuthBearerSaslServer``):
    the client's first message is ``n,[a=<authzid>],\\x01auth=Bearer <token>\\x01[key=value\\x01
    ...]\\x01``. A valid token (:mod:`~logstore.kafka.oauth` validates it) completes the
    exchange with an empty answer; an invalid one is answered with a JSON step,
    ``{"status":"invalid_token"}`` (``insufficient_scope`` with the ``scope`` required), the
    client answers ``\\x01`` and the exchange fails with that JSON as its message (why is logged,
    not told). An authzid must be the token's principal. Extensions (``key=value``, the key
    letters only) are checked and kept in :attr:`extensions`; none is required. After a successful
    step, ``done`` is true, ``user`` is the token's principal and ``lifetime_ms`` its expiry
    (ms since the epoch). Not thread-safe (one connection's).

    Raises (from :meth:`step`): :class:`SaslAuthenticationError`.
    """

    mechanism = OAUTHBEARER
    #: a step is one signature check (an RSA or EC verification: well under a millisecond): on the loop
    slow = False

    def __init__(self, validator: OAuthBearerValidator) -> None:
        self._validator = validator
        self._error: str | None = None
        self.done = False
        self.user: str | None = None
        self.lifetime_ms: int | None = None
        self.extensions: dict[str, str] = {}

    def step(self, token: bytes) -> bytes:
        """The answer to the client's message: empty on success, the JSON error step for an
        invalid token; the client's ``\\x01`` after that fails the exchange."""
        if self.done:
            raise SaslAuthenticationError("OAUTHBEARER exchange already complete")
        if bytes(token) == b"\x01" and self._error is not None:
            raise SaslAuthenticationError(self._error)
        self._error = None
        authzid, bearer, extensions = self._parse(bytes(token))
        try:
            validated = self._validator.validate(bearer)
        except OAuthBearerValidationError as exc:
            self._error = exc.json()
            logger.info("OAUTHBEARER token refused: %s", exc)
            return self._error.encode("utf-8")
        if authzid and authzid != validated.principal:
            raise SaslAuthenticationError(f"Authentication failed: Client requested an authorization id ({authzid}) "
                                          f"that is different from the token's principal name ({validated.principal})")
        self.user, self.lifetime_ms, self.extensions = validated.principal, validated.lifetime_ms, extensions
        self.done = True
        return b""

    def _parse(self, message: bytes) -> tuple[str, str, dict[str, str]]:
        """(authzid, token, extensions) of the client's first message (RFC 7628 section 3.1)."""
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslAuthenticationError("Authentication failed: the OAUTHBEARER message is not UTF-8") from None
        gs2, sep, rest = text.partition("\x01")
        if not sep or not gs2.startswith("n,") or not gs2.endswith(",") or not rest.endswith("\x01\x01"):
            raise SaslAuthenticationError("Authentication failed: invalid OAUTHBEARER client first message")
        authzid = gs2[2:-1]
        if authzid:
            if not authzid.startswith("a="):
                raise SaslAuthenticationError("Authentication failed: invalid OAUTHBEARER authorization id")
            authzid = authzid[2:].replace("=2C", ",").replace("=3D", "=")
        pairs: dict[str, str] = {}
        for item in rest[:-2].split("\x01"):
            key, eq, value = item.partition("=")
            if not eq or key in pairs:
                raise SaslAuthenticationError("Authentication failed: invalid OAUTHBEARER key/value pair")
            pairs[key] = value
        auth = pairs.pop("auth", None)
        match = _BEARER.fullmatch(auth) if auth is not None else None
        if match is None:
            raise SaslAuthenticationError("Authentication failed: the OAUTHBEARER message has no 'auth=Bearer <token>'")
        for key, value in pairs.items():
            if not _KEY.fullmatch(key) or not _VALUE.fullmatch(value):
                raise SaslAuthenticationError(f"Authentication failed: invalid OAUTHBEARER extension {key!r}")
        return authzid, match.group(1), pairs


Mechanism = Union[PlainServer, ScramServer, OAuthBearerServer]


class SaslAuthenticator:
    """A listener's SASL settings (Kafka's ``sasl.enabled.mechanisms`` and what they check):

    Args:
        credentials: the users of PLAIN and SCRAM (a
            :class:`~logstore.kafka.credentials.Credentials`, a file re-read when it changes, or a
            mapping, see :meth:`Credentials.from_mapping`); None: no password mechanism.
        mechanisms: the mechanisms enabled (None: the password ones when ``credentials`` is
            given, and OAUTHBEARER when ``oauthbearer`` is).
        failed_authentication_delay_s: how long a refused connection stays open after its answer.
        oauthbearer: OAUTHBEARER's validator (:mod:`~logstore.kafka.oauth`), or a mapping of
            Kafka's ``sasl.oauthbearer.*`` names that makes one; closed by :meth:`close`.
        connections_max_reauth_ms: Kafka's ``connections.max.reauth.ms`` (KIP-368): a session
            lasts at most this long (0: no limit but an OAUTHBEARER token's expiry); a client
            re-authenticates on its connection before then, or is closed at its next request.
        reserved_users: user names that only SCRAM authenticates, against ``credentials``
            (a replica set's own peer user): PLAIN and OAUTHBEARER refuse them, whatever a
            token's principal claim says.

    Raises:
        ValueError: no mechanism, an unknown one, or one enabled without what it checks.

    Thread-safe.
    """

    def __init__(self, credentials: (str | os.PathLike[str] | Mapping[str, Any] | Credentials | CredentialsFile
                                     | None) = None,
                 mechanisms: Sequence[str] | None = None, failed_authentication_delay_s: float = 0.1,
                 oauthbearer: OAuthBearerValidator | Mapping[str, Any] | None = None,
                 connections_max_reauth_ms: int = 0, reserved_users: Collection[str] = ()) -> None:
        if mechanisms is None:
            mechanisms = (MECHANISMS if credentials is not None else ()) + ((OAUTHBEARER,) if oauthbearer is not None
                                                                            else ())
        mechanisms = tuple(mechanisms)
        unknown = [m for m in mechanisms if m not in SASL_MECHANISMS]
        if unknown or not mechanisms:
            raise ValueError(f"SASL mechanisms must be among {', '.join(SASL_MECHANISMS)}; got {list(mechanisms)}")
        if OAUTHBEARER in mechanisms and oauthbearer is None:
            raise ValueError("OAUTHBEARER needs its token validation configured (sasl.oauthbearer.jwks.endpoint.url, "
                             "or sasl.oauthbearer.unsecured.validator.enable=true)")
        if any(m in MECHANISMS for m in mechanisms) and credentials is None:
            raise ValueError(f"{', '.join(m for m in mechanisms if m in MECHANISMS)} need SASL credentials (users)")
        if connections_max_reauth_ms < 0:
            raise ValueError(f"connections.max.reauth.ms must be >= 0, got {connections_max_reauth_ms}")
        self.mechanisms = mechanisms
        self.failed_authentication_delay_s = failed_authentication_delay_s
        self.connections_max_reauth_ms = connections_max_reauth_ms
        self.reserved_users = frozenset(reserved_users)
        self._fake_secret = secrets.token_bytes(32)
        if isinstance(credentials, (str, os.PathLike)):
            credentials = CredentialsFile(credentials)
        elif isinstance(credentials, Mapping):
            credentials = Credentials.from_mapping(credentials, [m for m in mechanisms if m in MECHANISMS])
        self._credentials = credentials
        self.oauthbearer: OAuthBearerValidator | None = (
            oauthbearer_validator(oauthbearer) if isinstance(oauthbearer, Mapping) else oauthbearer)

    def credentials(self) -> Credentials:
        """The credentials now (a file's are re-read when it changed; none without credentials)."""
        source = self._credentials
        if source is None:
            return Credentials()
        return source.current() if isinstance(source, CredentialsFile) else source

    @property
    def credentials_file(self) -> CredentialsFile | None:
        """The credentials file, when the users are one (what AlterUserScramCredentials writes)."""
        return self._credentials if isinstance(self._credentials, CredentialsFile) else None

    def mechanism(self, name: str) -> Mechanism:
        """A new server for one exchange of the enabled mechanism ``name``."""
        if name == OAUTHBEARER:
            assert self.oauthbearer is not None
            return OAuthBearerServer(self.oauthbearer)
        lookup = self.credentials().lookup
        if name == "PLAIN":
            return PlainServer(lookup)
        return ScramServer(name, lookup, self._fake_secret)

    def session_lifetime_ms(self, credential_expiry_ms: int | None) -> int | None:
        """How long a session just authenticated lasts (KIP-368, as Kafka's
        SaslServerAuthenticator): the least of ``connections.max.reauth.ms`` (when set) and the
        credential's remaining lifetime (``credential_expiry_ms``, ms since the epoch; an
        OAUTHBEARER token's), never below 0; None when neither bounds it."""
        max_reauth = self.connections_max_reauth_ms
        if credential_expiry_ms is None:
            return max_reauth or None
        remaining = max(0, credential_expiry_ms - int(time.time() * 1000))
        return min(remaining, max_reauth) if max_reauth else remaining

    def handshake(self, session: net.Session, api_versions: Callable[[bytearray], bytes]) -> "SaslHandshake":
        """A connection's handshake; ``api_versions`` answers an ApiVersions request frame."""
        return SaslHandshake(self, session, api_versions)

    def close(self) -> None:
        """Close OAUTHBEARER's validator (a JWKS refresh thread)."""
        if self.oauthbearer is not None:
            self.oauthbearer.close()


# Handshake states.
_MECHANISM, _REAUTH_MECHANISM, _TOKENS, _RAW_TOKENS = "mechanism", "re-authentication", "tokens", "raw tokens"


class SaslHandshake(net.Handshake):
    """One connection's SASL flow (see the module docstring), fed frames by the network loop,
    and its re-authentications (KIP-368): once authenticated with a session lifetime, a
    SaslHandshake (at most one a second, :data:`MIN_REAUTH_INTERVAL_S`) starts the flow again
    (:meth:`reauthenticate`), without ApiVersions, with the same mechanism and principal: a
    different mechanism fails the first SaslAuthenticate, a different principal the last
    (SASL_AUTHENTICATION_FAILED, then the connection is closed), as in Kafka.
    Not thread-safe; never blocks: a PLAIN check (one PBKDF2, milliseconds) is handed back as a
    :class:`~logstore.net.protocol.SlowStep`, which the network loop runs on a verification
    thread while the connection waits (the handshake belongs to that thread meanwhile); a SCRAM
    step (a few HMACs) and a JWT's signature check run on the loop.
    """

    def __init__(self, authenticator: SaslAuthenticator, session: net.Session,
                 api_versions: Callable[[bytearray], bytes]) -> None:
        self._authenticator = authenticator
        self._session = session
        self._api_versions = api_versions
        self._state = _MECHANISM
        self._mechanism: Mechanism | None = None
        self._previous: tuple[str, str] | None = None   # (mechanism, principal) while re-authenticating
        self._bad_mechanism: str | None = None           # why a re-authentication's mechanism is refused
        self._reauth_started: float | None = None       # when the last re-authentication began
        self._lifetime_ms: int | None = None
        self.done = False
        self.principal: str | None = None
        self.session_expires: float | None = None
        self.reauthentications = 0

    def reauthenticate(self, frame: bytearray, now: float) -> bool:
        if self.session_expires is None or len(frame) < 4 or _HEADER.unpack_from(frame, 0)[0] != SASL_HANDSHAKE:
            return False
        if self._reauth_started is not None and now - self._reauth_started < MIN_REAUTH_INTERVAL_S:
            return False  # answered by the handlers: ILLEGAL_SASL_STATE
        assert self._mechanism is not None and self.principal is not None
        self._reauth_started = now
        self._previous = (self._mechanism.mechanism, self.principal)
        self._state, self.done, self._mechanism = _REAUTH_MECHANISM, False, None
        return True

    def receive(self, frame: bytearray) -> bytes | net.SlowStep:
        if self._state is _RAW_TOKENS:
            return self._raw_token(frame)
        if len(frame) < 8:
            raise self._refused(f"a frame of {len(frame)} bytes before authentication")
        api_key, api_version = _HEADER.unpack_from(frame, 0)
        if self._state is _MECHANISM and api_key == API_VERSIONS:
            return self._api_versions(frame)
        wanted = SASL_HANDSHAKE if self._state in (_MECHANISM, _REAUTH_MECHANISM) else SASL_AUTHENTICATE
        if api_key != wanted:
            name = API_NAMES.get(api_key, f"api key {api_key}")
            raise self._refused(f"{name} v{api_version} before authentication (expected {API_NAMES[wanted]})")
        try:
            request = parse_request(frame)
        except KafkaProtocolError as exc:
            raise self._refused(str(exc)) from None
        if api_key == SASL_HANDSHAKE:
            return self._handshake(request)
        return self._authenticate(request)

    def _refused(self, why: str) -> net.HandshakeError:
        """Log why the connection closes; the error to raise (no reply)."""
        logger.warning("closing connection %d from %s: %s", self._session.id, self._session.peer, why)
        return net.HandshakeError(why)

    def _handshake(self, request: Any) -> bytes:
        name = request.body.mechanism
        enabled = self._authenticator.mechanisms
        if name not in enabled:
            reply = _frame(request, {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": enabled})
            logger.info("connection %d from %s: SASL mechanism %r is not enabled", self._session.id,
                        self._session.peer, name)
            raise net.HandshakeError(f"unsupported SASL mechanism {name!r}", reply,
                                     self._authenticator.failed_authentication_delay_s)
        if self._previous is not None and name != self._previous[0]:
            self._bad_mechanism = (f"SASL mechanism '{name}' requested by client is not supported for "
                                   f"re-authentication of mechanism '{self._previous[0]}'")
        self._mechanism = self._authenticator.mechanism(name)
        self._state = _TOKENS if request.api_version >= 1 else _RAW_TOKENS
        return _frame(request, {"error_code": ErrorCode.none, "mechanisms": enabled})

    def _off_the_loop_if_slow(self, step: Callable[[], bytes]) -> bytes | net.SlowStep:
        """``step()`` now, or as a SlowStep when the mechanism's steps are costly (PLAIN)."""
        assert self._mechanism is not None
        return net.SlowStep(step) if self._mechanism.slow else step()

    def _authenticate(self, request: Any) -> bytes | net.SlowStep:
        return self._off_the_loop_if_slow(lambda: self._authenticate_now(request))

    def _authenticate_now(self, request: Any) -> bytes:
        try:
            token = self._step(request.body.auth_bytes)
        except SaslAuthenticationError as exc:
            reply = _frame(request, {"error_code": ErrorCode.sasl_authentication_failed, "error_message": str(exc),
                                     "auth_bytes": b"", "session_lifetime": 0})
            raise net.HandshakeError(str(exc), reply, self._authenticator.failed_authentication_delay_s) from None
        lifetime_ms = self._lifetime_ms if self.done else 0
        return _frame(request, {"error_code": ErrorCode.none, "error_message": None, "auth_bytes": token,
                                "session_lifetime": lifetime_ms or 0})

    def _raw_token(self, frame: bytearray) -> bytes | net.SlowStep:
        return self._off_the_loop_if_slow(lambda: self._raw_token_now(frame))

    def _raw_token_now(self, frame: bytearray) -> bytes:
        try:
            token = self._step(bytes(frame))
        except SaslAuthenticationError as exc:
            raise net.HandshakeError(str(exc)) from None  # v0: no way to say why; the connection closes
        return _I32.pack(len(token)) + token

    def _step(self, token: bytes) -> bytes:
        mechanism = self._mechanism
        assert mechanism is not None
        try:
            if self._bad_mechanism is not None:
                raise SaslAuthenticationError(self._bad_mechanism)
            answer = mechanism.step(token)
            if mechanism.done and mechanism.user in self._authenticator.reserved_users and \
                    not mechanism.mechanism.startswith("SCRAM-"):
                raise SaslAuthenticationError(f"Authentication failed: the user {mechanism.user!r} is reserved: "
                                              f"SASL {mechanism.mechanism} may not authenticate it")
            if mechanism.done and self._previous is not None and f"User:{mechanism.user}" != self._previous[1]:
                raise SaslAuthenticationError(f"Cannot change principals during re-authentication from "
                                              f"{self._previous[1].replace(':', '.', 1)}: User.{mechanism.user}")
        except SaslAuthenticationError as exc:
            logger.info("connection %d from %s failed SASL %s %sauthentication%s: %s", self._session.id,
                        self._session.peer, mechanism.mechanism, "re-" if self._previous else "",
                        f" as {mechanism.user!r}" if mechanism.user else "", exc)
            raise
        if mechanism.done:
            lifetime_ms = self._authenticator.session_lifetime_ms(mechanism.lifetime_ms)
            self._lifetime_ms = lifetime_ms
            self.session_expires = None if lifetime_ms is None else time.monotonic() + lifetime_ms / 1000
            self.done = True
            self.principal = f"User:{mechanism.user}"
            if self._previous is not None:
                self.reauthentications += 1
            self._previous = None
            logger.debug("connection %d from %s authenticated as %s (%s), session lifetime %s ms", self._session.id,
                         self._session.peer, self.principal, mechanism.mechanism, lifetime_ms)
        return answer


def _frame(request: Any, fields: dict[str, Any]) -> bytes:
    return b"".join(encode(request.correlation_id, request.api_key, request.api_version, fields))
