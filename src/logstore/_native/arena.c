/* arena.c -- memory for Arrow columns that the decoder writes and Arrow keeps.
 *
 * A read as Arrow fills fresh memory with every chunk of rows (views, offsets, timestamps), and
 * the columns leave with the table. Fresh anonymous memory is slow on first touch: every page
 * faults in and the kernel zeroes it (measured on this project's VM: about as long as the CRC and
 * the walk of the records that fill it). So an arena is
 *   - a 2 MiB-aligned anonymous map in whole 2 MiB units with MADV_HUGEPAGE: where the kernel
 *     has transparent huge pages (`always` or `madvise`) each 2 MiB faults in at once;
 *   - recycled: a freed arena of one huge page (a decoder chunk's size) goes to a small cache
 *     (ARENA_CACHE arenas, shared by the process) that the next allocation takes from, so a
 *     process that reads table after table writes into memory that is already mapped.
 * The cache is guarded by a mutex: decode threads allocate and Python's garbage collector frees
 * from any thread. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/mman.h>

#include "logstore.h"

#define HUGE_PAGE ((int64_t)2 << 20)
#define ARENA_CACHE 24 /* 48 MiB: the columns of a 500,000-row read without headers */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static void *cache[ARENA_CACHE];
static int cached;

/* fork() while another thread holds the cache's lock would leave it held in the child for ever
 * (the thread that would release it does not exist there): the lock is taken around every fork,
 * and the child makes a new one (the cached arenas are the child's too: the mappings are). */
static void fork_prepare(void)
{
    pthread_mutex_lock(&cache_lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&cache_lock);
}

static void fork_child(void)
{
    pthread_mutex_init(&cache_lock, NULL);
}

__attribute__((constructor)) static void arena_init(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

int64_t ls_arena_size(int64_t size)
{
    if (size <= 0 || size > INT64_MAX / 2)
        return LS_ERR_ARG;
    return (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
}

static void *take_cached(void)
{
    void *arena = NULL;
    pthread_mutex_lock(&cache_lock);
    if (cached > 0)
        arena = cache[--cached];
    pthread_mutex_unlock(&cache_lock);
    return arena;
}

void *ls_arena_alloc(int64_t size)
{
    int64_t want = ls_arena_size(size);
    if (want < 0)
        return NULL;
    if (want == HUGE_PAGE) {
        void *arena = take_cached();
        if (arena != NULL)
            return arena;
    }
    /* Over-allocate by one huge page, then unmap the unaligned head and the tail. */
    size_t len = (size_t)(want + HUGE_PAGE);
    char *raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uintptr_t at = ((uintptr_t)raw + (uintptr_t)HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    size_t head = at - (uintptr_t)raw, tail = len - head - (size_t)want;
    if (head > 0)
        munmap(raw, head);
    if (tail > 0)
        munmap((char *)at + want, tail);
#ifdef MADV_HUGEPAGE
    madvise((void *)at, (size_t)want, MADV_HUGEPAGE); /* advice only: without THP, 4 KiB pages */
#endif
    return (void *)at;
}

void ls_arena_free(void *arena, int64_t size)
{
    int64_t len = ls_arena_size(size);
    if (arena == NULL || len < 0)
        return;
    if (len == HUGE_PAGE) {
        pthread_mutex_lock(&cache_lock);
        int kept = cached < ARENA_CACHE;
        if (kept)
            cache[cached++] = arena;
        pthread_mutex_unlock(&cache_lock);
        if (kept)
            return;
    }
    munmap(arena, (size_t)len);
}
