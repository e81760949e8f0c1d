"""One connection to a served store speaking kafka-python's request classes: the tests' raw
requests (versions and fields no client sends), checked against kafka-python's own decoder."""

from __future__ import annotations

import socket
import struct
from typing import Any, Callable


class RequestConnection:
    """A socket to ``address``; ``login(sock)``, when given, authenticates it first (SASL).
    ``call`` sends one request and decodes its response (at the request's version when the
    request class carries one). Not thread-safe: one test's."""

    def __init__(self, address: Any, client_id: str = "logstore-tests",
                 login: Callable[[socket.socket], None] | None = None) -> None:
        self.sock = socket.create_connection(address, timeout=20)
        self.client_id = client_id
        self.correlation = 0
        if login is not None:
            login(self.sock)

    def call(self, request: Any, response_cls: Any) -> Any:
        self.correlation += 1
        request.with_header(self.correlation, self.client_id)
        self.sock.sendall(request.encode(header=True, framed=True))
        (size,) = struct.unpack(">i", self._exactly(4))
        data = self._exactly(size)
        version = getattr(request, "version", None)
        answer = response_cls.decode(data, header=True) if version is None else \
            response_cls.decode(data, version=version, header=True)
        assert answer.header.correlation_id == self.correlation
        return answer

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()
