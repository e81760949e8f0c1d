"""`logstore node` processes on loopback (each one listener, Kafka's protocol, for clients and
peers), for the suites and the benchmark: the one way they are started, asked for a
partition's leader, and stopped."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from .proxy import LinkProxy
from .test_inprocess import free_ports


class KafkaNodes:
    """``n`` node processes. With ``proxies``, each node reaches each peer's listener through a
    :class:`LinkProxy` (``proxies[(i, j)]``: i -> j); Metadata still names the listeners
    themselves to clients. Clients log in with :attr:`client_config` (SASL SCRAM as the
    replica user). ``topics``: ``name:partitions``, several separated by commas; ``options``:
    more ``logstore node`` options for every node."""

    def __init__(self, tmp: Path, secret: bytes, topics: str = "replicated:1", n: int = 3,
                 election_timeout_ms: int = 300, proxies: bool = False, log_level: str = "INFO",
                 options: tuple[str, ...] = ()) -> None:
        self.tmp = Path(tmp)
        ports = free_ports(n)
        self.addrs = {i: ("127.0.0.1", ports[i]) for i in range(n)}
        self.kafka = self.addrs
        self.secret = secret
        self.topics = topics
        self.election_timeout_ms = election_timeout_ms
        self.log_level = log_level
        self.options = options
        self.proxies = ({(i, j): LinkProxy(self.addrs[j], f"{i}->{j}") for i in range(n) for j in range(n) if i != j}
                        if proxies else {})
        (self.tmp / "secret").write_bytes(secret)
        self.procs: dict[int, subprocess.Popen] = {}

    @property
    def client_config(self) -> dict[str, str]:
        """confluent-kafka's (librdkafka's) settings to log in."""
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": "replica", "sasl.password": self.secret.decode()}

    @property
    def kafka_python_config(self) -> dict[str, str]:
        """kafka-python's and aiokafka's settings to log in."""
        return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_plain_username": "replica", "sasl_plain_password": self.secret.decode()}

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.kafka.values())

    def _peer(self, i: int, j: int) -> tuple[str, int]:
        return self.proxies[(i, j)].address if self.proxies else self.addrs[j]

    def start(self, i: int) -> None:
        """Start node ``i`` (again, on its data directory) and wait for its "serving" line."""
        peers = [f"--peer={j}={self._peer(i, j)[0]}:{self._peer(i, j)[1]}" for j in self.addrs if j != i]
        advertised = [f"--advertised-peer={j}={h}:{p}" for j, (h, p) in self.addrs.items() if j != i]
        h, p = self.addrs[i]
        self.procs[i] = subprocess.Popen(
            [sys.executable, "-m", "logstore", "node", f"--node-id={i}", f"--data-dir={self.tmp / f'n{i}'}",
             f"--listen={h}:{p}", f"--secret-file={self.tmp / 'secret'}",
             f"--election-timeout-ms={self.election_timeout_ms}",
             *[f"--topic={topic}" for topic in self.topics.split(",")], f"--log-level={self.log_level}",
             *peers, *advertised, *self.options],
            stdout=subprocess.PIPE, stderr=open(self.tmp / f"node{i}.log", "ab"))
        line = self.procs[i].stdout.readline()
        assert f"serving on {h}:{p}".encode() in line, line

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()

    def leader(self, topic: str, partition: int = 0, timeout: float = 20.0) -> int | None:
        """The live node the cluster's Metadata names as the partition's leader (None if none
        within ``timeout``)."""
        from confluent_kafka.admin import AdminClient
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                meta = AdminClient({"bootstrap.servers": self.bootstrap, **self.client_config}).list_topics(
                    topic, timeout=2)
                leader = meta.topics[topic].partitions[partition].leader
                if leader in self.procs and self.procs[leader].poll() is None:
                    return leader
            except Exception:  # noqa: BLE001 - no answer yet: ask again
                pass
            time.sleep(0.1)
        return None

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for proxy in self.proxies.values():
            proxy.close()
