"""A TCP proxy for one directed network link, controlled by the test that owns it.

``LinkProxy(target)`` listens on an ephemeral port of 127.0.0.1 (never on another interface) and
forwards every connection it accepts to ``target``, byte for byte, in both directions. The test
points a node (or a client) at ``proxy.address`` instead of the target's real address, and then
injects faults on that one link. The target may be given later (``proxy.target = address``):
a set of servers that must know each other's proxies before they bind can then all bind port 0,
with no window in which a port picked in advance is taken by someone else. Until it has a
target the proxy resets every connection.

Controls:

* :meth:`LinkProxy.block` -- a network partition: every open connection is cut at once, and
  every new one is accepted and reset immediately (the connecting side sees a reset or an EOF
  during its handshake, at once, rather than a hang). :meth:`LinkProxy.unblock` heals it.
* :meth:`LinkProxy.set_delay` -- latency: every chunk read from one side is held for that many
  seconds before it is written to the other. Chunks of one direction stay in order and are held
  one after the other, so a burst of several chunks is slowed cumulatively (the protocols under
  test are request/response, where this is the latency of each message). Applies to open
  connections too; in-flight chunks are dropped if their connection is cut meanwhile.
* :meth:`LinkProxy.drop_existing` -- cut every open connection, but keep accepting new ones
  (a transient failure: peers reconnect).

When either side of a forwarded connection closes (or fails), the proxy closes both sides: no
half-open connections are kept. :meth:`LinkProxy.close` stops accepting, cuts every connection,
joins every thread it started and closes every socket; it is idempotent. The proxy is also a
context manager.

Threads: one accept thread, plus per connection one thread per direction (the upstream
connect is done by the first of them, so a slow target never stalls the accept loop). A
connection's sockets are closed by the last of its two threads to finish, never while the
other may still be blocked on them (closing a descriptor another thread is using risks the
number being reused under it); cutting a connection only shuts its sockets down, which wakes
both threads.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

__all__ = ["LinkProxy"]

_CHUNK = 64 * 1024
_ACCEPT_POLL_S = 0.05
_CONNECT_TIMEOUT_S = 5.0


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset (SO_LINGER 0) rather than an orderly FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _shutdown(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Link:
    """One forwarded connection: the accepted socket and, once connected, the upstream one."""

    def __init__(self, downstream: socket.socket) -> None:
        self.downstream = downstream
        self.upstream: socket.socket | None = None
        #: set when the link is cut: pumps stop forwarding, delayed chunks are dropped
        self.cut = threading.Event()
        self._lock = threading.Lock()
        self._users = 2  # the two pump threads; the last to leave closes the sockets

    def set_upstream(self, upstream: socket.socket) -> bool:
        """Attach the upstream socket; False (socket not attached) if the link was cut meanwhile."""
        with self._lock:
            if self.cut.is_set():
                return False
            self.upstream = upstream
            return True

    def shutdown(self) -> None:
        """Cut the link: wake both pumps (they close the sockets on their way out)."""
        with self._lock:
            self.cut.set()
            upstream = self.upstream
        _shutdown(self.downstream)
        _shutdown(upstream)

    def release(self) -> None:
        """A pump thread is done with the link; the last one closes both sockets."""
        with self._lock:
            self._users -= 1
            last = self._users == 0
            self.cut.set()
            upstream = self.upstream
        if last:
            _reset(self.downstream)
            if upstream is not None:
                _reset(upstream)


class LinkProxy:
    """Forward connections accepted on ``self.address`` (127.0.0.1, ephemeral port) to ``target``.

    Args:
        target: (host, port) to forward every accepted connection to; None to set it later
            (connections are reset until then).
        name: a label for thread names and repr (e.g. ``"0->1"``).
    """

    def __init__(self, target: tuple[str, int] | None, name: str = "") -> None:
        self.target: tuple[str, int] | None = None if target is None else (target[0], target[1])
        self.name = name or (f"->{target[0]}:{target[1]}" if target is not None else "->?")
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_ACCEPT_POLL_S)  # close() does not wake accept(): poll the flag
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._blocked = False
        self._delay = 0.0
        self._links: set[_Link] = set()
        self._threads: set[threading.Thread] = set()
        #: connections forwarded / refused (reset because the link was blocked or the target
        #: was unreachable) so far; tests use them to check that a fault really took effect.
        self.forwarded = 0
        self.refused = 0
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"proxy {self.name} accept",
                                               daemon=True)
        self._accept_thread.start()

    def __repr__(self) -> str:
        state = "closed" if self._closed.is_set() else "blocked" if self._blocked else "open"
        target = "?" if self.target is None else self.target[1]
        return f"<LinkProxy {self.name} {self.address[1]}->{target} {state} delay={self._delay}>"

    def __enter__(self) -> "LinkProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ controls
    @property
    def blocked(self) -> bool:
        return self._blocked

    @property
    def delay(self) -> float:
        return self._delay

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._links)

    def block(self) -> None:
        """Partition the link: cut every open connection and reset every new one at once."""
        with self._lock:
            self._blocked = True
        self.drop_existing()

    def unblock(self) -> None:
        """Heal the partition: forward new connections again."""
        with self._lock:
            self._blocked = False

    def set_delay(self, seconds: float) -> None:
        """Hold every chunk forwarded (either direction, open connections included) this long."""
        if seconds < 0:
            raise ValueError("a delay cannot be negative")
        self._delay = float(seconds)

    def drop_existing(self) -> None:
        """Cut every open connection; new ones are still forwarded (unless blocked)."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.shutdown()

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, cut every connection, join every thread, close every socket."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        self._accept_thread.join(timeout)
        try:
            self._listener.close()
        except OSError:
            pass
        deadline = time.monotonic() + timeout
        while True:
            # A link's first pump may start the second one after a first pass here: cut and
            # join until no thread is left (each pass cuts whatever was opened meanwhile).
            self.drop_existing()
            with self._lock:
                threads = list(self._threads)
            if not threads:
                return
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline and any(t.is_alive() for t in threads):
                leaked = [t.name for t in threads if t.is_alive()]
                raise RuntimeError(f"proxy {self.name}: threads still running after close(): {leaked}")

    # ------------------------------------------------------------------ internals
    def _spawn(self, target, *args, name: str) -> None:
        t = threading.Thread(target=self._run, args=(target, args), name=f"proxy {self.name} {name}", daemon=True)
        with self._lock:
            self._threads.add(t)
        t.start()

    def _run(self, target, args) -> None:
        try:
            target(*args)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            sock.settimeout(None)
            with self._lock:
                refuse = self._blocked or self._closed.is_set()
                if refuse:
                    self.refused += 1
                else:
                    link = _Link(sock)
                    self._links.add(link)
            if refuse:
                _reset(sock)
                continue
            self._spawn(self._connect_and_pump, link, name="down->up")

    def _connect_and_pump(self, link: _Link) -> None:
        """First pump thread of a link: connect upstream, start the reverse pump, forward."""
        target = self.target
        try:
            if target is None:
                raise ConnectionRefusedError("no target yet")
            upstream = socket.create_connection(target, timeout=_CONNECT_TIMEOUT_S)
        except OSError:
            with self._lock:
                self.refused += 1
            upstream = None
        if upstream is not None:
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not link.set_upstream(upstream):  # cut (blocked/closed) while connecting
                _reset(upstream)
                upstream = None
        if upstream is None:
            link.release()
            link.release()  # the reverse pump never starts
            with self._lock:
                self._links.discard(link)
            return
        with self._lock:
            self.forwarded += 1
        self._spawn(self._pump, link, upstream, link.downstream, name="up->down")
        self._pump(link, link.downstream, upstream)

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not link.cut.is_set():
                data = src.recv(_CHUNK)
                if not data:
                    break
                delay = self._delay
                if delay > 0 and link.cut.wait(delay):
                    break  # cut while the chunk was in flight: it is lost, as on a real link
                if link.cut.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            link.shutdown()  # one side is gone: take the other down too
            link.release()
            with self._lock:
                self._links.discard(link)
