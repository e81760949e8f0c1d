"""The network layer (net.py): framing with a cap checked before allocation, the handshake state
machine, muted connections (responses in order; a slow request holds up only its own
connection), no-response and deferred answers, limits, TLS, stop() and metrics.

Every server binds to 127.0.0.1 and is stopped by the fixture; waits are bounded.
"""

from __future__ import annotations

import ast
import os
import pathlib
import select
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future

import pytest

from logstore.net import server as net
from logstore._fileio import FileRegion

SECRET = b"HELLO open-sesame"
PRE_AUTH_CAP = 64
CAP = 1024


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


class _Handshake(net.Handshake):
    """Authenticated iff the first frame is SECRET; a wrong one is answered DENIED."""

    def receive(self, frame):
        if bytes(frame) != SECRET:
            raise net.HandshakeError("wrong secret", reply=framed(b"DENIED"))
        self.done = True
        self.principal = "alice"
        return framed(b"WELCOME")


class EchoProtocol(net.Protocol):
    """Frames are a 4-byte size + ``command:argument``. Commands: echo, sleep (``sleep:S:x``
    answers x after S seconds), big (``big:S:N``: N bytes after S seconds), whoami, none (no
    response), defer (answered 0.2 s later by a timer, through a Future), boom (the handler
    raises)."""

    header_size = 4

    def __init__(self, auth: bool = True) -> None:
        self.auth = auth
        self.lock = threading.Lock()
        self.running: dict[int, int] = {}       # session id -> handlers running now
        self.most_at_once: dict[int, int] = {}  # session id -> most handlers at once

    def frame_size(self, header, authenticated):
        (n,) = struct.unpack(">i", header)
        cap = CAP if authenticated else PRE_AUTH_CAP
        if n < 0 or n > cap:
            raise ValueError(f"a frame of {n} bytes is over the cap of {cap}")
        return n

    def handshake(self, session):
        return _Handshake() if self.auth else None

    def handle(self, session, request):
        with self.lock:
            self.running[session.id] = self.running.get(session.id, 0) + 1
            self.most_at_once[session.id] = max(self.most_at_once.get(session.id, 0), self.running[session.id])
        try:
            command, _, arg = bytes(request).partition(b":")
            if command == b"echo":
                return framed(arg)
            if command == b"sleep":
                seconds, _, value = arg.partition(b":")
                time.sleep(float(seconds))
                return [struct.pack(">i", len(value)), value]  # several buffers, written in order
            if command == b"big":  # big:S:N answers N bytes after S seconds
                seconds, _, size = arg.partition(b":")
                time.sleep(float(seconds))
                return framed(b"x" * int(size))
            if command == b"many":  # many:N answers N one-byte buffers (more than one sendmsg takes)
                n = int(arg)
                return [struct.pack(">i", n)] + [b"y"] * n
            if command == b"file":  # file:N answers N bytes of a file, as a region (sendfile)
                n = int(arg)
                with tempfile.TemporaryFile() as f:
                    f.write(b"<" + _pattern(n) + b">")
                    f.flush()
                    region = FileRegion(os.dup(f.fileno()), 1, n)  # the file is unlinked: the dup keeps it
                return [struct.pack(">i", n + 2), b"[", region, b"]"]
            if command == b"whoami":
                return framed(f"{session.principal} tls={session.tls}".encode())
            if command == b"none":
                return None
            if command == b"defer":
                future: Future = Future()
                threading.Timer(0.2, future.set_result, args=(framed(arg),)).start()
                return future
            raise RuntimeError(f"unknown command {command!r}")
        finally:
            with self.lock:
                self.running[session.id] -= 1


@pytest.fixture
def serve():
    """Factory of started servers on 127.0.0.1, all stopped after the test."""
    servers = []

    def make(protocol=None, **kw):
        server = net.Server(("127.0.0.1", 0), protocol or EchoProtocol(), name="test", **kw).start()
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


def recv_exactly(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def recv_frame(sock):
    (n,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, n)


def connect(server, auth=True, tls=None, timeout=5.0):
    sock = socket.create_connection(server.address, timeout=timeout)
    if tls is not None:
        sock = tls.wrap_socket(sock)
    if auth:
        sock.sendall(framed(SECRET))
        assert recv_frame(sock) == b"WELCOME"
    return sock


def call(sock, body):
    sock.sendall(framed(body))
    return recv_frame(sock)


def hung_up(sock):
    """True when the server closed the connection (orderly, or reset: our bytes were unread)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _pattern(n):
    """n bytes counting 0..250 over and over (built whole: a generator of 4 Mi items takes
    seconds under ASan with the system allocator, longer than the tests wait)."""
    return (bytes(range(251)) * (n // 251 + 1))[:n]


def wait_for(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached")


def metric(server, name):
    for key, value in server.metrics().items():
        if key.endswith("name=" + name):
            return value
    raise KeyError(name)


# ---------------------------------------------------------------------- requests and answers
def test_requests_are_answered_after_the_handshake_with_its_principal(serve):
    server = serve()
    with connect(server) as s:
        assert call(s, b"echo:hello") == b"hello"
        assert call(s, b"whoami") == b"alice tls=False"
    without = serve(EchoProtocol(auth=False))
    with connect(without, auth=False) as s:
        assert call(s, b"whoami") == b"None tls=False"


def test_responses_stay_in_request_order_on_one_connection(serve):
    protocol = EchoProtocol()
    server = serve(protocol)
    with connect(server) as s:
        # Pipelined: the slow first request must not be overtaken by the quick ones.
        s.sendall(b"".join(framed(b) for b in (b"sleep:0.3:a", b"echo:b", b"sleep:0.1:c", b"echo:d")))
        assert [recv_frame(s) for _ in range(4)] == [b"a", b"b", b"c", b"d"]
    # Muted while a request is in a worker: never two handlers at once for one connection.
    assert set(protocol.most_at_once.values()) == {1}


def test_a_slow_handler_holds_up_only_its_own_connection(serve):
    server = serve()
    slow, quick = connect(server), connect(server)
    try:
        slow.sendall(framed(b"sleep:1.5:slow"))
        time.sleep(0.1)  # the slow request is in its handler
        started = time.monotonic()
        for i in range(5):
            assert call(quick, b"echo:%d" % i) == b"%d" % i
        assert time.monotonic() - started < 1.0
        assert recv_frame(slow) == b"slow"
    finally:
        slow.close()
        quick.close()


def test_no_response_unmutes_the_connection_and_deferred_answers_arrive_in_order(serve):
    server = serve()
    with connect(server) as s:
        s.sendall(framed(b"none") + framed(b"defer:later") + framed(b"echo:after"))
        assert recv_frame(s) == b"later"   # "none" got nothing, and did not hold the connection
        assert recv_frame(s) == b"after"
    assert metric(server, "request-total") == 3
    wait_for(lambda: metric(server, "response-total") == 2)   # counted by the loop once it heard


class InlineProtocol(EchoProtocol):
    """EchoProtocol whose echo and defer requests are run on the loop (they never block)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: dict[bytes, str] = {}

    def inline(self, session, request):
        return bytes(request).split(b":")[0] in (b"echo", b"defer")

    def handle(self, session, request):
        self.threads[bytes(request).split(b":")[0]] = threading.current_thread().name
        return super().handle(session, request)


def test_requests_the_protocol_calls_non_blocking_are_answered_on_the_loop(serve):
    protocol = InlineProtocol()
    server = serve(protocol, thread_name="inline-loop")
    with connect(server) as s:
        # Pipelined, mixing the loop's requests with a worker's and a deferred answer.
        s.sendall(b"".join(framed(b) for b in (b"sleep:0.2:a", b"echo:b", b"defer:c", b"echo:d")))
        assert [recv_frame(s) for _ in range(4)] == [b"a", b"b", b"c", b"d"]
        assert call(s, b"echo:again") == b"again"
    assert protocol.threads[b"echo"] == "inline-loop"
    assert protocol.threads[b"defer"] == "inline-loop"
    assert protocol.threads[b"sleep"].startswith("inline-loop-worker")
    assert metric(server, "request-total") == 5
    wait_for(lambda: metric(server, "response-total") == 5)


class OffloadingProtocol(EchoProtocol):
    """EchoProtocol whose ``try:`` requests go to the loop, which answers ``try:now:x`` itself
    and hands ``try:wait:x`` (``x`` once the test's gate opens), ``try:fail`` (raises on the
    worker) and ``try:later:x`` (a Future settled 0.1 s later) to a worker (an Offload). On a
    worker (the frames of a burst after an offloaded one), ``handle`` answers them all."""

    def __init__(self) -> None:
        super().__init__(auth=False)  # (frames read in bursts: no handshake to re-check per frame)
        self.gate = threading.Event()
        self.threads: list[tuple[bytes, str]] = []

    def inline(self, session, request):
        return bytes(request).startswith(b"try:")

    def handle_inline(self, session, request):
        kind, _, value = bytes(request)[4:].partition(b":")
        self.threads.append((b"inline " + kind, threading.current_thread().name))
        if kind == b"now":
            return framed(value)
        return net.Offload(lambda: self._answer(b"offloaded ", kind, value))

    def handle(self, session, request):
        if bytes(request).startswith(b"try:"):
            kind, _, value = bytes(request)[4:].partition(b":")
            return self._answer(b"handled ", kind, value)
        return super().handle(session, request)

    def _answer(self, how, kind, value):
        self.threads.append((how + kind, threading.current_thread().name))
        if kind == b"now":
            return framed(value)
        if kind == b"wait":
            assert self.gate.wait(10)
            return framed(value)
        if kind == b"later":
            future: Future = Future()
            threading.Timer(0.1, future.set_result, args=(framed(value),)).start()
            return future
        raise RuntimeError("the offloaded call failed")


def test_an_inline_request_that_would_wait_is_answered_by_a_worker_in_order(serve):
    protocol = OffloadingProtocol()
    server = serve(protocol, thread_name="offload-loop")
    with connect(server, auth=False) as s, connect(server, auth=False) as other:
        s.sendall(b"".join(framed(b) for b in (b"try:now:a", b"try:wait:b", b"try:now:c", b"try:later:d",
                                               b"echo:e")))
        # The loop is free while the offloaded call waits: another connection is answered.
        for i in range(3):
            assert call(other, b"try:now:%d" % i) == b"%d" % i
        assert select.select([s], [], [], 0.2)[0] == []  # "a" leaves with "b", which waits
        protocol.gate.set()
        assert [recv_frame(s) for _ in range(5)] == [b"a", b"b", b"c", b"d", b"e"]
        assert call(s, b"try:now:again") == b"again"  # the connection is the loop's again
    seen = protocol.threads
    assert seen[:2] == [(b"inline now", "offload-loop"), (b"inline wait", "offload-loop")]
    worker = [name for how, name in seen if how.startswith((b"offloaded", b"handled"))]
    assert [how for how, _ in seen if how.startswith((b"offloaded", b"handled"))] == [
        b"offloaded wait", b"handled now", b"handled later"]  # the burst's rest on the same worker
    assert len(set(worker)) == 1 and worker[0].startswith("offload-loop-worker")
    assert seen[-1] == (b"inline now", "offload-loop")


def test_an_offloaded_call_that_raises_closes_only_its_connection_after_the_earlier_answers(serve):
    server = serve(OffloadingProtocol())
    with connect(server, auth=False) as s, connect(server, auth=False) as other:
        s.sendall(framed(b"try:now:a") + framed(b"try:fail") + framed(b"try:now:never"))
        assert recv_frame(s) == b"a"
        assert hung_up(s)
        assert call(other, b"try:now:still") == b"still"


def test_an_answer_of_more_buffers_than_one_sendmsg_takes_is_written_whole(serve):
    server = serve()
    with connect(server) as s:
        assert call(s, b"many:3000") == b"y" * 3000
        assert call(s, b"echo:next") == b"next"


def test_a_connection_closed_by_its_peer_while_its_request_runs_is_closed_after(serve):
    """The peer's close arrives while the connection is muted: the loop notices it once the
    answer is written (the connection does not linger, and the server keeps serving)."""
    server = serve()
    s = connect(server)
    s.sendall(framed(b"sleep:0.3:gone"))
    time.sleep(0.05)
    s.close()
    wait_for(lambda: metric(server, "connection-count") == 0, timeout=5)
    with connect(server) as other:
        assert call(other, b"echo:still here") == b"still here"


# ---------------------------------------------------------------------- failures close one connection
@pytest.mark.parametrize("authenticated, size", [(False, PRE_AUTH_CAP + 1), (True, CAP + 1), (True, 2**31 - 1),
                                                 (True, -1)])
def test_a_frame_over_the_cap_closes_only_its_connection(serve, authenticated, size):
    server = serve()
    bystander = connect(server)
    try:
        offender = connect(server, auth=authenticated)
        offender.sendall(struct.pack(">i", size) + b"\0" * 8)
        assert hung_up(offender)
        offender.close()
        assert call(bystander, b"echo:still here") == b"still here"
        wait_for(lambda: len(server.sessions()) == 1)
    finally:
        bystander.close()


def test_a_handler_that_raises_closes_only_its_connection(serve):
    server = serve()
    with connect(server) as bad, connect(server) as good:
        bad.sendall(framed(b"boom"))
        assert hung_up(bad)
        assert call(good, b"echo:fine") == b"fine"


def test_a_failed_handshake_gets_its_reply_then_the_connection_closes(serve):
    server = serve()
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(framed(b"HELLO wrong"))
        assert recv_frame(s) == b"DENIED"
        assert hung_up(s)
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(framed(b"echo:skipping the handshake"))  # a request before authenticating
        assert recv_frame(s) == b"DENIED"
        assert hung_up(s)
    wait_for(lambda: metric(server, "failed-authentication-total") == 2)
    assert metric(server, "successful-authentication-total") == 0
    assert metric(server, "request-total") == 0


class _SlowCloseHandshake(_Handshake):
    def receive(self, frame):
        if bytes(frame) != SECRET:
            raise net.HandshakeError("wrong secret", reply=framed(b"DENIED"), close_delay_s=0.3)
        return super().receive(frame)


class SlowCloseProtocol(EchoProtocol):
    def handshake(self, session):
        return _SlowCloseHandshake()


def test_a_failed_handshake_may_close_after_a_delay_reading_nothing_meanwhile(serve):
    server = serve(SlowCloseProtocol())
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(framed(b"HELLO wrong"))
        assert recv_frame(s) == b"DENIED"
        started = time.monotonic()
        s.sendall(framed(SECRET))  # too late: not read
        assert hung_up(s)
        assert 0.25 <= time.monotonic() - started < 2.0
    assert metric(server, "failed-authentication-total") == 1
    assert metric(server, "successful-authentication-total") == 0
    assert metric(server, "connection-expired-total") == 0
    wait_for(lambda: metric(server, "connection-count") == 0)


# ---------------------------------------------------------------------- limits
def test_a_connection_that_does_not_finish_its_handshake_in_time_is_closed(serve):
    server = serve(limits=net.Limits(handshake_timeout_s=0.3))
    started = time.monotonic()
    with socket.create_connection(server.address, timeout=5) as silent, \
            socket.create_connection(server.address, timeout=5) as dripping:
        dripping.sendall(struct.pack(">i", len(SECRET)))  # the size, then nothing more
        assert hung_up(silent) and hung_up(dripping)
    assert 0.25 <= time.monotonic() - started < 2.0
    assert metric(server, "connection-expired-total") == 2


def test_idle_connections_are_closed_but_not_while_their_request_runs(serve):
    server = serve(limits=net.Limits(idle_timeout_s=0.3))
    with connect(server) as busy:
        assert call(busy, b"sleep:0.6:done") == b"done"   # longer than the idle timeout
        started = time.monotonic()
        assert hung_up(busy)                              # then idle: closed
        assert 0.2 <= time.monotonic() - started < 2.0


def test_a_large_answer_to_a_slow_request_is_written_whole_past_the_idle_timeout(serve):
    """The answer is larger than the socket buffers take at once, and comes after longer than
    the idle timeout: the loop writes the rest as the client reads, and the idle clock starts
    with the answer, not with the request."""
    server = serve(limits=net.Limits(idle_timeout_s=0.5))
    size = 16 << 20
    with connect(server) as s:
        s.sendall(framed(b"big:1.0:%d" % size))
        time.sleep(1.2)   # the answer waits, partly written, for 0.2 s before we read (0.3 s to spare)
        assert recv_frame(s) == b"x" * size
        assert call(s, b"echo:then") == b"then"
    assert metric(server, "outgoing-byte-total") >= size


def test_connections_over_max_connections_are_refused(serve):
    server = serve(limits=net.Limits(max_connections=2))
    a, b = connect(server), connect(server)
    try:
        with socket.create_connection(server.address, timeout=5) as third:
            assert hung_up(third)
        assert metric(server, "connection-refused-total") == 1
        a.close()
        wait_for(lambda: len(server.sessions()) == 1)
        with connect(server) as c:
            assert call(c, b"echo:in") == b"in"
        assert call(b, b"echo:b") == b"b"
    finally:
        a.close()
        b.close()


def test_a_connection_keeps_its_slot_until_its_handler_returns(serve):
    server = serve(limits=net.Limits(max_connections=1))
    s = connect(server)
    s.sendall(framed(b"sleep:0.6:x"))
    time.sleep(0.1)
    s.close()   # the handler goes on; its slot is not free yet
    with socket.create_connection(server.address, timeout=5) as early:
        assert hung_up(early)
    wait_for(lambda: server.sessions() == [], timeout=5)  # the handler returned
    with connect(server) as late:
        assert call(late, b"echo:ok") == b"ok"


def test_limits_are_checked():
    with pytest.raises(ValueError):
        net.Limits(max_connections=0)
    with pytest.raises(ValueError):
        net.Limits(idle_timeout_s=0)
    with pytest.raises(ValueError):
        net.Limits(handshake_timeout_s=-1)


@pytest.mark.parametrize("size", [0, 1000, 3 << 20])
def test_a_file_region_in_an_answer_is_written_with_sendfile_and_closed(serve, size):
    server = serve()
    fds = len(os.listdir("/proc/self/fd"))
    with connect(server) as s:
        assert call(s, b"file:%d" % size) == b"[" + _pattern(size) + b"]"
        assert call(s, b"echo:after") == b"after"
    wait_for(lambda: len(os.listdir("/proc/self/fd")) <= fds)  # every region's descriptor closed


def test_a_file_region_for_a_closed_connection_is_closed(serve):
    server = serve()
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        s = connect(server)
        s.sendall(framed(b"file:%d" % (4 << 20)))  # more than the socket takes: the loop finishes it
        s.close()
    wait_for(lambda: metric(server, "connection-count") == 0)
    wait_for(lambda: len(os.listdir("/proc/self/fd")) <= fds)


# ---------------------------------------------------------------------- TLS
def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """Server and client contexts of a private CA (client certificates required)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path_factory.mktemp("net-pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ca", cwd=d)
    for name in ("server", "client"):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", cwd=d)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.verify_mode = ssl.CERT_REQUIRED
    server.load_cert_chain(d / "server.pem", d / "server.key")
    server.load_verify_locations(d / "ca.pem")
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.load_cert_chain(d / "client.pem", d / "client.key")
    client.load_verify_locations(d / "ca.pem")
    return server, client


def test_tls_round_trip_and_plain_clients_are_refused(serve, tls):
    server_ctx, client_ctx = tls
    server = serve(tls=server_ctx)
    with connect(server, tls=client_ctx) as s:
        assert call(s, b"whoami") == b"alice tls=True"
        big = b"x" * (CAP - 10)
        assert call(s, b"echo:" + big) == big
        # Pipelined over TLS: the second frame may sit decrypted in the TLS buffer.
        s.sendall(framed(b"echo:one") + framed(b"echo:two"))
        assert (recv_frame(s), recv_frame(s)) == (b"one", b"two")
    with socket.create_connection(server.address, timeout=5) as plain:
        plain.sendall(framed(SECRET))
        assert hung_up(plain)
    with connect(server, tls=client_ctx) as s:  # still serving
        assert call(s, b"echo:again") == b"again"
        assert call(s, b"file:100000") == b"[" + _pattern(100000) + b"]"  # read, not sendfile


# ---------------------------------------------------------------------- stop and metrics
def test_stop_closes_every_connection_and_the_listener(serve):
    server = serve()
    idle, busy = connect(server), connect(server)
    handshaking = socket.create_connection(server.address, timeout=5)
    busy.sendall(framed(b"sleep:0.3:never delivered"))
    time.sleep(0.1)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 3.0
    assert hung_up(idle) and hung_up(busy) and hung_up(handshaking)
    for s in (idle, busy, handshaking):
        s.close()
    with pytest.raises(OSError):
        socket.create_connection(server.address, timeout=2).close()
    assert server.sessions() == []
    server.stop()  # idempotent


def test_a_server_never_started_can_be_stopped():
    server = net.Server(("127.0.0.1", 0), EchoProtocol())
    server.stop()
    with pytest.raises(OSError):
        socket.create_connection(server.address, timeout=2).close()


def test_metrics_count_connections_requests_and_bytes(serve):
    server = serve()
    with connect(server) as s:
        assert call(s, b"echo:abc") == b"abc"
        assert call(s, b"echo:") == b""
        wait_for(lambda: metric(server, "connection-count") == 1)
    wait_for(lambda: metric(server, "connection-close-total") == 1)
    m = {key.rpartition("name=")[2]: value for key, value in server.metrics().items()}
    sent = len(framed(SECRET)) + len(framed(b"echo:abc")) + len(framed(b"echo:"))
    received = len(framed(b"WELCOME")) + len(framed(b"abc")) + len(framed(b""))
    assert m == {"connection-count": 0, "connection-creation-total": 1, "connection-close-total": 1,
                 "successful-authentication-total": 1, "failed-authentication-total": 0,
                 "successful-reauthentication-total": 0, "failed-reauthentication-total": 0,
                 "expired-connections-killed-count": 0,
                 "request-total": 2, "response-total": 2, "incoming-byte-total": sent,
                 "outgoing-byte-total": received, "connection-refused-total": 0,
                 "connection-expired-total": 0, "spare-buffer-bytes": 0, "RequestQueueSize": 0}
    assert "kafka.server:type=socket-server-metrics,listener=test,name=connection-count" in server.metrics()


def test_net_imports_nothing_above_the_base_layer():
    import logstore.net.server as module

    tree = ast.parse(pathlib.Path(module.__file__).read_text())
    ours = {node.module or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level > 0
            for alias in node.names}
    # the worker pool and the protocol contract, beside the server in net/, import nothing
    # above the base; _fileio (base) for the file regions an answer may hold, written with sendfile
    assert ours == {"errors", "workers", "_fileio", "protocol"}


def test_the_worker_pool_imports_nothing_of_logstore():
    import logstore.net.workers as module

    tree = ast.parse(pathlib.Path(module.__file__).read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level > 0]


# ---------------------------------------------------------------------- bursts of pipelined requests
class LoggingEcho(EchoProtocol):
    """EchoProtocol that logs every request it handles, in order: (session id, request)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[int, bytes]] = []

    def handle(self, session, request):
        with self.lock:
            self.log.append((session.id, bytes(request)))
        return super().handle(session, request)


def test_a_pipelined_burst_is_answered_in_order_around_no_response_and_deferred_answers(serve):
    protocol = EchoProtocol()
    server = serve(protocol)
    with connect(server) as s:
        s.sendall(b"".join(framed(b) for b in (b"echo:a", b"none", b"defer:b", b"echo:c", b"sleep:0.05:d",
                                                b"many:3", b"defer:e", b"file:5", b"echo:f")))
        assert [recv_frame(s) for _ in range(8)] == [b"a", b"b", b"c", b"d", b"yyy", b"e", b"[" + _pattern(5) + b"]",
                                                     b"f"]
        assert call(s, b"echo:again") == b"again"
    assert set(protocol.most_at_once.values()) == {1}  # one handler at a time per connection, as before
    assert metric(server, "request-total") == 10
    wait_for(lambda: metric(server, "response-total") == 9)


def test_a_burst_over_the_burst_bound_is_answered_whole_and_in_order(serve):
    server = serve()
    n = net.BURST_FRAMES * 3 + 5
    with connect(server) as s:
        s.sendall(b"".join(framed(b"echo:%d" % i) for i in range(n)))
        assert [recv_frame(s) for _ in range(n)] == [b"%d" % i for i in range(n)]
    wait_for(lambda: metric(server, "response-total") == n)


def test_a_handler_failing_inside_a_burst_closes_only_its_connection_after_the_earlier_answers(serve):
    protocol = LoggingEcho()
    server = serve(protocol)
    other = connect(server)
    try:
        with connect(server) as s:
            s.sendall(b"".join(framed(b) for b in (b"echo:a", b"defer:b", b"echo:c", b"boom", b"echo:never")))
            assert [recv_frame(s) for _ in range(3)] == [b"a", b"b", b"c"]
            assert hung_up(s)
        assert b"echo:never" not in [r for _, r in protocol.log]  # nothing after the failure is handled
        assert call(other, b"echo:still") == b"still"
    finally:
        other.close()


def test_an_oversized_frame_inside_a_burst_closes_its_connection_after_the_earlier_answers(serve):
    server = serve()
    other = connect(server)
    try:
        with connect(server) as s:
            s.sendall(framed(b"echo:a") + framed(b"sleep:0.05:b") + struct.pack(">i", CAP + 1) + b"x" * 16)
            assert [recv_frame(s) for _ in range(2)] == [b"a", b"b"]
            assert hung_up(s)
        assert call(other, b"echo:still") == b"still"
    finally:
        other.close()


def test_a_connection_pipelining_many_requests_does_not_starve_another(serve):
    protocol = LoggingEcho()
    server = serve(protocol)
    busy, quiet = connect(server), connect(server)
    try:
        n = 400
        busy.sendall(b"".join(framed(b"sleep:0.003:x") for _ in range(n)))  # over a second of handler time
        wait_for(lambda: len(protocol.log) >= 5)
        assert call(quiet, b"echo:q") == b"q"
        requests = [r for _, r in protocol.log]
        # Answered between two bursts of the busy connection, not after all of them.
        assert requests.index(b"echo:q") < n
        assert [recv_frame(busy) for _ in range(n)] == [b"x"] * n
    finally:
        busy.close()
        quiet.close()


def test_a_burst_on_a_tls_connection_is_answered_in_order(serve, tls):
    server_ctx, client_ctx = tls
    server = serve(tls=server_ctx)
    with connect(server, tls=client_ctx) as s:
        s.sendall(b"".join(framed(b) for b in (b"echo:a", b"defer:b", b"file:3", b"echo:c")))
        assert [recv_frame(s) for _ in range(4)] == [b"a", b"b", b"[" + _pattern(3) + b"]", b"c"]


class DoneFutureEcho(LoggingEcho):
    """``ready:x`` answers x through a Future that is done already; ``failed`` through one that
    failed already."""

    def handle(self, session, request):
        command, _, arg = bytes(request).partition(b":")
        if command in (b"ready", b"failed"):
            with self.lock:
                self.log.append((session.id, bytes(request)))
            future: Future = Future()
            if command == b"ready":
                future.set_result(framed(arg))
            else:
                future.set_exception(RuntimeError("failed already"))
            return future
        return super().handle(session, request)


def test_a_deferred_answer_done_already_is_written_with_its_burst(serve):
    protocol = DoneFutureEcho()
    server = serve(protocol)
    with connect(server) as s:
        s.sendall(b"".join(framed(b) for b in (b"echo:a", b"ready:b", b"echo:c", b"ready:d")))
        assert [recv_frame(s) for _ in range(4)] == [b"a", b"b", b"c", b"d"]
    with connect(server) as s:
        s.sendall(b"".join(framed(b) for b in (b"ready:e", b"failed", b"echo:never")))
        assert recv_frame(s) == b"e"
        assert hung_up(s)
    assert b"echo:never" not in [r for _, r in protocol.log]
    wait_for(lambda: metric(server, "response-total") == 5)


def _serves_two(server):
    """Whether two connections at once are served now (each slot free)."""
    try:
        with connect(server) as one, connect(server) as two:
            return call(one, b"echo:1") == b"1" and call(two, b"echo:2") == b"2"
    except OSError:
        return False


def test_a_connection_closed_while_a_bursts_deferred_answer_waits_gives_its_slot_back(serve):
    server = serve(limits=net.Limits(max_connections=2))
    for _ in range(3):  # more times than there are slots
        wait_for(lambda: metric(server, "connection-count") == 0)  # (the last check's connections are closed)
        s = connect(server)
        # A large first answer the peer does not read (it stays queued on the server), then a
        # deferred one: the connection closes while the deferred answer is still awaited.
        s.sendall(framed(b"big:0:8000000") + framed(b"defer:b"))
        assert struct.unpack(">i", recv_exactly(s, 4))[0] == 8_000_000
        s.close()
        # Once the deferred answer (0.2 s) is done, its slot is free again.
        wait_for(lambda: _serves_two(server))
    # (the last check's two connections close asynchronously: the server sees them go first)
    wait_for(lambda: metric(server, "connection-count") == 0)
    assert _serves_two(server)


def test_a_bad_frame_after_requests_without_response_closes_the_connection(serve):
    """A burst of no-response requests (acks=0) then a frame over the cap: nothing after it is
    read as frames (the rest of the refused frame would be parsed as requests); the connection
    closes."""
    server = serve()
    offender = connect(server)
    offender.sendall(framed(b"none:") + struct.pack(">i", CAP + 1))
    time.sleep(0.3)
    try:
        offender.sendall(framed(b"echo:inside the refused frame"))
    except OSError:
        pass  # (closed already)
    assert hung_up(offender)
    offender.close()


def test_a_write_stalled_before_a_deferred_answer_is_closed_by_the_idle_timeout(serve):
    """A peer that pipelines a large answer and a deferred one, then stops reading, holds a
    connection slot only until the idle timeout (not for ever: the burst stays in flight while
    its earlier answers wait to be written)."""
    server = serve(limits=net.Limits(max_connections=4, idle_timeout_s=1.0))
    stalled = connect(server)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.sendall(framed(b"big:0:8000000") + framed(b"defer:late"))  # and never reads
    try:
        wait_for(lambda: metric(server, "connection-count") == 0, timeout=10)
    finally:
        stalled.close()


class _RawSizes(EchoProtocol):
    """A protocol breaking frame_size's contract: it returns a negative size as it is."""

    def frame_size(self, header, authenticated):
        return struct.unpack(">i", header)[0]

    def handle(self, session, request):
        return None if not request else super().handle(session, request)  # (an empty frame: no answer)


def test_a_negative_frame_size_closes_the_connection_even_if_the_protocol_passes_it(serve):
    server = serve(_RawSizes(auth=False))
    offender = connect(server, auth=False)
    offender.sendall(struct.pack(">i", -4))  # (read back from where it starts, the size would loop for ever)
    assert hung_up(offender)
    offender.close()
    bystander = connect(server, auth=False)
    assert call(bystander, b"echo:fine") == b"fine"
    bystander.close()


def test_a_connection_pipelining_loop_answered_requests_does_not_keep_others_waiting(serve):
    """Requests answered on the loop (inline) come back as the connection's next burst is read:
    such a connection, pipelining without end, gets one burst per turn of the loop, and another
    connection is accepted and answered meanwhile."""
    server = serve(InlineProtocol())
    busy = connect(server, timeout=10)
    stop = threading.Event()
    batch = framed(b"echo:x") * 2000

    def write() -> None:
        while not stop.is_set():
            try:
                busy.sendall(batch)
            except OSError:
                return

    def read() -> None:
        while not stop.is_set():
            try:
                if not busy.recv(1 << 20):
                    return
            except OSError:
                return

    threads = [threading.Thread(target=write, daemon=True), threading.Thread(target=read, daemon=True)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        for _ in range(3):
            quiet = connect(server, timeout=10)
            assert call(quiet, b"sleep:0:answered") == b"answered"
            quiet.close()
    finally:
        stop.set()
        busy.close()
        for t in threads:
            t.join(5)


def test_freeze_startup_heap_takes_the_heap_out_of_collections_and_keeps_collecting_new_cycles():
    """``freeze_startup_heap``: what the process held (the imported modules: thousands of
    objects) is frozen, out of the collections' walks; a cycle made after is collected as before.
    In a child: it is process-wide."""
    code = (
        "import gc, weakref\n"
        "from logstore.net import server as net\n"
        "net.freeze_startup_heap()\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
        "class Node: pass\n"
        "a, b = Node(), Node()\n"
        "a.other, b.other = b, a\n"
        "gone = weakref.ref(a)\n"
        "del a, b\n"
        "gc.collect()\n"
        "assert gone() is None\n"
        "print('ok', gc.get_freeze_count())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("ok "), out.stderr
