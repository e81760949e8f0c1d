"""pytest fixtures for testing an application's Kafka code against a served store, no broker needed.

Installed as a pytest plugin (entry point ``pytest11``): any test session in an environment
where logstore is installed has the fixtures below.

- ``kafka_server``: a :class:`~logstore.KafkaServer` serving a fresh temporary store on a free
  loopback port, started for one test and stopped after it.
- ``kafka_server_session``: the same, shared by every test of the session (faster; tests see
  each other's topics).

Both expose ``bootstrap_servers`` (``"127.0.0.1:PORT"``) and ``store`` (the served
:class:`~logstore.LogStore`, to check what a client wrote)::

    def test_my_producer(kafka_server):
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": kafka_server.bootstrap_servers})
        p.produce("orders", b"order-1")
        p.flush()
        assert [r.value for r in kafka_server.store.partition("orders", 0).iter()] == [b"order-1"]

Thread-safety: as :class:`~logstore.KafkaServer`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import pytest

if TYPE_CHECKING:
    from .kafka.server import KafkaServer

__all__ = ["kafka_server", "kafka_server_session"]


def _served(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[KafkaServer]:
    # Imported here: pytest loads this plugin in every session of an environment with logstore,
    # and the Kafka codec costs about 300 ms to import (only the tests that use a fixture pay).
    from .kafka.server import KafkaServer

    server = KafkaServer(str(tmp_path_factory.mktemp(name)), ("127.0.0.1", 0)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kafka_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """A served temporary store for one test (see the module docstring)."""
    yield from _served(tmp_path_factory, "kafka")


@pytest.fixture(scope="session")
def kafka_server_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """A served temporary store shared by the whole test session."""
    yield from _served(tmp_path_factory, "kafka-session")
