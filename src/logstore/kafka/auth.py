"""SASL on the Kafka listener: the PLAIN and SCRAM servers and the connection's handshake.

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
``User:<name>``. Sessions do not expire (SaslAuthenticate v1 answers a session lifetime of 0:
no re-authentication, KIP-368).

Mechanisms (:class:`PlainServer`, :class:`ScramServer`) check what the client sends against
:mod:`~logstore.kafka.credentials`. An unknown user goes through the same exchange as a known
one: SCRAM answers with a salt derived from the user name under a per-process secret and the
default iteration count, PLAIN runs PBKDF2 against a dummy credential; both fail with the same
message as a wrong password. Only the standard library's hashlib, hmac and secrets are used.

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
import secrets
import struct
from typing import Any, Callable, Mapping, Sequence, Union

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
from .wire import API_NAMES, KafkaProtocolError, encode, parse_request

__all__ = ["SaslAuthenticationError", "PlainServer", "ScramServer", "SaslAuthenticator", "SaslHandshake"]

logger = logging.getLogger("logstore.kafka")

_HEADER = struct.Struct(">hh")
_I32 = struct.Struct(">i")


class SaslAuthenticationError(LogstoreError):
    """A client failed SASL authentication; the message is what the client is told (it never
    says whether the user exists)."""


def _failed(mechanism: str) -> SaslAuthenticationError:
    return SaslAuthenticationError(f"Authentication failed: invalid credentials with SASL mechanism {mechanism}")


class PlainServer:
    """The server's side of SASL PLAIN (RFC 4616): one token ``[authzid] NUL authcid NUL
    passwd``; an empty answer on success. Not thread-safe (one connection's)."""

    mechanism = "PLAIN"

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
        if attrs[1][2:] != self._nonce:
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


Mechanism = Union[PlainServer, ScramServer]


class SaslAuthenticator:
    """A listener's SASL settings: the enabled mechanisms and the credentials (a
    :class:`~logstore.kafka.credentials.Credentials`, a file re-read when it changes, or a
    mapping, see :meth:`Credentials.from_mapping`), and how long a refused connection stays
    open after its answer (``failed_authentication_delay_s``). Thread-safe."""

    def __init__(self, credentials: str | os.PathLike[str] | Mapping[str, Any] | Credentials | CredentialsFile,
                 mechanisms: Sequence[str] = MECHANISMS, failed_authentication_delay_s: float = 0.1) -> None:
        mechanisms = tuple(mechanisms)
        unknown = [m for m in mechanisms if m not in MECHANISMS]
        if unknown or not mechanisms:
            raise ValueError(f"SASL mechanisms must be among {', '.join(MECHANISMS)}; got {list(mechanisms)}")
        self.mechanisms = mechanisms
        self.failed_authentication_delay_s = failed_authentication_delay_s
        self._fake_secret = secrets.token_bytes(32)
        if isinstance(credentials, (str, os.PathLike)):
            credentials = CredentialsFile(credentials)
        elif isinstance(credentials, Mapping):
            credentials = Credentials.from_mapping(credentials, mechanisms)
        self._credentials = credentials

    def credentials(self) -> Credentials:
        """The credentials now (a file's are re-read when it changed)."""
        source = self._credentials
        return source.current() if isinstance(source, CredentialsFile) else source

    def mechanism(self, name: str) -> Mechanism:
        """A new server for one exchange of the enabled mechanism ``name``."""
        lookup = self.credentials().lookup
        if name == "PLAIN":
            return PlainServer(lookup)
        return ScramServer(name, lookup, self._fake_secret)

    def handshake(self, session: net.Session, api_versions: Callable[[bytearray], bytes]) -> "SaslHandshake":
        """A connection's handshake; ``api_versions`` answers an ApiVersions request frame."""
        return SaslHandshake(self, session, api_versions)


# Handshake states.
_MECHANISM, _TOKENS, _RAW_TOKENS = "mechanism", "tokens", "raw tokens"


class SaslHandshake(net.Handshake):
    """One connection's SASL flow (see the module docstring), fed frames by the network loop.
    Not thread-safe; never blocks (a PLAIN check runs one PBKDF2)."""

    def __init__(self, authenticator: SaslAuthenticator, session: net.Session,
                 api_versions: Callable[[bytearray], bytes]) -> None:
        self._authenticator = authenticator
        self._session = session
        self._api_versions = api_versions
        self._state = _MECHANISM
        self._mechanism: Mechanism | None = None
        self.done = False
        self.principal: str | None = None

    def receive(self, frame: bytearray) -> bytes:
        if self._state is _RAW_TOKENS:
            return self._raw_token(frame)
        if len(frame) < 8:
            raise self._refused(f"a frame of {len(frame)} bytes before authentication")
        api_key, api_version = _HEADER.unpack_from(frame, 0)
        if self._state is _MECHANISM and api_key == API_VERSIONS:
            return self._api_versions(frame)
        wanted = SASL_HANDSHAKE if self._state is _MECHANISM else SASL_AUTHENTICATE
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
        self._mechanism = self._authenticator.mechanism(name)
        self._state = _TOKENS if request.api_version >= 1 else _RAW_TOKENS
        return _frame(request, {"error_code": ErrorCode.none, "mechanisms": enabled})

    def _authenticate(self, request: Any) -> bytes:
        try:
            token = self._step(request.body.auth_bytes)
        except SaslAuthenticationError as exc:
            reply = _frame(request, {"error_code": ErrorCode.sasl_authentication_failed, "error_message": str(exc),
                                     "auth_bytes": b"", "session_lifetime": 0})
            raise net.HandshakeError(str(exc), reply, self._authenticator.failed_authentication_delay_s) from None
        return _frame(request, {"error_code": ErrorCode.none, "error_message": None, "auth_bytes": token,
                                "session_lifetime": 0})

    def _raw_token(self, frame: bytearray) -> bytes:
        try:
            token = self._step(bytes(frame))
        except SaslAuthenticationError as exc:
            raise net.HandshakeError(str(exc)) from None  # v0: no way to say why; the connection closes
        return _I32.pack(len(token)) + token

    def _step(self, token: bytes) -> bytes:
        mechanism = self._mechanism
        assert mechanism is not None
        try:
            answer = mechanism.step(token)
        except SaslAuthenticationError as exc:
            logger.info("connection %d from %s failed SASL %s authentication%s: %s", self._session.id,
                        self._session.peer, mechanism.mechanism,
                        f" as {mechanism.user!r}" if mechanism.user else "", exc)
            raise
        if mechanism.done:
            self.done = True
            self.principal = f"User:{mechanism.user}"
            logger.debug("connection %d from %s authenticated as %s (%s)", self._session.id, self._session.peer,
                         self.principal, mechanism.mechanism)
        return answer


def _frame(request: Any, fields: dict[str, Any]) -> bytes:
    return b"".join(encode(request.correlation_id, request.api_key, request.api_version, fields))
