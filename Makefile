# logstore — developer entry points. Needs only Python 3.11+, gcc and a C library.
#   make demo   create .venv, build the C core, run the examples (quickstart, producer/consumer, worker pool,
#               replicated cluster, Kafka clients on a served store, Arrow for pandas/polars/DuckDB,
#               Spark batch source)
#   make test   same setup, run the whole test suite (< 10 minutes on 2 cores)
#   make jar    the Spark JVM reader (src/logstore/spark/logstore-spark.jar; needs a Java 17 JDK: demo, test
#               and bench build it when javac is there, else note its absence and go on without it)
#   make bench  run the pytest-benchmark suite in bench/ and bench/compare.py
#   make soak   long-running suites (marker "slow"): full fault sweeps, deep crash-state exploration, and a
#               kill -9 soak of SOAK_SECONDS (default 300)
#   make asan   rebuild the C core with ASan/UBSan and run the native and corruption tests (also: make sanitize)
#   make fuzz   libFuzzer (clang) on every C parser, FUZZ_SECONDS each (default 60); seeds in tests/fuzz/corpus
#   make compat librdkafka's own test suite against `logstore serve` (needs npm and Debian's -dev
#               libraries: see COMPAT.md); summary in build/compat/summary.txt

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEPS   := pyproject.toml setup.py $(wildcard src/logstore/_native/*.c src/logstore/_native/*.h src/logstore/_native/build_native.py)
PYTEST_FLAGS ?= -q
# make test runs the test files on three worker processes (pytest-xdist; a file's tests stay on one
# worker, so module fixtures are built once). make soak runs serially: its reports (crash states,
# kill -9 figures) are printed by the process that ran the tests.
# Three workers on two cores: most tests wait (on sockets, subprocesses, timeouts), so two
# workers kept the cores about half busy; three measured 7 min 7 s against 8 min 59 s for two.
PARALLEL ?= -n 3 --dist loadfile

.PHONY: demo test bench soak asan sanitize fuzz compat venv clean jar jvm FORCE

$(STAMP): $(DEPS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench,spark]'
	touch $(STAMP)

venv: $(STAMP)

# The Spark JVM reader (logstore.spark.jar_path()): Java 17 sources compiled with the JDK's javac
# against the jars pyspark ships (.venv's pyspark/jars), into a jar inside the Python package. It is
# rebuilt when pyspark's version changes: PYSPARK_VERSION holds it, rewritten only when it differs.
JAR             := src/logstore/spark/logstore-spark.jar
JAR_SOURCES     := $(wildcard src/logstore/spark/jvm/*.java) src/logstore/spark/jvm/META-INF/services/org.apache.spark.sql.sources.DataSourceRegister
PYSPARK_VERSION := build/pyspark-version
JAVAC           ?= javac
$(PYSPARK_VERSION): $(STAMP) FORCE
	@mkdir -p $(@D)
	@v="$$($(PY) -c 'import pyspark; print(pyspark.__version__)')" && \
		{ [ "$$(cat $@ 2>/dev/null)" = "$$v" ] || echo "$$v" > $@; }

$(JAR): $(JAR_SOURCES) $(STAMP) $(PYSPARK_VERSION)
	@command -v $(JAVAC) >/dev/null || { echo "make jar needs a Java 17 JDK (javac): apt-get install openjdk-17-jdk-headless"; exit 2; }
	rm -rf build/jvm && mkdir -p build/jvm/classes/META-INF/services
	$(JAVAC) --release 17 -Xlint:all,-path,-serial,-processing -Werror -d build/jvm/classes \
		-cp "$$($(PY) -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars", "*"))')" \
		$(filter %.java,$(JAR_SOURCES))
	cp src/logstore/spark/jvm/META-INF/services/* build/jvm/classes/META-INF/services/
	jar --create --file $@.tmp -C build/jvm/classes . && mv $@.tmp $@

jar: $(JAR)

# demo, test and bench: the jar when a JDK is there; without one a note, and Spark reads through
# the Python source (tests/spark's JVM tests skip, saying why).
jvm: $(STAMP)
	@if command -v $(JAVAC) >/dev/null; then $(MAKE) --no-print-directory $(JAR); \
	else echo "note: no Java JDK (javac): the Spark JVM reader's jar is not built; format(\"logstore\") reads through" \
		"the Python source and the JVM reader's tests skip (apt-get install openjdk-17-jdk-headless for it)"; fi

FORCE:

demo: $(STAMP) jvm
	$(PY) examples/quickstart.py
	$(PY) examples/producer_consumer.py
	$(PY) examples/worker_pool.py
	$(PY) examples/replicated_cluster.py
	$(PY) examples/kafka_clients.py
	$(PY) examples/arrow_analytics.py
	$(PY) examples/tiered_storage.py
	$(PY) examples/spark_batch.py

test: $(STAMP) jvm
	$(PY) -m pytest $(PYTEST_FLAGS) $(PARALLEL) tests

bench: $(STAMP) jvm
	$(PY) -m pytest -q bench --benchmark-only --benchmark-columns=min,mean,ops
	$(PY) bench/compare.py
	$(PY) bench/bench_kafka.py
	$(PY) bench/bench_replica_kafka.py

SOAK_SECONDS ?= 300
soak: $(STAMP)
	LOGSTORE_SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m pytest $(PYTEST_FLAGS) -m slow tests

# The sanitizer build replaces the C core in .venv; the last step puts the normal build back.
asan: $(STAMP)
	LOGSTORE_SANITIZE=1 $(PY) -m pip install --quiet --no-deps --force-reinstall -e .
	PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
		$(PY) -m pytest $(PYTEST_FLAGS) -s -p no:cacheprovider tests/unit tests/corruption tests/compat; \
		status=$$?; $(PY) -m pip install --quiet --no-deps --force-reinstall -e .; exit $$status

sanitize: asan

FUZZ_SECONDS ?= 60
FUZZ_TARGETS := batch segment index varint columns flexcheck
# The C core's sources (py*.c are the CPython extension beside it: they need Python.h).
CORE_SOURCES := $(filter-out src/logstore/_native/py%.c,$(wildcard src/logstore/_native/*.c))
fuzz:
	@command -v clang >/dev/null || { echo "make fuzz needs clang with libFuzzer: apt-get install clang"; exit 2; }
	mkdir -p build/fuzz
	@for t in $(FUZZ_TARGETS); do \
		T=$$(echo $$t | tr a-z A-Z); \
		clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DFUZZ_$$T \
			-Isrc/logstore/_native tests/fuzz/fuzz_targets.c $(CORE_SOURCES) -o build/fuzz/$$t || exit 1; \
		mkdir -p build/fuzz/corpus-$$t; \
		echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
		ASAN_OPTIONS=detect_leaks=0 build/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			build/fuzz/corpus-$$t tests/fuzz/corpus/$$t > build/fuzz/$$t.log 2>&1; status=$$?; \
		grep -E "stat::number_of_executed_units|stat::new_units_added" build/fuzz/$$t.log; \
		test $$status -eq 0 || { tail -n 60 build/fuzz/$$t.log; echo "fuzz $$t: FINDING (crash input in build/fuzz)"; exit 1; }; \
	done

# librdkafka's source, from the npm package of Confluent's JavaScript client (it bundles the whole
# tree at deps/librdkafka, tests/ included): librdkafka 2.15.1. The harness checks the sha256.
export LIBRDKAFKA_NPM    := @confluentinc/kafka-javascript@1.10.1
export LIBRDKAFKA_SHA256 := ada7d703bb1d3237e2292bfabf438d663b6160c9f1ac2a2406b5dc4257c81b66
# COMPAT_FLAGS: e.g. --group-protocol consumer (KIP-848), --idempotent, --quick, --tests 0001,0081,
# --out DIR (keep a run apart); COMPAT.md says what each run found.
COMPAT_FLAGS ?=
compat: $(STAMP)
	$(PY) tests/compat/librdkafka_suite.py all $(COMPAT_FLAGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info src/logstore/_native/_lib.* .pytest_cache .hypothesis $(JAR)
