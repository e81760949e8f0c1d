"""A 3-node replica set on loopback that survives losing its leader.

Starts three ``logstore node`` processes (each its own data directory and one listener speaking
Kafka's protocol; peers and clients log in with a shared secret, SASL SCRAM), writes with acks="all" (acknowledged once a majority holds the records),
kills the leader with SIGKILL, shows the new leader taking over, writes again, restarts the
killed node and shows it catching up to the same log. Run: ``python examples/replicated_cluster.py``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from logstore.replication import Client, ReplicationError


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start(node: int, root: str, addrs: dict[int, tuple[str, int]], secret_file: str) -> subprocess.Popen:
    peers = [f"--peer={j}={h}:{p}" for j, (h, p) in addrs.items() if j != node]
    host, port = addrs[node]
    proc = subprocess.Popen(
        [sys.executable, "-m", "logstore", "node", f"--node-id={node}", f"--data-dir={root}/node{node}",
         f"--listen={host}:{port}", f"--secret-file={secret_file}", *peers], stdout=subprocess.PIPE, text=True)
    print("  " + proc.stdout.readline().strip())  # "node N serving on host:port"
    return proc


def leader_of(addrs: dict[int, tuple[str, int]], secret: bytes) -> tuple[int, int]:
    """(leader, epoch) as the leader itself reports it."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for node, address in addrs.items():
            probe = Client([address], secret, timeout=1)
            try:
                leader, epoch, _ = probe.metadata()[("replicated", 0)]
                if leader == node:
                    return leader, epoch
            except ReplicationError:
                pass
            finally:
                probe.close()
        time.sleep(0.1)
    raise SystemExit("no leader elected")


def main() -> None:
    root = tempfile.mkdtemp(prefix="logstore-cluster-")
    secret = secrets.token_hex(16).encode()
    secret_file = os.path.join(root, "secret")
    with open(secret_file, "wb") as f:
        f.write(secret)
    addrs = {i: ("127.0.0.1", port) for i, port in enumerate(free_ports(3))}
    print(f"starting 3 nodes in {root}")
    procs = {i: start(i, root, addrs, secret_file) for i in addrs}
    client = Client(list(addrs.values()), secret)
    try:
        leader, epoch = leader_of(addrs, secret)
        print(f"node {leader} leads (epoch {epoch})")
        offsets = client.produce("replicated", 0, [b"order-1", b"order-2", b"order-3"], acks="all")
        print(f"acks=all wrote offsets {offsets}")

        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait()
        killed_at = time.monotonic()
        print(f"killed node {leader} (SIGKILL)")
        offsets = client.produce("replicated", 0, [b"order-4"], acks="all", timeout=15)
        took = time.monotonic() - killed_at
        new_leader, new_epoch = leader_of({i: a for i, a in addrs.items() if i != leader}, secret)
        print(f"node {new_leader} leads (epoch {new_epoch}); acks=all wrote offset {offsets[0]} "
              f"{took:.2f} s after the kill")

        print(f"restarting node {leader}")
        procs[leader] = start(leader, root, addrs, secret_file)
        probe = Client([addrs[leader]], secret)
        deadline = time.monotonic() + 15
        while probe.metadata()[("replicated", 0)][2] <= offsets[0] and time.monotonic() < deadline:
            time.sleep(0.1)  # its high watermark passes the last write once it caught up
        probe.close()
        values = [r.value.decode() for r in client.fetch("replicated", 0, 0).records]
        print(f"committed log: {values}")
        if values != ["order-1", "order-2", "order-3", "order-4"]:
            raise SystemExit(f"unexpected log: {values}")
        print(f"node {leader} caught up and follows node {new_leader}")
    finally:
        client.close()
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
