"""Fixtures of the crash tests."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import pytest


@pytest.fixture
def mem_path(tmp_path) -> pathlib.Path:
    """A fresh directory on tmpfs (``/dev/shm``) when there is one, else ``tmp_path``.

    For tests whose durability is simulated (no real fsync matters: SIGKILL with a no-op sync,
    the power-loss simulator): they create and delete thousands of files, which a disk-backed
    file system makes slow for no benefit.
    """
    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    path = pathlib.Path(tempfile.mkdtemp(prefix="logstore-crash-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
