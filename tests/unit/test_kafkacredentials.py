"""SASL credentials (logstore.kafka.credentials): the file format and its errors, the mapping
form, adding and removing users, logstore kafka-user, re-reading a replaced file."""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import threading

import pytest

from logstore import LogstoreError
from logstore.cli import main as cli_main
from logstore.kafka.credentials import (
    Credentials,
    CredentialsError,
    CredentialsFile,
    PlainCredential,
    ScramCredential,
    add_user,
    plain_credential,
    remove_user,
    scram_credential,
    scram_credential_of_salted,
)

SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")


def test_scram_keys_are_rfc_5802s():
    import hashlib
    import hmac

    c = scram_credential("SCRAM-SHA-512", "pencil", SALT, 4096)
    salted = hashlib.pbkdf2_hmac("sha512", b"pencil", SALT, 4096)
    assert c.stored_key == hashlib.sha512(hmac.new(salted, b"Client Key", "sha512").digest()).digest()
    assert c.server_key == hmac.new(salted, b"Server Key", "sha512").digest()
    assert scram_credential("SCRAM-SHA-256", "pencil").salt != scram_credential("SCRAM-SHA-256", "pencil").salt
    with pytest.raises(ValueError):
        scram_credential("SCRAM-SHA-1", "x")
    with pytest.raises(ValueError):
        scram_credential("SCRAM-SHA-256", "x", iterations=4095)


def test_plain_credential_checks_a_password():
    c = plain_credential("s3cret")
    assert c.check(b"s3cret") and not c.check(b"s3cret ") and not c.check(b"")
    assert len(c.hash) == 32 and c.iterations == 4096


@pytest.mark.parametrize("user", ["alice", "a:b", "50%", "with space", "zoë", "x,y=z", "#hash", "@+~"])
def test_text_round_trip_for_any_user_name(user):
    entries = {(user, "SCRAM-SHA-256"): scram_credential("SCRAM-SHA-256", "pw", SALT),
               (user, "SCRAM-SHA-512"): scram_credential("SCRAM-SHA-512", "pw", SALT),
               (user, "PLAIN"): plain_credential("pw", SALT)}
    text = Credentials(entries).to_text()
    assert Credentials.parse(text).entries() == entries
    written = {line.split(":")[0] for line in text.splitlines()[1:]}
    assert len(written) == 1 and ":" not in written.pop().replace("%3A", "")
    if user in ("alice", "@+~"):
        assert text.splitlines()[1].startswith(user + ":")


GOOD_SCRAM = Credentials({("u", "SCRAM-SHA-256"): scram_credential("SCRAM-SHA-256", "pw", SALT)}).to_text().splitlines()[1]
GOOD_PLAIN = Credentials({("u", "PLAIN"): plain_credential("pw", SALT)}).to_text().splitlines()[1]


@pytest.mark.parametrize("line,message", [
    ("alice", "expected USER:MECHANISM"),
    ("a:b:c:d", "expected USER:MECHANISM"),
    (":PLAIN:salt=AA==", "an empty user name"),
    ("%FF:PLAIN:salt=AA==", "not percent-encoded UTF-8"),
    ("u:GSSAPI:salt=AA==", "unknown mechanism 'GSSAPI'"),
    ("u:PLAIN:salt", "expected key=value"),
    ("u:PLAIN:salt=AA==,salt=AA==", "salt twice"),
    ("u:PLAIN:salt=AA==,iterations=4096", "missing hash"),
    (GOOD_PLAIN + ",extra=1", "unknown extra"),
    (GOOD_PLAIN.replace("iterations=4096", "iterations=4k"), "not a number"),
    (GOOD_PLAIN.replace("iterations=4096", "iterations=100"), "iterations=100"),
    pytest.param(GOOD_PLAIN.replace("iterations=4096", "iterations=16385"),
                 "iterations=16385 (between 4096 and 16384)",  # Kafka's SCRAM maximum, also PLAIN's
                 marks=pytest.mark.regression),
    (GOOD_SCRAM.replace("salt=", "salt=!"), "salt is not base64"),
    (GOOD_SCRAM.replace("SCRAM-SHA-256", "SCRAM-SHA-512"), "must be 64 bytes"),
])
def test_a_bad_line_is_named(line, message):
    text = "# users\n\n" + GOOD_SCRAM.replace("u:", "v:") + "\n" + line + "\n"
    with pytest.raises(CredentialsError) as failed:
        Credentials.parse(text, "users.txt")
    assert str(failed.value).startswith("users.txt, line 4: ")
    assert message in str(failed.value)
    assert isinstance(failed.value, LogstoreError)


def test_a_duplicate_names_both_lines():
    with pytest.raises(CredentialsError, match=r"x, line 3: a second SCRAM-SHA-256 credential for 'u' \(the first "
                                               r"is on line 1\)"):
        Credentials.parse(f"{GOOD_SCRAM}\n{GOOD_PLAIN}\n{GOOD_SCRAM}\n", "x")


def test_from_mapping():
    c = Credentials.from_mapping({"alice": "pw", "bob": {"PLAIN": plain_credential("x")}}, ["PLAIN", "SCRAM-SHA-512"])
    assert sorted(c.entries()) == [("alice", "PLAIN"), ("alice", "SCRAM-SHA-512"), ("bob", "PLAIN")]
    assert isinstance(c.lookup("alice", "SCRAM-SHA-512"), ScramCredential)
    assert isinstance(c.lookup("bob", "PLAIN"), PlainCredential)
    assert c.lookup("bob", "SCRAM-SHA-512") is None and c.users() == ["alice", "bob"]
    for bad in ({"": "pw"}, {"u": 3}, {"u": {"PLAIN": scram_credential("SCRAM-SHA-256", "x")}},
                {"u": {"SCRAM-SHA-512": scram_credential("SCRAM-SHA-256", "x")}}):
        with pytest.raises(CredentialsError):
            Credentials.from_mapping(bad)


def test_add_and_remove_users(tmp_path):
    path = tmp_path / "users"
    add_user(path, "alice", "pw1", ["SCRAM-SHA-256", "PLAIN"])
    add_user(path, "bob", "pw2", ["SCRAM-SHA-512"])
    first = Credentials.load(path)
    add_user(path, "alice", "pw3", ["PLAIN"])  # replaces alice's PLAIN only
    again = Credentials.load(path)
    assert again.lookup("alice", "SCRAM-SHA-256") == first.lookup("alice", "SCRAM-SHA-256")
    assert again.lookup("alice", "PLAIN").check(b"pw3")
    assert (path.stat().st_mode & 0o777) == 0o600
    assert not (tmp_path / "users.tmp").exists()
    assert remove_user(path, "alice", ["PLAIN"]) == 1
    assert sorted(Credentials.load(path).entries()) == [("alice", "SCRAM-SHA-256"), ("bob", "SCRAM-SHA-512")]
    assert remove_user(path, "alice") == 1 and remove_user(path, "alice") == 0
    with pytest.raises(ValueError):
        add_user(path, "carol", "", ["PLAIN"])
    with pytest.raises(ValueError):
        add_user(path, "carol", "pw", ["GSSAPI"])


def test_the_cli(tmp_path, capsys):
    path = str(tmp_path / "users")
    assert cli_main(["kafka-user", "add", path, "alice", "--mechanism", "SCRAM-SHA-512"],
                    stdin=io.StringIO("from stdin\nignored\n")) == 0
    (tmp_path / "pw").write_text("from a file\n")
    assert cli_main(["kafka-user", "add", path, "bob", "--mechanism", "PLAIN", "--mechanism", "SCRAM-SHA-256",
                     "--password-file", str(tmp_path / "pw"), "--iterations", "8192"]) == 0
    c = Credentials.load(path)
    assert c.lookup("bob", "PLAIN").check(b"from a file") and c.lookup("bob", "PLAIN").iterations == 8192
    text = (tmp_path / "users").read_text()
    assert "from stdin" not in text and "from a file" not in text
    capsys.readouterr()
    assert cli_main(["kafka-user", "list", path]) == 0
    assert capsys.readouterr().out.splitlines() == ["alice\tSCRAM-SHA-512", "bob\tPLAIN", "bob\tSCRAM-SHA-256"]
    assert cli_main(["kafka-user", "delete", path, "bob", "--mechanism", "PLAIN"]) == 0
    assert cli_main(["kafka-user", "delete", path, "nobody"]) == 1
    assert cli_main(["kafka-user", "add", path, "carol", "--mechanism", "PLAIN"], stdin=io.StringIO("")) == 1
    assert "must not be empty" in capsys.readouterr().err
    assert cli_main(["kafka-user", "add", path, "carol"], stdin=io.StringIO("x\n")) == 2  # --mechanism required


def test_a_replaced_file_is_reread_and_a_broken_one_ignored(tmp_path, caplog):
    path = tmp_path / "users"
    add_user(path, "alice", "pw", ["PLAIN"])
    users = CredentialsFile(path, check_interval_s=0.0)
    assert users.current().users() == ["alice"]
    add_user(path, "bob", "pw", ["PLAIN"])
    assert users.current().users() == ["alice", "bob"]
    path.write_text("broken line\n")
    with caplog.at_level(logging.ERROR, logger="logstore.kafka"):
        assert users.current().users() == ["alice", "bob"]
    assert "line 1" in caplog.text
    with pytest.raises(CredentialsError, match="cannot read"):
        CredentialsFile(tmp_path / "missing")
    (tmp_path / "latin1").write_bytes(b"\xe9:PLAIN:x=y\n")
    with pytest.raises(CredentialsError, match="not UTF-8"):
        Credentials.load(tmp_path / "latin1")


def test_alter_rewrites_the_file_at_once_and_all_or_nothing(tmp_path):
    path = tmp_path / "users"
    add_user(path, "alice", "a", ["SCRAM-SHA-256", "PLAIN"])
    source = CredentialsFile(path, check_interval_s=3600)  # never re-read by time: alter updates it
    salted = hashlib.pbkdf2_hmac("sha512", b"b", b"salt", 4096)
    bob = scram_credential_of_salted("SCRAM-SHA-512", salted, b"salt", 4096)
    assert bob == scram_credential("SCRAM-SHA-512", "b", b"salt", 4096)  # the same keys as from the password
    source.alter([("alice", "PLAIN")], {("bob", "SCRAM-SHA-512"): bob})
    assert sorted(source.current().entries()) == [("alice", "SCRAM-SHA-256"), ("bob", "SCRAM-SHA-512")]
    assert sorted(Credentials.load(path).entries()) == [("alice", "SCRAM-SHA-256"), ("bob", "SCRAM-SHA-512")]
    before = path.read_bytes()
    with pytest.raises(KeyError):
        source.alter([("alice", "SCRAM-SHA-256"), ("carol", "PLAIN")], {})
    assert path.read_bytes() == before
    assert sorted(source.current().entries()) == [("alice", "SCRAM-SHA-256"), ("bob", "SCRAM-SHA-512")]


@pytest.mark.regression
def test_iterations_are_capped_at_kafkas_scram_maximum():
    """A PLAIN check runs PBKDF2 on the listener's loop for every attempt: a credential may ask
    for at most Kafka's SCRAM maximum, 16384 iterations (it was 1,000,000)."""
    assert plain_credential("pw", iterations=16384).iterations == 16384
    for make in (lambda: plain_credential("pw", iterations=16385),
                 lambda: scram_credential("SCRAM-SHA-256", "pw", iterations=1_000_000)):
        with pytest.raises(ValueError, match="between 4096 and 16384"):
            make()


def test_a_stores_own_file_may_not_exist_yet(tmp_path):
    """A data directory's own users (.sasl-credentials): none until the file is written, then
    those of the file; ``users_path`` maps a directory to it and leaves a file's path alone."""
    from logstore.kafka.credentials import STORE_FILE_NAME, store_users_path, users_path

    path = store_users_path(tmp_path)
    assert path == str(tmp_path / STORE_FILE_NAME) == users_path(tmp_path)
    assert users_path(tmp_path / "named") == str(tmp_path / "named")
    with pytest.raises(CredentialsError):
        CredentialsFile(path)
    users = CredentialsFile(path, check_interval_s=0, missing_ok=True)
    assert len(users.current()) == 0
    users.alter([], {("ann", "SCRAM-SHA-256"): scram_credential("SCRAM-SHA-256", "pw")})
    assert (tmp_path / STORE_FILE_NAME).stat().st_mode & 0o777 == 0o600
    assert CredentialsFile(path).current().users() == ["ann"]


@pytest.mark.regression
def test_concurrent_writers_of_one_file_lose_no_user(tmp_path):
    """``logstore kafka-user`` and a server's AlterUserScramCredentials write the same file:
    each read-change-write holds the flock beside it, so no writer undoes another's user."""
    path = tmp_path / "users"
    live = CredentialsFile(path, missing_ok=True)
    credential = scram_credential("SCRAM-SHA-256", "pw", iterations=4096)

    def cli_writer(n):
        for i in range(15):
            add_user(path, f"cli-{n}-{i}", "pw", iterations=4096)

    def server_writer():
        for i in range(15):
            live.alter([], {(f"srv-{i}", "SCRAM-SHA-256"): credential})

    threads = [threading.Thread(target=cli_writer, args=(n,)) for n in range(3)]
    threads.append(threading.Thread(target=server_writer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    users = set(Credentials.load(path).users())
    assert users == {f"cli-{n}-{i}" for n in range(3) for i in range(15)} | {f"srv-{i}" for i in range(15)}


@pytest.mark.regression
def test_current_never_waits_for_a_writer(tmp_path, monkeypatch):
    """A SASL handshake reads the credentials on the listener's network loop: while
    AlterUserScramCredentials (or ``logstore kafka-user`` holding the flock) rewrites the file,
    current() answers with the credentials read before instead of waiting. Before, it waited
    on the lock the writer held through its fsyncs, and every connection of the listener froze."""
    from logstore import _fileio

    path = tmp_path / "users"
    add_user(path, "old", "pw", iterations=4096)
    live = CredentialsFile(path, check_interval_s=0.0)
    writing, release = threading.Event(), threading.Event()
    waited_out: list[bool] = []
    real_fsync_dir = _fileio.FileOps.fsync_dir

    def slow_fsync_dir(self, directory):
        if threading.current_thread().name == "writer":
            writing.set()
            if not release.wait(30):
                waited_out.append(True)  # (current() was stuck behind this writer)
        real_fsync_dir(self, directory)

    monkeypatch.setattr(_fileio.FileOps, "fsync_dir", slow_fsync_dir)
    credential = scram_credential("SCRAM-SHA-256", "pw", iterations=4096)
    writer = threading.Thread(target=live.alter, args=([], {("new", "SCRAM-SHA-256"): credential}), name="writer")
    writer.start()
    assert writing.wait(30)
    assert "old" in live.current().users()  # answered while the writer is mid-write
    release.set()
    writer.join(30)
    assert not waited_out
    assert sorted(live.current().users()) == ["new", "old"]
