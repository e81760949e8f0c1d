"""The replication wire protocol: frames, fields and the shared-secret handshake."""

from __future__ import annotations

import socket
import struct
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.wire import (
    PRE_AUTH_MAX_FRAME,
    AuthenticationError,
    FrameError,
    Reader,
    RequestType,
    Writer,
    client_handshake,
    decode_frame,
    encode_frame,
    recv_frame,
    send_frame,
    server_handshake,
)


def test_frame_layout_and_round_trip():
    payload = Writer().int8(-1).int16(7).int32(1 << 20).int64(-5).blob(b"ab").blob(None).string("é").payload()
    data = encode_frame(RequestType.FETCH, 42, payload, version=3)
    assert data[:12] == struct.pack(">ihhi", 8 + len(payload), 11, 3, 42)
    frame, used = decode_frame(data + b"next")
    assert used == len(data)
    assert (frame.type, frame.version, frame.correlation_id) == (RequestType.FETCH, 3, 42)
    r = frame.reader()
    assert (r.int8(), r.int16(), r.int32(), r.int64(), r.blob(), r.blob(), r.string()) == (-1, 7, 1 << 20, -5, b"ab", None, "é")
    r.end()


@pytest.mark.parametrize("length", [-1, 0, 7, 1 << 30])
def test_bad_frame_lengths_are_refused_before_allocation(length):
    with pytest.raises(FrameError):
        decode_frame(struct.pack(">i", length) + b"\0" * 16, max_frame=1 << 20)


def test_truncated_fields_and_oversized_counts():
    with pytest.raises(FrameError, match="needs 4 bytes"):
        Reader(b"\0\0").int32()
    with pytest.raises(FrameError, match="negative length"):
        Reader(struct.pack(">i", -2)).blob()
    with pytest.raises(FrameError):
        Reader(struct.pack(">i", 100) + b"x").blob()
    with pytest.raises(FrameError, match="cannot fit"):
        Reader(struct.pack(">i", 1_000_000_000)).array(lambda r: r.int64(), 8)
    with pytest.raises(FrameError, match="UTF-8"):
        Reader(struct.pack(">h", 1) + b"\xff").string()
    with pytest.raises(FrameError, match="unexpected bytes"):
        Reader(b"\0").end()
    items = Writer().array([1, 2, 3], lambda w, v: w.int32(v)).payload()
    assert Reader(items).array(lambda r: r.int32(), 4) == [1, 2, 3]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_frame_error(data):
    try:
        frame, _ = decode_frame(data, max_frame=PRE_AUTH_MAX_FRAME)
    except FrameError:
        return
    r = frame.reader()
    try:
        r.int32()
        r.blob()
        r.string()
        r.array(lambda x: x.int64(), 8)
    except FrameError:
        pass


def _pair():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    server.close()
    return client, conn


def _serve(conn, secret, out):
    try:
        out.append(server_handshake(conn, secret))
    except Exception as exc:  # noqa: BLE001
        out.append(exc)


def test_handshake_with_the_same_secret():
    client, conn = _pair()
    out = []
    t = threading.Thread(target=_serve, args=(conn, b"s3cret", out), daemon=True)
    t.start()
    client_handshake(client, b"s3cret", node_id=2)
    t.join()
    assert out == [2]
    send_frame(client, RequestType.METADATA, 9, b"hello")
    assert recv_frame(conn, 1 << 20).payload == b"hello"
    client.close()
    conn.close()


def test_handshake_fails_both_ways_with_different_secrets():
    client, conn = _pair()
    out = []
    t = threading.Thread(target=_serve, args=(conn, b"right", out), daemon=True)
    t.start()
    with pytest.raises(AuthenticationError, match="server does not know"):
        client_handshake(client, b"wrong")
    client.close()
    t.join()
    assert isinstance(out[0], (AuthenticationError, ConnectionError))
    conn.close()


def test_server_rejects_a_big_frame_before_authentication():
    client, conn = _pair()
    out = []
    t = threading.Thread(target=_serve, args=(conn, b"k", out), daemon=True)
    t.start()
    client.sendall(struct.pack(">ihhi", PRE_AUTH_MAX_FRAME + 1, 1, 0, 0))
    t.join()
    assert isinstance(out[0], FrameError)
    client.close()
    conn.close()


class _Spy:
    """A socket stand-in recording what is sent."""

    def __init__(self, sock):
        self.sock = sock
        self.sent = bytearray()

    def sendall(self, data):
        self.sent.extend(data)
        return self.sock.sendall(data)

    def recv_into(self, *a):
        return self.sock.recv_into(*a)


def test_no_secret_on_the_wire():
    client, conn = _pair()
    out = []
    t = threading.Thread(target=_serve, args=(conn, b"TOP-SECRET-VALUE", out), daemon=True)
    t.start()
    spy = _Spy(client)
    client_handshake(spy, b"TOP-SECRET-VALUE")
    seen = spy.sent
    t.join()
    assert out == [-1]
    assert b"TOP-SECRET" not in seen and len(seen) > 0
    client.close()
    conn.close()
