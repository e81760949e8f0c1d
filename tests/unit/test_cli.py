"""The ``logstore`` command: dispatch and argument errors (each subcommand has its own suite)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from logstore.cli import main


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "logstore", *args], capture_output=True, text=True, timeout=60, **kw)


def test_no_command_prints_usage_and_fails():
    r = run()
    assert r.returncode == 2 and "a COMMAND is required" in r.stderr


def test_help_lists_the_commands(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for command in ("topics", "produce", "consume", "dump", "verify", "recover", "stats", "compact", "retention", "node"):
        assert command in text


def test_help_goes_to_the_given_stream_and_ends_its_last_line(capsys):
    import io

    for argv in (["--help"], ["stats", "--help"], ["topics", "--help"]):
        out = io.StringIO()
        assert main(argv, stdout=out) == 0
        text = out.getvalue()
        assert capsys.readouterr().out == "", f"{argv}: help went to sys.stdout, not to main's stdout"
        assert text.endswith("\n") and not text.endswith("\n\n"), argv
    lines = main_help_lines()
    assert lines[-2:] == ["'logstore COMMAND --help' describes a command and its options.",
                          "'logstore node --help' describes the replication node (logstore node ...)."]


def main_help_lines():
    import io

    out = io.StringIO()
    main(["--help"], stdout=out)
    return out.getvalue().splitlines()


def test_help_output_is_followed_cleanly_by_the_next_command():
    # Two commands' output one after the other, as a shell prints them: the help's last line
    # must not run into the next output ("...replication nodelogstore ...").
    first, second = run("--help"), run("topics", "--help")
    assert first.returncode == second.returncode == 0
    joined = first.stdout + second.stdout
    assert first.stdout.endswith("\n")
    assert "\nusage: logstore topics" in joined
    assert all(len(line) <= 100 for line in first.stdout.splitlines())


def test_unknown_command_is_named(capsys):
    assert main(["frobnicate"]) == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--listen", "nohost"], "expected host:port"),
    (["--listen", "127.0.0.1:0", "--peer", "x=127.0.0.1:1"], "expected id=host:port"),
    (["--listen", "127.0.0.1:0", "--tls-cert", "c.pem"], "go together"),
    (["--listen", "127.0.0.1:0", "--secret-file", "/nonexistent/secret"], "cannot read the secret file"),
])
def test_node_argument_errors_are_clear(tmp_path, args, message):
    base = ["node", "--node-id", "0", "--data-dir", str(tmp_path / "d")]
    if "--secret-file" not in args:
        (tmp_path / "secret").write_bytes(b"s")
        base += ["--secret-file", str(tmp_path / "secret")]
    r = run(*base, *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr


@pytest.mark.parametrize("command", ["serve", "node"])
def test_the_serving_commands_freeze_their_startup_heap_once_they_listen(tmp_path, monkeypatch, capfd, command):
    """``logstore serve`` and ``logstore node`` call ``net.freeze_startup_heap`` after they
    listen (a full collection walking the start-up heap stalled every connection: see there),
    then serve until SIGTERM. Run in this process: the call is recorded and sends the SIGTERM
    (to the command's own handler, installed before it)."""
    import os
    import signal
    import threading

    from logstore.net import server as net

    calls = []

    def freeze() -> None:
        calls.append(command)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(net, "freeze_startup_heap", freeze)
    if command == "serve":
        argv = ["serve", str(tmp_path / "store"), "--listen", "127.0.0.1:0"]
    else:
        (tmp_path / "secret").write_bytes(b"s")
        argv = ["node", "--node-id", "0", "--data-dir", str(tmp_path / "d"), "--secret-file",
                str(tmp_path / "secret"), "--listen", "127.0.0.1:0"]
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    # Without the call the command would serve on: stopped by SIGINT after 30 s (the assertion
    # below then fails), a timer that main() replaces with its own handler before it serves.
    returned = threading.Event()

    def watchdog() -> None:
        if not returned.wait(30):
            os.kill(os.getpid(), signal.SIGINT)

    guard = threading.Thread(target=watchdog, daemon=True)
    guard.start()
    try:
        assert main(argv) == 0
    finally:
        returned.set()
        guard.join(10)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if command == "node":
            import faulthandler

            faulthandler.unregister(signal.SIGUSR1)  # the node's stack dump on SIGUSR1
    assert calls == [command]
    assert "serving " in capfd.readouterr().out


# ---------------------------------------------------------------------- operator commands, end to end
import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "kafka" / "cluster-metadata-00000000000000000000.log"


def ok(*args, **kw):
    r = run(*args, **kw)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


@pytest.fixture
def store(tmp_path):
    """Built through the API (fast); test_produce_through_the_cli covers the produce command."""
    from logstore import LogStore

    root = str(tmp_path / "st")
    with LogStore(root, maintenance=False) as s:
        s.create_topic("events", 2, **{"segment.bytes": 4096})
        s.create_topic("table", 1, **{"cleanup.policy": "compact", "segment.bytes": 2048})
        with s.producer() as producer:
            for start in range(0, 600, 200):  # three batches per partition: several segments
                for i in range(start, start + 200):
                    producer.send("events", f"event {i}".encode(), key=f"user-{i % 7}".encode())
                producer.flush()
            for start in range(0, 300, 100):
                for i in range(start, start + 100):
                    producer.send("table", f"v{i}".encode(), key=f"k{i % 5}".encode())
                producer.flush()
    return root


def test_produce_through_the_cli(tmp_path):
    root = str(tmp_path / "p")
    ok("topics", "create", root, "t", "--partitions", "3")
    ok("produce", root, "t", "--key-separator", ":", input="".join(f"key-{i}:value {i}\n" for i in range(50)))
    ok("produce", root, "t", "--partition", "2", input="plain line\n")
    from logstore import LogStore
    from logstore.client.producer import default_partition

    with LogStore(root, maintenance=False) as s:
        got = {(r.key, r.value): p for p in range(3) for r in s.partition("t", p).iter()}
    assert got[(None, b"plain line")] == 2
    for i in range(50):
        assert got[(f"key-{i}".encode(), f"value {i}".encode())] == default_partition(f"key-{i}".encode(), 3)


def test_topics_list_describe_delete(store):
    assert ok("topics", "list", store).split() == ["events", "table"]
    assert json.loads(ok("topics", "list", store, "--json")) == ["events", "table"]
    described = json.loads(ok("topics", "describe", store, "events", "--json"))
    assert described["partitions"] == 2 and described["overrides"] == {"segment.bytes": "4096"}
    assert "segment.bytes = 4096 *" in ok("topics", "describe", store, "events")
    with open(os.path.join(store, "events-1", "partition.metadata")) as f:  # Kafka's copy of the id
        text_id = f.read().split("topic_id: ")[1]
    assert described["topic_id"] == text_id and len(text_id) == 22
    assert f"  topic id: {text_id}\n" in ok("topics", "describe", store, "events")
    ok("topics", "delete", store, "table")
    assert ok("topics", "list", store).split() == ["events"]
    r = run("topics", "create", store, "../escape")
    assert r.returncode == 1 and "topic" in r.stderr and not os.path.exists(os.path.join(store, "..", "escape-0"))
    r = run("topics", "create", store, "x", "--config", "retention.ms=soon")
    assert r.returncode == 1 and "retention" in r.stderr and "soon" in r.stderr


def test_produce_and_consume_round_trip(store):
    out = ok("consume", store, "events", "--from-beginning", "--print-key", "--key-separator", ":")
    assert sorted(out.splitlines()) == sorted(f"user-{i % 7}:event {i}" for i in range(600))
    assert "\t" in ok("consume", store, "events", "--from-beginning", "--print-key", "--max-records", "1")
    records = [json.loads(line) for line in ok("consume", store, "events", "--from-beginning", "--json").splitlines()]
    assert len(records) == 600 and {r["partition"] for r in records} == {0, 1}
    part = [r for r in records if r["partition"] == 1]
    one = [json.loads(line) for line in ok("consume", store, "events", "--partition", "1", "--offset", "5",
                                           "--max-records", "3", "--json").splitlines()]
    assert [r["offset"] for r in one] == [5, 6, 7] and one[0]["value"] == next(r["value"] for r in part if r["offset"] == 5)
    # A group resumes where it committed.
    assert len(ok("consume", store, "events", "--group", "g", "--max-records", "100").splitlines()) == 100
    assert len(ok("consume", store, "events", "--group", "g").splitlines()) == 500
    assert ok("consume", store, "events", "--group", "g") == ""
    r = run("produce", store, "events", "--key-separator", "|", input="no separator here\n")
    assert r.returncode == 1 and "no key separator" in r.stderr


def test_consume_follow_prints_records_as_they_arrive(store):
    """``consume --follow`` starts at the end and prints what is produced after it started. The
    follower may take a while to start on a loaded machine: records are produced until it prints
    one, then two more must follow in order. Bounded: a follower that prints nothing fails the
    test after a minute instead of hanging it."""
    import queue
    import subprocess
    import sys
    import threading
    import time

    follower = subprocess.Popen([sys.executable, "-m", "logstore", "consume", store, "events", "--follow"],
                                stdout=subprocess.PIPE, text=True)
    printed: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [printed.put(line.strip()) for line in follower.stdout], daemon=True).start()
    try:
        deadline, sent, first = time.monotonic() + 60, 0, None
        while first is None and time.monotonic() < deadline:
            sent += 1
            ok("produce", store, "events", input=f"late {sent}\n")
            try:
                first = printed.get(timeout=1.0)
            except queue.Empty:
                continue
        assert first is not None, "consume --follow printed nothing within a minute"
        ok("produce", store, "events", input="after 1\nafter 2\n")
        lines = [first]
        while lines[-2:] != ["after 1", "after 2"]:
            lines.append(printed.get(timeout=30))
        late = [int(line.split()[1]) for line in lines[:-2]]
        assert all(line.startswith("late ") for line in lines[:-2])
        assert late == list(range(late[0], sent + 1))  # from where it started, none missed, none twice
    finally:
        follower.kill()
        follower.wait()


def test_stats(store):
    rows = {f"{r['topic']}-{r['partition']}": r for r in json.loads(ok("stats", store, "--json"))}
    assert rows["events-0"]["log_end_offset"] + rows["events-1"]["log_end_offset"] == 600
    assert rows["events-0"]["records"] == rows["events-0"]["log_end_offset"]
    assert rows["events-0"]["segments"] > 1 and rows["table-0"]["dirty_ratio"] is not None
    ok("consume", store, "events", "--group", "billing", "--max-records", "10")
    rows = {f"{r['topic']}-{r['partition']}": r for r in json.loads(ok("stats", store, "--json"))}
    lag = rows["events-0"]["group_lag"]["billing"] + rows["events-1"]["group_lag"]["billing"]
    assert lag == 590
    assert "billing=" in ok("stats", store)


def test_stats_and_topics_list_on_a_partition_directory(store, tmp_path):
    rows = json.loads(ok("stats", os.path.join(store, "events-1"), "--json"))
    assert [(r["topic"], r["partition"]) for r in rows] == [("events", 1)]
    whole = {(r["topic"], r["partition"]): r for r in json.loads(ok("stats", store, "--json"))}
    assert rows[0] == whole[("events", 1)]
    assert json.loads(ok("stats", os.path.join(store, "table-0"), "--json"))[0]["dirty_ratio"] is not None
    assert ok("topics", "list", os.path.join(store, "events-1")) == "events\n"
    # A partition directory outside any store, not named <topic>-<n>: keyed as Log keys it.
    from logstore import Log

    with Log.open(tmp_path / "audit") as log:
        log.append(b"x")
    rows = json.loads(ok("stats", str(tmp_path / "audit"), "--json"))
    assert [(r["topic"], r["partition"], r["records"]) for r in rows] == [("audit", -1, 1)]


def test_read_only_commands_write_nothing_into_a_store(store):
    def listing():
        return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in pathlib.Path(store).rglob("*"))

    before = listing()
    ok("stats", store, "--quiet")
    ok("topics", "list", store)
    ok("topics", "describe", store, "events")
    ok("stats", os.path.join(store, "events-0"), "--quiet")
    assert listing() == before


def test_read_only_commands_name_a_missing_or_foreign_directory(tmp_path):
    r = run("topics", "list", str(tmp_path / "missing"))
    assert r.returncode == 1 and "no such store directory" in r.stderr
    r = run("stats", str(tmp_path))
    assert r.returncode == 1 and "nor a Kafka log directory" in r.stderr
    assert os.listdir(tmp_path) == []


def test_verify_passes_then_names_the_damage(store):
    assert json.loads(ok("verify", store, "--json"))["ok"] is True
    assert ok("verify", store).strip().endswith("OK")
    segment = sorted(pathlib.Path(store, "events-0").glob("*.log"))[0]
    data = bytearray(segment.read_bytes())
    data[200] ^= 0xFF
    segment.write_bytes(bytes(data))
    r = run("verify", store, "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert report["ok"] is False
    problem = report["problems"][0]
    assert problem["file"].endswith(segment.name) and problem["position"] is not None and "CRC" in problem["what"]
    r = run("verify", str(segment))
    assert r.returncode == 1 and "PROBLEM" in r.stdout


def test_verify_names_a_bad_index_entry(store):
    index = sorted(pathlib.Path(store, "events-1").glob("*.index"))[0]
    index.write_bytes(bytes.fromhex("0000000500000007"))  # offset 5 at position 7: no batch starts there
    r = run("verify", os.path.join(store, "events-1"))
    assert r.returncode == 1 and "no batch boundary" in r.stdout


def test_recover_reports_what_it_truncated(store):
    segment = sorted(pathlib.Path(store, "events-0").glob("*.log"))[-1]
    with open(segment, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x09\x00\x00\x00\x30" + b"garbage!" * 8)
    marker = pathlib.Path(store, "events-0", ".kafka_cleanshutdown")
    if marker.exists():  # as after a crash: no clean-shutdown marker
        marker.unlink()
    reports = {r["partition"]: r for r in json.loads(ok("recover", store, "--json"))}
    assert reports["events-0"]["bytes_truncated"] == 76 and reports["events-0"]["clean_shutdown"] is False
    assert reports["events-1"]["bytes_truncated"] == 0
    assert json.loads(ok("verify", store, "--json"))["ok"] is True
    one = json.loads(ok("recover", os.path.join(store, "events-1"), "--json"))
    assert [r["partition"] for r in one] == ["events-1"]
    from logstore import LogStore
    with LogStore(store, maintenance=False):  # in use by another process: refused
        r = run("recover", store)
    assert r.returncode == 1 and "open" in r.stderr


def test_dump_segments_indexes_checkpoints_and_kafkas_fixture(store):
    out = ok("dump", str(FIXTURE), "--deep", "--print-data")
    assert "baseOffset: 0 lastOffset: 0 count: 1" in out and "| offset: 3" in out
    items = [json.loads(line) for line in ok("dump", str(FIXTURE), "--json", "--deep").splitlines()]
    assert [b["last_offset"] for b in items] == [0, 3] and sum(len(b["records"]) for b in items) == 4
    segment = sorted(pathlib.Path(store, "table-0").glob("*.log"))[0]
    out = ok("dump", str(segment), "--print-data")
    assert "key: k0 payload: v0" in out
    checkpoint = os.path.join(store, "recovery-point-offset-checkpoint")
    entries = [json.loads(line) for line in ok("dump", checkpoint, "--json").splitlines()]
    assert {(e["topic"], e["partition"]) for e in entries} >= {("events", 0), ("events", 1)}
    index = sorted(pathlib.Path(store, "events-0").glob("*.timeindex"))[0]
    ok("dump", str(index))
    r = run("dump", os.path.join(store, "meta.properties"))
    assert r.returncode == 1 and "not a segment" in r.stderr


def test_compact_and_retention(store):
    out = ok("compact", store, "table")
    assert "table-0: kept" in out
    values = ok("consume", store, "table", "--from-beginning", "--print-key", "--key-separator", "=").splitlines()
    assert {line.split("=")[0] for line in values} == {f"k{i}" for i in range(5)}
    assert len(values) < 300
    r = run("compact", store, "events")
    assert r.returncode == 1 and "not compacted" in r.stderr
    assert "segment(s) deleted" in ok("retention", store)


def test_verify_finds_offsets_going_backwards_and_dump_goes_deep_into_compressed_batches(tmp_path):
    from logstore import LogStore

    root = str(tmp_path / "z")
    with LogStore(root, maintenance=False) as s:
        s.create_topic("z", 1, compression_type="zstd")
        log = s.partition("z", 0)
        log.append_batch([b"first %d" % i for i in range(5)])
        log.append_batch([b"second %d" % i for i in range(5)])
    segment = sorted(pathlib.Path(root, "z-0").glob("*.log"))[0]
    items = [json.loads(line) for line in ok("dump", str(segment), "--deep", "--print-data", "--json").splitlines()]
    assert [b["codec"] for b in items] == ["zstd", "zstd"]
    assert [r["value"] for b in items for r in b["records"]] == [f"first {i}" for i in range(5)] + [f"second {i}" for i in range(5)]
    # A copy of the first batch appended at the end: valid CRC, but offsets go backwards.
    data = segment.read_bytes()
    segment.write_bytes(data + data[:items[0]["size"]])
    r = run("verify", root)
    assert r.returncode == 1 and "offsets go backwards" in r.stdout


@pytest.mark.regression(reason=("fixed: verify read the zero-filled, preallocated time index of an empty active "
    "segment left by a crash as an entry (timestamp 0, offset 0) and reported it as past the "
    "segment's last offset"))
def test_verify_accepts_the_preallocated_indexes_of_an_empty_segment_after_a_crash(tmp_path):
    from logstore import Log
    from logstore import tools

    path = tmp_path / "t-0"
    log = Log.open(str(path), segment_index_bytes=4096)
    log._abandon()  # a crash: the active segment keeps its preallocated, zero-filled files
    timeindex = path / "00000000000000000000.timeindex"
    assert timeindex.stat().st_size > 12 and not timeindex.read_bytes().strip(b"\0")
    assert tools.verify(str(path)).problems == []
    # A real entry past an empty segment is still reported.
    timeindex.write_bytes(b"\0" * 7 + b"\x05" + b"\0\0\0\x01")
    assert [p.what for p in tools.verify(str(path)).problems] == [
        "entry names offset 1, past the segment's last offset -1"]


@pytest.mark.parametrize("damage", ["none", "a byte deep in the zero tail", "a torn batch", "offsets go backwards"])
def test_verify_and_dump_see_past_the_valid_batches_of_the_last_segment(tmp_path, damage):
    # The last segment is mapped only up to its valid batches (a writer may trim the rest); the
    # bytes past them are read otherwise, all of them: a zero tail is no problem, damage is.
    from logstore import Log
    from logstore.tools.dump import dump_file
    from logstore.tools.verify import verify

    path = tmp_path / "t-0"
    log = Log.open(str(path))
    for i in range(50):
        log.append(b"v%03d" % i * 25)
    end = log.segments[-1].size
    log._abandon()  # a crash: the active segment keeps its preallocated zero tail
    segment = path / ("%020d.log" % 0)
    data = bytearray(segment.read_bytes())
    size = len(data)
    assert size > end + (2 << 20) and not data[end:].strip(b"\0")
    first = list(dump_file(str(segment)))[0]
    if damage == "a byte deep in the zero tail":
        data[end + (2 << 20)] = 7
    elif damage == "a torn batch":
        data[end:end + first["size"] // 2] = data[:first["size"] // 2]
    elif damage == "offsets go backwards":
        data[end:end + first["size"]] = data[:first["size"]]
    segment.write_bytes(bytes(data))
    tail = list(dump_file(str(segment)))[50:]
    problems = [(p.position, p.what) for p in verify(str(path)).problems]
    assert [(p.position, p.what) for p in verify(str(segment)).problems] == problems
    if damage == "none":
        assert tail == [{"kind": "zero-tail", "position": end, "bytes": size - end}] and problems == []
        return
    reason = {"a byte deep in the zero tail": "malformed batch or record",
              "a torn batch": "CRC32C mismatch",  # (half a batch, zeros where its second half was)
              "offsets go backwards": "offsets go backwards: batch 0..0 after 49"}[damage]
    assert tail == [{"kind": "invalid", "position": end, "bytes": size - end, "error": reason}]
    assert problems == [(end, f"invalid batch ({reason}); {size - end} bytes from here are unreadable")]


def test_stats_of_an_empty_store_is_empty(tmp_path):
    from logstore import LogStore
    from logstore.tools import stats

    LogStore(str(tmp_path / "empty"), maintenance=False).close()
    assert stats(str(tmp_path / "empty")) == []


def test_stats_of_a_partition_directory_ignores_an_unrelated_parent(tmp_path, caplog):
    import logging

    from logstore import Log
    from logstore.tools import stats

    (tmp_path / "holiday-2024").mkdir()  # looks like a partition name, but tmp_path is no log dir
    with Log.open(tmp_path / "audit-3") as log:
        log.append(b"x")
    with caplog.at_level(logging.INFO, logger="logstore"):
        rows = stats(str(tmp_path / "audit-3"))
    assert [(r.topic, r.partition, r.records, r.group_lag) for r in rows] == [("audit", 3, 1, {})]
    assert "holiday" not in caplog.text


def test_dump_and_verify_a_producer_snapshot(tmp_path):
    from logstore import Log
    from logstore.records.batch import BatchBuilder

    path = tmp_path / "idem-0"
    with Log.open(str(path)) as log:
        for seq in (0, 2):
            log.append_idempotent(bytes(BatchBuilder().build([b"a", b"b"], producer_id=31, producer_epoch=2,
                                                             base_sequence=seq)))
    snapshot = path / f"{4:020d}.snapshot"
    out = ok("dump", str(snapshot))
    assert "producerId: 31 producerEpoch: 2" in out and "firstSequence: 2 lastSequence: 3 lastOffset: 3" in out
    (entry,) = [json.loads(line) for line in ok("dump", str(snapshot), "--json").splitlines()]
    assert (entry["kind"], entry["offset_delta"]) == ("producer", 1)
    assert ok("verify", str(path), "--quiet").endswith("OK\n")
    data = bytearray(snapshot.read_bytes())
    data[-20] ^= 1
    snapshot.write_bytes(data)
    r = run("verify", str(path), "--quiet")
    assert r.returncode != 0 and "snapshot is corrupt" in r.stdout
