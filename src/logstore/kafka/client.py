"""A small blocking client of Kafka's wire protocol: what ``logstore mirror`` sends to a cluster.

:class:`KafkaClient` connects to a bootstrap server, checks with ApiVersions that the cluster
speaks the versions used here, learns the brokers and partition leaders from Metadata, and sends
CreateTopics, ListOffsets and Produce to the broker that must answer each. Requests are written
and responses read by kio (the classes generated from Kafka's message specs), with the versions
below: non-flexible ones, spoken by Apache Kafka 2.4 to 4.x and by ``logstore serve``.

It is deliberately small: one request in flight per connection, no idempotent producer (the
mirror reconciles with the target's log end offsets instead, see :mod:`logstore.mirror`).
:class:`Security` says how to reach the cluster: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL,
with SASL PLAIN or SCRAM-SHA-256/512 (RFC 5802, the server's signature checked), as Kafka's
clients configure them (:meth:`Security.from_properties` reads their property names); a
connection re-authenticates before the next request once 85% of the session lifetime the
broker gave it passed (KIP-368). Every response frame is size-checked before it is read; a broker that
answers garbage, closes the connection or does not answer within ``timeout`` raises
:class:`KafkaClientError` and that connection is dropped.

Not thread-safe: one thread uses a client.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import hashlib
import hmac
import re
import secrets
import socket
import ssl
import struct
import time
import typing
from typing import Any, Mapping

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader
from kio.serial.errors import SerialError

from ..errorcodes import ErrorCode
from ..errors import LogstoreError
from .apikeys import (
    API_VERSIONS,
    CREATE_TOPICS,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_OFFSETS,
    METADATA,
    OFFSET_COMMIT,
    PRODUCE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    SYNC_GROUP,
)
from .bounds import check_response
from .writer import write_request

__all__ = ["KafkaClient", "KafkaClientError", "KafkaErrorResponse", "Broker", "Security", "Connection", "VERSIONS",
           "read_response"]

#: api key -> the version this client sends
VERSIONS: dict[int, int] = {API_VERSIONS: 0, METADATA: 8, PRODUCE: 8, LIST_OFFSETS: 5, CREATE_TOPICS: 4,
                            SASL_HANDSHAKE: 1, SASL_AUTHENTICATE: 1}
_NAMES = {API_VERSIONS: "ApiVersions", METADATA: "Metadata", PRODUCE: "Produce", LIST_OFFSETS: "ListOffsets",
          CREATE_TOPICS: "CreateTopics", SASL_HANDSHAKE: "SaslHandshake", SASL_AUTHENTICATE: "SaslAuthenticate"}
#: the group coordinator's APIs (what :mod:`logstore.kafka.groupclient` sends), checked by their user
GROUP_VERSIONS: dict[int, int] = {OFFSET_COMMIT: 7, JOIN_GROUP: 5, HEARTBEAT: 3, LEAVE_GROUP: 3, SYNC_GROUP: 3}
_NAMES.update({OFFSET_COMMIT: "OffsetCommit", JOIN_GROUP: "JoinGroup", HEARTBEAT: "Heartbeat",
               LEAVE_GROUP: "LeaveGroup", SYNC_GROUP: "SyncGroup"})
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SCRAM = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS = ("PLAIN", *_SCRAM)
MAX_RESPONSE_BYTES = 100 << 20  # a larger size prefix is a broken or hostile peer
LATEST = -1  # ListOffsets: the log end offset
_SIZE = struct.Struct(">i")


class KafkaClientError(LogstoreError):
    """The cluster cannot be reached, does not speak the versions needed, or answered badly."""


class KafkaErrorResponse(KafkaClientError):
    """A broker answered with one of Kafka's error codes (``code``, an ErrorCode)."""

    def __init__(self, what: str, code: ErrorCode) -> None:
        super().__init__(f"{what}: {code.name} ({int(code)})")
        self.code = code


@dataclasses.dataclass(frozen=True)
class Security:
    """How to reach a cluster (immutable): ``protocol`` one of PLAINTEXT, SSL, SASL_PLAINTEXT,
    SASL_SSL; for SASL a ``mechanism`` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) with ``username``
    and ``password``; for TLS the CA file to verify brokers with (default: the system's) and
    whether their host name must match their certificate.

    Raises:
        ValueError: an unknown protocol or mechanism, or SASL without a user and password.
    """
    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    ca_file: str | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"security.protocol must be one of {', '.join(PROTOCOLS)}, not {self.protocol!r}")
        if self.sasl:
            if self.mechanism not in MECHANISMS:
                raise ValueError(f"sasl.mechanism must be one of {', '.join(MECHANISMS)}, not {self.mechanism!r}")
            if not self.username or self.password is None:
                raise ValueError(f"{self.protocol} needs sasl.username and sasl.password")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    @classmethod
    def from_properties(cls, properties: typing.Mapping[str, str]) -> "Security":
        """From Kafka client properties: ``security.protocol``, ``sasl.mechanism`` (or
        librdkafka's ``sasl.mechanisms``), ``sasl.username``/``sasl.password`` or the Java
        clients' ``sasl.jaas.config`` (its ``username="..."`` and ``password="..."``),
        ``ssl.ca.location`` (or ``ssl.truststore.location`` holding PEM), and
        ``ssl.endpoint.identification.algorithm`` (empty or ``none``: no host name check).
        Other properties are ignored."""
        get = properties.get
        username, password = get("sasl.username"), get("sasl.password")
        jaas = get("sasl.jaas.config")
        if jaas and username is None:
            found = dict(re.findall(r'(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"', jaas))
            unescape = lambda v: None if v is None else re.sub(r"\\(.)", r"\1", v)  # noqa: E731
            username, password = unescape(found.get("username")), unescape(found.get("password"))
        identification = get("ssl.endpoint.identification.algorithm", "https").strip().lower()
        return cls(protocol=get("security.protocol", "PLAINTEXT").upper(),
                   mechanism=get("sasl.mechanism", get("sasl.mechanisms")),
                   username=username, password=password,
                   ca_file=get("ssl.ca.location", get("ssl.truststore.location")),
                   check_hostname=identification not in ("", "none"))


@dataclasses.dataclass(frozen=True)
class Broker:
    """A broker of the cluster as Metadata names it (immutable)."""
    node_id: int
    host: str
    port: int


def read_response(api_key: int, version: int, frame: bytes | memoryview, correlation_id: int,
                  what: str = "a response") -> Any:
    """kio's body of the response ``frame`` (header and body, after the size) of ``api_key`` at
    ``version``, checked before kio reads it and against the request's ``correlation_id``. Pure.

    Raises:
        KafkaClientError: a malformed response, or one that does not answer the request.
    """
    response_cls = load_response_schema(api_key, version)
    try:
        check_response(response_cls, frame)  # before kio, whose native reader trusts compact counts
        head, offset = entity_reader(response_cls.__header_schema__)(frame, 0)
        body_obj, used = entity_reader(response_cls)(frame, offset)
    except (SerialError, ValueError, KeyError, struct.error) as exc:  # KeyError: an unknown tag
        raise KafkaClientError(f"{what}: malformed response: {exc}") from None
    if head.correlation_id != correlation_id or offset + used != len(frame):
        raise KafkaClientError(f"{what}: a response that does not answer the request")
    return body_obj


class Connection:
    """One connection to a broker: requests written and responses read by kio, one at a time.
    ``sock``: a socket already connected (a Unix socket), used as it is."""

    def __init__(self, host: str, port: int, timeout: float, client_id: str, security: Security,
                 sock: socket.socket | None = None, context: ssl.SSLContext | None = None) -> None:
        self.address = f"{host}:{port}" if sock is None else host
        try:
            if sock is None:
                sock = socket.create_connection((host, port), timeout=timeout)
                if sock.getsockname() == sock.getpeername():
                    # TCP simultaneous open: a connect to a loopback port that nothing listens
                    # on can get that very port as its own and connect to itself, holding the
                    # port that the server we wanted is about to bind.
                    sock.close()
                    raise ConnectionRefusedError(errno.ECONNREFUSED, "connected to itself")
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if security.tls:
                if context is None:
                    context = ssl.create_default_context(cafile=security.ca_file)
                    context.check_hostname = security.check_hostname
                sock = context.wrap_socket(sock, server_hostname=host if context.check_hostname else None)
        except (OSError, ssl.SSLError) as exc:  # (the cause kept: a refusal is a ConnectionError)
            raise KafkaClientError(f"cannot connect to {self.address}: {exc}") from exc
        self.sock: socket.socket = sock
        self.client_id = client_id
        self.correlation_id = 0
        self._security = security
        #: when to re-authenticate (KIP-368: at 85% of the session lifetime the server gave), or None
        self._reauthenticate_at: float | None = None
        if security.sasl:
            try:
                self._authenticate(security)
            except BaseException:
                self.close()
                raise

    def _authenticate(self, security: Security) -> None:
        self._reauthenticate_at = None
        started = time.monotonic()
        mechanism = typing.cast(str, security.mechanism)
        answer = self.request(SASL_HANDSHAKE, {"mechanism": mechanism})
        if answer.error_code != ErrorCode.none:
            raise KafkaErrorResponse(f"SaslHandshake {mechanism} with {self.address} (it offers "
                                     f"{', '.join(answer.mechanisms)})", answer.error_code)
        user, password = typing.cast(str, security.username), typing.cast(str, security.password)
        if mechanism == "PLAIN":
            self._sasl_token(f"\0{user}\0{password}".encode(), started)
            return
        digest = _SCRAM[mechanism]
        nonce = base64.b64encode(secrets.token_bytes(24)).decode()
        first_bare = f"n={user.replace('=', '=3D').replace(',', '=2C')},r={nonce}"
        server_first = self._sasl_token(f"n,,{first_bare}".encode()).decode("utf-8", "replace")
        fields = dict(item.split("=", 1) for item in server_first.split(",") if "=" in item)
        try:
            combined, salt, iterations = fields["r"], base64.b64decode(fields["s"]), int(fields["i"])
        except (KeyError, ValueError) as exc:  # (binascii.Error is a ValueError)
            raise KafkaClientError(f"SCRAM with {self.address}: a malformed server-first message") from exc
        if not combined.startswith(nonce) or not 1 <= iterations <= 1_000_000:
            raise KafkaClientError(f"SCRAM with {self.address}: the server's nonce or iteration count is wrong")
        salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", digest)
        without_proof = f"c=biws,r={combined}"
        auth_message = f"{first_bare},{server_first},{without_proof}".encode()
        signature = hmac.digest(hashlib.new(digest, client_key).digest(), auth_message, digest)
        proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
        server_final = self._sasl_token(f"{without_proof},p={proof}".encode(), started).decode("utf-8", "replace")
        expected = base64.b64encode(hmac.digest(hmac.digest(salted, b"Server Key", digest), auth_message,
                                                digest)).decode()
        if not hmac.compare_digest(server_final, f"v={expected}"):
            raise KafkaClientError(f"SCRAM with {self.address}: the server did not prove it knows the password")

    def _sasl_token(self, token: bytes, started: float | None = None) -> bytes:
        """The server's answer to one token; with ``started`` (the last token), the session's
        lifetime sets when to re-authenticate."""
        answer = self.request(SASL_AUTHENTICATE, {"auth_bytes": token})
        if answer.error_code != ErrorCode.none:
            raise KafkaClientError(f"SASL authentication with {self.address} failed: "
                                   f"{answer.error_message or answer.error_code.name}")
        lifetime_ms = getattr(answer, "session_lifetime", None)
        lifetime_s = lifetime_ms.total_seconds() if hasattr(lifetime_ms, "total_seconds") else (lifetime_ms or 0) / 1000
        if started is not None and lifetime_s > 0:
            self._reauthenticate_at = started + 0.85 * lifetime_s
        return bytes(answer.auth_bytes)

    def request(self, api_key: int, fields: Mapping[str, Any], version: int | None = None,
                timeout: float | None = None) -> Any:
        """Send one request and read its answer (kio's response object). ``version``: the
        API's version (default :data:`VERSIONS`'); ``timeout``: seconds for this exchange
        (default the connection's). Raises KafkaClientError (the connection is unusable)."""
        if version is None:
            version = VERSIONS[api_key] if api_key in VERSIONS else GROUP_VERSIONS[api_key]
        if (self._reauthenticate_at is not None and time.monotonic() >= self._reauthenticate_at
                and api_key not in (SASL_HANDSHAKE, SASL_AUTHENTICATE)):
            self._authenticate(self._security)  # KIP-368: before the server's session ends
        if timeout is not None:
            self.sock.settimeout(timeout)
        what = f"{_NAMES.get(api_key, f'API {api_key}')} v{version} to {self.address}"
        try:
            self.send_only(api_key, fields, version)
            size = _SIZE.unpack(self._read(4))[0]
            if not 4 <= size <= MAX_RESPONSE_BYTES:
                raise KafkaClientError(f"{what}: a response of {size} bytes")
            frame = memoryview(self._read(size)).toreadonly()
        except OSError as exc:
            raise KafkaClientError(f"{what}: {exc}") from exc
        return read_response(api_key, version, frame, self.correlation_id, what)

    def send_only(self, api_key: int, fields: Mapping[str, Any], version: int) -> None:
        """Write one request and read nothing (a Produce with acks=0 has no answer).

        Raises:
            OSError: the connection failed.
        """
        cls = load_request_schema(api_key, version)
        self.correlation_id = (self.correlation_id + 1) & 0x7FFFFFFF
        self.sock.sendall(write_request(self.correlation_id, cls, self.client_id, fields))

    def _read(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ConnectionResetError("the connection was closed")  # (a ConnectionError: the peer is gone)
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self.sock.close()


class KafkaClient:
    """A blocking client of one Kafka-protocol cluster (see the module docstring).

    Args:
        bootstrap: ``"host:port[,host:port...]"``; the first that answers is used.
        timeout: seconds to wait for a connection or an answer.
        client_id: sent in every request header.
        security: TLS and SASL settings (default: PLAINTEXT).

    Not thread-safe: one thread uses a client (and closes it).

    Raises:
        KafkaClientError: no bootstrap server answers, or one lacks a version this client needs.
    """

    def __init__(self, bootstrap: str, timeout: float = 30.0, client_id: str = "logstore-mirror",
                 security: Security | None = None) -> None:
        self.timeout = timeout
        self.client_id = client_id
        self.security = security if security is not None else Security()
        self._connections: dict[int, Connection] = {}
        self.brokers: dict[int, Broker] = {}
        self.leaders: dict[tuple[str, int], int] = {}
        self.partitions: dict[str, int] = {}
        #: the cluster's id (Metadata), known after :meth:`refresh`
        self.cluster_id: str | None = None
        errors = []
        for address in bootstrap.split(","):
            host, _, port = address.strip().rpartition(":")
            if not host or not port.isdigit():
                raise KafkaClientError(f"bootstrap server {address!r} is not host:port")
            try:
                self._bootstrap = Connection(host, int(port), timeout, client_id, self.security)
                break
            except KafkaClientError as exc:
                errors.append(str(exc))
        else:
            raise KafkaClientError("; ".join(errors))
        self._check_versions()

    def _check_versions(self) -> None:
        answer = self._bootstrap.request(API_VERSIONS, {})
        if answer.error_code != ErrorCode.none:
            raise KafkaErrorResponse(f"ApiVersions from {self._bootstrap.address}", answer.error_code)
        ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in answer.api_keys}
        for key, version in VERSIONS.items():
            if key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
                continue  # spoken already, or not needed
            low, high = ranges.get(key, (0, -1))
            if not low <= version <= high:
                raise KafkaClientError(f"{self._bootstrap.address} does not speak {_NAMES[key]} v{version} "
                                       f"(it speaks {low}-{high})")

    # ------------------------------------------------------------------ metadata
    def refresh(self, topics: list[str] | None = None) -> None:
        """Learn the brokers, and the partition count and leaders of ``topics`` (None: all)."""
        answer = self._bootstrap.request(METADATA, {
            "topics": None if topics is None else [{"name": t} for t in topics],
            "allow_auto_topic_creation": False, "include_cluster_authorized_operations": False,
            "include_topic_authorized_operations": False})
        self.brokers = {int(b.node_id): Broker(int(b.node_id), b.host, int(b.port)) for b in answer.brokers}
        self.cluster_id = answer.cluster_id
        for topic in answer.topics:
            if topic.error_code == ErrorCode.unknown_topic_or_partition:
                self.partitions.pop(topic.name, None)
                continue
            if topic.error_code != ErrorCode.none:
                raise KafkaErrorResponse(f"Metadata of topic {topic.name!r}", topic.error_code)
            self.partitions[topic.name] = len(topic.partitions)
            for p in topic.partitions:
                self.leaders[(topic.name, int(p.partition_index))] = int(p.leader_id)

    def create_topic(self, topic: str, partitions: int) -> None:
        """Create ``topic`` with ``partitions`` partitions and the cluster's defaults (a topic
        that exists already is not an error). Raises KafkaErrorResponse for any other refusal."""
        answer = self._bootstrap.request(CREATE_TOPICS, {
            "topics": [{"name": topic, "num_partitions": partitions, "replication_factor": -1,
                        "assignments": [], "configs": []}],
            "timeout": int(self.timeout * 1000), "validate_only": False})
        for result in answer.topics:
            if result.error_code not in (ErrorCode.none, ErrorCode.topic_already_exists):
                raise KafkaErrorResponse(f"CreateTopics {topic!r}", result.error_code)
        self.refresh([topic])

    # ------------------------------------------------------------------ partitions
    def _leader(self, topic: str, partition: int) -> Connection:
        leader = self.leaders.get((topic, partition))
        if leader is None or leader not in self.brokers:
            self.refresh([topic])
            leader = self.leaders.get((topic, partition))
            if leader is None or leader < 0 or leader not in self.brokers:
                raise KafkaClientError(f"{topic}-{partition} has no leader")
        connection = self._connections.get(leader)
        if connection is None:
            broker = self.brokers[leader]
            connection = self._connections[leader] = Connection(broker.host, broker.port, self.timeout,
                                                                 self.client_id, self.security)
        return connection

    def _call(self, topic: str, partition: int, api_key: int, fields: Mapping[str, Any]) -> Any:
        connection = self._leader(topic, partition)
        try:
            return connection.request(api_key, fields)
        except KafkaClientError:
            self._drop(connection)
            raise

    def _drop(self, connection: Connection) -> None:
        for node, known in list(self._connections.items()):
            if known is connection:
                del self._connections[node]
        connection.close()

    def end_offset(self, topic: str, partition: int) -> int:
        """The partition's log end offset on its leader (ListOffsets, latest)."""
        answer = self._call(topic, partition, LIST_OFFSETS, {
            "replica_id": -1, "isolation_level": 0,
            "topics": [{"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1,
                                                       "timestamp": LATEST}]}]})
        found = answer.topics[0].partitions[0]
        self._check(f"ListOffsets of {topic}-{partition}", found.error_code, topic)
        return int(found.offset)

    def produce(self, topic: str, partition: int, batch: bytes, acks: int = -1,
                transactional_id: str | None = None) -> int:
        """Append one encoded record batch to the partition (part of ``transactional_id``'s
        transaction when given); returns its base offset there."""
        answer = self._call(topic, partition, PRODUCE, {
            "transactional_id": transactional_id, "acks": acks, "timeout": int(self.timeout * 1000),
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]})
        result = answer.responses[0].partition_responses[0]
        self._check(f"Produce to {topic}-{partition}", result.error_code, topic)
        return int(result.base_offset)

    def _check(self, what: str, code: ErrorCode, topic: str) -> None:
        if code == ErrorCode.none:
            return
        if code in (ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available,
                    ErrorCode.unknown_topic_or_partition):
            self.leaders = {k: v for k, v in self.leaders.items() if k[0] != topic}  # learn them again
        raise KafkaErrorResponse(what, code)

    def close(self) -> None:
        """Close every connection."""
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
        self._bootstrap.close()

    def __enter__(self) -> "KafkaClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
