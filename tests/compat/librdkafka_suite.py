#!/usr/bin/env python3
"""librdkafka's own test suite against ``logstore serve``: the compatibility harness of ``make compat``.

librdkafka (the C client under confluent-kafka, kcat and most non-Java Kafka tools) ships a test
suite, ``tests/`` of its source, that runs against any cluster named in ``tests/test.conf``. This
script gets that source, builds it, serves a fresh store, runs each test that needs one broker
and no external tooling, and writes what happened::

    python tests/compat/librdkafka_suite.py fetch   # the pinned source, checked against its sha256
    python tests/compat/librdkafka_suite.py build   # librdkafka and tests/test-runner (cached)
    python tests/compat/librdkafka_suite.py run     # serve, run, write build/compat/summary.{json,txt}
    python tests/compat/librdkafka_suite.py table   # COMPAT.md's table from the last summary
    python tests/compat/librdkafka_suite.py all     # fetch, build, run (make compat)

Where the source comes from. CI reaches PyPI, npm and Debian only. Debian (bookworm) has
librdkafka 2.0.2, older than KIP-848's tests; Confluent's JavaScript client on npm bundles
librdkafka's whole source tree, ``tests/`` included, at ``deps/librdkafka``. The package and its
sha256 are pinned in the Makefile (``LIBRDKAFKA_NPM``, ``LIBRDKAFKA_SHA256``: one home; this
script reads them from the environment ``make`` exports, or from the Makefile itself), and
``npm pack`` fetches it. librdkafka is built against Debian's -dev libraries, never with
``--install-deps``.

What runs. Every test of librdkafka's table that talks to a broker: not its local tests (``-L``:
they need no broker or run librdkafka's mock cluster), not its manual ones, not those its
authors flag as known issues, and not those in ``EXCLUDED`` (each with the reason: Kafka's Java
tools, three brokers, a SASL or SSL listener set up by trivup). Each test number runs in its own
``test-runner`` process, a few at a time, so that a test that hangs or whose timeout aborts the
runner costs only itself. ``TEST_KAFKA_VERSION`` says which Kafka the tests may expect (a Kafka
4 release; the share-group tests of 4.2 stay out), ``TEST_CONSUMER_GROUP_PROTOCOL`` which group
protocol consumers speak (``--group-protocol consumer``: KIP-848).

The summary (``summary.json``: one entry per test with its state, duration and the failing
check's message; in the build directory, or ``--out DIR`` to keep several runs) is what
COMPAT.md's table is made from: ``table --update COMPAT.md`` rewrites
the part between its markers, with the areas and diagnoses of ``AREAS`` and ``FINDINGS``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "compat"
KAFKA_VERSION = "4.1.0"

# Debian's packages the build needs: (header, package). The harness refuses to start without them.
NEEDED_HEADERS = [
    ("openssl/ssl.h", "libssl-dev"),
    ("sasl/sasl.h", "libsasl2-dev"),
    ("zlib.h", "zlib1g-dev"),
    ("zstd.h", "libzstd-dev"),
    ("lz4frame.h", "liblz4-dev"),
    ("rapidjson/document.h", "rapidjson-dev"),
]
NEEDED_TOOLS = [("gcc", "gcc"), ("g++", "g++"), ("make", "make"), ("pkg-config", "pkg-config")]

# Tests that cannot run against one broker without external tooling, by test number or name.
EXCLUDED = {
    "0045_subscribe_update_non_exist_and_partchange": "runs Kafka's kafka-topics.sh (KAFKA_PATH) to add partitions",
    "0045_subscribe_update_topic_remove": "runs Kafka's kafka-topics.sh (KAFKA_PATH) to delete a topic",
    "0052": "runs Kafka's kafka-topics.sh (KAFKA_PATH) to make a topic with message.timestamp.type",
    "0077": "runs Kafka's kafka-topics.sh (KAFKA_PATH) to make a compacted topic",
    "0097": "needs the SSL listener and certificates trivup sets up",
    "0098": "drives Kafka's Java TransactionProducerCli (KAFKA_PATH)",
    "0101": "fetch-from-follower: needs three brokers with broker.rack set",
    "0103": "creates its topics with replication factor 3 (trivup's three brokers)",
    "0107": "creates its topics with replication factor 3 (trivup's three brokers)",
    "0109": "runs Kafka's kafka-acls.sh (KAFKA_PATH) to deny a topic",
    "0111": "creates its topic with replication factor 3 (trivup's three brokers)",
    "0115": "runs Kafka's kafka-acls.sh (KAFKA_PATH) to deny a producer",
    "0119": "runs Kafka's kafka-acls.sh (KAFKA_PATH) to deny a consumer",
    "0126": "needs a SASL/OAUTHBEARER listener and an OIDC token endpoint",
    "0135": "needs a SASL PLAIN or SCRAM listener set up by trivup",
    "0142": "needs a SASL listener set up by trivup",
    "0139": "runs librdkafka's mock cluster, not a broker",
    "0150": "runs librdkafka's mock cluster, not a broker",
}

# The area of each test (COMPAT.md groups the table by it); a number not named is "produce and consume".
AREAS = {
    "admin operations": "0044 0069 0081 0112",
    "consumer groups": "0018 0019 0020 0029 0030 0045 0050 0051 0056 0089 0091 0099 0102 0113 "
                       "0118 0122 0130 0132 0137 0140",
    "transactions and idempotence": "0090 0094 0098 0103 0129",
    "fetch limits and offsets": "0031 0034 0036 0041 0054 0059 0061 0067 0082 0093 0127",
    "compression": "0017",
    "connections and timeouts": "0049 0068 0075 0076 0088 0123",
    "metadata and cluster": "0007 0035 0042 0057 0063",
    "share groups (KIP-932, Kafka 4.2)": "0170 0171 0172 0173 0174 0175 0176 0177 0178 0179 0180 0181 0184 0185 0190",
}

# Quick, representative tests that pass (the slow pytest of tests/compat/test_librdkafka_suite.py):
# produce and consume, compression (gzip, snappy, lz4, zstd), a group's commits, ApiVersions,
# the cluster id, the idempotent producer.
FAST_SUBSET = ("0001", "0012", "0017", "0030", "0035", "0063", "0090")

# Tests whose first failure would hide the rest run once per subtest (``SUBTESTS=do_test_NAME:``,
# one runner each): 0081 walks the whole admin API.
SPLIT = {
    "0081": ("CreateTopics", "DeleteTopics", "CreatePartitions", "DescribeConfigs", "DescribeConfigs_groups",
             "AlterConfigs", "IncrementalAlterConfigs", "DeleteRecords", "DeleteGroups", "DescribeConsumerGroups",
             "ListConsumerGroups", "ListConsumerGroupOffsets", "AlterConsumerGroupOffsets",
             "DeleteConsumerGroupOffsets", "DescribeTopics", "DescribeCluster", "ListOffsets",
             "UserScramCredentials", "CreateAcls", "DescribeAcls", "DeleteAcls"),
}

# Tests longer than the per-test timeout by design, and the seconds each may take: 0113 runs
# some fifty cooperative rebalances, each after Kafka's 3 s initial delay (637 s alone on this
# machine, every subtest passing).
LONG: dict[str, float] = {"0113": 1200.0}

# One-line diagnoses of the server-side cause of each failing test, by number (kept by hand,
# from the test's source and its failing check; COMPAT.md prints them beside the failures).
FINDINGS: dict[str, str] = {
    "0045": "timing: one CreateTopics of 100 topics took over the test's 30 s with four runners on 2 busy "
            "cores (passes alone)",
    "0055": "timing: linger.ms=3000 measured 3160 ms against 3000..3142 with four runners on 2 busy cores "
            "(passes alone)",
    "0081": "its first failure stops the rest; the tables of runs with SPLIT name each of its subtests",
    "0081[AlterConfigs]": "the test also sets sasl.kerberos.min.time.before.relogin on the broker: a Kafka "
                          "dynamic broker config of Kerberos, which logstore does not have, refused as "
                          "INVALID_CONFIG (\"Unknown broker config name\") [admin]",
    "0081[IncrementalAlterConfigs]": "the test also sets sasl.kerberos.min.time.before.relogin on the broker "
                                     "(see 0081[AlterConfigs]) [admin]",
}

# With ``--group-protocol consumer`` (KIP-848): the diagnoses of the tests that fail only with
# the consumer group protocol (the others fail as with the classic protocol: FINDINGS).
CONSUMER_FINDINGS: dict[str, str] = {
    "0045": "its regex-and-literal subscription expects Kafka's timing: Kafka resolves a new regex in the "
            "background, so its first assignment holds only the literal topic (2 partitions) and the regex's "
            "come in a later heartbeat; logstore resolves the regex in the same heartbeat and assigns all 10 "
            "at once (the same final assignment) [KIP-848]",
    "0113": "its max.poll.interval.ms variation waits for the broker to fence the member that stopped "
            "polling (it leaves no group: it waits for its application's revoke); session.timeout.ms is a "
            "broker config with the consumer protocol, and Kafka's default group.consumer.session.timeout.ms "
            "of 45 s outlives the test's 51 s (passes against logstore serve "
            "--group-consumer-session-timeout-ms 6000) [KIP-848, groups]",
}


def area_of(number: str) -> str:
    """The COMPAT.md area of test ``number`` (``"0081"``)."""
    for area, numbers in AREAS.items():
        if number in numbers.split():
            return area
    return "produce and consume"


class HarnessError(Exception):
    """What the harness needs is missing or broken; the message says what to do."""


# ---------------------------------------------------------------------------------------------
# The pins and the source


def pins() -> tuple[str, str]:
    """``(npm package spec, sha256 of its tarball)``: from the environment ``make`` exports, else
    from the Makefile's ``LIBRDKAFKA_NPM`` and ``LIBRDKAFKA_SHA256`` lines."""
    found = {name: os.environ.get(name) for name in ("LIBRDKAFKA_NPM", "LIBRDKAFKA_SHA256")}
    if not all(found.values()):
        text = (REPO / "Makefile").read_text()
        for name in found:
            match = re.search(rf"^(?:export\s+)?{name}\s*:?=\s*(\S+)", text, re.M)
            if not match:
                raise HarnessError(f"the Makefile has no {name} line")
            found[name] = found[name] or match.group(1)
    return found["LIBRDKAFKA_NPM"], found["LIBRDKAFKA_SHA256"]


def source_dir(build: Path = BUILD) -> Path:
    """Where the pinned librdkafka source tree is extracted (one directory per pin)."""
    return build / f"librdkafka-{pins()[1][:12]}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(build: Path = BUILD) -> Path:
    """Get the pinned package with ``npm pack``, check its sha256, extract its
    ``deps/librdkafka``. Returns the source tree; does nothing when it is already there."""
    target = source_dir(build)
    if (target / "tests" / "test.c").exists():
        return target
    spec, sha = pins()
    if shutil.which("npm") is None:
        raise HarnessError("fetching librdkafka's source needs npm (Debian: apt-get install npm)")
    build.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=build) as tmp:
        done = subprocess.run(["npm", "pack", spec, "--pack-destination", tmp, "--json", "--silent"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise HarnessError(f"npm pack {spec} failed: {done.stderr.strip()[-2000:]}")
        tarball = Path(tmp) / Path(json.loads(done.stdout)[0]["filename"]).name
        actual = _sha256(tarball)
        if actual != sha:
            raise HarnessError(f"{spec}: sha256 {actual}, pinned {sha} (LIBRDKAFKA_SHA256)")
        partial = Path(tmp) / "src"
        prefix = "package/deps/librdkafka/"
        with tarfile.open(tarball) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(partial, members=[m for m in members if m.name], filter="tar")
        if not (partial / "tests" / "test.c").exists():
            raise HarnessError(f"{spec} does not carry librdkafka's tests/")
        (partial / "configure").chmod(0o755)  # (the tarball's modes are kept; this one must hold)
        partial.rename(target)
    return target


def librdkafka_version(src: Path) -> str:
    """The version of the librdkafka source tree at ``src`` (from rdkafka.h), as ``2.15.1``."""
    match = re.search(r"#define RD_KAFKA_VERSION\s+0x([0-9a-f]{8})", (src / "src" / "rdkafka.h").read_text())
    v = int(match.group(1), 16)
    return f"{v >> 24}.{(v >> 16) & 0xff}.{(v >> 8) & 0xff}"


# ---------------------------------------------------------------------------------------------
# The build


def check_prerequisites() -> None:
    """Raise HarnessError naming the Debian packages to install when a tool or header is missing."""
    missing = [package for tool, package in NEEDED_TOOLS if shutil.which(tool) is None]
    if shutil.which("gcc"):
        for header, package in NEEDED_HEADERS:
            probe = subprocess.run(["gcc", "-E", "-x", "c++" if header.startswith("rapidjson") else "c", "-"],
                                   input=f"#include <{header}>\n", capture_output=True, text=True)
            if probe.returncode != 0:
                missing.append(package)
    if missing:
        raise HarnessError("building librdkafka's tests needs Debian's " + " ".join(missing)
                           + ": apt-get install " + " ".join(missing))


def build(src: Path, jobs: int = 2) -> Path:
    """Configure and build librdkafka and its ``tests/test-runner`` in ``src`` (incrementally:
    a finished build is reused). Returns the test runner's path."""
    runner = src / "tests" / "test-runner"
    if runner.exists():
        return runner
    check_prerequisites()
    log = src / "build.log"
    with open(log, "w") as out:
        def step(*command: str, cwd: Path = src) -> None:
            out.write(f"$ {' '.join(command)}\n")
            out.flush()
            if subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise HarnessError(f"{' '.join(command)} failed in {cwd}: see {log}")

        if not (src / "Makefile.config").exists():
            # --no-download: mklove's modules come with the source; curl (OIDC) is not needed.
            step("./configure", "--no-download", "--disable-curl", "--enable-ssl", "--enable-gssapi",
                 "--enable-zstd", "--enable-lz4-ext")
        step("make", f"-j{jobs}", "libs")
        step("make", f"-j{jobs}", "-C", "tests", "test-runner")
    return runner


# ---------------------------------------------------------------------------------------------
# The test table


@dataclass(frozen=True)
class SuiteTest:
    """One entry of librdkafka's test table (tests/test.c): its name, flags and the scenarios
    (cluster setups, ``tests/scenarios/``) it runs in."""

    name: str
    flags: str
    scenarios: tuple[str, ...] = ("default",)

    @property
    def number(self) -> str:
        return self.name.split("_", 1)[0]

    @property
    def talks_to_a_broker(self) -> bool:
        return not re.search(r"TEST_F_(LOCAL|MANUAL|KNOWN_ISSUE)\b", self.flags)

    @property
    def runs(self) -> bool:
        """Whether the harness runs it: it talks to a broker and is not excluded."""
        return self.talks_to_a_broker and self.number not in EXCLUDED and self.name not in EXCLUDED \
            and not self.number.startswith("8")


# The scenarios the harness serves, with the options of ``logstore serve`` that make them.
SCENARIOS = {"default": (), "noautocreate": ("--no-auto-create-topics",)}


def suite_tests(src: Path) -> list[SuiteTest]:
    """The entries of ``struct test tests[]`` in ``tests/test.c``, in order."""
    text = (src / "tests" / "test.c").read_text()
    start = text.index("struct test tests[]")
    table = text[start:text.index("{NULL}", start)]
    table = re.sub(r"/\*.*?\*/", "", table, flags=re.S)
    tests = []
    for entry in table.split("_TEST(")[1:]:
        match = re.match(r"\s*(\w+)\s*,\s*([^,)]*)", entry)
        scenario = re.search(r'\.scenario\s*=\s*"([^"]*)"', entry)
        tests.append(SuiteTest(match.group(1), match.group(2).strip(),
                               tuple(scenario.group(1).split(",")) if scenario else ("default",)))
    return tests


def numbers_to_run(src: Path, only: list[str] | None = None, scenario: str = "default") -> list[str]:
    """The test numbers to run in ``scenario``: those with a test of the scenario that talks to
    a broker, not excluded."""
    numbers: list[str] = []
    for test in suite_tests(src):
        if test.runs and scenario in test.scenarios and test.number not in numbers \
                and (only is None or test.number in only):
            numbers.append(test.number)
    return numbers


# ---------------------------------------------------------------------------------------------
# Serving and running


class Served:
    """``logstore serve`` over a fresh store in ``root``, in its own process, on 127.0.0.1.

    Kafka's defaults of trivup's default scenario: topics auto-created with 4 partitions.
    Not thread-safe; a context manager that stops the server (SIGTERM, then SIGKILL).
    """

    def __init__(self, root: Path, *args: str):
        if root.exists():
            shutil.rmtree(root)
        root.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"),
                                                                         os.environ.get("PYTHONPATH")])))
        self.log_path = root.parent / f"{root.name}.serve.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", str(root), "--listen",
                                      "127.0.0.1:0", "--num-partitions", "4",
                                      # Kafka's default (logstore serve's is 0), which the suite's
                                      # group tests expect: members starting together share the
                                      # first generation
                                      "--group-initial-rebalance-delay-ms", "3000",
                                      # an authorizer that lets everyone do everything while no
                                      # ACL names a resource: 0081's ACL subtests run, and
                                      # AlterUserScramCredentials is decided by it
                                      "--authorizer", "--allow-everyone-if-no-acl-found", *args],
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        line = self.proc.stdout.readline()
        if not line.startswith("serving "):
            self.stop()
            raise HarnessError(f"logstore serve did not start: {line!r}, see {self.log_path}")
        self.bootstrap = line.split(" on ")[1].strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class Outcome:
    """What one test of the table did: state PASSED, FAILED, SKIPPED, TIMEOUT or EXCLUDED."""

    name: str
    state: str
    duration: float
    message: str

    @property
    def number(self) -> str:
        return self.name.split("_", 1)[0]


_ANSI = re.compile(r"\x1b\[[0-9;]*m|\x1b\([0-9A-Z]")
_ROW = re.compile(r"^\|\s*(\S+)\s*\|\s*(PASSED|FAILED|SKIPPED|RUNNING|NOT_STARTED)\s*\|\s*([0-9.]+)s\s*\|(.*)$")
_FAILED_AT = re.compile(r'^### Test "([^" (]+)( \(.*\))?" failed at (.*?) at .*###$')
_STARTED = re.compile(r"=+ Running test (\S+) =+")
_PASSED = re.compile(r"=+ Test (\S+) PASSED =+")


def parse_output(number: str, text: str, timed_out: bool, names: set[str] | None = None) -> list[Outcome]:
    """The outcomes of test ``number``'s run from the runner's output: its summary table, or,
    when it was killed before printing one, its first failure. ``names``: the tests of the
    scenario that ran (the others of that number are left out)."""
    text = _ANSI.sub("", text)
    outcomes: dict[str, Outcome] = {}
    for line in text.splitlines():
        row = _ROW.match(line)
        if row and row.group(1).startswith(number + "_") and (names is None or row.group(1) in names):
            name, state, duration, message = row.groups()
            message = message.strip()
            if state == "SKIPPED" and message.startswith("Filtered due to negative test flags"):
                continue  # a local test, or a known issue: not run against a broker
            if state in ("RUNNING", "NOT_STARTED"):
                state = "TIMEOUT" if timed_out else "FAILED"
            outcomes[name] = Outcome(name, state, float(duration), message)
    if outcomes:
        return list(outcomes.values())
    # No summary: the runner aborted (a test's timeout, or threads a failed test left behind).
    # Each test it started passed, failed (its first failure is the cause) or never finished.
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if (started := _STARTED.search(line)) and started.group(1).startswith(number + "_") \
                and (names is None or started.group(1) in names):
            outcomes.setdefault(started.group(1), Outcome(started.group(1), "TIMEOUT" if timed_out else "FAILED",
                                                          0.0, "did not finish"))
        elif (passed := _PASSED.search(line)) and passed.group(1) in outcomes:
            outcomes[passed.group(1)] = Outcome(passed.group(1), "PASSED", 0.0, "")
        elif (failed := _FAILED_AT.match(line)) and failed.group(1) in outcomes:
            outcome = outcomes[failed.group(1)]
            if outcome.message == "did not finish":
                detail = lines[i + 1].strip() if i + 1 < len(lines) else ""
                subtest = f"{failed.group(2).strip(' ()')}: " if failed.group(2) else ""
                outcome.state, outcome.message = "FAILED", f"{subtest}{failed.group(3)}: {detail}"
    if not outcomes:
        outcomes[number] = Outcome(number, "TIMEOUT" if timed_out else "FAILED", 0.0,
                                   "the runner stopped before any test started")
    return list(outcomes.values())


def run_one(src: Path, number: str, conf: Path, logs: Path, *, scenario: str, kafka_version: str,
            group_protocol: str, quick: bool, idempotent: bool, timeout: float,
            subtest: str | None = None) -> list[Outcome]:
    """Run test ``number`` of ``scenario`` (only its ``do_test_<subtest>`` when given) in its own
    test-runner process; its output goes to ``logs/NUMBER[-SCENARIO][-SUBTEST].log``, its outcomes
    are named ``NAME[SUBTEST]``."""
    tests = src / "tests"
    env = dict(os.environ, TESTS=number, TEST_KAFKA_VERSION=kafka_version, RDKAFKA_TEST_CONF=str(conf),
               LD_LIBRARY_PATH=os.pathsep.join([str(src / "src"), str(src / "src-cpp")]), TEST_LEVEL="2")
    env.pop("TESTS_SKIP", None)
    env.pop("SUBTESTS", None)
    if subtest is not None:
        env["SUBTESTS"] = f"do_test_{subtest}:"  # (the colon: not do_test_<subtest>_more)
    if group_protocol != "classic":
        env["TEST_CONSUMER_GROUP_PROTOCOL"] = group_protocol
    args = ["./test-runner", "-L", "-p2", "-s", scenario] + (["-Q"] if quick else []) + (["-P"] if idempotent else [])
    names = {t.name for t in suite_tests(src) if t.runs and scenario in t.scenarios and t.number == number}
    started = time.monotonic()
    suffix = ("" if scenario == "default" else f"-{scenario}") + ("" if subtest is None else f"-{subtest}")
    with open(logs / f"{number}{suffix}.log", "w+") as out:
        proc = subprocess.Popen(args, cwd=tests, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        outcomes = parse_output(number, out.read(), timed_out, names)
    if subtest is not None:
        outcomes = [replace(o, name=f"{o.name}[{subtest}]") for o in outcomes]
    if timed_out:
        for outcome in outcomes:
            outcome.message = f"killed after {timeout:.0f} s; {outcome.message}".rstrip("; ")
            outcome.duration = outcome.duration or time.monotonic() - started
    return outcomes


def run(src: Path, build: Path = BUILD, *, only: list[str] | None = None, kafka_version: str = KAFKA_VERSION,
        group_protocol: str = "classic", quick: bool = False, idempotent: bool = False, parallel: int = 4,
        timeout: float = 420,
        serve_args: tuple[str, ...] = ()) -> dict:
    """Serve a fresh store, run the tests, write ``summary.json`` and ``summary.txt`` in
    ``build``; returns the summary."""
    runner = src / "tests" / "test-runner"
    if not runner.exists():
        raise HarnessError(f"{runner} is not built: run the build step first")
    logs = build / "logs"
    if logs.exists():
        shutil.rmtree(logs)
    logs.mkdir(parents=True)
    for stale in (src / "tests").glob("stats_*.json"):  # each test's statistics, left by earlier runs
        stale.unlink()
    started = time.monotonic()
    outcomes: list[Outcome] = []
    for scenario, scenario_args in SCENARIOS.items():
        numbers = numbers_to_run(src, only, scenario)
        if not numbers:
            continue
        store = build / ("store" if scenario == "default" else f"store-{scenario}")
        with Served(store, *scenario_args, *serve_args) as served:
            conf = build / "test.conf"
            conf.write_text(f"bootstrap.servers={served.bootstrap}\ntest.topic.random=true\n")
            # librdkafka's README tells a developer to write tests/test.conf: the same file.
            shutil.copyfile(conf, src / "tests" / "test.conf")
            with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
                futures = [pool.submit(run_one, src, n, conf, logs, scenario=scenario, kafka_version=kafka_version,
                                       group_protocol=group_protocol, quick=quick, idempotent=idempotent,
                                       timeout=max(timeout, LONG.get(n, 0.0)), subtest=sub)
                           for n in numbers for sub in (SPLIT.get(n) if scenario == "default" else None) or [None]]
                for future in futures:
                    outcomes.extend(future.result())
    outcomes.extend(Outcome(f"{n}", "EXCLUDED", 0.0, reason) for n, reason in sorted(EXCLUDED.items())
                    if only is None or n[:4] in only)
    outcomes.sort(key=lambda o: o.name)
    summary = {
        "librdkafka": librdkafka_version(src),
        "source": pins()[0],
        "kafka_version": kafka_version,
        "group_protocol": group_protocol,
        "quick": quick,
        "idempotent": idempotent,
        "seconds": round(time.monotonic() - started, 1),
        "counts": {state: sum(o.state == state for o in outcomes)
                   for state in ("PASSED", "FAILED", "TIMEOUT", "SKIPPED", "EXCLUDED")},
        "tests": [asdict(o) for o in outcomes],
    }
    (build / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (build / "summary.txt").write_text(summary_text(summary))
    return summary


def _mode(summary: dict) -> str:
    mode = "quick mode" if summary["quick"] else "full mode"
    return mode + (", idempotent producers" if summary.get("idempotent") else "")


def summary_text(summary: dict) -> str:
    """The summary as one line per test, then the counts (the plain closing line)."""
    lines = [f"librdkafka {summary['librdkafka']} tests against logstore serve "
             f"(TEST_KAFKA_VERSION={summary['kafka_version']}, group protocol {summary['group_protocol']}, "
             f"{_mode(summary)}, {summary['seconds']} s)"]
    for t in summary["tests"]:
        lines.append(f"{t['state']:<8} {t['name']:<42} {t['duration']:8.1f}s  {t['message']}".rstrip())
    c = summary["counts"]
    lines.append(f"{c['PASSED']} passed, {c['FAILED'] + c['TIMEOUT']} failed, {c['SKIPPED']} skipped, "
                 f"{c['EXCLUDED']} excluded")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# COMPAT.md's table

def markers(summary: dict) -> tuple[str, str]:
    """The comments around a run's table in COMPAT.md: one table per group protocol (and for
    idempotent producers), so each kind of run rewrites its own."""
    name = "librdkafka-table" + ("" if summary["group_protocol"] == "classic" else f"-{summary['group_protocol']}") \
        + ("-idempotent" if summary.get("idempotent") else "")
    return (f"<!-- {name}: start (python tests/compat/librdkafka_suite.py table --update COMPAT.md) -->",
            f"<!-- {name}: end -->")


def _cell(text: str, limit: int = 300) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:limit]


def table(summary: dict) -> str:
    """COMPAT.md's table: per area, each test that did not pass with its failing check and the
    diagnosis of ``FINDINGS``, then what passed and what was skipped."""
    tests = summary["tests"]
    c = summary["counts"]
    out = [f"Run: librdkafka {summary['librdkafka']} (`{summary['source']}`), "
           f"TEST_KAFKA_VERSION={summary['kafka_version']}, group protocol `{summary['group_protocol']}`, "
           f"{_mode(summary)}: **{c['PASSED']} passed, "
           f"{c['FAILED'] + c['TIMEOUT']} failed, {c['SKIPPED']} skipped**, {c['EXCLUDED']} excluded "
           f"({summary['seconds']:.0f} s).", ""]
    areas = sorted({area_of(t["name"].split("_", 1)[0]) for t in tests})
    for area in areas:
        mine = [t for t in tests if area_of(t["name"].split("_", 1)[0]) == area]
        bad = [t for t in mine if t["state"] in ("FAILED", "TIMEOUT")]
        passed = [t["name"] for t in mine if t["state"] == "PASSED"]
        skipped = [t for t in mine if t["state"] == "SKIPPED"]
        out.append(f"#### {area}")
        out.append("")
        if bad:
            out.append("| test | state | failing check | diagnosis |")
            out.append("|---|---|---|---|")
            for t in bad:
                number = t["name"].split("_", 1)[0]
                subtest = number + t["name"][t["name"].index("["):] if "[" in t["name"] else None
                consumer = summary["group_protocol"] == "consumer"
                diagnosis = (consumer and (CONSUMER_FINDINGS.get(subtest) or CONSUMER_FINDINGS.get(number))) \
                    or FINDINGS.get(subtest) or FINDINGS.get(number, "not diagnosed yet: read build/compat/logs/")
                out.append(f"| {t['name']} | {t['state']} | {_cell(t['message'])} | {_cell(diagnosis, 1000)} |")
            out.append("")
        out.append("Passed: " + (", ".join(passed) if passed else "none") + ".")
        if skipped:
            reasons: dict[str, list[str]] = {}
            for t in skipped:
                reasons.setdefault(t["message"] or "no reason given", []).append(t["name"])
            out.append("Skipped by the suite: " + "; ".join(f"{', '.join(names)} ({_cell(reason)})"
                                                           for reason, names in reasons.items()) + ".")
        out.append("")
    excluded = [t for t in tests if t["state"] == "EXCLUDED"]
    if excluded:
        out.append("#### not run (the harness excludes them)")
        out.append("")
        out.extend(f"- {t['name']}: {t['message']}" for t in excluded)
        out.append("")
    return "\n".join(out)


def update_document(path: Path, summary: dict) -> None:
    """Replace the part of ``path`` between the run's ``markers`` by ``table(summary)``."""
    text = path.read_text()
    begin, finish = markers(summary)
    start, end = text.index(begin) + len(begin), text.index(finish)
    path.write_text(text[:start] + "\n\n" + table(summary) + "\n" + text[end:])


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["fetch", "build", "run", "table", "all"])
    parser.add_argument("--build-dir", type=Path, default=BUILD)
    parser.add_argument("--jobs", type=int, default=2, help="make -j for the build")
    parser.add_argument("--tests", help="only these test numbers, comma-separated (e.g. 0001,0081)")
    parser.add_argument("--kafka-version", default=KAFKA_VERSION, help="TEST_KAFKA_VERSION")
    parser.add_argument("--group-protocol", default="classic", choices=["classic", "consumer"],
                        help="TEST_CONSUMER_GROUP_PROTOCOL (consumer: KIP-848)")
    parser.add_argument("--quick", action="store_true", help="the suite's quick mode (-Q): fewer messages")
    parser.add_argument("--idempotent", action="store_true",
                        help="every producer with enable.idempotence=true (the suite's -P)")
    parser.add_argument("--parallel", type=int, default=4, help="test-runner processes at once")
    parser.add_argument("--timeout", type=float, default=420, help="seconds one test number may take")
    parser.add_argument("--update", type=Path, help="table: rewrite this document's table (COMPAT.md)")
    parser.add_argument("--out", type=Path, help="where run writes (and table reads) the summary, logs and "
                                                  "stores (default: the build directory)")
    args = parser.parse_args(argv)
    build_dir = args.build_dir.resolve()
    out = (args.out or build_dir).resolve()
    try:
        if args.command in ("fetch", "build", "run", "all"):
            src = fetch(build_dir)
        if args.command in ("build", "all"):
            t0 = time.monotonic()
            build(src, args.jobs)
            print(f"built {src / 'tests' / 'test-runner'} ({time.monotonic() - t0:.0f} s)")
        if args.command in ("run", "all"):
            only = args.tests.split(",") if args.tests else None
            summary = run(src, out, only=only, kafka_version=args.kafka_version,
                          group_protocol=args.group_protocol, quick=args.quick, idempotent=args.idempotent,
                          parallel=args.parallel,
                          timeout=args.timeout)
            print(summary_text(summary), end="")
        if args.command in ("table", "all"):
            summary = json.loads((out / "summary.json").read_text())
            if args.update:
                update_document(args.update, summary)
            elif args.command == "table":
                print(table(summary))
    except HarnessError as e:
        print(f"librdkafka_suite: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
