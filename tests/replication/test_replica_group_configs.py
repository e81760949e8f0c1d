"""Group configs on a replica set, through confluent-kafka's AdminClient: nothing replicates
them, so a group is described with the broker's defaults and a change is refused
(POLICY_VIOLATION, with the reason)."""

from __future__ import annotations

import pytest

from .test_kafka_listener import CONFLUENT_LOGIN, kafka_cluster, leader_of, stop_all

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,  # noqa: E402
                                   ResourceType)

POLICY_VIOLATION = 44


def test_a_replica_set_describes_the_defaults_and_refuses_changes(tmp_path):
    nodes, addresses = kafka_cluster(tmp_path)
    try:
        leader_of(nodes)
        bootstrap = ",".join(f"{h}:{p}" for h, p in addresses.values())
        admin = AdminClient({**CONFLUENT_LOGIN, "bootstrap.servers": bootstrap})
        [described] = admin.describe_configs([ConfigResource(ResourceType.GROUP, "g")]).values()
        entries = described.result(timeout=20)
        assert {n: e.value for n, e in entries.items()} == {"consumer.session.timeout.ms": "45000",
                                                            "consumer.heartbeat.interval.ms": "5000"}
        change = ConfigResource(ResourceType.GROUP, "g", incremental_configs=[
            ConfigEntry("consumer.session.timeout.ms", "50000", incremental_operation=AlterConfigOpType.SET)])
        [altered] = admin.incremental_alter_configs([change]).values()
        with pytest.raises(confluent_kafka.KafkaException) as refused:
            altered.result(timeout=20)
        error = refused.value.args[0]
        assert error.code() == POLICY_VIOLATION and "fixed" in error.str()
        assert not any((tmp_path / f"node{i}" / ".group-configs").exists() for i in nodes)  # nothing kept
    finally:
        stop_all(nodes)
