"""logdirs: which directories of a Kafka log directory are partitions, and of which topic."""

from __future__ import annotations

import pytest

from logstore import Log, LogstoreError
from logstore.store.kafkadirs import looks_like_log_dir, parse_partition_dir, scan
from logstore.store.kafkadirs import _ranges


@pytest.mark.parametrize("name, expected", [
    ("orders-0", ("orders", 0)),
    ("orders-12", ("orders", 12)),
    ("my-topic-3", ("my-topic", 3)),
    ("a.b_c-d-999999", ("a.b_c-d", 999999)),
    ("__consumer_offsets-49", ("__consumer_offsets", 49)),
    ("__transaction_state-0", ("__transaction_state", 0)),
    ("orders--1", ("orders-", 1)),  # topic "orders-", as Kafka's parser splits it too
])
def test_partition_directory_names_split_at_the_last_dash(name, expected):
    assert parse_partition_dir(name) == expected


@pytest.mark.parametrize("name, reason", [
    ("orders", "not a partition directory"),
    ("orders-", "not a partition directory"),
    ("orders-x", "not a partition directory"),
    ("orders-007", "no leading zero"),
    ("orders-\u0663", "not a partition directory"),  # ARABIC-INDIC DIGIT THREE is no partition number
    ("orders-1000000", "not below 1000000"),
    ("bad topic-0", "contains ' '"),
    ("-0", "not a partition directory"),
    ("..-0", "cannot be '..'"),
    ("x" * 250 + "-0", "250 characters long"),
    ("__cluster_metadata-0", "KRaft metadata log"),
    ("orders-3.0f8e6d4c3b2a19080706050403020100-delete", "deleted partition"),
    ("orders-3.0f8e6d4c3b2a19080706050403020100-future", "between log directories"),
    ("orders-3.0f8e6d4c3b2a19080706050403020100-stray", "should no longer hold"),
    ("remote-log-index-cache", "tiered-storage"),
])
def test_directories_that_are_not_partitions_say_why(name, reason):
    found = parse_partition_dir(name)
    assert isinstance(found, str) and reason in found, found


def test_scan_counts_partitions_up_to_the_highest_number_and_reports_gaps(tmp_path):
    for name in ("t-0", "t-3", "u-1", ".topics.adopt", ".0123-delete"):
        (tmp_path / name).mkdir()
    (tmp_path / "v-0").write_text("a file, not a directory")
    found = scan(str(tmp_path), quiet=True)
    assert sorted(found.topics) == ["t", "u"]
    t, u = found.topics["t"], found.topics["u"]
    assert (t.partitions, t.present, t.missing, t.overrides) == (4, (0, 3), (1, 2), {})
    assert (u.partitions, u.present, u.missing) == (2, (1,), (0,))
    assert found.skipped == () and found.foreign_offsets == ()


def test_scan_of_a_missing_directory_is_an_error(tmp_path):
    with pytest.raises(LogstoreError, match="no such directory"):
        scan(str(tmp_path / "missing"))


def test_an_empty_one_partition_offsets_topic_is_compatible(tmp_path):
    Log.open(tmp_path / "__consumer_offsets-0").close()
    found = scan(str(tmp_path), quiet=True)
    assert found.topics["__consumer_offsets"].overrides["cleanup.policy"] == "compact"


def test_what_looks_like_a_kafka_log_dir(tmp_path):
    assert not looks_like_log_dir(str(tmp_path / "missing"))
    assert not looks_like_log_dir(str(tmp_path))
    (tmp_path / "notes").mkdir()
    (tmp_path / "bad name-0").mkdir()
    assert not looks_like_log_dir(str(tmp_path))
    (tmp_path / "t-0").mkdir()
    assert looks_like_log_dir(str(tmp_path))
    other = tmp_path / "other"
    other.mkdir()
    (other / "recovery-point-offset-checkpoint").write_text("0\n0\n")
    assert looks_like_log_dir(str(other))


@pytest.mark.parametrize("numbers, text", [((0,), "0"), ((0, 1, 2, 5), "0-2, 5"), ((1, 3, 4), "1, 3-4"), ((), "")])
def test_partition_ranges_read_compactly(numbers, text):
    assert _ranges(numbers) == text
