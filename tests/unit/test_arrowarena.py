"""The memory a views read writes its Arrow columns into (arena.c, RecordDecoder.take_arrow_columns)
and the work-stealing helper of chunk pairs (log/arrow.py's DecodeJob)."""

from __future__ import annotations

import gc
import os
import signal
import threading

import pyarrow as pa
import pytest

from logstore import Log
from logstore._native import ffi, lib
from logstore.log.arrow import DecodeJob, submit
from logstore.records.batch import BatchBuilder, RecordDecoder

HUGE = 2 << 20


def test_arenas_are_whole_aligned_huge_pages_and_recycled():
    assert lib.ls_arena_size(1) == HUGE and lib.ls_arena_size(HUGE) == HUGE and lib.ls_arena_size(HUGE + 1) == 2 * HUGE
    assert lib.ls_arena_size(0) == lib.LS_ERR_ARG and lib.ls_arena_size(-5) == lib.LS_ERR_ARG
    assert lib.ls_arena_alloc(0) == ffi.NULL and lib.ls_arena_alloc(-1) == ffi.NULL
    for size in (100, HUGE, 3 * HUGE - 7):
        arena = lib.ls_arena_alloc(size)
        assert arena != ffi.NULL and int(ffi.cast("uintptr_t", arena)) % HUGE == 0
        ffi.memmove(arena, b"\xab" * lib.ls_arena_size(size), lib.ls_arena_size(size))  # every byte writable
        assert ffi.buffer(arena, lib.ls_arena_size(size))[-1] == b"\xab"
        lib.ls_arena_free(arena, size)
    lib.ls_arena_free(ffi.NULL, HUGE)  # nothing to give back
    a = lib.ls_arena_alloc(HUGE)
    lib.ls_arena_free(a, HUGE)
    b = lib.ls_arena_alloc(1)  # one huge page: the one just freed, from the cache
    assert b == a
    lib.ls_arena_free(b, 1)


def _batch(base_offset, keys, values, timestamp=1_700_000_000_000):
    return bytes(BatchBuilder().build(values, keys, timestamps=[timestamp + i for i in range(len(values))],
                                      base_offset=base_offset))


def test_the_walk_writes_validity_null_counts_and_the_long_values_end():
    keys = [None, b"k" * 12, b"K" * 13, None, b"", b"x" * 40, b"y", None, b"z" * 20]
    values = [b"v" * 13, None, b"s", b"w" * 100, None, b"", b"t" * 12, b"u" * 14, None]
    data = _batch(5, keys, values)
    seen = []

    def sink(buf, out, n):
        key_bits = ffi.buffer(out.key_valid, 2)[:]
        value_bits = ffi.buffer(out.value_valid, 2)[:]
        seen.append((n, out.key_nulls, out.value_nulls, out.views_end,
                     [bool(key_bits[i >> 3] >> (i & 7) & 1) for i in range(n)],
                     [bool(value_bits[i >> 3] >> (i & 7) & 1) for i in range(n)],
                     list(ffi.unpack(out.timestamps_us, n)), list(ffi.unpack(out.timestamp_types32, n)),
                     list(ffi.unpack(out.offsets, n))))

    decoder = RecordDecoder(capacity=64, views=True)
    decoder.decode_columns(data, 0, len(data), sink)
    ((n, key_nulls, value_nulls, end, key_valid, value_valid, us, types, offsets),) = seen
    assert n == 9 and key_nulls == 3 and value_nulls == 3
    assert key_valid == [k is not None for k in keys] and value_valid == [v is not None for v in values]
    assert us == [(1_700_000_000_000 + i) * 1000 for i in range(9)] and types == [0] * 9
    assert offsets == list(range(5, 14))
    last_long = data.rindex(b"z" * 20) + 20  # the furthest key or value longer than 12 bytes (the last key)
    assert end == last_long


def test_taken_columns_are_fresh_memory_and_outlive_the_decoder(tmp_path):
    decoder = RecordDecoder(capacity=16, views=True)
    with pytest.raises(ValueError):
        RecordDecoder(capacity=16).take_arrow_columns()
    taken = []
    data = _batch(0, [b"a" * 20] * 3, [b"b" * 30] * 3) + _batch(3, [b"c" * 20] * 3, [b"d" * 30] * 3)

    def sink(buf, out, n):
        taken.append(decoders[0].take_arrow_columns())
        assert int(ffi.cast("uintptr_t", out.offsets)) != taken[-1].offsets  # the next rows go elsewhere

    decoders = [decoder]
    decoder.decode_columns(data, 0, len(data), sink)
    assert len(taken) == 1 and taken[0].owner is not None
    first = taken[0]
    del decoder, decoders[:]
    gc.collect()
    assert list(ffi.unpack(ffi.cast("int64_t *", first.offsets), 6)) == list(range(6))


def test_a_views_table_keeps_its_columns_after_the_log_closes(tmp_path):
    with Log.open(str(tmp_path / "p-0")) as log:
        for i in range(40):
            log.append_batch([b"value-%06d-" % (i * 100 + j) * 2 for j in range(100)],
                             keys=[None if j % 7 == 0 else b"key-%d" % j for j in range(100)])
        table = log.read_arrow(37, views=True)  # starts mid-batch, not on a bitmap byte
        binary = log.read_arrow(37)
    gc.collect()
    table.validate(full=True)
    assert table.num_rows == 4000 - 37
    assert table.equals(binary.cast(table.schema))
    assert table.column("key").null_count == binary.column("key").null_count


def test_a_job_runs_on_the_helper_or_is_taken_back():
    class Decoder:
        def __init__(self):
            self.threads = []

        def decode_columns(self, *args, **kwargs):
            self.threads.append(threading.current_thread())
            raise RuntimeError("boom")

    from logstore.log import arrow as logarrow
    from logstore.log.segments import ColumnsFrom

    at = ColumnsFrom(b"", 0, 0, "nowhere")
    gate, busy = threading.Event(), threading.Event()

    class Blocking(Decoder):
        def decode_columns(self, *args, **kwargs):
            busy.set()
            gate.wait(10)  # keeps the helper thread busy
            return super().decode_columns(*args, **kwargs)

    blocker = logarrow._HELPER.submit(DecodeJob(Blocking(), at, 0, 1, None))
    assert busy.wait(10)
    stolen = Decoder()
    job = submit(stolen, at, 0, 1, None)
    with pytest.raises(RuntimeError, match="boom"):
        job.result()  # the helper is busy: this thread ran it
    assert stolen.threads == [threading.current_thread()]
    dropped = Decoder()
    cancelled = submit(dropped, at, 0, 1, None)
    cancelled.cancel()
    gate.set()
    helped = Decoder()
    job = submit(helped, at, 0, 1, None)
    for _ in range(1000):
        if helped.threads:
            break
        threading.Event().wait(0.01)
    with pytest.raises(RuntimeError, match="boom"):
        job.result()
    assert dropped.threads == [] and helped.threads and helped.threads[0] is not threading.current_thread()
    with pytest.raises(RuntimeError, match="boom"):
        blocker.result()  # run by the helper, its error handed over
    assert pa.binary_view()  # pyarrow present: the module under test is importable without it too


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_table_of_many_small_chunks_holds_no_huge_page_per_chunk(tmp_path):
    """Each small compressed batch is a chunk of its own: taking the decoder's 2 MiB arena for
    each (as first built) made a 4,000-record lz4 log of 10-record batches a table of 800 MB;
    such chunks are copied into buffers of their own size."""
    with Log.open(str(tmp_path / "small-0"), compression_type="lz4") as log:
        for i in range(400):
            log.append_batch([b"v%05d-%d" % (i, j) for j in range(10)], [b"k%d" % j for j in range(10)])
        gc.collect()
        before = _rss_bytes()
        table = log.read_arrow(0, views=True)
        grew = _rss_bytes() - before
        assert table.num_rows == 4000
        assert table.column("value")[3999].as_py() == b"v00399-9"
    assert grew < 100 << 20, f"the table took {grew >> 20} MiB"


def test_a_fork_while_another_thread_allocates_arenas_leaves_the_child_able_to(tmp_path):
    """The arena cache's lock is taken around fork(): a child forked while another thread held
    it can allocate (it hung for ever in 32 of 2,000 forks before)."""
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            lib.ls_arena_free(lib.ls_arena_alloc(1), 1)

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for _ in range(200):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                signal.alarm(10)  # a hang ends the child (and fails the check below)
                arena = lib.ls_arena_alloc(1)
                lib.ls_arena_free(arena, 1)
                os._exit(0 if arena != ffi.NULL else 1)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
    finally:
        stop.set()
        worker.join()


def test_a_large_decoders_row_arrays_are_recycled_memory_not_fresh_pages():
    import resource

    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("ASan's allocator quarantines freed memory: every allocation touches fresh pages")
    from logstore.records.arrow import ROWS_PER_BATCH

    rows = ROWS_PER_BATCH // 1000 * 1000
    data = b"".join(_batch(i, [b"key"] * 1000, [b"v" * 20] * 1000) for i in range(0, rows, 1000))

    def read_once() -> int:
        # as a read as Arrow on two cores: a pair of chunk decoders, made for the read
        decoders = [RecordDecoder(capacity=ROWS_PER_BATCH) for _ in range(2)]
        counts: list[int] = []
        for decoder in decoders:
            decoder.decode_columns(data, 0, len(data), lambda buf, out, n: counts.append(n))
        return sum(counts)

    assert read_once() == 2 * rows  # the first maps the arenas, which go back to the cache
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        assert read_once() == 2 * rows
    # The row arrays take 45 bytes a row, 1.5 MB a decoder: calloc'd, they were fresh pages
    # faulted in at every read (measured: ~580 faults per 500,000-row read as Arrow)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults < 100
