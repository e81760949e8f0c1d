"""The replica set's cluster id (logstore.replica.context): Kafka's form (16 bytes in URL-safe
base64), a random one, the default derived from the voters' ids alone (never the secret)."""

from __future__ import annotations

import base64

import pytest

from logstore.replica.context import check_cluster_id, default_cluster_id, random_cluster_id


def test_a_random_cluster_id_is_kafkas_form():
    ids = {random_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    for cluster_id in ids:
        assert check_cluster_id(cluster_id) == cluster_id
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16 and not cluster_id.startswith("-")


@pytest.mark.parametrize("bad", ["", "short", "x" * 23, "!" * 22, "abc-def"])
def test_a_malformed_cluster_id_is_refused(bad):
    with pytest.raises(ValueError, match="is not a cluster id"):
        check_cluster_id(bad)


def test_the_default_depends_on_the_voters_only():
    assert default_cluster_id([2, 0, 1]) == default_cluster_id([0, 1, 2]) != default_cluster_id([0, 1, 3])
    assert check_cluster_id(default_cluster_id([0, 1, 2]))
