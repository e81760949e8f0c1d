/* shared.c -- the shared partition state page and the notification counter (see logstore.h).
 *
 * Page layout (host byte order; the page never leaves the machine):
 *   0  uint64 magic "LSSHARE1"      8  uint32 layout version   12 uint32 notification counter
 *   16 int32  registered waiters    20 int32  dirty flag        24 uint64 current slot sequence
 *   64 slot 0, 256 slot 1: uint64 sequence (0 while being written) + ls_shared_view
 * Every field shared between processes is accessed with __atomic builtins, so the protocol holds
 * on weakly ordered CPUs too and is free of data races as C11 defines them. */
#define _GNU_SOURCE 1 /* syscall(), nanosleep() under -std=c11 */
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include "logstore.h"

#ifdef __linux__
#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#else
#include <time.h>
#endif

#define MAGIC 0x3145524148534c53ull /* "LSSHARE1" read as a little-endian uint64 */
#define OFF_MAGIC 0
#define OFF_VERSION 8
#define OFF_COUNTER 12
#define OFF_WAITERS 16
#define OFF_DIRTY 20
#define OFF_CURRENT 24
#define OFF_SLOT0 64
#define SLOT_STRIDE 192
#define VIEW_WORDS ((int)(sizeof(ls_shared_view) / sizeof(int64_t)))

_Static_assert(sizeof(ls_shared_view) % sizeof(int64_t) == 0, "view is whole int64 words");
_Static_assert(8 + sizeof(ls_shared_view) <= SLOT_STRIDE, "slot holds sequence + view");
_Static_assert(OFF_SLOT0 + 2 * SLOT_STRIDE <= LS_SHARED_SIZE, "two slots fit in the page");

static uint64_t *u64_at(const char *page, int off) { return (uint64_t *)(uintptr_t)(page + off); }
static uint32_t *u32_at(const char *page, int off) { return (uint32_t *)(uintptr_t)(page + off); }
static int32_t *i32_at(const char *page, int off) { return (int32_t *)(uintptr_t)(page + off); }
static int64_t *slot_words(const char *page, uint64_t seq)
{
    return (int64_t *)(uintptr_t)(page + OFF_SLOT0 + (int)(seq & 1) * SLOT_STRIDE + 8);
}
static uint64_t *slot_seq(const char *page, uint64_t seq)
{
    return u64_at(page, OFF_SLOT0 + (int)(seq & 1) * SLOT_STRIDE);
}

static int usable(const char *page, int64_t len)
{
    return page != NULL && len >= LS_SHARED_SIZE && ((uintptr_t)page & 7u) == 0;
}

static int formatted(const char *page)
{
    return __atomic_load_n(u64_at(page, OFF_MAGIC), __ATOMIC_ACQUIRE) == MAGIC
        && __atomic_load_n(u32_at(page, OFF_VERSION), __ATOMIC_RELAXED) == LS_SHARED_MAGIC_VERSION;
}

static void write_slot(char *page, uint64_t seq, const ls_shared_view *v)
{
    int64_t words[VIEW_WORDS];
    memcpy(words, v, sizeof(words));
    uint64_t *sp = slot_seq(page, seq);
    int64_t *dst = slot_words(page, seq);
    __atomic_store_n(sp, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (int i = 0; i < VIEW_WORDS; i++)
        __atomic_store_n(&dst[i], words[i], __ATOMIC_RELAXED);
    __atomic_store_n(sp, seq, __ATOMIC_RELEASE);
    __atomic_store_n(u64_at(page, OFF_CURRENT), seq, __ATOMIC_RELEASE);
}

int ls_shared_init(char *page, int64_t len, const ls_shared_view *v)
{
    if (!usable(page, len) || v == NULL)
        return LS_ERR_ARG;
    /* Only the first process to open the log formats the page (under an exclusive lock), so plain
     * stores would do; atomics keep the accesses uniform. */
    __atomic_store_n(u64_at(page, OFF_MAGIC), 0, __ATOMIC_RELAXED);
    for (int off = 8; off < LS_SHARED_SIZE; off += 8)
        __atomic_store_n(u64_at(page, off), 0, __ATOMIC_RELAXED);
    __atomic_store_n(u32_at(page, OFF_VERSION), LS_SHARED_MAGIC_VERSION, __ATOMIC_RELAXED);
    write_slot(page, 1, v);
    __atomic_store_n(u64_at(page, OFF_MAGIC), MAGIC, __ATOMIC_RELEASE);
    return LS_OK;
}

static void relax(unsigned spins)
{
    if (spins % 64 == 63) {
        struct timespec ts = {0, 1000};
        nanosleep(&ts, NULL);
    }
}

int ls_shared_read(const char *page, int64_t len, ls_shared_view *out)
{
    if (!usable(page, len) || out == NULL)
        return LS_ERR_ARG;
    if (!formatted(page))
        return LS_ERR_CORRUPT;
    int64_t words[VIEW_WORDS];
    for (unsigned spins = 0;; spins++) {
        uint64_t seq = __atomic_load_n(u64_at(page, OFF_CURRENT), __ATOMIC_ACQUIRE);
        uint64_t *sp = slot_seq(page, seq);
        if (seq == 0 || __atomic_load_n(sp, __ATOMIC_ACQUIRE) != seq) {
            relax(spins); /* the writer of seq + 1 is overwriting this slot: reload current */
            continue;
        }
        const int64_t *src = slot_words(page, seq);
        for (int i = 0; i < VIEW_WORDS; i++)
            words[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(sp, __ATOMIC_RELAXED) == seq) {
            memcpy(out, words, sizeof(words));
            return LS_OK;
        }
        relax(spins);
    }
}

int ls_shared_publish(char *page, int64_t len, const ls_shared_view *v)
{
    if (!usable(page, len) || v == NULL)
        return LS_ERR_ARG;
    if (!formatted(page))
        return LS_ERR_CORRUPT;
    uint64_t seq = __atomic_load_n(u64_at(page, OFF_CURRENT), __ATOMIC_ACQUIRE) + 1;
    write_slot(page, seq, v);
    __atomic_store_n(i32_at(page, OFF_DIRTY), 0, __ATOMIC_RELEASE);
    ls_notify(page);
    return LS_OK;
}

void ls_shared_set_dirty(char *page, int32_t dirty)
{
    __atomic_store_n(i32_at(page, OFF_DIRTY), dirty, __ATOMIC_SEQ_CST);
}

int32_t ls_shared_dirty(const char *page)
{
    return __atomic_load_n(i32_at(page, OFF_DIRTY), __ATOMIC_ACQUIRE);
}

uint32_t ls_notify_enter(char *page)
{
    __atomic_add_fetch(i32_at(page, OFF_WAITERS), 1, __ATOMIC_SEQ_CST);
    return __atomic_load_n(u32_at(page, OFF_COUNTER), __ATOMIC_SEQ_CST);
}

void ls_notify_leave(char *page)
{
    int32_t *w = i32_at(page, OFF_WAITERS);
    int32_t n = __atomic_load_n(w, __ATOMIC_RELAXED);
    /* Never below zero, even if the page was reformatted while this process waited. */
    while (n > 0 && !__atomic_compare_exchange_n(w, &n, n - 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
        ;
}

uint32_t ls_notify_counter(const char *page)
{
    return __atomic_load_n(u32_at(page, OFF_COUNTER), __ATOMIC_SEQ_CST);
}

void ls_notify(char *page)
{
    __atomic_add_fetch(u32_at(page, OFF_COUNTER), 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(i32_at(page, OFF_WAITERS), __ATOMIC_SEQ_CST) > 0) {
#ifdef __linux__
        /* Not FUTEX_PRIVATE: waiters may be in other processes mapping the same file. */
        syscall(SYS_futex, u32_at(page, OFF_COUNTER), FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
#endif
    }
}

int ls_notify_wait(char *page, uint32_t seen, int64_t timeout_us)
{
    uint32_t *word = u32_at(page, OFF_COUNTER);
    if (__atomic_load_n(word, __ATOMIC_SEQ_CST) != seen)
        return 1;
    if (timeout_us == 0)
        return 0;
#ifdef __linux__
    struct timespec ts, *tsp = NULL;
    if (timeout_us > 0) {
        ts.tv_sec = (time_t)(timeout_us / 1000000);
        ts.tv_nsec = (long)(timeout_us % 1000000) * 1000;
        tsp = &ts;
    }
    long rc = syscall(SYS_futex, word, FUTEX_WAIT, seen, tsp, NULL, 0);
    if (rc == -1 && errno == ETIMEDOUT)
        return 0;
    return 1; /* woken, value changed (EAGAIN) or interrupted: the caller re-checks */
#else
    /* Portable fallback: a short sleep, then the caller re-checks its condition. */
    int64_t step = timeout_us < 0 || timeout_us > 1000 ? 1000 : timeout_us;
    struct timespec ts = {0, (long)step * 1000};
    nanosleep(&ts, NULL);
    return __atomic_load_n(word, __ATOMIC_SEQ_CST) != seen;
#endif
}

void ls_view_from_appender(ls_shared_view *v, const ls_appender *a, int64_t records_before)
{
    v->active_base = a->base_offset;
    v->position = a->position;
    v->next_offset = a->next_offset;
    v->index_entries = a->index_entries;
    v->timeindex_entries = a->timeindex_entries;
    v->bytes_since_last_entry = a->bytes_since_last_entry;
    v->max_timestamp = a->max_timestamp;
    v->offset_of_max_timestamp = a->offset_of_max_timestamp;
    v->last_timeindex_timestamp = a->last_timeindex_timestamp;
    v->records = records_before + a->records;
    v->partition_leader_epoch = a->partition_leader_epoch;
}

void ls_appender_adopt(ls_appender *a, const ls_shared_view *v)
{
    a->position = v->position;
    a->next_offset = v->next_offset;
    a->index_entries = v->index_entries;
    a->timeindex_entries = v->timeindex_entries;
    a->bytes_since_last_entry = v->bytes_since_last_entry;
    a->max_timestamp = v->max_timestamp;
    a->offset_of_max_timestamp = v->offset_of_max_timestamp;
    a->last_timeindex_timestamp = v->last_timeindex_timestamp;
    a->records = (int32_t)v->records;
    a->partition_leader_epoch = (int32_t)v->partition_leader_epoch;
}
