"""Kafka's ACLs on ``logstore serve --authorizer``, through confluent-kafka, kafka-python,
aiokafka and kcat: the admin clients create, describe and delete them; principals from SASL
users (and ``User:ANONYMOUS`` without SASL) are denied a topic, a group and a transactional id
with Kafka's errors while the rest of their requests is served; Metadata hides the topics a
principal may not describe; prefixed and literal patterns, deny over allow, super users,
``allow.everyone.if.no.acl.found`` both ways; the ACLs survive a restart and ``logstore acls``
changes them offline and while served. What was written is read back through the store, and
the ACLs through the store's file or another client."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from logstore.cli import main as cli_main
from logstore.kafka.aclfile import AclFile
from logstore.kafka.acls import AclOperation as Op, AclPermissionType as Perm, PatternType as PT, ResourceType as RT
from logstore.kafka.server import KafkaServer

kafka = pytest.importorskip("kafka")
ck = pytest.importorskip("confluent_kafka")
aiokafka = pytest.importorskip("aiokafka")
from confluent_kafka import KafkaError, KafkaException  # noqa: E402
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,  # noqa: E402
                                   AdminClient, ResourcePatternType, ResourceType)

USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
MECHANISM = "SCRAM-SHA-256"


def serve(root, **kwargs):
    kwargs.setdefault("sasl_credentials", USERS)
    kwargs.setdefault("super_users", ["User:admin"])
    return KafkaServer(str(root), ("127.0.0.1", 0), authorizer=True, **kwargs)


@pytest.fixture
def server(tmp_path):
    with serve(tmp_path / "store") as srv:
        yield srv


def ck_config(server, user):
    if user is None:
        return {"bootstrap.servers": server.bootstrap_servers}
    return {"bootstrap.servers": server.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": MECHANISM, "sasl.username": user, "sasl.password": USERS[user]}


def kp_config(server, user):
    return {"bootstrap_servers": server.bootstrap_servers, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": MECHANISM, "sasl_plain_username": user, "sasl_plain_password": USERS[user],
            "request_timeout_ms": 10_000}


_ADMINS: dict = {}


@pytest.fixture(autouse=True)
def _drop_admins():
    """The admin clients of a test go with it (else they keep calling its stopped server)."""
    yield
    _ADMINS.clear()


def admin(server, user="admin"):
    """One AdminClient per server and user, kept alive (a client collected before its
    futures are done fails them)."""
    key = (id(server), server.bootstrap_servers, user)
    if key not in _ADMINS:
        _ADMINS[key] = AdminClient({**ck_config(server, user), "socket.timeout.ms": 10_000})
    return _ADMINS[key]


def binding(kind, name, principal, operation, permission=AclPermissionType.ALLOW,
            pattern=ResourcePatternType.LITERAL, host="*"):
    return AclBinding(kind, name, pattern, principal, host, operation, permission)


def grant(server, *bindings):
    for future in admin(server).create_acls(list(bindings), request_timeout=10).values():
        assert future.result() is None


def describe_with_kafka_python(server, user):
    """Every ACL, as kafka-python's admin client describes them (it raises the answer's error)."""
    from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, ResourcePatternFilter
    from kafka.admin import ACLResourcePatternType, ResourceType as KType
    config = kp_config(server, user) if user else {"bootstrap_servers": server.bootstrap_servers}
    client = kafka.KafkaAdminClient(**config)
    try:
        described, _ = client.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                                      ResourcePatternFilter(KType.ANY, None,
                                                                            ACLResourcePatternType.ANY)))
        return described
    finally:
        client.close()


def stored(server, topic):
    if topic not in server.store.topics():
        return []
    return [r.value for r in server.store.partition(topic, 0).iter()]


def produce_error(server, user, topic, value=b"v"):
    """The error of one confluent-kafka produce (None: delivered)."""
    producer = ck.Producer({**ck_config(server, user), "message.timeout.ms": 10_000})
    errors = []
    producer.produce(topic, value, on_delivery=lambda err, msg: errors.append(err))
    producer.flush(15)
    assert len(errors) == 1
    return errors[0]


ANY_FILTER = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                              AclPermissionType.ANY)


# ---------------------------------------------------------------------- the ACL APIs
def test_confluent_creates_describes_and_deletes_acls_read_back_from_the_store(server):
    a = admin(server)
    made = [binding(ResourceType.TOPIC, "orders", "User:alice", AclOperation.READ),
            binding(ResourceType.GROUP, "app-", "User:bob", AclOperation.ALL, AclPermissionType.DENY,
                    ResourcePatternType.PREFIXED),
            binding(ResourceType.TRANSACTIONAL_ID, "tx", "User:alice", AclOperation.WRITE, host="127.0.0.1"),
            binding(ResourceType.BROKER, "kafka-cluster", "User:*", AclOperation.IDEMPOTENT_WRITE)]
    for future in a.create_acls(made, request_timeout=10).values():
        assert future.result() is None
    # the store's own file holds them (another reader than the protocol)
    on_disk = {(b.resource_type, b.name, b.pattern_type, b.principal, b.host, b.operation, b.permission)
               for b in AclFile(server.store.root).current()}
    assert on_disk == {(RT.TOPIC, "orders", PT.LITERAL, "User:alice", "*", Op.READ, Perm.ALLOW),
                       (RT.GROUP, "app-", PT.PREFIXED, "User:bob", "*", Op.ALL, Perm.DENY),
                       (RT.TRANSACTIONAL_ID, "tx", PT.LITERAL, "User:alice", "127.0.0.1", Op.WRITE, Perm.ALLOW),
                       (RT.CLUSTER, "kafka-cluster", PT.LITERAL, "User:*", "*", Op.IDEMPOTENT_WRITE, Perm.ALLOW)}
    assert sorted(map(str, a.describe_acls(ANY_FILTER, request_timeout=10).result())) == sorted(map(str, made))
    # MATCH: the bindings that apply to group app-1
    match = AclBindingFilter(ResourceType.GROUP, "app-1", ResourcePatternType.MATCH, None, None, AclOperation.ANY,
                             AclPermissionType.ANY)
    assert [str(b) for b in a.describe_acls(match, request_timeout=10).result()] == [str(made[1])]
    topics = AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                              AclPermissionType.ANY)
    deleted = {str(k): [str(b) for b in v.result()] for k, v in a.delete_acls([topics], request_timeout=10).items()}
    assert list(deleted.values()) == [[str(made[0])]]
    assert len(AclFile(server.store.root).current()) == 3


def test_kafka_python_admin_creates_describes_and_deletes_acls(server):
    from kafka.admin import ACL, ACLFilter, ACLOperation, ACLPermissionType, ResourcePattern, ResourcePatternFilter
    from kafka.admin import ACLResourcePatternType, ResourceType as KType
    client = kafka.KafkaAdminClient(**kp_config(server, "admin"))
    try:
        acl = ACL("User:alice", "*", ACLOperation.WRITE, ACLPermissionType.ALLOW,
                  ResourcePattern(KType.TOPIC, "logs-", ACLResourcePatternType.PREFIXED))
        result = client.create_acls([acl])
        assert result["failed"] == [] and len(result["succeeded"]) == 1
        described, error = client.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                                          ResourcePatternFilter(KType.ANY, None,
                                                                                ACLResourcePatternType.ANY)))
        assert error is kafka.errors.NoError and [a.resource_pattern.resource_name for a in described] == ["logs-"]
        # a confluent-kafka client sees what kafka-python made
        assert [b.name for b in admin(server).describe_acls(ANY_FILTER, request_timeout=10).result()] == ["logs-"]
        # ... and the grant holds: alice writes logs-1
        server.store.create_topic("logs-1", 1)
        assert produce_error(server, "alice", "logs-1") is None and stored(server, "logs-1") == [b"v"]
        removed = client.delete_acls([ACLFilter("User:alice", None, ACLOperation.ANY, ACLPermissionType.ANY,
                                                ResourcePatternFilter(KType.TOPIC, None, ACLResourcePatternType.ANY))])
        assert [len(matched) for _, matched, _ in removed] == [1]
    finally:
        client.close()
    assert len(AclFile(server.store.root).current()) == 0


def test_a_principal_without_alter_on_the_cluster_may_not_change_acls(server):
    a = admin(server, "alice")
    futures = a.create_acls([binding(ResourceType.TOPIC, "t", "User:alice", AclOperation.ALL)], request_timeout=10)
    for future in futures.values():
        with pytest.raises(KafkaException) as info:
            future.result()
        assert info.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # (librdkafka drops DescribeAcls' error: kafka-python reports it)
    with pytest.raises(kafka.errors.ClusterAuthorizationFailedError):
        describe_with_kafka_python(server, "alice")
    assert len(AclFile(server.store.root).current()) == 0
    # ALTER on the cluster lets bob do it
    grant(server, binding(ResourceType.BROKER, "kafka-cluster", "User:bob", AclOperation.ALTER))
    grant_by_bob = admin(server, "bob").create_acls([binding(ResourceType.TOPIC, "t", "User:bob", AclOperation.READ)],
                                                    request_timeout=10)
    assert [f.result() for f in grant_by_bob.values()] == [None]


def test_acl_requests_without_an_authorizer_are_security_disabled(tmp_path):
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as srv:
        a = AdminClient({"bootstrap.servers": srv.bootstrap_servers})
        with pytest.raises(kafka.errors.SecurityDisabledError):
            describe_with_kafka_python(srv, None)
        for future in a.create_acls([binding(ResourceType.TOPIC, "t", "User:x", AclOperation.READ)],
                                    request_timeout=10).values():
            with pytest.raises(KafkaException) as info:
                future.result()
            assert info.value.args[0].code() == KafkaError.SECURITY_DISABLED
        # and everyone may do everything
        assert produce_error(srv, None, "open") is None and stored(srv, "open") == [b"v"]


def test_an_invalid_creation_is_invalid_request_and_the_valid_ones_are_added(server):
    from kafka.admin import ACL, ACLOperation, ACLPermissionType, ResourcePattern, ACLResourcePatternType
    from kafka.admin import ResourceType as KType
    client = kafka.KafkaAdminClient(**kp_config(server, "admin"))
    try:
        good = ACL("User:alice", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                   ResourcePattern(KType.TOPIC, "a", ACLResourcePatternType.LITERAL))
        bad_cluster = ACL("User:alice", "*", ACLOperation.ALTER, ACLPermissionType.ALLOW,
                          ResourcePattern(KType.CLUSTER, "not-the-cluster", ACLResourcePatternType.LITERAL))
        bad_principal = ACL("alice", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                            ResourcePattern(KType.GROUP, "g", ACLResourcePatternType.LITERAL))
        result = client.create_acls([good, bad_cluster, bad_principal])
    finally:
        client.close()
    assert [a.resource_pattern.resource_name for a in result["succeeded"]] == ["a"]
    assert [e.__name__ for e in result["failed"]] == ["InvalidRequestError", "InvalidRequestError"]
    assert [b.name for b in AclFile(server.store.root).current()] == ["a"]


# ---------------------------------------------------------------------- enforcement
def test_confluent_producer_denied_a_topic_gets_topic_authorization_failed(server):
    grant(server, binding(ResourceType.TOPIC, "allowed", "User:alice", AclOperation.WRITE))
    server.store.create_topic("allowed", 1)  # (WRITE alone does not create it: CREATE does)
    server.store.create_topic("denied", 1)
    assert produce_error(server, "alice", "allowed") is None
    error = produce_error(server, "alice", "denied")
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert stored(server, "allowed") == [b"v"] and stored(server, "denied") == []


def test_one_produce_request_is_served_for_its_allowed_topic_and_refused_for_the_other(server):
    """kafka-python sends both topics' batches in one Produce request: one is appended, the
    other answered TOPIC_AUTHORIZATION_FAILED."""
    grant(server, binding(ResourceType.TOPIC, "yes", "User:alice", AclOperation.WRITE),
          binding(ResourceType.TOPIC, "no", "User:alice", AclOperation.DESCRIBE))
    server.store.create_topic("yes", 1)
    server.store.create_topic("no", 1)
    producer = kafka.KafkaProducer(**kp_config(server, "alice"), linger_ms=500, retries=0)
    try:
        yes, no = producer.send("yes", b"in"), producer.send("no", b"out")
        producer.flush(10)
        assert yes.get(10).offset == 0
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            no.get(10)
    finally:
        producer.close()
    assert stored(server, "yes") == [b"in"] and stored(server, "no") == []


def test_metadata_lists_only_the_topics_a_principal_may_describe(server):
    for name in ("public", "secret", "app-a", "app-b"):
        server.store.create_topic(name, 1)
    grant(server, binding(ResourceType.TOPIC, "public", "User:alice", AclOperation.READ),
          binding(ResourceType.TOPIC, "app-", "User:alice", AclOperation.DESCRIBE,
                  pattern=ResourcePatternType.PREFIXED),
          binding(ResourceType.TOPIC, "app-b", "User:alice", AclOperation.DESCRIBE, AclPermissionType.DENY))
    assert set(admin(server, "alice").list_topics(timeout=10).topics) == {"public", "app-a"}
    assert set(admin(server, "bob").list_topics(timeout=10).topics) == set()
    assert {"public", "secret", "app-a", "app-b"} <= set(admin(server).list_topics(timeout=10).topics)  # super user
    consumer = kafka.KafkaConsumer(**kp_config(server, "alice"))
    try:
        assert consumer.topics() == {"public", "app-a"}
    finally:
        consumer.close()
    # a denied topic asked for by name: TOPIC_AUTHORIZATION_FAILED, and no auto-creation
    md = admin(server, "bob").list_topics("new-topic", timeout=10)
    assert md.topics["new-topic"].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "new-topic" not in server.store.topics()


def test_auto_creation_needs_create_on_the_cluster_or_the_topic(server):
    grant(server, binding(ResourceType.TOPIC, "auto-", "User:alice", AclOperation.ALL,
                          pattern=ResourcePatternType.PREFIXED))
    assert produce_error(server, "alice", "auto-made") is None
    assert stored(server, "auto-made") == [b"v"]
    grant(server, binding(ResourceType.TOPIC, "nocreate", "User:bob", AclOperation.WRITE))
    md = admin(server, "bob").list_topics("nocreate", timeout=10)
    assert md.topics["nocreate"].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "nocreate" not in server.store.topics()


def test_confluent_consumer_denied_a_group_gets_group_authorization_failed(server):
    server.store.create_topic("data", 1)
    server.store.partition("data", 0).append(b"record")
    grant(server, binding(ResourceType.TOPIC, "data", "User:alice", AclOperation.READ),
          binding(ResourceType.GROUP, "good", "User:alice", AclOperation.READ))
    consumer = ck.Consumer({**ck_config(server, "alice"), "group.id": "bad", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe(["data"])
        deadline = time.monotonic() + 15
        error = None
        while error is None and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is not None:
                error = m.error()
        assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        consumer.close()
    consumer = ck.Consumer({**ck_config(server, "alice"), "group.id": "good", "auto.offset.reset": "earliest",
                            "enable.auto.commit": False})
    try:
        consumer.subscribe(["data"])
        deadline = time.monotonic() + 20
        got = None
        while got is None and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got = m.value()
        assert got == b"record"
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    # the group's commit is in the store, read back by the super user
    committed = admin(server).list_consumer_group_offsets(
        [ck.ConsumerGroupTopicPartitions("good")])["good"].result()
    assert [tp.offset for tp in committed.topic_partitions] == [1]
    # ListGroups shows alice only the group she may describe; the super user both
    listed = admin(server, "alice").list_consumer_groups(request_timeout=10).result()
    assert {g.group_id for g in listed.valid} == {"good"}


def test_confluent_transactional_producer_denied_its_transactional_id(server):
    grant(server, binding(ResourceType.TOPIC, "tx-topic", "User:alice", AclOperation.WRITE),
          binding(ResourceType.TRANSACTIONAL_ID, "tx-good", "User:alice", AclOperation.WRITE))
    server.store.create_topic("tx-topic", 1)
    producer = ck.Producer({**ck_config(server, "alice"), "transactional.id": "tx-bad"})
    with pytest.raises(KafkaException) as info:
        producer.init_transactions(15)
    assert info.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    producer = ck.Producer({**ck_config(server, "alice"), "transactional.id": "tx-good"})
    producer.init_transactions(15)
    producer.begin_transaction()
    producer.produce("tx-topic", b"committed")
    producer.commit_transaction(15)
    assert stored(server, "tx-topic") == [b"committed"]


def test_kafka_python_gets_kafkas_errors_for_a_topic_a_group_and_a_transactional_id(server):
    server.store.create_topic("kp-data", 1)
    grant(server, binding(ResourceType.TOPIC, "kp-data", "User:alice", AclOperation.DESCRIBE))
    producer = kafka.KafkaProducer(**kp_config(server, "alice"), retries=0)
    try:
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            producer.send("kp-data", b"x").get(10)
    finally:
        producer.close()
    with pytest.raises(kafka.errors.TransactionalIdAuthorizationFailedError):
        producer = kafka.KafkaProducer(**kp_config(server, "alice"), transactional_id="kp-tx")
        try:
            producer.init_transactions()
        finally:
            producer.close(timeout=1)
    grant(server, binding(ResourceType.TOPIC, "kp-data", "User:alice", AclOperation.READ))
    consumer = kafka.KafkaConsumer("kp-data", **kp_config(server, "alice"), group_id="kp-group",
                                   consumer_timeout_ms=5000)
    try:
        with pytest.raises(kafka.errors.GroupAuthorizationFailedError):
            consumer.poll(timeout_ms=5000)
            consumer.poll(timeout_ms=5000)
    finally:
        consumer.close(autocommit=False)
    assert stored(server, "kp-data") == []


def test_aiokafka_gets_kafkas_errors_for_a_topic_a_group_and_a_transactional_id(server):
    server.store.create_topic("aio-data", 1)
    server.store.partition("aio-data", 0).append(b"r")
    grant(server, binding(ResourceType.TOPIC, "aio-data", "User:alice", AclOperation.READ))
    config = {"bootstrap_servers": server.bootstrap_servers, "security_protocol": "SASL_PLAINTEXT",
              "sasl_mechanism": MECHANISM, "sasl_plain_username": "alice",
              "sasl_plain_password": USERS["alice"], "request_timeout_ms": 10_000}

    async def run():
        errors = {}
        producer = aiokafka.AIOKafkaProducer(**config)
        await producer.start()
        try:
            try:
                await producer.send_and_wait("aio-data", b"x")
            except aiokafka.errors.TopicAuthorizationFailedError as exc:
                errors["produce"] = exc
        finally:
            await producer.stop()
        producer = aiokafka.AIOKafkaProducer(**config, transactional_id="aio-tx")
        try:
            await producer.start()
        except aiokafka.errors.TransactionalIdAuthorizationFailed as exc:
            errors["transaction"] = exc
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer("aio-data", **config, group_id="aio-group")
        try:
            await consumer.start()
            await asyncio.wait_for(consumer.getone(), 10)
        except aiokafka.errors.GroupAuthorizationFailedError as exc:
            errors["group"] = exc
        finally:
            await consumer.stop()
        return errors

    errors = asyncio.run(run())
    assert set(errors) == {"produce", "transaction", "group"}
    assert stored(server, "aio-data") == [b"r"]


def test_kcat_lists_only_the_described_topics_and_reads_with_read(server):
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        pytest.skip("kcat is not installed (Debian: apt-get install kcat)")
    server.store.create_topic("kc-visible", 1)
    server.store.create_topic("kc-hidden", 1)
    server.store.partition("kc-visible", 0).append(b"hello")
    grant(server, binding(ResourceType.TOPIC, "kc-visible", "User:alice", AclOperation.READ))
    common = [kcat, "-b", server.bootstrap_servers, "-X", "security.protocol=SASL_PLAINTEXT",
              "-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=alice", "-X",
              f"sasl.password={USERS['alice']}"]
    listing = subprocess.run(common + ["-L"], capture_output=True, text=True, timeout=30)
    assert "kc-visible" in listing.stdout and "kc-hidden" not in listing.stdout
    read = subprocess.run(common + ["-C", "-t", "kc-visible", "-o", "beginning", "-e", "-q"], capture_output=True,
                          text=True, timeout=30)
    assert read.stdout.splitlines() == ["hello"]


# ---------------------------------------------------------------------- the rules end to end
def test_deny_wins_over_allow_and_prefixed_patterns_cover_their_names(server):
    grant(server, binding(ResourceType.TOPIC, "app-", "User:alice", AclOperation.WRITE,
                          pattern=ResourcePatternType.PREFIXED),
          binding(ResourceType.TOPIC, "app-secret", "User:alice", AclOperation.WRITE, AclPermissionType.DENY),
          binding(ResourceType.TOPIC, "*", "User:bob", AclOperation.WRITE))
    for name in ("app-ok", "app-secret", "other"):
        server.store.create_topic(name, 1)
    assert produce_error(server, "alice", "app-ok") is None
    assert produce_error(server, "alice", "app-secret").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_error(server, "alice", "other").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # bob's wildcard ALLOW covers app-secret, but the resource's DENY is alice's only
    assert produce_error(server, "bob", "app-secret") is None
    assert stored(server, "app-ok") == [b"v"] and stored(server, "app-secret") == [b"v"]


def test_allow_everyone_if_no_acl_found_both_ways(tmp_path):
    with serve(tmp_path / "open", allow_everyone_if_no_acl_found=True) as srv:
        assert produce_error(srv, "alice", "no-acls") is None
        grant(srv, binding(ResourceType.TOPIC, "guarded", "User:bob", AclOperation.WRITE))
        # a resource with ACLs is closed to those they do not name
        assert produce_error(srv, "alice", "guarded").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert stored(srv, "no-acls") == [b"v"]
    with serve(tmp_path / "closed") as srv:
        assert produce_error(srv, "alice", "no-acls").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert produce_error(srv, "admin", "no-acls") is None  # a super user


def test_anonymous_principal_without_sasl(tmp_path):
    with serve(tmp_path, sasl_credentials=None, super_users=()) as srv:
        assert produce_error(srv, None, "anon").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        cli = cli_main(["acls", "add", str(tmp_path), "--allow-principal", "User:ANONYMOUS", "--operation", "All",
                        "--topic", "anon"])
        assert cli == 0
        assert produce_error(srv, None, "anon") is None
        assert stored(srv, "anon") == [b"v"]


def test_grants_and_denials_survive_a_restart(tmp_path):
    root = tmp_path / "store"
    with serve(root) as srv:
        grant(srv, binding(ResourceType.TOPIC, "kept", "User:alice", AclOperation.ALL),
              binding(ResourceType.TOPIC, "kept", "User:bob", AclOperation.ALL, AclPermissionType.DENY))
        assert produce_error(srv, "alice", "kept") is None
    with serve(root) as srv:
        assert produce_error(srv, "alice", "kept") is None
        assert produce_error(srv, "bob", "kept").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert len(admin(srv).describe_acls(ANY_FILTER, request_timeout=10).result()) == 2
        assert stored(srv, "kept") == [b"v", b"v"]


def test_logstore_acls_offline_then_served_then_changed_while_served(tmp_path):
    root = tmp_path / "store"
    assert cli_main(["acls", "add", str(root), "--allow-principal", "User:alice", "--operation", "Write",
                     "--topic", "cli-"]) == 1  # no store there
    root.mkdir()
    assert cli_main(["acls", "add", str(root), "--allow-principal", "User:alice", "--operation", "Write",
                     "--operation", "Create", "--topic", "cli-", "--resource-pattern-type", "prefixed"]) == 0
    with serve(root) as srv:
        assert produce_error(srv, "alice", "cli-one") is None
        listed = admin(srv).describe_acls(ANY_FILTER, request_timeout=10).result()
        assert sorted(b.operation for b in listed) == sorted([AclOperation.WRITE, AclOperation.CREATE])
        # another process (the CLI in a child) denies it while the server runs
        done = subprocess.run([sys.executable, "-m", "logstore", "acls", "add", str(root), "--deny-principal",
                               "User:alice", "--operation", "Write", "--topic", "cli-one"], capture_output=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert produce_error(srv, "alice", "cli-one").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert cli_main(["acls", "remove", str(root), "--topic", "cli-one"]) == 0
        assert produce_error(srv, "alice", "cli-one") is None
    assert stored_after(root, "cli-one") == [b"v", b"v"]


def stored_after(root, topic):
    from logstore import LogStore
    with LogStore(str(root)) as store:
        return [r.value for r in store.partition(topic, 0).iter()]


def test_authorized_operations_are_the_principals(server):
    server.store.create_topic("ops", 1)
    grant(server, binding(ResourceType.TOPIC, "ops", "User:alice", AclOperation.READ))
    a = admin(server, "alice")
    described = a.describe_topics(ck.TopicCollection(["ops"]), include_authorized_operations=True)
    ops = set(described["ops"].result().authorized_operations)
    assert ops == {AclOperation.READ, AclOperation.DESCRIBE}


@contextlib.contextmanager
def serve_cli(root, *flags):
    """``logstore serve ROOT --listen 127.0.0.1:0 FLAGS`` in a child process: its bootstrap
    address; stopped with SIGTERM, which it must obey."""
    proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", str(root), "--listen", "127.0.0.1:0",
                             *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), (line, proc.stderr.read() if proc.poll() is not None else "")
        yield line.split(" on ")[1].strip()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_logstore_serve_authorizer_flags(tmp_path):
    """``logstore serve --authorizer --super-users ... --allow-everyone-if-no-acl-found``: a topic
    without ACLs is open, one with ACLs closed to the others; the super user passes."""
    root = tmp_path / "store"
    root.mkdir()
    assert cli_main(["acls", "add", str(root), "--allow-principal", "User:bob", "--operation", "All",
                     "--topic", "closed"]) == 0
    with serve_cli(root, "--authorizer", "--super-users", "User:nobody;User:ANONYMOUS",
                   "--allow-everyone-if-no-acl-found") as bootstrap:
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10_000, retries=0)
        try:
            assert producer.send("open", b"a").get(10).offset == 0
            assert producer.send("closed", b"b").get(10).offset == 0  # ANONYMOUS is a super user here
        finally:
            producer.close()
    with serve_cli(root, "--authorizer", "--allow-everyone-if-no-acl-found") as bootstrap:
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10_000, retries=0)
        try:
            assert producer.send("open", b"c").get(10).offset == 1
            with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
                producer.send("closed", b"d").get(10)
        finally:
            producer.close()
    assert stored_after(root, "open") == [b"a", b"c"] and stored_after(root, "closed") == [b"b"]


def test_admin_requests_per_resource(server):
    """CreateTopics, DeleteTopics, DescribeConfigs and DescribeGroups answer each resource on its
    own: the denied ones with Kafka's error, the others served."""
    from confluent_kafka.admin import ConfigResource, NewTopic
    server.store.create_topic("mine", 1)
    server.store.create_topic("theirs", 1)
    grant(server, binding(ResourceType.TOPIC, "new-", "User:alice", AclOperation.CREATE,
                          pattern=ResourcePatternType.PREFIXED),
          binding(ResourceType.TOPIC, "mine", "User:alice", AclOperation.ALL),
          binding(ResourceType.GROUP, "grp", "User:alice", AclOperation.DESCRIBE))
    a = admin(server, "alice")
    created = a.create_topics([NewTopic("new-ok", 1), NewTopic("other-new", 1)], request_timeout=10)
    assert created["new-ok"].result() is None
    with pytest.raises(KafkaException) as info:
        created["other-new"].result()
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "new-ok" in server.store.topics() and "other-new" not in server.store.topics()
    configs = a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "mine"),
                                  ConfigResource(ConfigResource.Type.TOPIC, "theirs")], request_timeout=10)
    by_name = {resource.name: future for resource, future in configs.items()}
    assert "cleanup.policy" in by_name["mine"].result()
    with pytest.raises(KafkaException) as info:
        by_name["theirs"].result()
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    deleted = a.delete_topics(["mine", "theirs"], request_timeout=10)
    assert deleted["mine"].result() is None
    with pytest.raises(KafkaException) as info:
        deleted["theirs"].result()
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "mine" not in server.store.topics() and "theirs" in server.store.topics()
    groups = a.describe_consumer_groups(["grp", "hidden"], include_authorized_operations=True, request_timeout=10)
    assert set(groups["grp"].result().authorized_operations) == {AclOperation.DESCRIBE}
    with pytest.raises(KafkaException) as info:
        groups["hidden"].result()
    assert info.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_a_consumer_without_read_gets_topic_authorization_failed(server):
    """kafka-python's consumer raises Kafka's error; librdkafka's never delivers the record."""
    server.store.create_topic("unreadable", 1)
    server.store.partition("unreadable", 0).append(b"secret")
    grant(server, binding(ResourceType.TOPIC, "unreadable", "User:alice", AclOperation.DESCRIBE))
    consumer = kafka.KafkaConsumer(**kp_config(server, "alice"), enable_auto_commit=False)
    try:
        tp = kafka.TopicPartition("unreadable", 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                assert not consumer.poll(timeout_ms=500)
    finally:
        consumer.close()
    consumer = ck.Consumer({**ck_config(server, "alice"), "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition("unreadable", 0, 0)])
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            m = consumer.poll(0.5)
            assert m is None or m.error() is not None
    finally:
        consumer.close()
