"""Group configs (KIP-848's config resource type GROUP) on ``logstore serve``, through
confluent-kafka's AdminClient (describe_configs, incremental_alter_configs) and kafka-python's
KafkaAdminClient (describe_configs, alter_configs: AlterConfigs and IncrementalAlterConfigs):
``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms`` described with their
sources, set, deleted and replaced, checked against the broker's ``group.consumer.*`` bounds
with Kafka's errors; ``validate_only``; kept across a restart (read back from the store's
``.group-configs`` and by a new server); ACLs on the group; a consumer group of
``group.protocol=consumer`` whose session timeout is lowered while its members run fences a
killed member by the group's timeout, not the broker's. (A replica set's answers:
tests/replication/test_replica_group_configs.py.)"""

from __future__ import annotations

import json
import os

import pytest

from logstore.groups.consumergroup import ConsumerGroupConfig
from logstore.kafka.configs import GroupConfigBounds
from logstore.kafka.groupconfigfile import GROUP_CONFIG_FILE
from logstore.kafka.server import KafkaServer

ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from confluent_kafka import KafkaException  # noqa: E402
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,  # noqa: E402
                                   AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, ResourcePatternType,
                                   ResourceType)
from kafka.admin import KafkaAdminClient  # noqa: E402
from kafka.admin import ConfigResource as KpResource, ConfigResourceType  # noqa: E402

SESSION, HEARTBEAT = "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"
INVALID_CONFIG, INVALID_REQUEST, GROUP_AUTHORIZATION_FAILED, POLICY_VIOLATION = 40, 42, 30, 44


@pytest.fixture
def server(tmp_path):
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as srv:
        yield srv


def ck_admin(bootstrap, **config):
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10_000, **config})


def describe(admin, group):
    [future] = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)]).values()
    return future.result(timeout=20)


def incremental(admin, group, *changes, validate_only=False):
    """``changes``: (name, op, value); the error (a KafkaError) or None."""
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op) for name, op, value in changes])
    [future] = admin.incremental_alter_configs([resource], validate_only=validate_only).values()
    try:
        future.result(timeout=20)
    except KafkaException as exc:
        return exc.args[0]
    return None


def on_disk(root):
    with open(f"{root}/{GROUP_CONFIG_FILE}") as f:
        return json.load(f)["groups"]


def kp_describe(bootstrap, group, **login):
    client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000, **login)
    try:
        return client.describe_configs([KpResource(ConfigResourceType.GROUP, group)], include_synonyms=True,
                                       config_filter="all")["group"][group]
    finally:
        client.close()


def test_a_group_without_configs_is_described_with_the_brokers(tmp_path):
    """A group that does not exist has the broker's values: Kafka's default (DEFAULT_CONFIG),
    or the broker's own setting (STATIC_BROKER_CONFIG) with Kafka's default as its synonym."""
    config = ConsumerGroupConfig(session_timeout_ms=50_000)
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), consumer_group_config=config) as srv:
        entries = describe(ck_admin(srv.bootstrap_servers), "nobody")
        assert set(entries) == {SESSION, HEARTBEAT}
        session, heartbeat = entries[SESSION], entries[HEARTBEAT]
        assert (session.value, session.source) == ("50000", ConfigSource.STATIC_BROKER_CONFIG.value)
        listed = kp_describe(srv.bootstrap_servers, "nobody")
        assert listed[SESSION]["synonyms"] == [
            {"name": "group.consumer.session.timeout.ms", "value": "50000", "source": "STATIC_BROKER_CONFIG"},
            {"name": "group.consumer.session.timeout.ms", "value": "45000", "source": "DEFAULT_CONFIG"}]
        assert (heartbeat.value, heartbeat.source, heartbeat.is_read_only) == (
            "5000", ConfigSource.DEFAULT_CONFIG.value, False)
        assert not (tmp_path / GROUP_CONFIG_FILE).exists()  # describing writes nothing


def test_set_delete_and_replace_read_back_by_the_other_client_and_the_file(server):
    admin = ck_admin(server.bootstrap_servers)
    assert incremental(admin, "g1", (SESSION, AlterConfigOpType.SET, "50000"),
                       (HEARTBEAT, AlterConfigOpType.SET, "6000")) is None
    entries = kp_describe(server.bootstrap_servers, "g1")
    assert entries[SESSION]["value"] == "50000" and entries[SESSION]["config_source"] == "DYNAMIC_GROUP_CONFIG"
    assert entries[SESSION]["synonyms"][0] == {"name": SESSION, "value": "50000", "source": "DYNAMIC_GROUP_CONFIG"}
    assert entries[HEARTBEAT]["value"] == "6000"
    assert on_disk(server.store.root) == {"g1": {SESSION: "50000", HEARTBEAT: "6000"}}
    # DELETE goes back to the broker's value
    assert incremental(admin, "g1", (HEARTBEAT, AlterConfigOpType.DELETE, None)) is None
    described = describe(admin, "g1")
    assert (described[HEARTBEAT].value, described[HEARTBEAT].source) == ("5000", ConfigSource.DEFAULT_CONFIG.value)
    assert described[SESSION].value == "50000"
    # kafka-python's AlterConfigs (incremental=False; the client adds the group's other set configs)
    client = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers, request_timeout_ms=10_000)
    try:
        answer = client.alter_configs([KpResource(ConfigResourceType.GROUP, "g1", {HEARTBEAT: "7000"})],
                                      incremental=False)
        assert answer == {"group": {"g1": "OK"}}
        # ... and its IncrementalAlterConfigs sets one
        answer = client.alter_configs([KpResource(ConfigResourceType.GROUP, "g2", {SESSION: "46000"})],
                                      incremental=True)
        assert answer == {"group": {"g2": "OK"}}
        # a bad value through AlterConfigs: refused, nothing replaced
        answer = client.alter_configs([KpResource(ConfigResourceType.GROUP, "g1", {SESSION: "5"})], incremental=False)
        assert answer["group"]["g1"].startswith("[Error 40]")
    finally:
        client.close()
    assert on_disk(server.store.root) == {"g1": {SESSION: "50000", HEARTBEAT: "7000"}, "g2": {SESSION: "46000"}}
    # confluent-kafka's AlterConfigs replaces the whole set: what it does not name goes
    [future] = admin.alter_configs([ConfigResource(ResourceType.GROUP, "g1", set_config={HEARTBEAT: "8000"})]).values()
    future.result(timeout=20)
    assert on_disk(server.store.root) == {"g1": {HEARTBEAT: "8000"}, "g2": {SESSION: "46000"}}
    assert describe(admin, "g1")[SESSION].value == "45000"
    # the last config deleted: the group leaves the file
    assert incremental(admin, "g2", (SESSION, AlterConfigOpType.DELETE, None)) is None
    assert on_disk(server.store.root) == {"g1": {HEARTBEAT: "8000"}}


def test_validate_only_keeps_nothing(server):
    admin = ck_admin(server.bootstrap_servers)
    assert incremental(admin, "g", (SESSION, AlterConfigOpType.SET, "50000"), validate_only=True) is None
    assert describe(admin, "g")[SESSION].value == "45000"
    error = incremental(admin, "g", (SESSION, AlterConfigOpType.SET, "1"), validate_only=True)
    assert error.code() == INVALID_CONFIG
    assert not os.path.exists(os.path.join(server.store.root, GROUP_CONFIG_FILE))


@pytest.mark.parametrize("changes, code, words", [
    ([("nope.ms", AlterConfigOpType.SET, "1")], INVALID_CONFIG, "Unknown group config name: nope.ms"),
    ([("share.auto.offset.reset", AlterConfigOpType.SET, "earliest")], INVALID_CONFIG, "no share groups"),
    ([("streams.session.timeout.ms", AlterConfigOpType.SET, "50000")], INVALID_CONFIG, "no streams groups"),
    ([(SESSION, AlterConfigOpType.SET, "abc")], INVALID_CONFIG, "Not a number of type INT"),
    ([(SESSION, AlterConfigOpType.SET, "1_000")], INVALID_CONFIG, "Not a number of type INT"),
    ([(SESSION, AlterConfigOpType.SET, "99999999999")], INVALID_CONFIG, "Not a number of type INT"),
    ([(SESSION, AlterConfigOpType.SET, "0")], INVALID_CONFIG, "at least 1"),
    ([(SESSION, AlterConfigOpType.SET, "44999")], INVALID_CONFIG, "group.consumer.min.session.timeout.ms"),
    ([(SESSION, AlterConfigOpType.SET, "60001")], INVALID_CONFIG, "group.consumer.max.session.timeout.ms"),
    ([(HEARTBEAT, AlterConfigOpType.SET, "4999")], INVALID_CONFIG, "group.consumer.min.heartbeat.interval.ms"),
    ([(HEARTBEAT, AlterConfigOpType.SET, "15001")], INVALID_CONFIG, "group.consumer.max.heartbeat.interval.ms"),
    ([(SESSION, AlterConfigOpType.APPEND, "1")], INVALID_CONFIG, "append is not allowed"),
])
def test_bad_changes_get_kafkas_errors_and_change_nothing(server, changes, code, words):
    admin = ck_admin(server.bootstrap_servers)
    assert incremental(admin, "g", (SESSION, AlterConfigOpType.SET, "50000")) is None
    error = incremental(admin, "g", *changes)
    assert error.code() == code and words in error.str()
    assert describe(admin, "g")[SESSION].value == "50000"


def test_the_session_must_outlast_the_heartbeat_and_an_empty_group_is_invalid(tmp_path):
    bounds = GroupConfigBounds(min_session_timeout_ms=1000, min_heartbeat_interval_ms=1000)
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), group_config_bounds=bounds) as srv:
        admin = ck_admin(srv.bootstrap_servers)
        error = incremental(admin, "g", (SESSION, AlterConfigOpType.SET, "5000"))
        assert error.code() == INVALID_CONFIG and "greater than consumer.heartbeat.interval.ms" in error.str()
        assert incremental(admin, "g", (SESSION, AlterConfigOpType.SET, "5001"),
                           (HEARTBEAT, AlterConfigOpType.SET, "1000")) is None
        client = KafkaAdminClient(bootstrap_servers=srv.bootstrap_servers, request_timeout_ms=10_000)
        try:
            answer = client.alter_configs([KpResource(ConfigResourceType.GROUP, "", {SESSION: "5001"})],
                                          incremental=True, raise_on_unknown=False)
            assert answer["group"][""].startswith(f"[Error {INVALID_REQUEST}]")
        finally:
            client.close()
        # the bounds and the defaults are the broker's configs
        [future] = admin.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
        broker = future.result(timeout=20)
        assert broker["group.consumer.min.session.timeout.ms"].value == "1000"
        assert broker["group.consumer.max.heartbeat.interval.ms"].value == "15000"


def test_group_configs_survive_a_restart(tmp_path):
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as srv:
        assert incremental(ck_admin(srv.bootstrap_servers), "kept", (SESSION, AlterConfigOpType.SET, "55000")) is None
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as srv:
        assert kp_describe(srv.bootstrap_servers, "kept")[SESSION]["value"] == "55000"


def test_acls_on_the_group_guard_its_configs(tmp_path):
    """DESCRIBE_CONFIGS and ALTER_CONFIGS on the group, as Kafka; else GROUP_AUTHORIZATION_FAILED."""
    users = {"admin": "admin-secret", "alice": "alice-secret"}

    def login(user):
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": user,
                "sasl.password": users[user]}

    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), authorizer=True, sasl_credentials=users,
                     super_users=["User:admin"]) as srv:
        root, alice = ck_admin(srv.bootstrap_servers, **login("admin")), ck_admin(srv.bootstrap_servers,
                                                                                   **login("alice"))
        with pytest.raises(KafkaException) as denied:
            describe(alice, "g")
        assert denied.value.args[0].code() == GROUP_AUTHORIZATION_FAILED
        assert incremental(alice, "g", (SESSION, AlterConfigOpType.SET, "50000")).code() == GROUP_AUTHORIZATION_FAILED

        def grant(operation):
            binding = AclBinding(ResourceType.GROUP, "g", ResourcePatternType.LITERAL, "User:alice", "*", operation,
                                 AclPermissionType.ALLOW)
            [future] = root.create_acls([binding]).values()
            future.result(timeout=20)

        grant(AclOperation.DESCRIBE_CONFIGS)
        assert describe(alice, "g")[SESSION].value == "45000"
        assert incremental(alice, "g", (SESSION, AlterConfigOpType.SET, "50000")).code() == GROUP_AUTHORIZATION_FAILED
        grant(AclOperation.ALTER_CONFIGS)
        assert incremental(alice, "g", (SESSION, AlterConfigOpType.SET, "50000")) is None
        assert describe(root, "g")[SESSION].value == "50000"
        with pytest.raises(KafkaException) as other:
            describe(alice, "other")
        assert other.value.args[0].code() == GROUP_AUTHORIZATION_FAILED


def test_a_lowered_session_timeout_fences_a_killed_member_by_the_groups_timeout(tmp_path):
    """The broker's session timeout is ten minutes; the group's, set while its members run, is
    two seconds. Once the members heartbeat again (a third member joins: every member
    reconciles through heartbeats), a killed member's partitions move to the others long before
    the broker's timeout could end its session."""
    from .test_kip848 import PARTITIONS, Member, stable, wait_for

    config = ConsumerGroupConfig(session_timeout_ms=600_000, heartbeat_interval_ms=500)
    bounds = GroupConfigBounds(min_session_timeout_ms=1000, min_heartbeat_interval_ms=100)
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), consumer_group_config=config, group_config_bounds=bounds) as srv:
        srv.store.create_topic("work", partitions=PARTITIONS)
        members = [Member(srv.bootstrap_servers, group="lowered") for _ in range(2)]
        try:
            wait_for("both members assigned", lambda: stable(members))
            admin = ck_admin(srv.bootstrap_servers)
            assert incremental(admin, "lowered", (SESSION, AlterConfigOpType.SET, "2000"),
                               (HEARTBEAT, AlterConfigOpType.SET, "200")) is None
            members.append(Member(srv.bootstrap_servers, group="lowered"))
            wait_for("three members assigned", lambda: stable(members) and all(m.assignment() for m in members))
            members[0].kill()
            wait_for("the survivors holding every partition", lambda: stable(members[1:]), timeout=120)
        finally:
            for m in members:
                m.stop()


def test_a_broker_serving_only_classic_groups_refuses_group_configs(tmp_path):
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0), consumer_group_config=None) as srv:
        admin = ck_admin(srv.bootstrap_servers)
        error = incremental(admin, "g", (SESSION, AlterConfigOpType.SET, "50000"))
        assert error.code() == INVALID_CONFIG and "rebalance.protocols=classic" in error.str()
        assert describe(admin, "g")[SESSION].value == "45000"
