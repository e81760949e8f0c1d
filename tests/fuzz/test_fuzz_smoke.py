"""A short fuzzing run of every C parser in make test (the long runs are make fuzz, libFuzzer).

Each target of fuzz_targets.c is built with gcc under AddressSanitizer and
UndefinedBehaviorSanitizer together with fuzz_driver.c, which replays the seed corpus
(tests/fuzz/corpus, written by make_corpus.py from real batches, segments and indexes) and then
mutates it at random for a few seconds. Any out-of-bounds read, overflow or abort fails the test
with the sanitizer's report. The execution counts are printed at the end of the run.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

HERE = pathlib.Path(__file__).resolve().parent
NATIVE = HERE.parents[1] / "src" / "logstore" / "_native"
TARGETS = ["batch", "segment", "index", "varint", "columns", "flexcheck"]
SECONDS = float(os.environ.get("LOGSTORE_FUZZ_SMOKE_SECONDS", "1"))
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    """The C core's objects, compiled once with the sanitizers."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    out = tmp_path_factory.mktemp("fuzz")
    objects = []
    # The C core only: py*.c are the CPython extension (they need Python.h and build objects).
    sources = [s for s in sorted(NATIVE.glob("*.c")) if not s.name.startswith("py")]
    for source in sources:
        obj = out / (source.stem + ".o")
        subprocess.run(["gcc", "-std=c11", "-O1", "-g", *SANITIZE, "-I", str(NATIVE), "-c", str(source),
                        "-o", str(obj)], check=True)
        objects.append(str(obj))
    return out, objects


#: Executions per target in this run (printed at the end of the run, see conftest.py).
EXECUTIONS: dict[str, int] = {}


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_survives_the_corpus_and_mutations(core, target):
    out, objects = core
    binary = out / f"fuzz-{target}"
    subprocess.run(["gcc", "-std=gnu11", "-O1", "-g", *SANITIZE, f"-DFUZZ_{target.upper()}",
                    "-I", str(NATIVE), str(HERE / "fuzz_targets.c"), str(HERE / "fuzz_driver.c"), *objects,
                    "-o", str(binary)], check=True)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    run = subprocess.run([str(binary), str(HERE / "corpus" / target), str(SECONDS), "12345"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-4000:]
    executions = int(run.stdout.strip())
    EXECUTIONS[target] = executions
    print(f"fuzz {target}: {executions} executions in {SECONDS:g} s, no findings")
    assert executions > len(list((HERE / "corpus" / target).iterdir()))
