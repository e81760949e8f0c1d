"""KIP-848's consumer group protocol through librdkafka (confluent-kafka, ``group.protocol=consumer``):
consumer processes joining, leaving and killed (SIGKILL), a static member restarted, the group
across a server restart. Every record is consumed once, and the commits, read back from the
store's ``__consumer_offsets`` in log order, never move backwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from logstore.groups.consumergroup import ConsumerGroupConfig
from logstore.groups.offsets import OFFSETS_TOPIC, decode_offset_key, decode_offset_value
from logstore.kafka.server import KafkaServer

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import ConsumerGroupState, ConsumerGroupType  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

MEMBER = os.path.join(os.path.dirname(__file__), "kip848_member.py")
PARTITIONS = 6
PER_PARTITION = 10
#: short sessions so that a killed member's partitions move within the test
CONFIG = ConsumerGroupConfig(session_timeout_ms=3000, heartbeat_interval_ms=250)


class MemberProcess:
    """A group member in its own process (``args`` after the interpreter; ``env``: more
    environment), printing ``A <partitions>`` and ``R <partition> <offset> <value>`` lines;
    stopped by closing its standard input."""

    def __init__(self, args, env=None):
        self.proc = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def assignments(self):
        return [{int(p) for p in line[2:].split(",") if p} for line in list(self.lines) if line.startswith("A ")]

    def assignment(self):
        found = self.assignments()
        return found[-1] if found else None

    def records(self):
        return [(int(p), int(o), v) for _, p, o, v in
                (line.split(" ", 3) for line in list(self.lines) if line.startswith("R "))]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


class Member(MemberProcess):
    """A kip848_member.py process; ``config``: more librdkafka settings (a login)."""

    def __init__(self, bootstrap, instance_id=None, group="grp", config=None):
        super().__init__([MEMBER, bootstrap, "work", group] + ([instance_id] if instance_id else []),
                         {"KIP848_CONFIG": json.dumps(config or {})})


def wait_for(what, predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def stable(members):
    found = [m.assignment() for m in members]
    if any(not a for a in found):
        return False
    return set().union(*found) == set(range(PARTITIONS)) and sum(len(a) for a in found) == PARTITIONS


def commit_start_offsets(bootstrap, group="grp", config=None):
    """Commit offset 0 of every partition of ``work`` for ``group`` before its members join
    (an admin client's AlterConsumerGroupOffsets; ``config``: more of its settings, a replica
    set's login): each member then starts from a committed
    offset (OffsetFetch), as every later owner does, and librdkafka never resolves
    ``auto.offset.reset``.

    Without it librdkafka (2.16) may deliver a partition's records again, whatever the broker:
    a member that resolves the earliest offset (ListOffsets) while a rebalance bumps the
    partition's op version gets the reply as outdated, and rd_kafka_toppar_handle_Offset then
    calls rd_kafka_toppar_offset_retry, which puts the partition back in offset-query and
    resolves the earliest offset again 500 ms later, although it has started fetching meanwhile
    (its debug log: "outdated offset response: (re)starting offset query timer for offset
    BEGINNING", "changed fetch state active -> offset-query", "Offset BEGINNING request ...
    returned offset 0", "fetch decide: ... at offset 0"). The fetcher goes back to offset 0: the
    member that kept the partition through the rebalance reads (and commits) it again from its
    first record, as seen in CI (one phase re-read by the member that kept its partition). The
    server's heartbeat answers meanwhile keep the partition with that member, as Kafka's
    reconciliation does."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    admin = AdminClient({"bootstrap.servers": bootstrap, **(config or {})})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition("work", p, 0) for p in range(PARTITIONS)])
    (future,) = admin.alter_consumer_group_offsets([request]).values()
    done = future.result(timeout=30)
    assert all(tp.error is None for tp in done.topic_partitions)


def append_phase(store, phase):
    for p in range(PARTITIONS):
        store.partition("work", p).append_batch([f"{phase}-{p}-{i}".encode() for i in range(PER_PARTITION)])


def consumed(members, phase):
    return sum(1 for m in members for r in m.records() if r[2].startswith(f"{phase}-"))


def twice(members):
    """Which member read which record more than once, with every member's assignments in order."""
    seen: dict[tuple, list[int]] = {}
    for i, m in enumerate(members):
        for r in m.records():
            seen.setdefault(r, []).append(i)
    repeated = {r: who for r, who in seen.items() if len(who) > 1}
    return {"repeated": sorted(repeated.items())[:20], "assignments": [m.assignments() for m in members]}


def commits_in_log_order(store, group):
    """Every offset committed for ``group``, read from the store's ``__consumer_offsets`` in order."""
    log = store.partition(OFFSETS_TOPIC, 0)
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        records = log.read(offset)
        if not records:
            break
        for r in records:
            key = decode_offset_key(r.key) if r.key is not None and r.key[:2] in (b"\x00\x00", b"\x00\x01") else None
            if key is not None and key[0] == group and r.value is not None:
                out.append((key[1], key[2], decode_offset_value(r.value)[0]))
        offset = records[-1].offset + 1
    return out


def assert_commits_never_backwards(store, group):
    last: dict[tuple[str, int], int] = {}
    for topic, partition, offset in commits_in_log_order(store, group):
        assert offset >= last.get((topic, partition), 0), f"{topic}-{partition}: commit {offset} after " \
                                                           f"{last[(topic, partition)]}"
        last[(topic, partition)] = offset
    return last


@pytest.fixture
def server(tmp_path):
    server = KafkaServer(str(tmp_path), ("127.0.0.1", 0), consumer_group_config=CONFIG).start()
    server.store.create_topic("work", PARTITIONS)
    yield server
    server.stop()


def test_members_join_leave_and_one_killed_consume_every_record_once(server):
    commit_start_offsets(server.bootstrap_servers)
    members = [Member(server.bootstrap_servers) for _ in range(2)]
    try:
        wait_for("a stable group of two", lambda: stable(members))
        append_phase(server.store, 1)
        wait_for("phase 1 consumed", lambda: consumed(members, 1) >= PARTITIONS * PER_PARTITION)

        members.append(Member(server.bootstrap_servers))  # a third joins
        wait_for("a stable group of three", lambda: stable(members) and all(len(m.assignment()) == 2 for m in members))
        append_phase(server.store, 2)
        wait_for("phase 2 consumed", lambda: consumed(members, 2) >= PARTITIONS * PER_PARTITION)

        leaver = members[0]
        leaver.stop()  # a clean leave: its partitions move at once
        rest = members[1:]
        wait_for("the leaver's partitions taken", lambda: stable(rest))
        append_phase(server.store, 3)
        wait_for("phase 3 consumed", lambda: consumed(rest, 3) >= PARTITIONS * PER_PARTITION)

        victim, survivor = rest
        lost = victim.assignment()
        victim.kill()
        wait_for("the killed member's partitions after its session", lambda: survivor.assignment() ==
                 set(range(PARTITIONS)))
        append_phase(server.store, 4)
        wait_for("phase 4 consumed", lambda: consumed([survivor], 4) >= PARTITIONS * PER_PARTITION)

        everything = [r for m in members for r in m.records()]
        assert len(everything) == len(set(everything)) == 4 * PARTITIONS * PER_PARTITION, \
            f"records read again: {twice(members)}"
        assert {v for _, _, v in everything} == {f"{ph}-{p}-{i}" for ph in range(1, 5) for p in range(PARTITIONS)
                                                for i in range(PER_PARTITION)}
        assert lost, "the victim held partitions"
        final = assert_commits_never_backwards(server.store, "grp")
        assert final == {("work", p): 4 * PER_PARTITION for p in range(PARTITIONS)}
        # what the group looks like through the admin client (ConsumerGroupDescribe)
        admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
        described = admin.describe_consumer_groups(["grp"])["grp"].result(timeout=10)
        assert described.type == ConsumerGroupType.CONSUMER
        assert described.state == ConsumerGroupState.STABLE and described.partition_assignor == "uniform"
        (only,) = described.members
        assert sorted(tp.partition for tp in only.assignment.topic_partitions) == list(range(PARTITIONS))
    finally:
        for m in members:
            m.stop()


def test_a_static_member_restarted_gets_its_partitions_back_without_a_rebalance(server):
    commit_start_offsets(server.bootstrap_servers)
    other = Member(server.bootstrap_servers)
    static = Member(server.bootstrap_servers, instance_id="static-1")
    restarted = None
    try:
        wait_for("a stable group of two", lambda: stable([other, static]))
        held = static.assignment()
        other_before = len(other.assignments())
        static.stop()  # librdkafka leaves with epoch -2: the member keeps its assignment
        restarted = Member(server.bootstrap_servers, instance_id="static-1")
        wait_for("the restarted static member's partitions", lambda: restarted.assignment() == held)
        append_phase(server.store, 1)
        wait_for("phase 1 consumed", lambda: consumed([other, restarted], 1) >= PARTITIONS * PER_PARTITION)
        assert len(other.assignments()) == other_before, "the other member saw a rebalance"
        assert {p for p, _, _ in restarted.records()} <= held
        everything = [r for m in (other, restarted) for r in m.records()]
        assert len(everything) == len(set(everything)) == PARTITIONS * PER_PARTITION
        assert_commits_never_backwards(server.store, "grp")
    finally:
        for m in (other, static, restarted):
            if m is not None:
                m.stop()


def test_the_group_survives_a_server_restart_with_its_epoch_and_assignment(tmp_path):
    server = KafkaServer(str(tmp_path), ("127.0.0.1", 0), consumer_group_config=CONFIG).start()
    server.store.create_topic("work", PARTITIONS)
    port = server.address[1]
    commit_start_offsets(server.bootstrap_servers)
    members = [Member(server.bootstrap_servers) for _ in range(2)]
    try:
        wait_for("a stable group of two", lambda: stable(members))
        append_phase(server.store, 1)
        wait_for("phase 1 consumed", lambda: consumed(members, 1) >= PARTITIONS * PER_PARTITION)
        admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
        before = admin.describe_consumer_groups(["grp"])["grp"].result(timeout=10)
        held = [m.assignment() for m in members]
        server.stop()
        server = KafkaServer(str(tmp_path), ("127.0.0.1", port), consumer_group_config=CONFIG).start()
        append_phase(server.store, 2)
        wait_for("phase 2 consumed", lambda: consumed(members, 2) >= PARTITIONS * PER_PARTITION)
        admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})  # a new connection
        after = admin.describe_consumer_groups(["grp"])["grp"].result(timeout=10)
        assert [m.assignment() for m in members] == held  # taken up where it was: no rebalance
        assert {m.member_id: sorted(tp.partition for tp in m.assignment.topic_partitions) for m in after.members} == \
            {m.member_id: sorted(tp.partition for tp in m.assignment.topic_partitions) for m in before.members}
        everything = [r for m in members for r in m.records()]
        assert len(everything) == len(set(everything)) == 2 * PARTITIONS * PER_PARTITION
        assert assert_commits_never_backwards(server.store, "grp") == \
            {("work", p): 2 * PER_PARTITION for p in range(PARTITIONS)}
    finally:
        for m in members:
            m.stop()
        server.stop()


def _consume_all(consumer, want, timeout=30):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            got.append((msg.topic(), msg.partition(), msg.offset()))
    return got


def test_a_regex_subscription_and_the_range_assignor(server):
    server.store.create_topic("work-b", 2)
    server.store.create_topic("other", 1)
    for topic, count in (("work", PARTITIONS), ("work-b", 2), ("other", 1)):
        for p in range(count):
            server.store.partition(topic, p).append_batch([b"x"])
    consumer = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap_servers, "group.id": "regex",
                                         "group.protocol": "consumer", "group.remote.assignor": "range",
                                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe(["^work.*"])
        got = _consume_all(consumer, PARTITIONS + 2)
        assert sorted({(t, p) for t, p, _ in got}) == sorted([("work", p) for p in range(PARTITIONS)]
                                                              + [("work-b", 0), ("work-b", 1)])
        admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
        described = admin.describe_consumer_groups(["regex"])["regex"].result(timeout=10)
        assert described.partition_assignor == "range"
    finally:
        consumer.close()


def test_an_invalid_regex_is_refused_with_kafkas_error(server):
    consumer = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap_servers, "group.id": "bad",
                                         "group.protocol": "consumer"})
    try:
        consumer.subscribe(["^(work)\\1$"])  # a backreference: POSIX (librdkafka's check) but not RE2
        deadline = time.monotonic() + 20
        error = None
        while error is None and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error():
                error = msg.error()
        assert error is not None and error.code() == confluent_kafka.KafkaError._FATAL  # librdkafka: fatal
        assert "The regular expression is not valid" in error.str()  # Kafka's INVALID_REGULAR_EXPRESSION
    finally:
        consumer.close()


def test_list_and_describe_groups_name_a_consumer_groups_type_and_state(server):
    from kafka.admin import KafkaAdminClient

    consumer = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap_servers, "group.id": "listed",
                                         "group.protocol": "consumer"})
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
    try:
        consumer.subscribe(["work"])
        wait_for("an assignment", lambda: consumer.poll(0.1) is None and len(consumer.assignment()) == PARTITIONS)
        assert {"group_id": "listed", "protocol_type": "consumer", "group_state": "Stable",
                "group_type": "consumer"} in admin.list_groups()  # (ListGroups v5: state and type)
        described = admin.describe_groups(["listed"])["listed"]
        assert (described["error"], described["group_state"], described["protocol_type"]) == \
            (None, "Stable", "consumer")
        assert len(described["members"]) == 1
    finally:
        admin.close()
        consumer.close()


def test_an_emptied_consumer_group_id_is_taken_over_by_a_classic_consumer(server):
    from kafka import KafkaConsumer

    append_phase(server.store, 1)
    first = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap_servers, "group.id": "handover",
                                      "group.protocol": "consumer", "auto.offset.reset": "earliest",
                                      "enable.auto.commit": False})
    first.subscribe(["work"])
    try:
        got = _consume_all(first, PARTITIONS * PER_PARTITION // 2)
        first.commit(asynchronous=False)
    finally:
        first.close()  # the last member leaves: the group is empty
    done = {p: max(o for t, q, o in got if q == p) + 1 for p in {q for _, q, _ in got}}
    classic = KafkaConsumer("work", bootstrap_servers=server.bootstrap_servers, group_id="handover",
                            enable_auto_commit=False, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    try:
        rest = [(r.partition, r.offset) for r in classic]
        classic.commit()
    finally:
        classic.close()
    assert sorted(rest + [(p, o) for _, p, o in got]) == sorted((p, o) for p in range(PARTITIONS)
                                                               for o in range(PER_PARTITION))
    assert all(o >= done.get(p, 0) for p, o in rest)  # from the consumer group's commits on
    final = assert_commits_never_backwards(server.store, "handover")
    assert final == {("work", p): PER_PARTITION for p in range(PARTITIONS)}


def test_the_brokers_consumer_group_settings_by_kafkas_names(server):
    from confluent_kafka.admin import ConfigResource

    admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
    resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["group.coordinator.rebalance.protocols"].value == "classic,consumer"
    assert configs["group.consumer.session.timeout.ms"].value == str(CONFIG.session_timeout_ms)
    assert configs["group.consumer.heartbeat.interval.ms"].value == str(CONFIG.heartbeat_interval_ms)
    assert configs["group.consumer.assignors"].value == "uniform,range"


@pytest.mark.parametrize("protocols, served", [("classic", "classic"), ("classic,consumer", "classic,consumer")])
def test_logstore_serve_takes_the_consumer_group_options(tmp_path, protocols, served):
    from .test_serve_cli import served as serve

    with serve(tmp_path / "store", "--group-coordinator-rebalance-protocols", protocols,
               "--group-consumer-session-timeout-ms", "7000", "--group-consumer-assignors", "range") as bootstrap:
        from confluent_kafka.admin import ConfigResource

        resource = ConfigResource(ConfigResource.Type.BROKER, "0")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["group.coordinator.rebalance.protocols"].value == served
    if served == "classic,consumer":
        assert configs["group.consumer.session.timeout.ms"].value == "7000"
        assert configs["group.consumer.assignors"].value == "range"
    else:
        assert "group.consumer.session.timeout.ms" not in configs


def test_logstore_serve_refuses_an_unknown_assignor(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "logstore", "serve", str(tmp_path / "s"), "--listen", "127.0.0.1:0",
                           "--group-consumer-assignors", "sticky"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "group.consumer.assignors" in proc.stderr


@pytest.mark.parametrize("config, advertised", [(CONFIG, True), (None, False)], ids=["consumer", "classic-only"])
def test_api_versions_advertises_the_consumer_group_apis_only_where_served(tmp_path, config, advertised):
    import socket

    from .test_wire_edges import api_versions_v0, request, response

    server = KafkaServer(str(tmp_path), ("127.0.0.1", 0), consumer_group_config=config).start()
    try:
        with socket.create_connection(server.address, timeout=10) as s:
            s.sendall(request(18, 0, 5))
            correlation, error, ranges = api_versions_v0(response(s))
        assert (correlation, error) == (5, 0)
        assert (ranges.get(68), ranges.get(69)) == (((0, 1), (0, 1)) if advertised else (None, None))
    finally:
        server.stop()
