"""A worker that answers a request gives the connection back to the loop without waking it, also
when the loop has no deadline to wake for (one connection, its request in a worker): the loop
then sleeps an idle timeout at most, so the connection's new idle deadline is never before its
wake-up. The idle timeout is still enforced (test_net's idle tests)."""

from __future__ import annotations

import socket
import struct
import time

from logstore.net import server as net


class Echo(net.Protocol):
    def frame_size(self, header, authenticated):
        (n,) = struct.unpack(">i", header)
        if not 0 <= n <= 1 << 20:
            raise ValueError(f"a frame of {n} bytes")
        return n

    def handle(self, session, request):  # on a worker (nothing is inline)
        return struct.pack(">i", len(request)) + bytes(request)


def test_answers_from_workers_do_not_wake_the_loop(monkeypatch):
    wakes = []
    original = net.Server._wake
    monkeypatch.setattr(net.Server, "_wake", lambda self: (wakes.append(1), original(self)))
    server = net.Server(("127.0.0.1", 0), Echo(), name="test", limits=net.Limits(idle_timeout_s=30)).start()
    try:
        with socket.create_connection(server.address, timeout=10) as sock:
            for i in range(50):
                body = b"request %d" % i
                sock.sendall(struct.pack(">i", len(body)) + body)
                got = b""
                while len(got) < 4 + len(body):
                    got += sock.recv(4096)
                assert got[4:] == body
        assert len(wakes) < 5  # (one per request before)
    finally:
        server.stop()


def test_a_connection_given_back_is_still_closed_when_idle():
    server = net.Server(("127.0.0.1", 0), Echo(), name="test", limits=net.Limits(idle_timeout_s=0.3)).start()
    try:
        with socket.create_connection(server.address, timeout=10) as sock:
            sock.sendall(struct.pack(">i", 2) + b"hi")
            assert sock.recv(6) == struct.pack(">i", 2) + b"hi"
            started = time.monotonic()
            assert sock.recv(1) == b""  # closed by the server, not by this timeout
            assert time.monotonic() - started < 5
    finally:
        server.stop()
