"""The ``logstore`` command: dispatch and argument errors (each subcommand has its own suite)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from logstore.cli import main


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "logstore", *args], capture_output=True, text=True, timeout=60, **kw)


def test_no_command_prints_usage_and_fails():
    r = run()
    assert r.returncode == 2 and "usage: logstore COMMAND" in r.stderr


def test_help_lists_the_commands(capsys):
    assert main(["--help"]) == 0
    assert "node" in capsys.readouterr().out


def test_unknown_command_is_named(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--listen", "nohost"], "expected host:port"),
    (["--listen", "127.0.0.1:0", "--peer", "x=127.0.0.1:1"], "expected id=host:port"),
    (["--listen", "127.0.0.1:0", "--tls-cert", "c.pem"], "go together"),
    (["--listen", "127.0.0.1:0", "--secret-file", "/nonexistent/secret"], "cannot read the secret file"),
])
def test_node_argument_errors_are_clear(tmp_path, args, message):
    base = ["node", "--node-id", "0", "--data-dir", str(tmp_path / "d")]
    if "--secret-file" not in args:
        (tmp_path / "secret").write_bytes(b"s")
        base += ["--secret-file", str(tmp_path / "secret")]
    r = run(*base, *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
