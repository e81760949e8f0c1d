"""SCRAM users over the protocol (DescribeUserScramCredentials, AlterUserScramCredentials) with
confluent-kafka's and kafka-python's admin clients, each read back through the other: a user
added over the protocol authenticates at once with its password (and not with another), a
changed password replaces the old, a deleted credential stops working; the changes are in the
credentials file ``logstore kafka-user`` lists, and survive a restart; Kafka's errors for a
duplicate, an unknown user or credential, and too few or too many iterations."""

from __future__ import annotations

import io
import time
from contextlib import redirect_stdout

import pytest

from logstore.cli import main as cli_main
from logstore.kafka.server import KafkaServer

kafka = pytest.importorskip("kafka")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kafka.admin import KafkaAdminClient  # noqa: E402
from kafka.admin._users import ScramMechanism as KpScramMechanism  # noqa: E402
from kafka.admin._users import UserScramCredentialDeletion as KpDeletion  # noqa: E402
from kafka.admin._users import UserScramCredentialUpsertion as KpUpsertion  # noqa: E402

ADMIN = ("admin", "admin-secret")


def new_credentials_file(path):
    argv = ["kafka-user", "add", str(path), ADMIN[0], "--mechanism", "SCRAM-SHA-512"]
    assert cli_main(argv, stdin=io.StringIO(ADMIN[1] + "\n")) == 0
    return path


@pytest.fixture
def users_file(tmp_path):
    return new_credentials_file(tmp_path / "kafka-users")


def confluent(server, user, password, mechanism="SCRAM-SHA-512"):
    return {"bootstrap.servers": server.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": mechanism, "sasl.username": user, "sasl.password": password}


def kafka_python_admin(server):
    return KafkaAdminClient(bootstrap_servers=server.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                            sasl_mechanism="SCRAM-SHA-512", sasl_plain_username=ADMIN[0],
                            sasl_plain_password=ADMIN[1], request_timeout_ms=10_000)


def can_produce(server, user, password, mechanism, topic):
    """Whether a new confluent-kafka producer authenticating as ``user`` gets a record in."""
    errors, delivered = [], []
    producer = ck.Producer({**confluent(server, user, password, mechanism),
                            "error_cb": lambda e: errors.append(e.code()), "message.timeout.ms": 3000})
    producer.produce(topic, f"from {user}".encode(),
                     on_delivery=lambda err, msg: delivered.append(None if err is None else err.code()))
    deadline = time.monotonic() + 10  # (a refused login shows at once; its message would wait 3 s)
    while not delivered and ck.KafkaError._AUTHENTICATION not in errors and time.monotonic() < deadline:
        producer.poll(0.05)
    producer.purge()
    producer.flush(1)
    if delivered == [None]:
        return True
    assert ck.KafkaError._AUTHENTICATION in errors, (errors, delivered)
    return False


def test_a_user_added_changed_and_deleted_over_the_protocol(tmp_path, users_file):
    root = tmp_path / "store"
    with KafkaServer(str(root), ("127.0.0.1", 0), sasl_credentials=users_file) as server:
        admin = AdminClient(confluent(server, *ADMIN))
        futures = admin.alter_user_scram_credentials([
            UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"first"),
        ])
        assert futures["carol"].result(10) is None
        # read back by the other client
        kp_admin = kafka_python_admin(server)
        try:
            described = kp_admin.describe_user_scram_credentials(["carol"])
            assert described == {"carol": {"error": None, "credential_infos": [
                {"mechanism": KpScramMechanism.SCRAM_SHA_256, "iterations": 8192}]}}
        finally:
            kp_admin.close()
        assert can_produce(server, "carol", "first", "SCRAM-SHA-256", "carol-topic")
        assert not can_produce(server, "carol", "second", "SCRAM-SHA-256", "carol-topic")
        assert not can_produce(server, "carol", "first", "SCRAM-SHA-512", "carol-topic")  # no such credential
        # a new password, and a SHA-512 credential, through kafka-python
        kp_admin = kafka_python_admin(server)
        try:
            assert kp_admin.alter_user_scram_credentials([
                KpUpsertion("carol", KpScramMechanism.SCRAM_SHA_256, "second"),
                ]) == {"carol": None}
            assert kp_admin.alter_user_scram_credentials([
                KpUpsertion("carol", KpScramMechanism.SCRAM_SHA_512, "second", iterations=4096),
                ]) == {"carol": None}
        finally:
            kp_admin.close()
        assert can_produce(server, "carol", "second", "SCRAM-SHA-256", "carol-topic")
        assert not can_produce(server, "carol", "first", "SCRAM-SHA-256", "carol-topic")
        described = admin.describe_user_scram_credentials(["carol"])["carol"].result(10)
        assert sorted((i.mechanism, i.iterations) for i in described.scram_credential_infos) == [
            (ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 4096)]
    # the credentials file holds them (no password): logstore kafka-user lists them
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["kafka-user", "list", str(users_file)]) == 0
    assert out.getvalue().splitlines() == ["admin\tSCRAM-SHA-512", "carol\tSCRAM-SHA-256", "carol\tSCRAM-SHA-512"]
    assert "second" not in users_file.read_text()
    # a restart on the same directory and file: carol still authenticates; then deleted
    with KafkaServer(str(root), ("127.0.0.1", 0), sasl_credentials=users_file) as server:
        assert can_produce(server, "carol", "second", "SCRAM-SHA-512", "carol-topic")
        admin = AdminClient(confluent(server, *ADMIN))
        futures = admin.alter_user_scram_credentials([UserScramCredentialDeletion("carol",
                                                                                  ScramMechanism.SCRAM_SHA_512)])
        assert futures["carol"].result(10) is None
        assert not can_produce(server, "carol", "second", "SCRAM-SHA-512", "carol-topic")
        assert can_produce(server, "carol", "second", "SCRAM-SHA-256", "carol-topic")
        every = admin.describe_user_scram_credentials().result(10)
        assert sorted(every) == ["admin", "carol"]
        assert [r.value for r in server.store.partition("carol-topic", 0).iter()] == [b"from carol"] * 4


def test_kafkas_errors(tmp_path, users_file):
    with KafkaServer(str(tmp_path / "store"), ("127.0.0.1", 0), sasl_credentials=users_file) as server:
        admin = kafka_python_admin(server)
        try:
            few = KpUpsertion("dave", KpScramMechanism.SCRAM_SHA_256, "pw", iterations=1024)
            many = KpUpsertion("erin", KpScramMechanism.SCRAM_SHA_256, "pw", iterations=20000)
            twice = [KpUpsertion("frank", KpScramMechanism.SCRAM_SHA_256, "pw"),
                     KpDeletion("frank", KpScramMechanism.SCRAM_SHA_512)]
            gone = KpDeletion("grace", KpScramMechanism.SCRAM_SHA_256)
            ok = KpUpsertion("heidi", KpScramMechanism.SCRAM_SHA_512, "pw")
            answer = admin.alter_user_scram_credentials([few, many, *twice, gone, ok])
            assert answer == {"dave": "Too few iterations", "erin": "Too many iterations",
                              "frank": "A user credential cannot be altered twice in the same request",
                              "grace": "Attempt to delete a user credential that does not exist", "heidi": None}
            described = admin.describe_user_scram_credentials(["heidi", "nobody", "heidi"])
            assert described["heidi"]["error"].startswith("Cannot describe SCRAM credentials for the same user twice")
            assert described["nobody"]["error"] == "Attempt to describe a user credential that does not exist: nobody"
            assert sorted(admin.describe_user_scram_credentials()) == ["admin", "heidi"]
        finally:
            admin.close()
        # confluent-kafka sees the error codes
        admin = AdminClient(confluent(server, *ADMIN))
        with pytest.raises(ck.KafkaException) as info:
            admin.describe_user_scram_credentials(["nobody"])["nobody"].result(10)
        assert info.value.args[0].code() == ck.KafkaError.RESOURCE_NOT_FOUND
        with pytest.raises(ck.KafkaException) as info:
            admin.alter_user_scram_credentials([UserScramCredentialDeletion(
                "nobody", ScramMechanism.SCRAM_SHA_256)])["nobody"].result(10)
        assert info.value.args[0].code() == ck.KafkaError.RESOURCE_NOT_FOUND
        with pytest.raises(ck.KafkaException) as info:
            admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
                "ivan", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"pw")])["ivan"].result(10)
        assert info.value.args[0].code() == ck.KafkaError.UNACCEPTABLE_CREDENTIAL
        assert "dave" not in users_file.read_text() and "heidi" in users_file.read_text()


def test_without_a_credentials_file_alter_is_refused_with_a_reason(tmp_path):
    with KafkaServer(str(tmp_path / "store"), ("127.0.0.1", 0), sasl_credentials={ADMIN[0]: ADMIN[1]}) as server:
        admin = kafka_python_admin(server)
        try:
            answer = admin.alter_user_scram_credentials([KpUpsertion("judy", KpScramMechanism.SCRAM_SHA_256, "pw")])
            assert "not a credentials file" in answer["judy"]
            assert admin.describe_user_scram_credentials([ADMIN[0]])[ADMIN[0]]["error"] is None
        finally:
            admin.close()


def test_a_password_added_by_kafka_user_is_seen_by_describe_at_once(tmp_path, users_file):
    with KafkaServer(str(tmp_path / "store"), ("127.0.0.1", 0), sasl_credentials=users_file) as server:
        argv = ["kafka-user", "add", str(users_file), "kim", "--mechanism", "SCRAM-SHA-256", "--iterations", "5000"]
        assert cli_main(argv, stdin=io.StringIO("kim's\n")) == 0
        admin = AdminClient(confluent(server, *ADMIN))
        deadline = time.monotonic() + 5  # the file is checked for a change once a second
        while True:
            try:
                info = admin.describe_user_scram_credentials(["kim"])["kim"].result(10)
                break
            except ck.KafkaException:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert [(i.mechanism, i.iterations) for i in info.scram_credential_infos] == [
            (ScramMechanism.SCRAM_SHA_256, 5000)]


@pytest.mark.regression
def test_a_listener_without_sasl_keeps_scram_users_in_the_store(tmp_path):
    """Kafka keeps SCRAM users in its metadata whatever its listeners speak: on a listener
    without SASL (with an authorizer, which decides who may alter them),
    AlterUserScramCredentials writes the data directory's own credentials file;
    DescribeUserScramCredentials, ``logstore kafka-user`` on the directory and a later SASL
    listener on the same directory all see them. Before, a listener without --sasl-credentials
    refused the alteration."""
    root = tmp_path / "store"
    with KafkaServer(str(root), ("127.0.0.1", 0), authorizer=True, allow_everyone_if_no_acl_found=True) as server:
        admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
        assert admin.describe_user_scram_credentials().result(10) == {}
        futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            "lena", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"lena-secret")])
        assert futures["lena"].result(10) is None
        kp_admin = KafkaAdminClient(bootstrap_servers=server.bootstrap_servers, request_timeout_ms=10_000)
        try:
            assert kp_admin.describe_user_scram_credentials(["lena"]) == {"lena": {"error": None, "credential_infos": [
                {"mechanism": KpScramMechanism.SCRAM_SHA_256, "iterations": 4096}]}}
        finally:
            kp_admin.close()
    assert (root / ".sasl-credentials").stat().st_mode & 0o777 == 0o600
    assert b"lena-secret" not in (root / ".sasl-credentials").read_bytes()
    # logstore kafka-user given the data directory: lists lena, adds mo
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["kafka-user", "list", str(root)]) == 0
    assert out.getvalue().splitlines() == ["lena\tSCRAM-SHA-256"]
    assert cli_main(["kafka-user", "add", str(root), "mo", "--mechanism", "SCRAM-SHA-512"],
                    stdin=io.StringIO("mo-secret\n")) == 0
    # a SASL listener on the same directory, no file named: both authenticate with SCRAM
    with KafkaServer(str(root), ("127.0.0.1", 0), sasl_mechanisms=["SCRAM-SHA-256", "SCRAM-SHA-512"]) as server:
        assert can_produce(server, "lena", "lena-secret", "SCRAM-SHA-256", "users")
        assert not can_produce(server, "lena", "wrong", "SCRAM-SHA-256", "users")
        assert can_produce(server, "mo", "mo-secret", "SCRAM-SHA-512", "users")
        admin = AdminClient(confluent(server, "mo", "mo-secret"))
        assert sorted(admin.describe_user_scram_credentials().result(10)) == ["lena", "mo"]
        futures = admin.alter_user_scram_credentials([UserScramCredentialDeletion("lena",
                                                                                  ScramMechanism.SCRAM_SHA_256)])
        assert futures["lena"].result(10) is None
        assert not can_produce(server, "lena", "lena-secret", "SCRAM-SHA-256", "users")
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["kafka-user", "list", str(root)]) == 0
    assert out.getvalue().splitlines() == ["mo\tSCRAM-SHA-512"]


@pytest.mark.regression
def test_a_listener_that_neither_authenticates_nor_authorizes_mints_no_login(tmp_path):
    """Two servers on one store: an open loopback listener (no SASL, no authorizer) and a SASL
    listener with an authorizer whose super user is admin, both on the store's own users. The
    open listener's AlterUserScramCredentials is refused (POLICY_VIOLATION), so whoever reaches
    it cannot mint admin's login for the other; DescribeUserScramCredentials still answers.
    Before, the open listener wrote the store's users, and its client became a super user of
    the SASL listener."""
    root = tmp_path / "store"
    with KafkaServer(str(root), ("127.0.0.1", 0)) as open_server, \
            KafkaServer(str(root), ("127.0.0.1", 0), sasl_mechanisms=["SCRAM-SHA-256"], authorizer=True,
                        super_users=["User:admin"]) as sasl_server:
        admin = AdminClient({"bootstrap.servers": open_server.bootstrap_servers})
        futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            "admin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"minted")])
        with pytest.raises(ck.KafkaException) as refused:
            futures["admin"].result(10)
        assert refused.value.args[0].code() == ck.KafkaError.POLICY_VIOLATION
        assert "authenticates no one" in refused.value.args[0].str()
        assert admin.describe_user_scram_credentials().result(10) == {}
        assert not (root / ".sasl-credentials").exists()
        assert not can_produce(sasl_server, "admin", "minted", "SCRAM-SHA-256", "users")
