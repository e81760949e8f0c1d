"""The public home of :class:`TLSConfig` and the protocol contract of the network layer, kept at
its old path (``logstore.netprotocol``) for applications that configure TLS; the code lives in
:mod:`logstore.net.protocol`."""

from .net.protocol import Handshake, HandshakeError, Limits, Protocol, Response, Session, SlowStep, TLSConfig

__all__ = ["Protocol", "Handshake", "HandshakeError", "SlowStep", "Session", "Limits", "Response", "TLSConfig"]
