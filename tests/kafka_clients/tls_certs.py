"""Test certificates made with the openssl CLI: a CA, a server certificate for localhost and
127.0.0.1, and a client certificate, all signed by the CA (EC P-256: made in about 0.1 s).
``make_certs`` skips the calling test when openssl is missing."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Certs:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def _run(*args: str, cwd: pathlib.Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"openssl {args[0]} failed: {done.stderr.strip()[-300:]}")


def make_certs(directory: pathlib.Path) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=logstore-test-ca",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign", cwd=d)
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=logstore-test-{name}", cwd=d)
        _run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return Certs(str(d / "ca.pem"), str(d / "server.pem"), str(d / "server.key"), str(d / "client.pem"),
                 str(d / "client.key"))
