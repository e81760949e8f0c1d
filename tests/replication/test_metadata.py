"""Topics changed at runtime on a replica set (replica.metadata): topic configs and new
partitions go to the leader of ``__cluster_metadata-0`` (forwarded there by the other nodes),
are answered once a majority holds them, and reach every node's store; a node down during a
change catches up when it rejoins; an acknowledged change survives the leader's SIGKILL; new
partitions take produces with keys, partitioned as Kafka's, and are consumed by another client."""

from __future__ import annotations

import threading
import time

import pytest
from kafka.protocol.admin import (DescribeConfigsRequest, DescribeConfigsResponse, DescribeQuorumRequest,
                                  DescribeQuorumResponse, IncrementalAlterConfigsRequest,
                                  IncrementalAlterConfigsResponse)

from logstore.replica.metadata import METADATA_TOPIC
from logstore.replication import ReplicaNode

from .kafkanodes import KafkaNodes
from .test_inprocess import SECRET, wait_for
from .test_kafka_listener import Conn, kafka_cluster, leader_of, stop_all

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError  # noqa: E402
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,  # noqa: E402
                                   NewPartitions)

TOPIC = "replicated"
META = (METADATA_TOPIC, 0)
RETRIED = (KafkaError.NOT_CONTROLLER, KafkaError.REQUEST_TIMED_OUT)


def login(addrs):
    return {"bootstrap.servers": ",".join(f"{h}:{p}" for h, p in addrs.values()), "security.protocol":
            "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "replica",
            "sasl.password": SECRET.decode()}


def kafka_python_login(addrs):
    return {"bootstrap_servers": [f"{h}:{p}" for h, p in addrs.values()], "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "replica",
            "sasl_plain_password": SECRET.decode()}


def until_done(call, timeout=30.0):
    """confluent-kafka admin futures' results, retried while the metadata has no leader yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return [f.result(timeout=20) for f in call().values()]
        except confluent_kafka.KafkaException as exc:
            if exc.args[0].code() not in RETRIED or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def set_config(address, name, value, topic=TOPIC):
    """IncrementalAlterConfigs SET on one node's listener (kafka-python's messages): its error
    code, retried while the metadata has no leader."""
    R = IncrementalAlterConfigsRequest
    request = R(resources=[R.AlterConfigsResource(resource_type=2, resource_name=topic, configs=[
        R.AlterConfigsResource.AlterableConfig(name=name, config_operation=0, value=value)])],
        validate_only=False, version=1)
    conn = Conn(address)
    try:
        deadline = time.monotonic() + 30
        while True:
            answer = conn.call(request, IncrementalAlterConfigsResponse)
            code = answer.responses[0].error_code
            if code not in RETRIED or time.monotonic() > deadline:
                return code, answer.responses[0].error_message
            time.sleep(0.2)
    finally:
        conn.close()


def described(address, name, topic=TOPIC):
    """One topic config's value as one node's DescribeConfigs (kafka-python's messages) names it."""
    D = DescribeConfigsRequest
    conn = Conn(address)
    try:
        answer = conn.call(D(resources=[D.DescribeConfigsResource(resource_type=2, resource_name=topic,
                                                                  configuration_keys=[name])],
                             include_synonyms=False, include_documentation=False, version=3),
                           DescribeConfigsResponse)
    finally:
        conn.close()
    [result] = answer.results
    assert result.error_code == 0, result
    return {c.name: c.value for c in result.configs}[name]


def restart(tmp_path, addrs, i, partitions=((TOPIC, 1),)):
    return ReplicaNode(i, str(tmp_path / f"node{i}"), addrs[i], {j: a for j, a in addrs.items() if j != i},
                       SECRET, election_timeout_ms=300, partitions=partitions).start()


def test_a_topic_config_set_through_a_follower_reaches_every_node_and_survives_restarts(tmp_path):
    nodes, addrs = kafka_cluster(tmp_path)
    try:
        leader = leader_of(nodes, META)
        follower, other = [i for i in nodes if i != leader]
        # IncrementalAlterConfigs on a follower's listener: forwarded to the metadata's leader
        assert set_config(addrs[follower], "retention.ms", "123456") == (0, None)
        for node in nodes.values():  # every node's store, and its open log, took it
            wait_for(lambda: node.store.partition(TOPIC, 0).config.retention_ms == 123456)
        wait_for(lambda: described(addrs[other], "retention.ms") == "123456")
        # a bad value and an unknown name are refused with Kafka's error, through the follower too
        assert set_config(addrs[follower], "retention.ms", "soon")[0] == KafkaError.INVALID_CONFIG
        assert set_config(addrs[follower], "no.such.config", "1")[0] == KafkaError.INVALID_CONFIG
        assert set_config(addrs[follower], "retention.ms", "1", topic="missing")[0] == \
            KafkaError.UNKNOWN_TOPIC_OR_PART
        # confluent-kafka's AlterConfigs replaces the whole set; kafka-python reads it back
        admin = AdminClient(login(addrs))
        until_done(lambda: admin.alter_configs([ConfigResource("topic", TOPIC, set_config={
            "cleanup.policy": "compact", "segment.bytes": "1048576"})]))
        for node in nodes.values():
            wait_for(lambda: node.store.partition(TOPIC, 0).config.cleanup_policy == "compact")
            assert node.store.partition(TOPIC, 0).config.retention_ms != 123456
        from kafka.admin import ConfigResource as KPConfigResource, ConfigResourceType, KafkaAdminClient
        kp = KafkaAdminClient(**kafka_python_login(addrs))
        try:
            def kafka_python_view():
                answer = kp.describe_configs([KPConfigResource(ConfigResourceType.TOPIC, TOPIC)])
                [configs] = [named for kind in answer.values() for named in kind.values()]
                return {name: entry["value"] if isinstance(entry, dict) else entry for name, entry in configs.items()}
            wait_for(lambda: kafka_python_view().get("cleanup.policy") == "compact")
            assert "retention.ms" not in kafka_python_view()  # (only the modified ones: replaced)
        finally:
            kp.close()
        # broker configs are each node's own: refused
        broker = ConfigResource("broker", str(follower), incremental_configs=[
            ConfigEntry("log.retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(confluent_kafka.KafkaException) as refused:
            until_done(lambda: admin.incremental_alter_configs([broker]))
        assert refused.value.args[0].code() == KafkaError.POLICY_VIOLATION
    finally:
        stop_all(nodes)
    # the whole set restarted on its directories: the config is the metadata's, applied again
    nodes = {i: restart(tmp_path, addrs, i) for i in addrs}
    try:
        for node in nodes.values():
            assert node.store.partition(TOPIC, 0).config.cleanup_policy == "compact"
        leader_of(nodes, META)
        wait_for(lambda: described(addrs[0], "segment.bytes") == "1048576")
    finally:
        stop_all(nodes)


def test_a_node_down_during_changes_catches_up_when_it_rejoins(tmp_path):
    nodes, addrs = kafka_cluster(tmp_path)
    try:
        leader = leader_of(nodes, META)
        down = next(i for i in nodes if i != leader)
        nodes[down].stop()
        live = {i: a for i, a in addrs.items() if i != down}
        admin = AdminClient(login(live))
        until_done(lambda: admin.incremental_alter_configs([ConfigResource("topic", TOPIC, incremental_configs=[
            ConfigEntry("retention.bytes", "777777", incremental_operation=AlterConfigOpType.SET)])]))
        until_done(lambda: admin.create_partitions([NewPartitions(TOPIC, 2)]))
        # and kafka-python's admin: CreatePartitions, and an incremental AlterConfigs
        from kafka.admin import ConfigResource as KPConfigResource, ConfigResourceType, KafkaAdminClient
        from kafka.admin import NewPartitions as KPNewPartitions
        from kafka.errors import KafkaError as KafkaPythonError
        kp = KafkaAdminClient(**kafka_python_login(live))
        try:
            for change in (lambda: kp.create_partitions({TOPIC: KPNewPartitions(total_count=3)}),
                           lambda: kp.alter_configs([KPConfigResource(ConfigResourceType.TOPIC, TOPIC,
                                                                      configs={"segment.ms": "3600000"})],
                                                    incremental=True)):
                deadline = time.monotonic() + 30
                tried = False
                while True:  # each change retried alone
                    try:
                        change()
                        break
                    except KafkaPythonError as exc:  # NOT_CONTROLLER while a new metadata leader takes over
                        if tried and type(exc).__name__ == "InvalidPartitionsError":
                            break  # an attempt answered NOT_CONTROLLER had taken: already 3
                        if time.monotonic() > deadline:
                            raise
                        tried = True
                        time.sleep(0.2)
        finally:
            kp.close()
        nodes[down] = restart(tmp_path, addrs, down)  # with its old --topic count: the metadata wins
        wait_for(lambda: nodes[down].store.partition(TOPIC, 0).config.retention_bytes == 777777, timeout=20)
        wait_for(lambda: (TOPIC, 2) in nodes[down].describe(), timeout=20)
        assert nodes[down].store.partitions_for(TOPIC) == 3
        # (the config's record follows the partitions' and is applied after it)
        wait_for(lambda: nodes[down].store.partition(TOPIC, 2).config.segment_ms == 3600000, timeout=20)
        wait_for(lambda: described(addrs[down], "retention.bytes") == "777777")
        wait_for(lambda: described(addrs[down], "segment.ms") == "3600000")
    finally:
        stop_all(nodes)


def _metadata_leader(address):
    """The leader of ``__cluster_metadata-0`` as one node's DescribeQuorum (kafka-python's
    messages) names it (-1: none)."""
    R = DescribeQuorumRequest
    conn = Conn(address)
    try:
        answer = conn.call(R(topics=[R.TopicData(topic_name=METADATA_TOPIC, partitions=[
            R.TopicData.PartitionData(partition_index=0)])], version=1), DescribeQuorumResponse)
    finally:
        conn.close()
    return answer.topics[0].partitions[0].leader_id


def test_an_acknowledged_change_survives_the_metadata_leader_killed(tmp_path):
    """Changes sent one after another while the metadata's leader is SIGKILLed: every value
    acknowledged is held by the survivors (the config they show is the last acknowledged one or
    a later one), and by the killed node once it restarts."""
    cluster = KafkaNodes(tmp_path, SECRET)
    for i in range(3):
        cluster.start(i)
    acked: list[int] = []
    errors: list = []
    stop = threading.Event()
    try:
        wait_for(lambda: len({_metadata_leader(a) for a in cluster.addrs.values()} - {-1}) == 1, timeout=30)
        leader = _metadata_leader(cluster.addrs[0])
        # (the controller Metadata names is the node answering, as a KRaft broker names an alive
        # one: it forwards; the client looks again every second, so a killed one is soon replaced)
        admin = AdminClient({**cluster.client_config, "bootstrap.servers": cluster.bootstrap,
                             "topic.metadata.refresh.interval.ms": 1000})

        def changes():
            value = 0
            while not stop.is_set():
                value += 1
                resource = ConfigResource("topic", TOPIC, incremental_configs=[
                    ConfigEntry("retention.ms", str(100000 + value), incremental_operation=AlterConfigOpType.SET)])
                try:  # (librdkafka waits for the killed controller until the request's timeout)
                    [f.result(timeout=20) for f in admin.incremental_alter_configs([resource],
                                                                                   request_timeout=5).values()]
                    acked.append(value)
                except (confluent_kafka.KafkaException, TimeoutError) as exc:
                    errors.append((time.time(), repr(exc)))
                    time.sleep(0.05)

        sender = threading.Thread(target=changes, daemon=True)
        sender.start()
        wait_for(lambda: len(acked) >= 5, timeout=30)
        cluster.kill(leader)
        killed_at = len(acked)
        try:
            wait_for(lambda: len(acked) >= killed_at + 3, timeout=60)  # a new leader takes changes
        except AssertionError:
            raise AssertionError(errors[-20:])
        stop.set()
        sender.join(30)
        last = acked[-1]
        survivors = [i for i in cluster.addrs if i != leader]
        for i in survivors:
            wait_for(lambda: int(described(cluster.addrs[i], "retention.ms")) >= 100000 + last, timeout=20)
        cluster.start(leader)
        wait_for(lambda: int(described(cluster.addrs[leader], "retention.ms")) >= 100000 + last, timeout=30)
    finally:
        stop.set()
        cluster.stop_all()


def test_new_partitions_take_keyed_records_partitioned_as_kafka_and_another_client_reads_them(tmp_path):
    from kafka import KafkaProducer
    from kafka.partitioner.default import murmur2

    nodes, addrs = kafka_cluster(tmp_path)
    try:
        leader_of(nodes, META)
        admin = AdminClient(login(addrs))
        # Kafka's errors: a count that does not grow, an assignment that does not name the voters
        with pytest.raises(confluent_kafka.KafkaException) as shrink:
            until_done(lambda: admin.create_partitions([NewPartitions(TOPIC, 1)]))
        assert shrink.value.args[0].code() == KafkaError.INVALID_PARTITIONS
        with pytest.raises(confluent_kafka.KafkaException) as wrong:
            until_done(lambda: admin.create_partitions([NewPartitions(TOPIC, 2, replica_assignment=[[0]])]))
        assert wrong.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
        until_done(lambda: admin.create_partitions([NewPartitions(TOPIC, 3, replica_assignment=[[0, 1, 2],
                                                                                                [2, 1, 0]])]))
        for node in nodes.values():
            wait_for(lambda: {(TOPIC, 1), (TOPIC, 2)} <= set(node.describe()))
            assert node.store.partitions_for(TOPIC) == 3
        for p in (1, 2):
            leader_of(nodes, (TOPIC, p))
        wait_for(lambda: len(admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions) == 3)
        producer = KafkaProducer(**kafka_python_login(addrs), acks="all", retries=10)
        keys = [f"key-{i}".encode() for i in range(60)]
        where = {}
        for key in keys:
            where[key] = producer.send(TOPIC, key=key, value=b"v-" + key).get(timeout=30).partition
        producer.close()
        assert where == {key: (murmur2(key) & 0x7FFFFFFF) % 3 for key in keys}  # Kafka's partitioner
        assert {1, 2} <= set(where.values())
        consumer = confluent_kafka.Consumer({**login(addrs), "group.id": "meta-test", "auto.offset.reset": "earliest",
                                             "enable.auto.commit": False})
        try:
            consumer.subscribe([TOPIC])
            seen = {}
            deadline = time.monotonic() + 60
            while len(seen) < len(keys) and time.monotonic() < deadline:
                message = consumer.poll(1.0)
                if message is not None and message.error() is None:
                    seen[message.key()] = (message.partition(), message.value())
        finally:
            consumer.close()
        assert seen == {key: (where[key], b"v-" + key) for key in keys}
        for p in (1, 2):  # the new partitions are replicated: every node holds their records
            count = sum(1 for key in keys if where[key] == p)
            for node in nodes.values():
                wait_for(lambda: len(node.read(TOPIC, p, 0)) == count)
    finally:
        stop_all(nodes)


def test_create_topics_on_the_set_and_delete_topics_refused(tmp_path):
    from kafka.admin import KafkaAdminClient, NewTopic as KPNewTopic
    from kafka.errors import TopicAlreadyExistsError
    from confluent_kafka.admin import NewTopic

    nodes, addrs = kafka_cluster(tmp_path)
    try:
        leader_of(nodes, META)
        admin = AdminClient(login(addrs))
        until_done(lambda: admin.create_topics([NewTopic("fresh", 2, replication_factor=3,
                                                         config={"retention.ms": "60000"})]))
        for node in nodes.values():
            wait_for(lambda: {("fresh", 0), ("fresh", 1)} <= set(node.describe()))
            assert node.store.partition("fresh", 1).config.retention_ms == 60000
        # one topic id on every node; Metadata lists it, not __cluster_metadata
        assert len({node.store.topic_id("fresh") for node in nodes.values()}) == 1
        listed = admin.list_topics(timeout=10).topics
        assert "fresh" in listed and METADATA_TOPIC not in listed
        # Kafka's errors: a replication factor other than the voters', a name taken
        with pytest.raises(confluent_kafka.KafkaException) as factor:
            until_done(lambda: admin.create_topics([NewTopic("single", 1, replication_factor=1)]))
        assert factor.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
        kp = KafkaAdminClient(**kafka_python_login(addrs))
        try:
            with pytest.raises(TopicAlreadyExistsError):
                kp.create_topics([KPNewTopic("fresh", 1, 3)])
        finally:
            kp.close()
        for p in (0, 1):
            leader_of(nodes, ("fresh", p))
        producer = confluent_kafka.Producer({**login(addrs), "acks": "all", "partitioner": "murmur2_random"})
        for i in range(20):
            producer.produce("fresh", key=f"k{i}".encode(), value=f"v{i}".encode())
        assert producer.flush(30) == 0
        consumer = confluent_kafka.Consumer({**login(addrs), "group.id": "fresh-reader",
                                             "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe(["fresh"])
            seen = set()
            deadline = time.monotonic() + 60
            while len(seen) < 20 and time.monotonic() < deadline:
                message = consumer.poll(1.0)
                if message is not None and message.error() is None:
                    seen.add(message.value())
        finally:
            consumer.close()
        assert seen == {f"v{i}".encode() for i in range(20)}
        # DeleteTopics: refused (each node derives a topic's id from its name)
        [deleted] = admin.delete_topics(["fresh"]).values()
        with pytest.raises(confluent_kafka.KafkaException) as refused:
            deleted.result(timeout=20)
        assert refused.value.args[0].code() == KafkaError.POLICY_VIOLATION
        # a node restarted with its command line's topics only still replicates the created one
        nodes[2].stop()
        nodes[2] = restart(tmp_path, addrs, 2)
        assert {("fresh", 0), ("fresh", 1)} <= set(nodes[2].describe())
        wait_for(lambda: sum(len(nodes[2].read("fresh", p, 0)) for p in (0, 1)) == 20, timeout=20)
    finally:
        stop_all(nodes)


@pytest.mark.regression
def test_a_tiny_max_message_bytes_keeps_leaders_and_internal_topics_configs_are_refused(tmp_path):
    """max.message.bytes holds clients' batches only: a new leader's leader-change record is
    written all the same, so the partition gets a leader after its leader stops and takes
    produces; the internal topics' configs (the metadata log's own, the coordinators') are
    refused on a replica set (POLICY_VIOLATION), so the metadata can never be frozen or wiped."""
    nodes, addrs = kafka_cluster(tmp_path)
    try:
        leader_of(nodes, META)
        assert set_config(addrs[0], "max.message.bytes", "100") == (0, None)
        for node in nodes.values():
            wait_for(lambda: node.store.partition(TOPIC, 0).config.max_message_bytes == 100)
        admin = AdminClient(login(addrs))
        for topic, name, value in ((METADATA_TOPIC, "max.message.bytes", "100"),
                                   (METADATA_TOPIC, "cleanup.policy", "delete"),
                                   ("__consumer_offsets", "retention.ms", "1")):
            change = ConfigResource("topic", topic, incremental_configs=[
                ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
            with pytest.raises(confluent_kafka.KafkaException) as refused:
                until_done(lambda: admin.incremental_alter_configs([change]))
            assert refused.value.args[0].code() == KafkaError.POLICY_VIOLATION
        for node in nodes.values():
            assert node.store.partition(METADATA_TOPIC, 0).config.cleanup_policy == "compact"
        first = leader_of(nodes, (TOPIC, 0))
        nodes[first].stop()
        rest = {i: n for i, n in nodes.items() if i != first}
        second = leader_of(rest, (TOPIC, 0), timeout=20)
        assert second != first
        producer = confluent_kafka.Producer({**login({i: addrs[i] for i in rest}), "acks": "all"})
        producer.produce(TOPIC, value=b"v")
        assert producer.flush(30) == 0
        wait_for(lambda: [r.value for r in rest[second].read(TOPIC, 0, 0)] == [b"v"])
    finally:
        stop_all(nodes)


@pytest.mark.regression
def test_create_topics_the_store_would_refuse_commit_nothing(tmp_path):
    """A CreateTopics no node could apply (more partitions than one change may create, a
    config the store refuses) is refused with Kafka's error by the metadata's leader, also
    when forwarded, and writes no record; a good one right after is created everywhere."""
    from confluent_kafka.admin import NewTopic
    from kafka.admin import KafkaAdminClient, NewTopic as KPNewTopic
    from kafka.errors import InvalidPartitionsError

    nodes, addrs = kafka_cluster(tmp_path)
    try:
        leader = leader_of(nodes, META)
        follower = next(i for i in nodes if i != leader)
        end = nodes[leader].store.partition(METADATA_TOPIC, 0).log_end_offset
        for i in (leader, follower):
            admin = AdminClient(login({i: addrs[i]}))  # (confluent-kafka itself refuses above 100000)
            with pytest.raises(confluent_kafka.KafkaException) as refused:
                until_done(lambda: admin.create_topics([NewTopic(f"huge{i}", 20_000, replication_factor=3)]))
            assert refused.value.args[0].code() == KafkaError.INVALID_PARTITIONS
            kp = KafkaAdminClient(**kafka_python_login({i: addrs[i]}))
            try:
                with pytest.raises(InvalidPartitionsError):
                    kp.create_topics([KPNewTopic(f"huge{i}", 2_000_000, 3)])
            finally:
                kp.close()
        assert nodes[leader].store.partition(METADATA_TOPIC, 0).log_end_offset == end
        admin = AdminClient(login(addrs))
        until_done(lambda: admin.create_topics([NewTopic("fine", 2, replication_factor=3)]))
        for node in nodes.values():
            wait_for(lambda: {("fine", 0), ("fine", 1)} <= set(node.describe()))
            assert not any(t.startswith("huge") for t in node.store.topics())
    finally:
        stop_all(nodes)


def _blocking(grow, entered, release):
    """A grow hook that waits for ``release`` (a slow apply: thousands of partitions)."""
    def hook(topic, count):
        entered.set()
        release.wait(60)
        return grow(topic, count)
    return hook


def _create_partitions_in_background(addrs, i, count, answered):
    """CreatePartitions (kafka-python's messages) on node ``i``'s listener, on a thread,
    retried while the metadata's new leader has not committed its log yet; ``answered`` is set
    once it was answered otherwise, whatever the answer."""
    from kafka.protocol.admin import CreatePartitionsRequest, CreatePartitionsResponse

    R = CreatePartitionsRequest
    request = R(topics=[R.CreatePartitionsTopic(name=TOPIC, count=count, assignments=None)], timeout_ms=60000,
                validate_only=False, version=1)

    def run():
        conn = Conn(addrs[i])
        try:
            deadline = time.monotonic() + 30
            while conn.call(request, CreatePartitionsResponse).results[0].error_code in RETRIED and \
                    time.monotonic() < deadline:
                time.sleep(0.2)
        except Exception:  # noqa: BLE001 - any answer will do: the test looks at the nodes
            pass
        finally:
            conn.close()
            answered.set()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.regression
def test_elections_go_on_while_a_slow_topic_change_is_applied(tmp_path):
    """The metadata's records are applied on a thread of their own: while two nodes are stuck
    applying a CreatePartitions, the partition whose leader stopped gets a new leader among them."""
    nodes, addrs = kafka_cluster(tmp_path)
    release = threading.Event()
    answered = threading.Event()
    try:
        leader_of(nodes, META)
        first = leader_of(nodes, (TOPIC, 0))
        rest = {i: n for i, n in nodes.items() if i != first}
        entered = {i: threading.Event() for i in rest}
        for i, node in rest.items():
            node.metadata.grow = _blocking(node.metadata.grow, entered[i], release)
        _create_partitions_in_background(addrs, first, 2, answered)
        for event in entered.values():
            assert event.wait(30)
        nodes[first].stop()
        assert leader_of(rest, (TOPIC, 0), timeout=20) != first
        release.set()
        for node in rest.values():
            wait_for(lambda: (TOPIC, 1) in node.describe(), timeout=20)
    finally:
        release.set()
        stop_all(nodes)


@pytest.mark.regression
def test_a_forwarded_change_does_not_hold_the_peer_connection_of_elections(tmp_path):
    """A CreatePartitions forwarded to the metadata's leader waits for it on a connection of its
    own: meanwhile the forwarding node's election requests to that leader (leader discovery
    here) are answered at once, while the forwarded change is still unanswered."""
    from logstore.replica.client import METADATA, metadata_request

    nodes, addrs = kafka_cluster(tmp_path)
    release = threading.Event()
    answered = threading.Event()
    try:
        meta = leader_of(nodes, META)
        via = next(i for i in nodes if i != meta)
        entered = threading.Event()
        nodes[meta].metadata.grow = _blocking(nodes[meta].metadata.grow, entered, release)
        _create_partitions_in_background(addrs, via, 2, answered)
        assert entered.wait(30)  # the leader is applying it: the Envelope from `via` waits for its answer
        answer = nodes[via].context.peer_connections.request(meta, METADATA, metadata_request([TOPIC]), 5.0)
        assert [t.name for t in answer.topics] == [TOPIC]
        assert not answered.is_set()
        release.set()
        assert answered.wait(60)
        for node in nodes.values():
            wait_for(lambda: (TOPIC, 1) in node.describe(), timeout=20)
    finally:
        release.set()
        stop_all(nodes)


def test_remote_storage_is_refused_on_a_replica_set_without_an_object_store(tmp_path):
    """Without --remote-storage the set has no object store: CreateTopics (validate-only too, on the leader and
    forwarded by a follower) and AlterConfigs enabling ``remote.storage.enable`` get
    INVALID_CONFIG saying so, and no metadata record is written."""
    from confluent_kafka.admin import NewTopic

    nodes, addrs = kafka_cluster(tmp_path)
    try:
        leader = leader_of(nodes, META)
        follower = next(i for i in nodes if i != leader)
        admin = AdminClient(login(addrs))
        until_done(lambda: admin.create_topics([NewTopic("plain", 1, replication_factor=3)]))
        for node in nodes.values():
            wait_for(lambda: ("plain", 0) in set(node.describe()))
        end = nodes[leader].store.partition(METADATA_TOPIC, 0).log_end_offset
        for i in (leader, follower):
            one = AdminClient(login({i: addrs[i]}))
            for validate_only in (True, False):
                with pytest.raises(confluent_kafka.KafkaException) as refused:
                    until_done(lambda: one.create_topics([NewTopic(f"tiered{i}", 1, replication_factor=3, config={
                        "remote.storage.enable": "true"})], validate_only=validate_only))
                assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
                assert "remote_storage" in refused.value.args[0].str()
            code, message = set_config(addrs[i], "remote.storage.enable", "true", topic="plain")
            assert code == KafkaError.INVALID_CONFIG and "remote_storage" in message
        assert nodes[leader].store.partition(METADATA_TOPIC, 0).log_end_offset == end
        for node in nodes.values():
            assert not any(t.startswith("tiered") for t in node.store.topics())
            assert node.store.partition("plain", 0).config.remote_storage_enable is False
    finally:
        stop_all(nodes)
