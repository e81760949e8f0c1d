"""Fixtures of the corruption suite.

``tmp_path`` is overridden to live on tmpfs (``/dev/shm``) when there is one: these tests open and
close logs thousands of times and every close, roll and recovery fsyncs, which costs real disk
flushes on ext4 and nothing on tmpfs. Crashes are simulated with ``Log._abandon()`` (the page
cache survives), so no test here depends on what fsync makes durable.

Corrupt input is exactly what turns a missing bounds check into an endless loop, so every test
runs under a wall-clock alarm: a hang fails that test instead of the whole run.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import shutil
import signal
import tempfile

import pytest

from .helpers import HangError

TEST_TIMEOUT_S = 60


@pytest.fixture(autouse=True)
def _alarm():
    def expired(signum, frame):
        raise HangError(f"test still running after {TEST_TIMEOUT_S} s (endless loop on corrupt input?)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def _quiet_recovery_warnings(caplog):
    # Recovery and rebuilds log a warning per corruption; hundreds of seeds make that noise.
    caplog.set_level(logging.ERROR, logger="logstore")
    yield


_SHM = "/dev/shm"


@pytest.fixture
def tmp_path(request, tmp_path_factory):
    if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK):
        path = pathlib.Path(tempfile.mkdtemp(prefix="logstore-corruption-", dir=_SHM))
        yield path
        shutil.rmtree(path, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp(re.sub(r"\W", "_", request.node.name)[:30], numbered=True)
