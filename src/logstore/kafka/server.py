"""A store served to Kafka clients: :class:`KafkaServer`, its protocol on ``net``, and ``logstore serve``.

Unmodified Kafka clients (librdkafka/confluent-kafka, kafka-python, aiokafka, kcat) produce to
and fetch from a :class:`~logstore.store.store.LogStore` through Kafka's wire protocol, on the same
files the library, the CLI and Spark read (the store is opened shared). The server is one
``net.Server`` (an event loop and a worker pool, no thread per connection) speaking
:class:`KafkaProtocol`; :mod:`~logstore.kafka.wire` reads and writes the messages and
:mod:`~logstore.kafka.apis` answers them.

Limits: a request larger than ``max_request_bytes`` (Kafka's ``socket.request.max.bytes``, 100 MiB)
closes its connection before any of it is allocated; so does a malformed request, after a log
line (the server and its other connections go on, and nothing of that request is written).

Security (Kafka's security protocols): ``tls`` makes the listener SSL, ``sasl_credentials``
or ``sasl_oauthbearer`` make it SASL_PLAINTEXT, with TLS SASL_SSL. With SASL, a connection must
authenticate (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER: :mod:`~logstore.kafka.auth`,
credentials in :mod:`~logstore.kafka.credentials`, tokens validated by
:mod:`~logstore.kafka.oauth`) before anything but ApiVersions is answered, and re-authenticate
as ``connections_max_reauth_ms`` (KIP-368) asks. The listener
binds to loopback unless told otherwise; binding another address needs authentication (SASL,
or TLS that requires client certificates: a ``TLSConfig`` with ``cafile``), or
``allow_anonymous=True``. TLS without client certificates encrypts but identifies no one.
A connection's ``net.Session.principal`` is ``User:<name>`` after SASL, None otherwise (a
client certificate's subject is not made a principal), which the authorizer takes for
``User:ANONYMOUS``. SCRAM users are also managed over the protocol (:mod:`~logstore.kafka.scramusers`).

Authorization (Kafka's ``authorizer.class.name``): off by default, everyone may do everything.
With ``authorizer``, every request is checked against the store's ACLs
(:mod:`~logstore.kafka.acls`, stored by :mod:`~logstore.kafka.aclfile`, managed with
CreateAcls/DeleteAcls or ``logstore acls``) by the table of :mod:`~logstore.kafka.aclguard`.

Thread-safety: :class:`KafkaServer` methods may be called from any thread.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import logging
import os
import signal
import ssl
import struct
import sys
import threading
import time
import uuid
from dataclasses import replace
from concurrent.futures import Future
from typing import Any, Callable, Mapping, Sequence

from ..errorcodes import ErrorCode
from ..net import server as net
from ..metrics import Histogram
from ..errors import LogstoreError
from .apikeys import API_VERSIONS, PRODUCE
from ..txn.coordinator import TxnConfig
from .apis import KafkaApis, api_version_ranges
from .acls import Authorizer
from .auth import SASL_MECHANISMS, SaslAuthenticator
from .credentials import (MECHANISMS, STORE_FILE_NAME, Credentials, CredentialsError, CredentialsFile,
                          store_users_path)
from .oauth import CONFIG_NAMES as OAUTHBEARER_CONFIG_NAMES, OAUTHBEARER, OAuthBearerValidator
from .scramusers import ScramUsers
from ..groups.consumergroup import MIGRATION_POLICIES, ConsumerGroupConfig
from .configs import GroupConfigBounds
from ..groups.coordinator import GroupConfig
from .wire import KafkaProtocolError, KafkaRequest, UnsupportedVersionError, encode, parse_request
from ..store.store import LogStore, meta_properties
from ..net.protocol import TLSConfig
from ..tiered.objectstore import parse_options
from ..net.purgatory import mapped as _mapped

__all__ = ["KafkaServer", "KafkaProtocol", "RequestMetrics", "add_sasl_arguments", "sasl_options",
           "add_authorizer_arguments", "authorizer_options", "add_remote_storage_arguments",
           "remote_storage_options", "main"]

logger = logging.getLogger("logstore.kafka")

#: Kafka's socket.request.max.bytes default.
DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024
#: The largest frame before SASL authentication (Kafka's sasl.server.max.receive.size is 512 KiB).
DEFAULT_SASL_MAX_RECEIVE_BYTES = 64 * 1024
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
#: The largest Produce request the network loop answers itself (when the append need not wait:
#: ``KafkaApis.on_produce``); a larger one goes to a worker, so that no connection's batch holds
#: the loop for its validation and copy (a 64 KiB batch: ~20 us of CRC32C and copy).
INLINE_PRODUCE_BYTES = 64 * 1024
#: Upper bounds (ms) of the request time histograms (a fetch may wait up to its max_wait_ms).
REQUEST_BUCKETS_MS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0,
                      5000.0, 10000.0, 30000.0)


class RequestMetrics:
    """Kafka's request metrics, per API: ``RequestsPerSec`` (a count) and ``TotalTimeMs`` (a
    histogram of the time from the handler taking a request to its answer being ready; a
    long-poll fetch counts its wait). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: dict[str, Histogram] = {}

    def record(self, api: str, ms: float) -> None:
        """Count one answered request of ``api`` that took ``ms``."""
        histogram = self._times.get(api)
        if histogram is None:
            with self._lock:
                histogram = self._times.setdefault(api, Histogram(REQUEST_BUCKETS_MS))
        histogram.observe(ms)

    def snapshot(self) -> dict[str, Any]:
        """``kafka.network:type=RequestMetrics,name=...,request=<API>`` -> value."""
        with self._lock:
            times = dict(self._times)
        out: dict[str, Any] = {}
        for api, histogram in sorted(times.items()):
            snap = histogram.snapshot()
            out[f"kafka.network:type=RequestMetrics,name=RequestsPerSec,request={api}"] = snap.count
            out[f"kafka.network:type=RequestMetrics,name=TotalTimeMs,request={api}"] = snap
        return out


class KafkaProtocol(net.Protocol):
    """Kafka's framing (a 4-byte size, then the request) and dispatch to :class:`KafkaApis`;
    with ``sasl``, each connection first runs :class:`~logstore.kafka.auth.SaslHandshake`, its
    frames capped at ``sasl_max_receive_bytes`` until it succeeds.

    Thread-safety: thread-safe (handlers run on several workers at once).
    """

    header_size = 4

    def __init__(self, apis: KafkaApis, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 sasl: SaslAuthenticator | None = None,
                 sasl_max_receive_bytes: int = DEFAULT_SASL_MAX_RECEIVE_BYTES) -> None:
        self.apis = apis
        self.max_request_bytes = max_request_bytes
        self.sasl = sasl
        self.sasl_max_receive_bytes = sasl_max_receive_bytes
        self.request_metrics = RequestMetrics()

    def frame_size(self, header: bytes, authenticated: bool) -> int:
        (size,) = _I32.unpack(header)
        if not authenticated:  # a raw SASL token (after SaslHandshake v0) may be short
            if size < 0 or size > self.sasl_max_receive_bytes:
                raise KafkaProtocolError(f"a frame of {size} bytes before authentication (the limit is "
                                         f"{self.sasl_max_receive_bytes})")
            return size  # type: ignore[no-any-return]
        if size < 8 or size > self.max_request_bytes:
            raise KafkaProtocolError(f"a request of {size} bytes (the limit is {self.max_request_bytes}, "
                                     "socket.request.max.bytes)")
        return size  # type: ignore[no-any-return]

    def handshake(self, session: net.Session) -> net.Handshake | None:
        if self.sasl is None:
            return None
        return self.sasl.handshake(session, lambda frame: b"".join(self.handle(session, frame)))

    def inline(self, session: net.Session, request: bytearray) -> bool:
        """The APIs of :attr:`KafkaApis.inline`; a Produce only when its frame is small (at most
        :data:`INLINE_PRODUCE_BYTES`: validating and copying a large batch on the loop would
        hold up every other connection)."""
        api_key = _I16.unpack_from(request, 0)[0]
        return api_key in self.apis.inline and (api_key != PRODUCE or len(request) <= INLINE_PRODUCE_BYTES)

    def handle_inline(self, session: net.Session, request: bytearray) -> Any:
        return self.handle(session, request, on_loop=True)

    def handle(self, session: net.Session, request: bytearray, on_loop: bool = False) -> Any:
        try:
            parsed = parse_request(request, self.apis.supported)
        except UnsupportedVersionError as exc:
            if exc.api_key == API_VERSIONS:
                return _api_versions_unsupported(exc.correlation_id, self.apis.supported)
            logger.warning("closing connection %d from %s: %s", session.id, session.peer, exc)
            raise
        except KafkaProtocolError as exc:
            logger.warning("closing connection %d from %s: %s", session.id, session.peer, exc)
            raise
        if isinstance(session.peer, tuple):
            parsed.client_host = f"/{session.peer[0]}"
        parsed.principal = session.principal
        parsed.on_loop = on_loop
        started = time.monotonic()
        return self._answer(parsed, self.apis.handlers[parsed.api_key](parsed), started)

    def _answer(self, parsed: KafkaRequest, fields: Any, started: float) -> Any:
        """A handler's answer as the frames to write (None: no response; a Future or an
        Offload of them)."""
        if fields is None:
            if parsed.api_key != PRODUCE:
                raise KafkaProtocolError(f"{parsed.name} v{parsed.api_version}: the handler gave no answer")
            self.request_metrics.record(parsed.name, (time.monotonic() - started) * 1000)
            return None  # acks=0: no response at all
        if isinstance(fields, Future):
            return _mapped(fields, lambda done: self._encode_timed(parsed, done, started))
        if fields.__class__ is net.Offload:  # (handled on the loop) it would wait: a worker answers
            call = fields.call
            return net.Offload(lambda: self._answer(parsed, call(), started))
        return self._encode_timed(parsed, fields, started)

    def _encode_timed(self, request: KafkaRequest, fields: Any, started: float) -> list[bytes]:
        frame = _encode(request, fields)
        self.request_metrics.record(request.name, (time.monotonic() - started) * 1000)
        return frame


def _encode(request: KafkaRequest, fields: Any) -> list[bytes]:
    return encode(request.correlation_id, request.api_key, request.api_version, fields)


def _api_versions_unsupported(correlation_id: int, supported: Any) -> list[bytes]:
    """Error 35 in ApiVersions' v0 format, still listing the ranges (a client then retries with
    a version it shares: KIP-511)."""
    return encode(correlation_id, API_VERSIONS, 0, {"error_code": ErrorCode.unsupported_version,
                                                     "api_keys": api_version_ranges(supported)})


class KafkaServer:
    """Serve ``root_or_store`` to Kafka clients on ``listen``, from construction on.

    The constructor binds the listener and starts answering before it returns, so that
    :attr:`address` and :attr:`bootstrap_servers` (the port bound, when ``listen`` asked for
    port 0) are served as soon as a caller can read them, as a Kafka broker's listeners are
    once its startup completes. :meth:`start` has nothing left to do and returns the server, for
    ``KafkaServer(...).start()`` and ``with KafkaServer(...) as server``; :meth:`stop` (or
    leaving the ``with`` block) closes it.

    Args:
        root_or_store: a store directory (opened shared, closed by :meth:`stop`) or an open
            :class:`LogStore` (left open).
        listen: (host, port); port 0 picks a free one. Loopback by default. A path instead
            serves a Unix socket there (local clients only; Metadata then names localhost:0).
        advertised: (host, port) that Metadata names (default: the bound address).
        node_id: this broker's id in Metadata.
        auto_create_topics, num_partitions: Kafka's ``auto.create.topics.enable`` (a topic a
            client asks metadata for is created) and ``num.partitions``.
        max_request_bytes: Kafka's ``socket.request.max.bytes``.
        limits: connection limits (``max.connections``: 4096 here; ``connections.max.idle.ms``).
            Idle connections cost no thread: one loop serves them all, and worker threads are
            started for requests being answered, up to ``max_connections``.
        tls: a :class:`~logstore.net.protocol.TLSConfig` (``cafile`` set: client certificates required,
            Kafka's ``ssl.client.auth=required``; None: none asked for) or a server-side
            ``ssl.SSLContext``; None for plain TCP.
        sasl_credentials: enables SASL: a credentials file (re-read when it changes, see
            :class:`~logstore.kafka.credentials.CredentialsFile`), a mapping ``{user: password}``
            (salted keys are derived for each mechanism and the passwords dropped) or
            ``{user: {mechanism: credential}}``, a
            :class:`~logstore.kafka.credentials.Credentials` (fixed) or a ``CredentialsFile``.
            None: the data directory's own file
            (:func:`~logstore.kafka.credentials.store_users_path`, ``.sasl-credentials``; no
            users while it does not exist), the users of the password mechanisms
            ``sasl_mechanisms`` enables, and of AlterUserScramCredentials and
            DescribeUserScramCredentials with or without SASL.
        sasl_mechanisms: the mechanisms enabled (Kafka's ``sasl.enabled.mechanisms``: PLAIN,
            SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER; None: the password ones with
            ``sasl_credentials``, OAUTHBEARER with ``sasl_oauthbearer``); a user authenticates with
            those it has a credential for. Enables SASL by itself too.
        sasl_oauthbearer: enables SASL/OAUTHBEARER: a mapping of Kafka's ``sasl.oauthbearer.*``
            settings (:data:`~logstore.kafka.oauth.CONFIG_NAMES`: a JWKS URL with the expected
            issuer and audience, or the unsecured validator for development) or a validator
            (:mod:`~logstore.kafka.oauth`); closed by :meth:`stop`. The principal is
            ``User:<sub>`` (``sasl.oauthbearer.sub.claim.name``).
        connections_max_reauth_ms: Kafka's ``connections.max.reauth.ms`` (KIP-368; 0: off): a
            SASL session lasts at most this long (an OAUTHBEARER session never past its token's
            expiry, in any case); clients re-authenticate on the connection before then, and
            a connection that sends anything else after it is closed.
        sasl_reserved_users: user names only SCRAM authenticates, against ``sasl_credentials``
            (a replica node's peer user): PLAIN and OAUTHBEARER refuse them.
        sasl_max_receive_bytes: the largest frame before authentication.
        failed_authentication_delay_ms: how long a connection that failed authentication stays
            open after its answer, reading nothing (Kafka's
            ``connection.failed.authentication.delay.ms``).
        allow_anonymous: allow a non-loopback bind without authentication.
        group_min_session_timeout_ms, group_max_session_timeout_ms, group_initial_rebalance_delay_ms:
            Kafka's ``group.min.session.timeout.ms`` (6000), ``group.max.session.timeout.ms``
            (1800000) and ``group.initial.rebalance.delay.ms`` (0 here; Kafka's is 3000).
        apis_factory: makes the request handlers from KafkaApis' arguments (a replica node's
            Kafka listener passes one that answers for its replicated partitions).
        group_liveness: ``liveness(client_id)`` for the group coordinator
            (:class:`~logstore.groups.coordinator.GroupConfig`): the store's own coordinator passes it.
        fsync_acks_all: make acks=all mean fsynced: the answer waits for an fsync of every
            partition the request wrote (one fsync shared by the requests waiting at once).
        authorizer: check every request against the store's ACLs (True: the handlers'
            :meth:`~logstore.kafka.apis.KafkaApis.new_authorizer`, over the store's
            :class:`~logstore.kafka.aclfile.AclFile`, a replica set's replicated ACLs, with
            ``super_users`` and ``allow_everyone_if_no_acl_found``; or an
            :class:`~logstore.kafka.acls.Authorizer` of the caller's). False: none.
        super_users: Kafka's ``super.users`` (``User:admin``): they may do everything.
        allow_everyone_if_no_acl_found: Kafka's ``allow.everyone.if.no.acl.found`` (False).
        txn_config: the transaction coordinator's settings
            (:class:`~logstore.txn.coordinator.TxnConfig`: ``transaction.max.timeout.ms``,
            ``transactional.id.expiration.ms``, the intervals of its timeout and expiry checks;
            ``fsync`` is on with ``fsync_acks_all``: power-loss durability for transactions too).
        consumer_group_config: the consumer group protocol's settings
            (:class:`~logstore.groups.consumergroup.ConsumerGroupConfig`: Kafka's
            ``group.consumer.*``); None serves only the classic protocol (Kafka's
            ``group.coordinator.rebalance.protocols=classic``).
        group_config_bounds: the bounds of a consumer group's own configs
            (:class:`~logstore.kafka.configs.GroupConfigBounds`: Kafka's
            ``group.consumer.min/max.session.timeout.ms`` and ``...heartbeat.interval.ms``).
        store_options: keyword arguments of the :class:`LogStore` the server opens when given a
            directory: tiered storage's ``remote_storage``, ``remote_storage_options``,
            ``remote_log_manager_task_interval_ms``, ``remote_fetch_max_wait_ms`` and
            ``remote_log_index_cache_size_bytes`` (Kafka's broker settings of those names; see
            :func:`remote_storage_options`), or any other. Not with an open store.

    Durability: a produce is answered once its batch is in the log (acks=1; acks=all too unless
    ``fsync_acks_all``): in the page cache, which survives the death of the process, and
    fsynced when the topic's flush policy (``flush.messages``, ``flush.ms``) says so; with
    ``fsync_acks_all`` an acks=all answer means the batch survives power loss.
    Thread-safety: thread-safe.
    """

    def __init__(self, root_or_store: str | os.PathLike[str] | LogStore,
                 listen: tuple[str, int] | str | os.PathLike[str] = ("127.0.0.1", 9092),
                 *, advertised: tuple[str, int] | None = None, node_id: int = 0, auto_create_topics: bool = True,
                 num_partitions: int = 1, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 limits: net.Limits = net.Limits(max_connections=4096), allow_anonymous: bool = False,
                 tls: TLSConfig | ssl.SSLContext | None = None,
                 sasl_credentials: (str | os.PathLike[str] | Mapping[str, Any] | Credentials | CredentialsFile
                                    | None) = None,
                 sasl_mechanisms: Sequence[str] | None = None,
                 sasl_oauthbearer: OAuthBearerValidator | Mapping[str, Any] | None = None,
                 connections_max_reauth_ms: int = 0, sasl_reserved_users: Sequence[str] = (),
                 sasl_max_receive_bytes: int = DEFAULT_SASL_MAX_RECEIVE_BYTES,
                 failed_authentication_delay_ms: int = 100,
                 group_min_session_timeout_ms: int = 6000, group_max_session_timeout_ms: int = 1_800_000,
                 group_initial_rebalance_delay_ms: int = 0, fsync_acks_all: bool = False,
                 group_liveness: Callable[[str], bool] | None = None,
                 apis_factory: Callable[..., KafkaApis] = KafkaApis, txn_config: TxnConfig = TxnConfig(),
                 authorizer: bool | Authorizer = False, super_users: Sequence[str] = (),
                 allow_everyone_if_no_acl_found: bool = False,
                 consumer_group_config: ConsumerGroupConfig | None = ConsumerGroupConfig(),
                 group_config_bounds: GroupConfigBounds = GroupConfigBounds(),
                 store_options: Mapping[str, Any] | None = None) -> None:
        if store_options and isinstance(root_or_store, LogStore):
            raise ValueError("store_options are for a store the server opens: pass them to the LogStore given")
        context = tls.server_context() if isinstance(tls, TLSConfig) else tls
        client_certs = context is not None and context.verify_mode == ssl.CERT_REQUIRED
        local = isinstance(listen, (str, os.PathLike))  # a Unix socket: its file's permissions guard it
        with_sasl = sasl_credentials is not None or sasl_oauthbearer is not None or sasl_mechanisms is not None
        if not with_sasl and connections_max_reauth_ms:
            raise ValueError("connections_max_reauth_ms needs SASL: sasl_credentials (--sasl-credentials), "
                             "sasl_mechanisms (--sasl-mechanisms) or sasl_oauthbearer (--sasl-oauthbearer)")
        if not local and not _is_loopback(listen[0]) and not allow_anonymous and not with_sasl and not client_certs:
            raise LogstoreError(f"refusing to serve {listen[0]} without authentication: bind a loopback address, "
                                "configure SASL (sasl_credentials, --sasl-credentials; sasl_oauthbearer) or TLS "
                                "client certificates (--tls-ca), or pass allow_anonymous=True (--allow-anonymous)")
        # The data directory's own users, when no others are named (Kafka keeps SCRAM users in its
        # metadata whatever its listeners speak).
        store_users = None
        if sasl_credentials is None:
            try:
                store_users = CredentialsFile(store_users_path(
                    root_or_store.root if isinstance(root_or_store, LogStore) else root_or_store), missing_ok=True)
            except CredentialsError as exc:
                if with_sasl:
                    raise  # (the listener's users: it cannot serve without them)
                logger.error("the store's SASL users are not readable, so this listener without SASL neither "
                             "describes nor alters them: %s", exc)
        if with_sasl and sasl_mechanisms is None:
            sasl_mechanisms = ((MECHANISMS if sasl_credentials is not None else ())
                               + ((OAUTHBEARER,) if sasl_oauthbearer is not None else ()))
        sasl = (SaslAuthenticator(store_users if sasl_credentials is None else sasl_credentials, sasl_mechanisms,
                                  failed_authentication_delay_ms / 1000, sasl_oauthbearer,
                                  connections_max_reauth_ms, sasl_reserved_users)
                if with_sasl else None)
        if sasl is not None and context is None and "PLAIN" in sasl.mechanisms and not local and \
                not _is_loopback(listen[0]):
            logger.warning("SASL PLAIN without TLS on %s: passwords cross the network in clear", listen[0])
        #: Kafka's name for what the listener speaks: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
        self.security_protocol = ("SASL_" if sasl is not None else "") + ("SSL" if context is not None else
                                                                          "PLAINTEXT")
        if isinstance(root_or_store, LogStore):
            self.store, self._owns_store = root_or_store, False
        else:
            self.store, self._owns_store = LogStore(root_or_store, shared=True, **(store_options or {})), True
        apis: KafkaApis | None = None
        try:
            self._apis = apis = apis_factory(self.store, node_id=node_id, host="", port=0, cluster_id=_cluster_id(self.store.root),
                                   auto_create_topics=auto_create_topics, num_partitions=num_partitions,
                                   group_config=GroupConfig(group_min_session_timeout_ms, group_max_session_timeout_ms,
                                                            group_initial_rebalance_delay_ms, group_liveness),
                                   fsync_acks_all=fsync_acks_all, consumer_group_config=consumer_group_config,
                                   group_config_bounds=group_config_bounds,
                                   txn_config=replace(txn_config, fsync=txn_config.fsync or fsync_acks_all))
            if authorizer is True:
                authorizer = apis.new_authorizer(super_users, allow_everyone_if_no_acl_found)
            apis.scram_users = ScramUsers(sasl, store_users, authorized=bool(authorizer))
            apis.guard_handlers(authorizer or None)
            self._protocol = KafkaProtocol(self._apis, max_request_bytes, sasl, sasl_max_receive_bytes)
            self._server = net.Server(listen, self._protocol, tls=context, limits=limits,
                                      name="kafka", thread_name=f"kafka-{node_id}-net")
        except BaseException:
            if sasl is not None:
                sasl.close()
            if apis is not None:
                apis.close()  # (its threads: the replica set's transaction coordinator)
            if self._owns_store:
                self.store.close()
            raise
        #: (host, port) bound, or the Unix socket's path
        self.address: Any = self._server.address
        host, port = advertised or (("localhost", 0) if local else self.address)
        self._apis.host, self._apis.port = host, port
        self._stopped = threading.Event()
        try:
            self._server.start()
        except BaseException:
            self.stop()
            raise
        logger.info("serving %s to Kafka clients on %s (%s)", self.store.root, self.bootstrap_servers,
                    self.security_protocol)

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for a client's ``bootstrap.servers``."""
        if isinstance(self.address, str):
            return self.address
        host, port = self.address
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> "KafkaServer":
        """Return self: the server serves from construction (see the class docstring)."""
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close every connection, answer the waiting fetches, and close the store if this
        server opened it. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._apis.close()
        self._server.stop(timeout)
        if self._protocol.sasl is not None:
            self._protocol.sasl.close()
        if self._owns_store:
            self.store.close()

    @property
    def node_id(self) -> int:
        """This broker's id (Metadata's and FindCoordinator's)."""
        return self._apis.node_id

    @property
    def cluster_id(self) -> str:
        """The cluster id this broker reports (Metadata's and DescribeCluster's)."""
        return self._apis.cluster_id

    def metrics(self) -> dict[str, Any]:
        """Everything a broker reports, under Kafka's names: the listener's counters (see
        ``net.Server.metrics``), request counts and times per API
        (``kafka.network:type=RequestMetrics,name=RequestsPerSec|TotalTimeMs,request=Produce``),
        and the store's (``kafka.server:type=BrokerTopicMetrics`` ... per partition; see
        :meth:`LogStore.metrics`). Render with :func:`logstore.metrics.prometheus_text`."""
        out = dict(self._server.metrics())
        out.update(self._protocol.request_metrics.snapshot())
        out.update(self.store.metrics())
        return out

    def __enter__(self) -> "KafkaServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"KafkaServer({self.store.root!r}, {self.bootstrap_servers})"


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _cluster_id(root: str) -> str:
    """Kafka's cluster id (22 characters of URL-safe base64): ``cluster.id`` in a Kafka log
    directory's meta.properties, else one derived from the store's ``directory.id``."""
    props = meta_properties(root)
    if props.get("cluster.id"):
        return props["cluster.id"]
    try:
        raw = uuid.UUID(props.get("directory.id", "")).bytes
    except ValueError:
        raw = uuid.uuid5(uuid.NAMESPACE_URL, os.path.abspath(root)).bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# ---------------------------------------------------------------------- logstore serve
def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def add_sasl_arguments(parser: Any) -> None:
    """The SASL command-line options (``logstore serve`` and ``logstore node``), read back by
    :func:`sasl_options`."""
    parser.add_argument("--sasl-credentials", metavar="FILE",
                        help="enable SASL with the users of FILE (made by 'logstore kafka-user add' or "
                             "AlterUserScramCredentials; re-read when it changes)")
    parser.add_argument("--sasl-mechanisms", metavar="M,M",
                        help=f"the SASL mechanisms enabled, among {','.join(SASL_MECHANISMS)} (default: the "
                             "password ones with --sasl-credentials, OAUTHBEARER with --sasl-oauthbearer); the "
                             "password ones without --sasl-credentials check the store's own users (logstore "
                             f"kafka-user add DIR USER, AlterUserScramCredentials: DIR/{STORE_FILE_NAME})")
    parser.add_argument("--sasl-oauthbearer", action="append", default=[], metavar="NAME=VALUE",
                        help="enable SASL/OAUTHBEARER with Kafka's settings (repeat), e.g. "
                             "sasl.oauthbearer.jwks.endpoint.url=file:///etc/jwks.json, "
                             "sasl.oauthbearer.expected.issuer=..., sasl.oauthbearer.expected.audience=...; or "
                             "sasl.oauthbearer.unsecured.validator.enable=true (unsigned tokens: development only)")
    parser.add_argument("--connections-max-reauth-ms", type=int, default=0, metavar="MS",
                        help="a SASL session lasts at most MS (KIP-368: clients re-authenticate; 0: no limit)")


def sasl_options(args: Any) -> dict[str, Any]:
    """KafkaServer's SASL arguments from parsed :func:`add_sasl_arguments` options (only those
    given).

    Raises:
        ValueError: a malformed or unknown ``--sasl-oauthbearer`` setting.
    """
    options: dict[str, Any] = {}
    if args.sasl_credentials:
        options["sasl_credentials"] = args.sasl_credentials
    if args.sasl_mechanisms:
        options["sasl_mechanisms"] = [m.strip() for m in args.sasl_mechanisms.split(",") if m.strip()]
    if args.sasl_oauthbearer:
        config = {}
        for item in args.sasl_oauthbearer:
            name, sep, value = item.partition("=")
            if not sep or name.strip() not in OAUTHBEARER_CONFIG_NAMES:
                raise ValueError(f"--sasl-oauthbearer {item!r}: expected NAME=VALUE with NAME one of "
                                 f"{', '.join(OAUTHBEARER_CONFIG_NAMES)}")
            config[name.strip()] = value.strip()
        options["sasl_oauthbearer"] = config
    if args.connections_max_reauth_ms:
        options["connections_max_reauth_ms"] = args.connections_max_reauth_ms
    return options


def add_transaction_arguments(parser: Any) -> None:
    """The transaction coordinator's command-line options (``logstore serve`` and ``logstore
    node``), read back by :func:`transaction_config`."""
    parser.add_argument("--transaction-max-timeout-ms", type=int, default=TxnConfig.transaction_max_timeout_ms,
                        metavar="MS", help="the longest transaction.timeout.ms a producer may ask for")
    parser.add_argument("--transactional-id-expiration-ms", type=int,
                        default=TxnConfig.transactional_id_expiration_ms, metavar="MS",
                        help="a transactional id idle this long is forgotten")
    parser.add_argument("--max-ongoing-transactions", type=int, metavar="N",
                        help="at most N transactions open at once (more wait: CONCURRENT_TRANSACTIONS)")


def transaction_config(args: Any) -> TxnConfig:
    """The TxnConfig of parsed :func:`add_transaction_arguments` options.

    Raises:
        ValueError: a value out of range.
    """
    return TxnConfig(transaction_max_timeout_ms=args.transaction_max_timeout_ms,
                     transactional_id_expiration_ms=args.transactional_id_expiration_ms,
                     max_ongoing=args.max_ongoing_transactions)


def add_authorizer_arguments(parser: Any) -> None:
    """The authorizer's command-line options (``logstore serve`` and ``logstore node``), read
    back by :func:`authorizer_options`."""
    parser.add_argument("--authorizer", action="store_true",
                        help="check every request against the ACLs (Kafka's authorizer.class.name; "
                             "managed with CreateAcls/DeleteAcls, or 'logstore acls' on a single store)")
    parser.add_argument("--super-users", default="", metavar="User:A;User:B",
                        help="principals that may do everything (Kafka's super.users)")
    parser.add_argument("--allow-everyone-if-no-acl-found", action="store_true",
                        help="a resource without ACLs is open to everyone (Kafka's allow.everyone.if.no.acl.found)")


def authorizer_options(args: Any) -> dict[str, Any]:
    """KafkaServer's authorizer arguments from parsed :func:`add_authorizer_arguments` options
    (none without ``--authorizer``)."""
    if not args.authorizer:
        return {}
    return {"authorizer": True, "allow_everyone_if_no_acl_found": args.allow_everyone_if_no_acl_found,
            "super_users": [u.strip() for u in args.super_users.split(";") if u.strip()]}


def add_remote_storage_arguments(parser: Any) -> None:
    """Tiered storage's command-line options (``logstore serve``), by Kafka's broker setting
    names, read back by :func:`remote_storage_options`."""
    parser.add_argument("--remote-storage", metavar="URL",
                        help="the object store that topics with remote.storage.enable=true copy their sealed "
                             "segments to (tiered storage): file:///path, s3://bucket, gs://bucket, az://container; "
                             "remembered in the store (without credentials) for its later opens. S3 credentials "
                             "come from the environment as the AWS tools read them")
    parser.add_argument("--remote-storage-option", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of --remote-storage's object store (repeat), obstore's names, e.g. "
                             "endpoint=http://127.0.0.1:8333, region=us-east-1, allow_http=true")
    parser.add_argument("--remote-log-manager-task-interval-ms", type=int, metavar="MS",
                        help="how often each tiered partition's copy and expiration run (Kafka's "
                             "remote.log.manager.task.interval.ms; default 30000)")
    parser.add_argument("--remote-fetch-max-wait-ms", type=int, metavar="MS",
                        help="how long a fetch waits for a read from the object store before it answers without "
                             "that partition's records (Kafka's remote.fetch.max.wait.ms; default 500)")
    parser.add_argument("--remote-log-index-cache-size-bytes", type=int, metavar="BYTES",
                        help="the bound of the remote segments' indexes kept in memory (Kafka's "
                             "remote.log.index.file.cache.total.size.bytes; default 1 GiB)")


def remote_storage_options(args: Any) -> dict[str, Any]:
    """LogStore's tiered-storage arguments from parsed :func:`add_remote_storage_arguments`
    options (only those given).

    Raises:
        ValueError: a malformed ``--remote-storage-option``, or a value below 1.
    """
    options: dict[str, Any] = {}
    if args.remote_storage:
        options["remote_storage"] = args.remote_storage
    if args.remote_storage_option:
        options["remote_storage_options"] = parse_options(args.remote_storage_option)
    for name in ("remote_log_manager_task_interval_ms", "remote_fetch_max_wait_ms",
                 "remote_log_index_cache_size_bytes"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
            options[name] = value
    return options


def add_consumer_group_arguments(parser: Any) -> None:
    """The consumer group protocol's (KIP-848) command-line options (``logstore serve`` and
    ``logstore node``), by Kafka's setting names, read back by :func:`consumer_group_config`."""
    parser.add_argument("--group-coordinator-rebalance-protocols", default="classic,consumer", metavar="P,P",
                        help="the group protocols served: classic, and consumer (KIP-848) unless left out")
    parser.add_argument("--group-consumer-session-timeout-ms", type=int,
                        default=ConsumerGroupConfig.session_timeout_ms, metavar="MS",
                        help="a consumer-protocol member silent this long is fenced")
    parser.add_argument("--group-consumer-heartbeat-interval-ms", type=int,
                        default=ConsumerGroupConfig.heartbeat_interval_ms, metavar="MS",
                        help="how often consumer-protocol members heartbeat")
    parser.add_argument("--group-consumer-assignors", default=",".join(ConsumerGroupConfig.assignors),
                        metavar="A,A", help="the server-side assignors (uniform, range); the first is the default")
    parser.add_argument("--group-consumer-migration-policy", default=ConsumerGroupConfig.migration_policy,
                        type=str.lower, choices=MIGRATION_POLICIES,
                        help="whether classic groups become consumer groups (upgrade) and back (downgrade) as "
                             "their members change protocol")


def add_group_config_arguments(parser: Any) -> None:
    """``logstore serve``'s bounds of a consumer group's own configs, by Kafka's setting names,
    read back by :func:`group_config_bounds`."""
    for name, what in (("session-timeout", "a group's consumer.session.timeout.ms"),
                       ("heartbeat-interval", "a group's consumer.heartbeat.interval.ms")):
        for end in ("min", "max"):
            field = f"{end}_{name.replace('-', '_')}_ms"
            parser.add_argument(f"--group-consumer-{end}-{name}-ms", type=int, metavar="MS",
                                default=getattr(GroupConfigBounds, field), help=f"the {end}imum of {what}")


def group_config_bounds(args: Any) -> GroupConfigBounds:
    """The GroupConfigBounds of parsed :func:`add_group_config_arguments` options.

    Raises:
        ValueError: a minimum above its maximum, or below 1.
    """
    return GroupConfigBounds(args.group_consumer_min_session_timeout_ms, args.group_consumer_max_session_timeout_ms,
                             args.group_consumer_min_heartbeat_interval_ms,
                             args.group_consumer_max_heartbeat_interval_ms)


def consumer_group_config(args: Any) -> ConsumerGroupConfig | None:
    """The ConsumerGroupConfig of parsed :func:`add_consumer_group_arguments` options (None:
    the classic protocol only).

    Raises:
        ValueError: an unknown protocol or assignor.
    """
    protocols = {p.strip() for p in args.group_coordinator_rebalance_protocols.split(",") if p.strip()}
    if not protocols <= {"classic", "consumer"} or "classic" not in protocols:
        raise ValueError(f"group.coordinator.rebalance.protocols must be classic or classic,consumer, not "
                         f"{args.group_coordinator_rebalance_protocols}")
    if "consumer" not in protocols:
        return None
    return ConsumerGroupConfig(session_timeout_ms=args.group_consumer_session_timeout_ms,
                               heartbeat_interval_ms=args.group_consumer_heartbeat_interval_ms,
                               assignors=tuple(a.strip() for a in args.group_consumer_assignors.split(",")
                                               if a.strip()),
                               migration_policy=args.group_consumer_migration_policy)


def main(argv: Sequence[str] | None = None, prog: str = "logstore serve") -> int:
    """``logstore serve ROOT [--listen HOST:PORT] [--advertised-listener HOST:PORT] [--node-id N]
    [--sasl-credentials FILE] [--sasl-oauthbearer NAME=VALUE ...] [--sasl-mechanisms M,M]
    [--connections-max-reauth-ms MS] [--tls-cert F --tls-key F [--tls-ca F]] [--remote-storage URL
    [--remote-storage-option NAME=VALUE ...] [--remote-fetch-max-wait-ms MS] ...]``:
    print the bound address once it accepts, serve until SIGTERM or SIGINT, close cleanly."""
    parser = argparse.ArgumentParser(prog=prog, description="Serve a store to Kafka clients.")
    parser.add_argument("root", help="the store's directory (created if missing)")
    parser.add_argument("--listen", type=_address, default=("127.0.0.1", 9092), metavar="HOST:PORT")
    parser.add_argument("--advertised-listener", type=_address, metavar="HOST:PORT",
                        help="the address Metadata gives clients (default: the bound one)")
    parser.add_argument("--node-id", type=int, default=0)
    parser.add_argument("--no-auto-create-topics", action="store_true")
    parser.add_argument("--num-partitions", type=int, default=1, help="partitions of an auto-created topic")
    parser.add_argument("--allow-anonymous", action="store_true",
                        help="allow a non-loopback bind without authentication")
    add_sasl_arguments(parser)
    parser.add_argument("--tls-cert", metavar="FILE", help="PEM certificate (chain) of the listener: SSL")
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    parser.add_argument("--tls-ca", metavar="FILE",
                        help="require client certificates that chain to these PEM CA certificates")
    add_authorizer_arguments(parser)
    parser.add_argument("--fsync-acks-all", action="store_true",
                        help="answer acks=all produces once their batches are fsynced (transactions' too)")
    parser.add_argument("--group-initial-rebalance-delay-ms", type=int, default=0, metavar="MS",
                        help="how long a new group's first rebalance waits for more members (Kafka's "
                             "group.initial.rebalance.delay.ms; Kafka's default is 3000, logstore's 0)")
    add_transaction_arguments(parser)
    add_consumer_group_arguments(parser)
    add_group_config_arguments(parser)
    add_remote_storage_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_ca and not args.tls_cert):
        sys.stderr.write(f"{prog}: --tls-cert and --tls-key go together (--tls-ca needs them)\n")
        return 2
    if args.group_initial_rebalance_delay_ms < 0:
        sys.stderr.write(f"{prog}: --group-initial-rebalance-delay-ms must be >= 0\n")
        return 2
    logging.basicConfig(level=logging.WARNING, format=f"{prog}: %(levelname)s: %(message)s")
    try:
        txn_config = transaction_config(args)
        sasl = sasl_options(args)
        consumer_groups = consumer_group_config(args)
        bounds = group_config_bounds(args)
        store_options = remote_storage_options(args)
    except ValueError as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = KafkaServer(args.root, args.listen, advertised=args.advertised_listener, node_id=args.node_id,
                             auto_create_topics=not args.no_auto_create_topics, num_partitions=args.num_partitions,
                             allow_anonymous=args.allow_anonymous, fsync_acks_all=args.fsync_acks_all,
                             tls=TLSConfig(args.tls_cert, args.tls_key, args.tls_ca) if args.tls_cert else None,
                             group_initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
                             consumer_group_config=consumer_groups, group_config_bounds=bounds,
                             txn_config=txn_config, store_options=store_options, **sasl,
                             **authorizer_options(args))
    except (LogstoreError, OSError, ValueError) as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return 1
    with server:
        net.freeze_startup_heap()  # the start-up heap out of the collector's walks (see there)
        sys.stdout.write(f"serving {args.root} on {server.bootstrap_servers}\n")
        sys.stdout.flush()
        stop.wait()
    return 0
