"""The ACL file of a store (logstore.kafka.aclfile): written atomically through _fileio, read
back after a restart, re-read when another process replaced it, kept when it became invalid,
two writers' changes both kept; and ``logstore acls`` on it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout

import pytest

from logstore import _fileio
from logstore.kafka.aclcommand import main as acls_main
from logstore.kafka.aclfile import ACL_FILE, AclFile, decode, encode
from logstore.kafka.acls import (AclBinding, AclBindingFilter, AclError, AclOperation as Op,
                                 AclPermissionType as Perm, AclSet, Authorizer, PatternType as PT,
                                 ResourceType as RT)


def acl(name, principal="User:alice", op=Op.READ, perm=Perm.ALLOW, pattern=PT.LITERAL, kind=RT.TOPIC):
    return AclBinding(kind, name, pattern, principal, "*", op, perm)


def test_no_file_is_no_acls_and_a_change_writes_one_read_back_by_a_new_reader(tmp_path):
    file = AclFile(tmp_path)
    assert len(file.current()) == 0 and not (tmp_path / ACL_FILE).exists()
    Authorizer(file).create([acl("a"), acl("b-", pattern=PT.PREFIXED, perm=Perm.DENY)])
    assert AclFile(tmp_path).current() == AclSet([acl("a"), acl("b-", pattern=PT.PREFIXED, perm=Perm.DENY)])
    doc = json.loads((tmp_path / ACL_FILE).read_text())
    assert doc["version"] == 1 and {e["name"] for e in doc["acls"]} == {"a", "b-"}


def test_a_reader_sees_another_writers_change_at_its_next_look(tmp_path):
    reader, writer = AclFile(tmp_path), AclFile(tmp_path)
    assert len(reader.current()) == 0
    Authorizer(writer).create([acl("x")])
    assert reader.current() == AclSet([acl("x")])
    Authorizer(writer).delete([AclBindingFilter()])
    assert len(reader.current()) == 0


def test_two_writers_keep_both_changes(tmp_path):
    one, two = AclFile(tmp_path), AclFile(tmp_path)
    Authorizer(one).create([acl("from-one")])
    Authorizer(two).create([acl("from-two")])  # re-reads under the lock: one's change stays
    assert {a.name for a in AclFile(tmp_path).current()} == {"from-one", "from-two"}


def test_an_invalid_file_keeps_what_was_read_and_refuses_a_change(tmp_path, caplog):
    file = AclFile(tmp_path)
    Authorizer(file).create([acl("kept")])
    (tmp_path / ACL_FILE).write_text("{torn")
    assert file.current() == AclSet([acl("kept")])
    assert "keeping the ACLs read before" in caplog.text
    with pytest.raises(AclError, match="not an ACL file"):
        Authorizer(file).create([acl("more")])
    with pytest.raises(AclError, match="not an ACL file"):
        AclFile(tmp_path)


def test_the_write_is_atomic_through_fileio(tmp_path):
    """A failed rename leaves the old file whole (the new one is a temp file beside it)."""
    file = AclFile(tmp_path)
    Authorizer(file).create([acl("old")])

    class FailingRename(_fileio.FileOps):
        def rename(self, src, dst):
            raise OSError("no space")

    with _fileio.install(FailingRename()):
        with pytest.raises(OSError):
            Authorizer(file).create([acl("new")])
    assert AclFile(tmp_path).current() == AclSet([acl("old")])


@pytest.mark.parametrize("text, reason", [
    ('{"version": 2, "acls": []}', "version 1"),
    ('{"version": 1, "acls": [{"name": "x"}]}', "entry 0"),
    ('{"version": 1, "acls": [{"resource_type": "TOPIC", "name": "", "pattern_type": "LITERAL", '
     '"principal": "User:a", "host": "*", "operation": "READ", "permission": "ALLOW"}]}', "empty"),
])
def test_decode_names_what_is_wrong(text, reason):
    with pytest.raises(AclError, match=reason):
        decode(text.encode(), "f")


def test_encode_round_trips_any_name():
    acls = AclSet([acl('we"ird\nname é'), acl("g", kind=RT.GROUP, principal="User:*", op=Op.ALL)])
    assert decode(encode(acls), "f") == acls


# ---------------------------------------------------------------------- logstore acls
def run(*argv):
    out = io.StringIO()
    with redirect_stdout(out):
        code = acls_main(list(argv))
    return code, out.getvalue()


def test_cli_add_list_remove(tmp_path):
    root = str(tmp_path)
    code, out = run("add", root, "--allow-principal", "User:alice", "--allow-principal", "User:bob",
                    "--operation", "Read", "--operation", "describe-configs", "--topic", "t", "--group", "g")
    assert code == 0 and "operation=DESCRIBE_CONFIGS" in out
    assert len(AclFile(root).current()) == 8  # 2 principals x 2 operations x 2 resources
    code, out = run("add", root, "--deny-principal", "User:bob", "--deny-host", "10.0.0.9", "--operation", "All",
                    "--cluster")
    assert code == 0 and "host=10.0.0.9" in out
    code, out = run("list", root, "--topic", "t")
    assert code == 0 and out.count("principal=") == 4
    code, out = run("list", root, "--principal", "User:bob", "--cluster")
    assert out.count("principal=") == 1
    code, _ = run("remove", root, "--group", "g", "--allow-principal", "User:bob")
    assert code == 0 and len(AclFile(root).current()) == 7
    code, _ = run("remove", root, "--topic", "t")
    assert code == 0 and {a.resource_type for a in AclFile(root).current()} == {RT.GROUP, RT.CLUSTER}
    assert run("remove", root, "--topic", "t")[0] == 1  # nothing left to remove


def test_cli_refuses_bad_usage(tmp_path, capsys):
    root = str(tmp_path)
    assert acls_main(["add", root, "--operation", "Read", "--topic", "t"]) == 2  # no principal
    assert acls_main(["add", root, "--allow-principal", "User:a", "--topic", "t"]) == 2  # no operation
    assert acls_main(["add", root, "--allow-principal", "User:a", "--operation", "Read"]) == 2  # no resource
    assert acls_main(["add", root, "--allow-principal", "User:a", "--operation", "Fly", "--topic", "t"]) == 2
    assert acls_main(["add", root, "--allow-principal", "alice", "--operation", "Read", "--topic", "t"]) == 1
    assert "TYPE:NAME" in capsys.readouterr().err
    assert len(AclFile(root).current()) == 0


def test_cli_loads_no_codec(tmp_path):
    """logstore acls runs without kio, like the other offline commands."""
    code = ("import sys; from logstore.cli import main; rc = main(['acls', 'list', sys.argv[1]]); "
            "assert 'kio' not in sys.modules, 'kio loaded'; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ}, timeout=60)
    assert done.returncode == 0, done.stderr
