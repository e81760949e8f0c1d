"""The librdkafka compatibility harness (``tests/compat/librdkafka_suite.py``, ``make compat``).

The unit tests read the runner's output, librdkafka's test table and COMPAT.md's table from
small texts written here. The ``slow`` test (``make soak``) builds librdkafka's suite (cached
in build/compat) and runs the fast subset against ``logstore serve``: it is not in ``make
test`` because a cold build takes 65 s on an idle 2-core machine and over 200 s on a loaded one,
and the source comes from npm, which ``make test`` may not reach.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("librdkafka_suite", HERE / "librdkafka_suite.py")
suite = importlib.util.module_from_spec(_spec)
sys.modules["librdkafka_suite"] = suite
_spec.loader.exec_module(suite)

SUMMARY_OUTPUT = """\
\x1b[36m[0045_subscribe_update      /  0.000s] ================= Running test 0045_subscribe_update =================
TEST 20261128194305 (bare, scenario default) SUMMARY
#==================================================================#
| <MAIN>                                   |     PASSED |   3.000s |
| 0045_subscribe_update                    | \x1b[32m    PASSED |   2.500s |
| 0045_subscribe_update_mock               |    SKIPPED |   0.000s | Filtered due to negative test flags
| 0045_resubscribe_with_regex              |     FAILED |   1.250s | do_test:12: Expected 4 partitions, not 2
| 0045_subscribe_many_updates              |    SKIPPED |   0.000s | Test skipped due to quick mode
#==================================================================#
"""

ABORTED_OUTPUT = """\
[0044_partition_cnt          /  0.000s] ================= Running test 0044_partition_cnt =================
[0044_partition_cnt_two      /  0.000s] ================= Running test 0044_partition_cnt_two =================
[0044_partition_cnt_two      /  1.000s] ================= Test 0044_partition_cnt_two PASSED =================
### Test "0044_partition_cnt (sub_one:12)" failed at test.c:5604:test_admin_create_partitions() at Sat Nov 28 19:49:26 2026: ###
Test assertion failed: "terr": CreatePartitions_result_topics returned NULL
### Test "<MAIN>" failed at test.c:1950:test_wait_exit() at Sat Nov 28 19:49:26 2026: ###
3 thread(s) still active in librdkafka
"""


def test_summary_rows_give_each_test_its_state_and_local_tests_are_left_out():
    outcomes = {o.name: o for o in suite.parse_output("0045", SUMMARY_OUTPUT, timed_out=False)}
    assert set(outcomes) == {"0045_subscribe_update", "0045_resubscribe_with_regex", "0045_subscribe_many_updates"}
    assert (outcomes["0045_subscribe_update"].state, outcomes["0045_subscribe_update"].duration) == ("PASSED", 2.5)
    failed = outcomes["0045_resubscribe_with_regex"]
    assert (failed.state, failed.message) == ("FAILED", "do_test:12: Expected 4 partitions, not 2")
    assert outcomes["0045_subscribe_many_updates"].state == "SKIPPED"


def test_an_aborted_runner_is_read_from_its_first_failure_not_from_main():
    outcomes = {o.name: o for o in suite.parse_output("0044", ABORTED_OUTPUT, timed_out=False)}
    assert outcomes["0044_partition_cnt_two"].state == "PASSED"
    failed = outcomes["0044_partition_cnt"]
    assert failed.state == "FAILED"
    assert failed.message == ('sub_one:12: test.c:5604:test_admin_create_partitions(): Test assertion failed: '
                              '"terr": CreatePartitions_result_topics returned NULL')


def test_a_killed_runner_marks_what_did_not_finish_as_timeout():
    started_only = ABORTED_OUTPUT.splitlines()[0] + "\n"
    [outcome] = suite.parse_output("0044", started_only, timed_out=True)
    assert (outcome.name, outcome.state, outcome.message) == ("0044_partition_cnt", "TIMEOUT", "did not finish")
    [nothing] = suite.parse_output("0044", "", timed_out=False)
    assert (nothing.name, nothing.state) == ("0044", "FAILED")


TEST_TABLE = """\
struct test tests[] = {
    {.name = "<MAIN>", .flags = TEST_F_LOCAL},
    _TEST(0001_multiobj, 0),
    _TEST(0004_conf, TEST_F_LOCAL),
    _TEST(0011_produce_batch,
          0,
          /* Produces a lot of messages */
          _THRES(.ucpu = 40.0, .scpu = 8.0)),
    _TEST(0045_subscribe_update_mock, TEST_F_LOCAL),
    _TEST(0045_subscribe_update, 0, TEST_BRKVER(0, 9, 0, 0)),
    _TEST(0047_partial_buf_tmout, TEST_F_KNOWN_ISSUE),
    _TEST(0052_msg_timestamps, 0, TEST_BRKVER(0, 10, 0, 0)),
    _TEST(0103_transactions_local, TEST_F_LOCAL),
    _TEST(8000_idle, TEST_F_MANUAL),
    {NULL}};
"""


def test_the_runs_are_the_broker_tests_of_the_table_less_the_excluded(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.c").write_text("int x;\n" + TEST_TABLE)
    names = [t.name for t in suite.suite_tests(tmp_path)]
    assert names == ["0001_multiobj", "0004_conf", "0011_produce_batch", "0045_subscribe_update_mock",
                     "0045_subscribe_update", "0047_partial_buf_tmout", "0052_msg_timestamps",
                     "0103_transactions_local", "8000_idle"]
    assert "0052" in suite.EXCLUDED
    assert suite.numbers_to_run(tmp_path) == ["0001", "0011", "0045"]
    assert suite.numbers_to_run(tmp_path, only=["0045", "0004"]) == ["0045"]


def test_the_pins_are_read_from_the_makefile(monkeypatch):
    monkeypatch.delenv("LIBRDKAFKA_NPM", raising=False)
    monkeypatch.delenv("LIBRDKAFKA_SHA256", raising=False)
    spec, sha = suite.pins()
    assert spec.startswith("@confluentinc/kafka-javascript@") and len(sha) == 64
    monkeypatch.setenv("LIBRDKAFKA_NPM", "x@1")
    monkeypatch.setenv("LIBRDKAFKA_SHA256", "ab" * 32)
    assert suite.pins() == ("x@1", "ab" * 32)


SUMMARY = {
    "librdkafka": "2.15.1", "source": "@confluentinc/kafka-javascript@1.10.1", "kafka_version": "4.1.0",
    "group_protocol": "classic", "quick": False, "seconds": 61.0,
    "counts": {"PASSED": 1, "FAILED": 1, "TIMEOUT": 0, "SKIPPED": 1, "EXCLUDED": 1},
    "tests": [
        {"name": "0001_multiobj", "state": "PASSED", "duration": 1.0, "message": ""},
        {"name": "0044_partition_cnt", "state": "FAILED", "duration": 1.0, "message": "CreatePartitions | NULL"},
        {"name": "0082_fetch_max_bytes", "state": "SKIPPED", "duration": 0.0, "message": "quick mode"},
        {"name": "0052", "state": "EXCLUDED", "duration": 0.0, "message": "runs kafka-topics.sh"},
    ],
}


def test_the_table_groups_failures_by_area_with_their_check_and_diagnosis(monkeypatch):
    monkeypatch.setitem(suite.FINDINGS, "0044", "CreatePartitions (37) is not served")
    text = suite.table(SUMMARY)
    assert "**1 passed, 1 failed, 1 skipped**, 1 excluded" in text
    admin = text.split("### admin operations")[1].split("###")[0]
    assert "| 0044_partition_cnt | FAILED | CreatePartitions \\| NULL | CreatePartitions (37) is not served |" in admin
    assert "Passed: 0001_multiobj." in text.split("### produce and consume")[1]
    assert "0082_fetch_max_bytes (quick mode)" in text.split("### fetch limits and offsets")[1]
    assert "- 0052: runs kafka-topics.sh" in text
    assert "".join(suite.summary_text(SUMMARY).splitlines(True)[-1:]) == "1 passed, 1 failed, 1 skipped, 1 excluded\n"


def test_a_split_tests_subtests_get_their_own_diagnosis(monkeypatch):
    monkeypatch.setitem(suite.FINDINGS, "0081", "the first failure hides the rest")
    monkeypatch.setitem(suite.FINDINGS, "0081[AlterConfigs]", "AlterConfigs (33) is not served")
    monkeypatch.delitem(suite.FINDINGS, "0081[ListOffsets]", raising=False)
    summary = dict(SUMMARY, tests=[{"name": "0081_admin[AlterConfigs]", "state": "FAILED", "duration": 1.0,
                                    "message": "_UNSUPPORTED_FEATURE"},
                                   {"name": "0081_admin[ListOffsets]", "state": "FAILED", "duration": 1.0,
                                    "message": "Expected offset 1, got 0"}])
    text = suite.table(summary)
    assert "| 0081_admin[AlterConfigs] | FAILED | _UNSUPPORTED_FEATURE | AlterConfigs (33) is not served |" in text
    assert "| 0081_admin[ListOffsets] | FAILED | Expected offset 1, got 0 | the first failure hides the rest |" in text


def test_a_consumer_protocol_run_gives_group_tests_the_kip848_diagnosis(monkeypatch):
    monkeypatch.setitem(suite.FINDINGS, "0044", "CreatePartitions (37) is not served")
    monkeypatch.setitem(suite.CONSUMER_FINDINGS, "0044", "no heartbeat")
    assert "| no heartbeat |" in suite.table(dict(SUMMARY, group_protocol="consumer"))
    assert "| CreatePartitions (37) is not served |" in suite.table(SUMMARY)


def test_update_rewrites_only_the_part_between_the_markers(tmp_path):
    doc = tmp_path / "COMPAT.md"
    start, end = suite.markers(SUMMARY)
    consumer = suite.markers(dict(SUMMARY, group_protocol="consumer"))
    assert consumer != (start, end)
    doc.write_text(f"# title\n\nprose\n{start}\nold table\n{end}\n{consumer[0]}\nkept\n{consumer[1]}\nafter\n")
    suite.update_document(doc, SUMMARY)
    text = doc.read_text()
    assert text.startswith("# title\n\nprose\n" + start)
    assert "old table" not in text and "0044_partition_cnt" in text
    assert text.endswith(f"{end}\n{consumer[0]}\nkept\n{consumer[1]}\nafter\n")


def test_every_area_finding_and_exclusion_names_a_test_by_its_number_or_name():
    numbers = {n for ns in suite.AREAS.values() for n in ns.split()}
    assert all(len(n) == 4 and n.isdigit() for n in numbers)
    for key in [*suite.FINDINGS, *suite.CONSUMER_FINDINGS]:
        number, _, subtest = key.partition("[")
        assert len(number) == 4 and number.isdigit() and (not subtest or subtest[:-1] in suite.SPLIT[number]), key
    assert all(re.fullmatch(r"\d{4}(_\w+)?", n) for n in suite.EXCLUDED)


@pytest.mark.slow
def test_the_fast_subset_passes_against_a_served_store():
    """librdkafka's quick, representative tests (``FAST_SUBSET``) against ``logstore serve``:
    all pass, and what they produced is in the store, read back through the library."""
    try:
        src = suite.fetch()
        suite.build(src)
    except suite.HarnessError as exc:
        pytest.skip(str(exc))
    build = suite.BUILD / "fast"
    summary = suite.run(src, build, only=list(suite.FAST_SUBSET), quick=True, parallel=2, timeout=300)
    states = {t["name"]: (t["state"], t["message"]) for t in summary["tests"]}
    assert all(state == "PASSED" for state, _ in states.values()), json.dumps(states, indent=1)
    assert {name.split("_", 1)[0] for name in states} == set(suite.FAST_SUBSET)
    from logstore import LogStore

    # 0012 produced to a topic named "..._0012"; 0017 one per codec: the library decodes them all.
    with LogStore(str(build / "store")) as store:
        for suffix in ("_0012", "_gzip", "_snappy", "_lz4", "_zstd"):
            [topic] = [t for t in store.topics() if t.endswith(suffix)]
            records = [r for p in range(store.partitions_for(topic)) for r in store.partition(topic, p).iter()]
            assert records and all(r.value for r in records), topic
