"""Unit tests of logstore.checkpoint: Kafka's checkpoint text format and OffsetCheckpoints."""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import threading

import pytest

from logstore import _fileio
from logstore.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    CheckpointFile,
    CorruptCheckpointError,
    OffsetCheckpoints,
)
from logstore.errors import LogstoreError


@pytest.fixture
def cp_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / RECOVERY_POINT_CHECKPOINT


# ---------------------------------------------------------------------- CheckpointFile format
def test_write_produces_kafkas_exact_text(cp_path: pathlib.Path) -> None:
    CheckpointFile(str(cp_path), 3).write([("orders", 0, 1500), ("orders", 1, 1320)])
    assert cp_path.read_bytes() == b"0\n2\norders 0 1500\norders 1 1320\n"


def test_empty_write_is_version_and_zero_count(cp_path: pathlib.Path) -> None:
    f = CheckpointFile(str(cp_path), 3)
    f.write([])
    assert cp_path.read_bytes() == b"0\n0\n"
    assert f.read() == []


def test_read_returns_string_fields_in_file_order(cp_path: pathlib.Path) -> None:
    f = CheckpointFile(str(cp_path), 2)
    f.write([(5, 100), (3, 50)])  # leader-epoch-checkpoint style: epoch, start offset
    assert f.read() == [["5", "100"], ["3", "50"]]


def test_missing_file_reads_as_empty(tmp_path: pathlib.Path) -> None:
    assert CheckpointFile(str(tmp_path / "absent"), 3).read() == []


def test_kafka_written_file_without_trailing_newline_reads(cp_path: pathlib.Path) -> None:
    cp_path.write_bytes(b"0\n1\nt 0 42")
    assert CheckpointFile(str(cp_path), 3).read() == [["t", "0", "42"]]


def test_rewrite_replaces_old_content_and_leaves_no_temp_file(cp_path: pathlib.Path) -> None:
    f = CheckpointFile(str(cp_path), 3)
    f.write([("a", 0, 1), ("b", 0, 2), ("c", 0, 3)])
    f.write([("z", 9, 99)])
    assert f.read() == [["z", "9", "99"]]
    assert sorted(os.listdir(cp_path.parent)) == [cp_path.name]


def test_entry_with_newline_is_rejected_before_touching_the_file(cp_path: pathlib.Path) -> None:
    f = CheckpointFile(str(cp_path), 3)
    f.write([("t", 0, 1)])
    with pytest.raises(ValueError, match="newline"):
        f.write([("bad\ntopic", 0, 5)])
    assert f.read() == [["t", "0", "1"]]


@pytest.mark.parametrize("text, match", [
    (b"1\n0\n", r"unsupported checkpoint version 1 \(expected 0\)"),
    (b"-1\n0\n", r"unsupported checkpoint version -1"),
    (b"0\n2\nt 0 1\n", r"header says 2 entries but the file holds 1"),
    (b"0\n0\nt 0 1\n", r"header says 0 entries but the file holds 1"),
    (b"0\n1\nt 0 1\n\n", r"header says 1 entries but the file holds 2"),
    (b"0\n1\nt 0\n", r"expected 3 fields per line, got 't 0'"),
    (b"0\n1\nt 0 1 2\n", r"expected 3 fields per line, got 't 0 1 2'"),
    (b"0\n1\nt  0 1\n", r"expected 3 fields per line"),  # fields are separated by single spaces
    (b"0\n", r"expected version and count lines"),
    (b"", r"expected version and count lines"),
    (b"x\n0\n", r"malformed version/count lines"),
    (b"0\ntwo\n", r"malformed version/count lines"),
])
def test_malformed_files_raise_corrupt_checkpoint_naming_the_file(cp_path: pathlib.Path, text: bytes, match: str) -> None:
    cp_path.write_bytes(text)
    with pytest.raises(CorruptCheckpointError, match=match) as info:
        CheckpointFile(str(cp_path), 3).read()
    assert str(cp_path) in str(info.value)


def test_corrupt_checkpoint_error_is_a_logstore_error() -> None:
    assert issubclass(CorruptCheckpointError, LogstoreError)


def test_write_rejects_entries_that_read_would_reject(cp_path: pathlib.Path) -> None:
    f = CheckpointFile(str(cp_path), 3)
    f.write([("t", 0, 1)])
    with pytest.raises(ValueError):
        f.write([("t", 0)])
    assert f.read() == [["t", "0", "1"]]


def test_write_goes_through_the_installed_file_ops(cp_path: pathlib.Path) -> None:
    calls: list[str] = []

    class Recording(_fileio.FileOps):
        def write_file_atomic(self, path: str, data: bytes) -> None:
            calls.append(path)
            super().write_file_atomic(path, data)

    with _fileio.install(Recording()):
        CheckpointFile(str(cp_path), 3).write([("t", 0, 1)])
    assert calls == [str(cp_path)]


# ---------------------------------------------------------------------- OffsetCheckpoints
def test_update_sets_and_read_returns_typed_keys(tmp_path: pathlib.Path) -> None:
    oc = OffsetCheckpoints(str(tmp_path), RECOVERY_POINT_CHECKPOINT)
    assert oc.read() == {}
    oc.update({("orders", 1): 1320, ("orders", 0): 1500})
    assert oc.read() == {("orders", 0): 1500, ("orders", 1): 1320}
    assert oc.get(("orders", 0)) == 1500
    assert oc.get(("orders", 7)) is None


def test_update_writes_entries_sorted_in_kafka_format(tmp_path: pathlib.Path) -> None:
    oc = OffsetCheckpoints(str(tmp_path), LOG_START_OFFSET_CHECKPOINT)
    oc.update({("b", 0): 3, ("a", 10): 2, ("a", 2): 1})
    assert (tmp_path / LOG_START_OFFSET_CHECKPOINT).read_bytes() == b"0\n3\na 2 1\na 10 2\nb 0 3\n"


def test_update_merges_with_existing_entries_and_none_removes(tmp_path: pathlib.Path) -> None:
    oc = OffsetCheckpoints(str(tmp_path), RECOVERY_POINT_CHECKPOINT)
    oc.update({("t", 0): 5, ("t", 1): 6})
    oc.update({("t", 1): 60, ("u", 0): 7})
    oc.update({("t", 0): None, ("never", 0): None})
    assert oc.read() == {("t", 1): 60, ("u", 0): 7}


def test_lock_file_is_separate_from_the_checkpoint(tmp_path: pathlib.Path) -> None:
    oc = OffsetCheckpoints(str(tmp_path), RECOVERY_POINT_CHECKPOINT)
    oc.update({("t", 0): 1})
    assert sorted(os.listdir(tmp_path)) == [f".lock-{RECOVERY_POINT_CHECKPOINT}", RECOVERY_POINT_CHECKPOINT]


def test_non_integer_partition_or_offset_is_corrupt(tmp_path: pathlib.Path) -> None:
    oc = OffsetCheckpoints(str(tmp_path), RECOVERY_POINT_CHECKPOINT)
    (tmp_path / RECOVERY_POINT_CHECKPOINT).write_bytes(b"0\n1\nt x 5\n")
    with pytest.raises(CorruptCheckpointError, match="malformed entry t x 5"):
        oc.read()
    (tmp_path / RECOVERY_POINT_CHECKPOINT).write_bytes(b"0\n1\nt 0 five\n")
    with pytest.raises(CorruptCheckpointError, match="malformed entry"):
        oc.get(("t", 0))


def test_update_over_a_corrupt_file_rewrites_it_whole(tmp_path: pathlib.Path) -> None:
    oc = OffsetCheckpoints(str(tmp_path), RECOVERY_POINT_CHECKPOINT)
    (tmp_path / RECOVERY_POINT_CHECKPOINT).write_bytes(b"7\ngarbage\n")
    oc.update({("t", 3): 9})
    assert oc.read() == {("t", 3): 9}


def test_concurrent_updates_from_threads_all_land(tmp_path: pathlib.Path) -> None:
    # Each thread uses its own OffsetCheckpoints (as separate Logs of one directory do) and
    # updates its own partition repeatedly; a lost read-merge-write would drop a partition.
    threads_n, rounds = 8, 15
    barrier = threading.Barrier(threads_n)
    errors: list[BaseException] = []

    def worker(partition: int) -> None:
        try:
            oc = OffsetCheckpoints(str(tmp_path), RECOVERY_POINT_CHECKPOINT)
            barrier.wait()
            for r in range(rounds):
                oc.update({("t", partition): r})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(p,)) for p in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert OffsetCheckpoints(str(tmp_path), RECOVERY_POINT_CHECKPOINT).read() == {
        ("t", p): rounds - 1 for p in range(threads_n)
    }


def _process_worker(log_dir: str, partition: int, rounds: int) -> None:
    oc = OffsetCheckpoints(log_dir, RECOVERY_POINT_CHECKPOINT)
    for r in range(rounds):
        oc.update({(f"p{partition}", 0): r})


def test_concurrent_updates_from_processes_all_land(tmp_path: pathlib.Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_process_worker, args=(str(tmp_path), p, 10)) for p in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert OffsetCheckpoints(str(tmp_path), RECOVERY_POINT_CHECKPOINT).read() == {
        (f"p{p}", 0): 9 for p in range(3)
    }
