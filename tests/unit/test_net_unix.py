"""The network layer (net.py) on a Unix domain socket: requests and answers on several
connections, a path longer than sun_path (bound and connected through its directory), stop()
removing the socket file, an existing file refusing the bind, an oversized frame closing only its
connection, TLS, and a file region written with sendfile.

Every server listens in tmp_path and is stopped by the fixture; waits are bounded. The protocol
and the client helpers follow test_net.py's (a subset, kept here so that the files stand alone).
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import ssl
import stat
import struct
import subprocess
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
    """Frames are a 4-byte size + ``command:argument`` (as in test_net.py). Commands: echo,
    sleep (``sleep:S:x`` answers x after S seconds), defer (answered 0.2 s later through a
    Future), whoami, file (``file:N``: N bytes of a file as a region, between brackets), boom
    (the handler raises)."""

    header_size = 4

    def frame_size(self, header, authenticated):
        (n,) = struct.unpack(">i", header)
        cap = CAP if authenticated else PRE_AUTH_CAP
        if n < 0 or n > cap:
            raise ValueError(f"a frame of {n} bytes is over the cap of {cap}")
        return n

    def handshake(self, session):
        return _Handshake()

    def handle(self, session, request):
        command, _, arg = bytes(request).partition(b":")
        if command == b"echo":
            return framed(arg)
        if command == b"sleep":
            seconds, _, value = arg.partition(b":")
            time.sleep(float(seconds))
            return [struct.pack(">i", len(value)), value]
        if command == b"defer":
            future: Future = Future()
            threading.Timer(0.2, future.set_result, args=(framed(arg),)).start()
            return future
        if command == b"whoami":
            return framed(f"{session.principal} tls={session.tls}".encode())
        if command == b"file":
            n = int(arg)
            with tempfile.TemporaryFile() as f:
                f.write(b"<" + _pattern(n) + b">")
                f.flush()
                region = FileRegion(os.dup(f.fileno()), 1, n)  # the file is unlinked: the dup keeps it
            return [struct.pack(">i", n + 2), b"[", region, b"]"]
        raise RuntimeError(f"unknown command {command!r}")


def _pattern(n):
    return (bytes(range(251)) * (n // 251 + 1))[:n]


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


def call(sock, body):
    sock.sendall(framed(body))
    return recv_frame(sock)


def hung_up(sock):
    """True when the server closed the connection (orderly, or reset: our bytes were unread)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


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


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """Server and client contexts of a private CA (client certificates required)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path_factory.mktemp("net-unix-pki")
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


@pytest.fixture
def serve_unix(tmp_path):
    """Factory of started servers on a Unix socket (tmp_path/<name> unless a path is given),
    all stopped after the test."""
    servers = []

    def make(path=None, protocol=None, **kw):
        server = net.Server(path if path is not None else tmp_path / "logstore.sock", protocol or EchoProtocol(),
                            name="test", **kw).start()
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


def connect(server, auth=True, tls=None, timeout=5.0):
    sock = net.connect_unix(server.address, timeout=timeout)
    if tls is not None:
        sock = tls.wrap_socket(sock)
    if auth:
        sock.sendall(framed(SECRET))
        assert recv_frame(sock) == b"WELCOME"
    return sock


def is_socket(path):
    """Whether a socket file is at ``path`` (which may be longer than sun_path: lstat does not care)."""
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def long_path(tmp_path):
    """A socket path of more than 107 bytes (the most sun_path holds) under tmp_path."""
    directory = tmp_path
    while len(os.fsencode(str(directory))) <= 120:
        directory = directory / ("d" * 40)
    directory.mkdir(parents=True)
    path = directory / "logstore.sock"
    assert len(os.fsencode(str(path))) > 107
    return path


# ---------------------------------------------------------------------- requests and answers
def test_requests_on_two_connections_are_answered_over_a_unix_socket(serve_unix, tmp_path):
    path = tmp_path / "logstore.sock"
    server = serve_unix(path)
    assert server.address == str(path) and isinstance(server.address, str)
    assert is_socket(path)
    with connect(server) as a, connect(server) as b:
        for i in range(5):
            assert call(a, b"echo:a%d" % i) == b"a%d" % i
            assert call(b, b"echo:b%d" % i) == b"b%d" % i
        # Pipelined on one connection while the other asks: answers stay in order.
        a.sendall(b"".join(framed(x) for x in (b"sleep:0.2:one", b"echo:two", b"defer:three")))
        assert call(b, b"whoami") == b"alice tls=False"
        assert [recv_frame(a) for _ in range(3)] == [b"one", b"two", b"three"]
        # No TCP peer: the session holds what accept() returned, and nothing in net.py minded.
        peers = [session.peer for session in server.sessions()]
        assert len(peers) == 2 and not any(isinstance(peer, tuple) for peer in peers)
    assert metric(server, "connection-creation-total") == 2
    assert metric(server, "successful-authentication-total") == 2
    assert metric(server, "request-total") == 14
    wait_for(lambda: metric(server, "response-total") == 14)
    wait_for(lambda: metric(server, "connection-close-total") == 2)


def test_a_file_region_is_written_with_sendfile_over_a_unix_socket(serve_unix):
    server = serve_unix()
    size = 3 << 20   # more than the socket takes at once: the loop writes the rest
    with connect(server) as s:
        assert call(s, b"file:%d" % size) == b"[" + _pattern(size) + b"]"
        assert call(s, b"echo:after") == b"after"


def test_tls_over_a_unix_socket(serve_unix, tls):
    server_ctx, client_ctx = tls
    server = serve_unix(tls=server_ctx)
    with connect(server, tls=client_ctx) as s:
        assert call(s, b"whoami") == b"alice tls=True"
        big = b"x" * (CAP - 10)
        assert call(s, b"echo:" + big) == big
    with net.connect_unix(server.address, timeout=5) as plain:   # not TLS: refused
        plain.sendall(framed(SECRET))
        assert hung_up(plain)


# ---------------------------------------------------------------------- paths
def test_a_path_longer_than_sun_path_is_bound_and_connected_through_its_directory(serve_unix, tmp_path):
    path = long_path(tmp_path)
    with pytest.raises(OSError):   # what connect_unix spares its callers
        socket.socket(socket.AF_UNIX).connect(str(path))
    server = serve_unix(path)
    assert server.address == str(path)
    assert is_socket(path)   # at the long path itself, not somewhere under /proc
    fds = len(os.listdir("/proc/self/fd"))
    with connect(server) as a, connect(server) as b:
        assert call(a, b"echo:far") == b"far"
        assert call(b, b"echo:away") == b"away"
    # connect_unix closed the directory descriptors it opened (the two sockets are closed too).
    wait_for(lambda: len(os.listdir("/proc/self/fd")) <= fds)
    server.stop()
    assert not is_socket(path) and not path.exists()


def test_a_relative_path_is_bound_in_the_working_directory(serve_unix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    server = serve_unix("relative.sock")
    assert server.address == "relative.sock"
    with connect(server) as s:
        assert call(s, b"echo:here") == b"here"
    monkeypatch.chdir("/")   # stop() removes the file it bound, wherever the process is now
    server.stop()
    assert not (tmp_path / "relative.sock").exists()


def test_connect_unix_raises_when_nothing_listens(tmp_path):
    with pytest.raises(FileNotFoundError):
        net.connect_unix(tmp_path / "nobody.sock", timeout=1)
    with pytest.raises(FileNotFoundError):
        net.connect_unix(long_path(tmp_path), timeout=1)


# ---------------------------------------------------------------------- stop and existing files
def test_stop_removes_the_socket_file(serve_unix, tmp_path):
    path = tmp_path / "logstore.sock"
    server = serve_unix(path)
    idle = connect(server)
    assert is_socket(path)
    server.stop()
    assert hung_up(idle)
    idle.close()
    assert not path.exists()
    with pytest.raises(FileNotFoundError):
        net.connect_unix(path, timeout=2)
    server.stop()  # idempotent
    # The path is free again: a new server binds it.
    again = serve_unix(path)
    with connect(again) as s:
        assert call(s, b"echo:again") == b"again"


def test_a_server_never_started_removes_its_socket_file_at_stop(tmp_path):
    path = tmp_path / "logstore.sock"
    server = net.Server(path, EchoProtocol())
    assert is_socket(path)
    server.stop()
    assert not path.exists()


@pytest.mark.parametrize("what", ["file", "socket"])
def test_stop_leaves_what_replaced_the_socket_file(serve_unix, tmp_path, what):
    path = tmp_path / "logstore.sock"
    server = serve_unix(path)
    os.unlink(path)   # someone else's file at the path now: a plain file, or another server's socket
    if what == "file":
        path.write_bytes(b"not a socket")
        server.stop()
        assert path.read_bytes() == b"not a socket"
    else:
        other = serve_unix(path)
        server.stop()
        assert is_socket(path)
        with connect(other) as s:
            assert call(s, b"echo:the other") == b"the other"


@pytest.mark.parametrize("what", ["file", "socket", "long path"])
def test_binding_where_a_file_exists_raises_and_leaves_it(tmp_path, what):
    path = long_path(tmp_path) if what == "long path" else tmp_path / "logstore.sock"
    if what == "socket":   # a stale socket: nothing listens, the file remains
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(path))
        stale.close()
        assert is_socket(path)
    else:
        path.write_bytes(b"precious")
    with pytest.raises(OSError) as raised:
        net.Server(path, EchoProtocol())
    assert raised.value.errno == errno.EADDRINUSE
    if what == "socket":
        assert is_socket(path)
    else:
        assert path.read_bytes() == b"precious"


# ---------------------------------------------------------------------- failures close one connection
@pytest.mark.parametrize("authenticated, size", [(False, PRE_AUTH_CAP + 1), (True, CAP + 1), (True, 2**31 - 1),
                                                 (True, -1)])
def test_a_frame_over_the_cap_closes_only_its_connection(serve_unix, authenticated, size):
    server = serve_unix()
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


def test_a_handler_that_raises_closes_only_its_connection(serve_unix):
    server = serve_unix()
    with connect(server) as bad, connect(server) as good:
        bad.sendall(framed(b"boom"))
        assert hung_up(bad)
        assert call(good, b"echo:fine") == b"fine"
