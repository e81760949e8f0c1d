"""KIP-848 mixed groups through real clients in their own processes: confluent-kafka consumers of the
consumer protocol (``group.protocol=consumer``) and of the classic protocol (confluent-kafka's
``group.protocol=classic`` and kafka-python) in one group, members joining and leaving; and a
running classic group upgraded by rolling its members to the consumer protocol, then downgraded
by rolling them back. Once the group is stable every record is consumed exactly once, and the
commits, read back from the store's ``__consumer_offsets`` in log order, never move backwards;
the group's type is read back through confluent-kafka's AdminClient."""

from __future__ import annotations

import json
import os

import pytest

from logstore.groups.consumergroup import ConsumerGroupConfig
from logstore.kafka.server import KafkaServer

from .test_kip848 import (PARTITIONS, PER_PARTITION, MemberProcess as Proc, append_phase,
                          assert_commits_never_backwards, commit_start_offsets, stable, wait_for)

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import ConsumerGroupType  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

HERE = os.path.dirname(__file__)
#: sessions long enough for a loaded machine (no member is killed here), frequent heartbeats
CONFIG = ConsumerGroupConfig(session_timeout_ms=10000, heartbeat_interval_ms=250)
SESSION_MS = 10000
#: librdkafka's classic protocol, eager range assignment
CLASSIC = {"group.protocol": "classic", "partition.assignment.strategy": "range", "session.timeout.ms": SESSION_MS,
           "heartbeat.interval.ms": 500}


def consumer_member(bootstrap, group):
    """confluent-kafka with ``group.protocol=consumer``."""
    return Proc([os.path.join(HERE, "kip848_member.py"), bootstrap, "work", group])


def confluent_classic(bootstrap, group):
    """confluent-kafka with the classic protocol."""
    return Proc([os.path.join(HERE, "kip848_member.py"), bootstrap, "work", group],
                {"KIP848_CONFIG": json.dumps(CLASSIC)})


def kafka_python(bootstrap, group):
    """kafka-python (the classic protocol only)."""
    return Proc([os.path.join(HERE, "group_member.py"), "kafka-python", bootstrap, "work", group],
                {"GROUP_MEMBER_SESSION_MS": str(SESSION_MS)})


def settled(members):
    """Wait until the members' assignments cover every partition exactly once."""
    wait_for(f"a stable assignment over {len(members)} members", lambda: stable(members), timeout=90)


def consumed_once(server, members, everyone, phase):
    """Append ``phase``'s records and wait until each was consumed, then check none twice."""
    append_phase(server.store, phase)
    want = PARTITIONS * PER_PARTITION

    def seen():
        return [r for m in everyone for r in m.records() if r[2].startswith(f"{phase}-")]

    try:
        wait_for(f"phase {phase} consumed", lambda: len({r[2] for r in seen()}) == want, timeout=90)
    except AssertionError:  # say where the group stands (the coordinator's own view, for the diagnosis)
        missing = sorted({f"{phase}-{p}-{i}" for p in range(PARTITIONS) for i in range(PER_PARTITION)} -
                         {r[2] for r in seen()})
        consumer = server._apis.consumer_groups
        views = {g: consumer.describe(g) for g in ("mixed", "rolling", "kept")} if consumer is not None else {}
        raise AssertionError(f"phase {phase}: {len(missing)} records not consumed (first {missing[:3]}); members' "
                             f"assignments {[m.assignment() for m in members]}; groups {views}") from None
    values = [r[2] for r in seen()]
    assert len(values) == len(set(values)) == want, f"phase {phase}: some record was consumed twice"


def group_type(server, group):
    admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
    listed = {g.group_id: g.type for g in admin.list_consumer_groups().result(10).valid}
    return listed.get(group)


@pytest.fixture
def server(tmp_path):
    server = KafkaServer(str(tmp_path), ("127.0.0.1", 0), consumer_group_config=CONFIG,
                         group_min_session_timeout_ms=1000).start()
    server.store.create_topic("work", PARTITIONS)
    yield server
    server.stop()


def test_consumer_and_classic_members_share_a_group_joining_and_leaving(server):
    bootstrap = server.bootstrap_servers
    commit_start_offsets(bootstrap, "mixed")  # (librdkafka's re-reads: see commit_start_offsets)
    everyone = [consumer_member(bootstrap, "mixed")]
    try:
        settled(everyone)
        everyone += [confluent_classic(bootstrap, "mixed"), kafka_python(bootstrap, "mixed"),
                     consumer_member(bootstrap, "mixed")]
        members = list(everyone)
        settled(members)
        assert group_type(server, "mixed") == ConsumerGroupType.CONSUMER
        consumed_once(server, members, everyone, 1)
        for leaving in (members[1], members[0]):  # a classic member, then a consumer-protocol one
            leaving.stop()
            members.remove(leaving)
            settled(members)
            consumed_once(server, members, everyone, 2 if leaving is everyone[1] else 3)
        everyone.append(confluent_classic(bootstrap, "mixed"))  # a classic member joins again
        members.append(everyone[-1])
        settled(members)
        consumed_once(server, members, everyone, 4)
    finally:
        for m in everyone:
            m.stop()
    final = assert_commits_never_backwards(server.store, "mixed")
    assert final == {("work", p): 4 * PER_PARTITION for p in range(PARTITIONS)}


def test_a_classic_group_is_upgraded_and_downgraded_by_rolling_its_members(server):
    bootstrap = server.bootstrap_servers
    commit_start_offsets(bootstrap, "rolling")
    everyone = [confluent_classic(bootstrap, "rolling"), kafka_python(bootstrap, "rolling")]
    members = list(everyone)
    try:
        settled(members)
        assert group_type(server, "rolling") == ConsumerGroupType.CLASSIC
        consumed_once(server, members, everyone, 1)
        phase = 2
        for make, kind in ((consumer_member, ConsumerGroupType.CONSUMER),
                           (confluent_classic, ConsumerGroupType.CLASSIC)):
            for i in range(2):  # roll: one member at a time leaves and its successor joins
                members[i].stop()
                members[i] = make(bootstrap, "rolling")
                everyone.append(members[i])
                settled(members)
                consumed_once(server, members, everyone, phase)
                phase += 1
            assert group_type(server, "rolling") == kind
    finally:
        for m in everyone:
            m.stop()
    final = assert_commits_never_backwards(server.store, "rolling")
    assert final == {("work", p): (phase - 1) * PER_PARTITION for p in range(PARTITIONS)}


def test_a_mixed_group_survives_a_server_restart(tmp_path):
    server = KafkaServer(str(tmp_path), ("127.0.0.1", 0), consumer_group_config=CONFIG,
                         group_min_session_timeout_ms=1000).start()
    server.store.create_topic("work", PARTITIONS)
    port = server.address[1]
    commit_start_offsets(server.bootstrap_servers, "kept")
    members = [consumer_member(server.bootstrap_servers, "kept"), kafka_python(server.bootstrap_servers, "kept")]
    try:
        settled(members)
        consumed_once(server, members, members, 1)
        held = [m.assignment() for m in members]
        admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
        before = admin.describe_consumer_groups(["kept"])["kept"].result(timeout=10)
        server.stop()
        server = KafkaServer(str(tmp_path), ("127.0.0.1", port), consumer_group_config=CONFIG,
                             group_min_session_timeout_ms=1000).start()
        consumed_once(server, members, members, 2)
        assert [m.assignment() for m in members] == held  # taken up where it was, its classic member too
        admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
        after = admin.describe_consumer_groups(["kept"])["kept"].result(timeout=10)
        assert after.type == ConsumerGroupType.CONSUMER
        assert {m.member_id for m in after.members} == {m.member_id for m in before.members}
        assert assert_commits_never_backwards(server.store, "kept") == \
            {("work", p): 2 * PER_PARTITION for p in range(PARTITIONS)}
    finally:
        for m in members:
            m.stop()
        server.stop()
