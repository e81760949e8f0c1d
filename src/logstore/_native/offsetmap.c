/* offsetmap.c -- the cleaner's key -> latest offset map (open addressing, linear probing).
 *
 * Invariant: every key present sits in the probe run that starts at its home slot (first 8 bytes
 * of the hash mod capacity) without an empty slot in between; keys are never removed, so the
 * invariant holds for the life of a map. A slot keeps the key's whole 128-bit hash: two keys of
 * the log share a slot only on a hash collision (2^-128 per pair).
 *
 * A cleaning pass hands over decoded rows (ls_offset_map_put_rows, ls_offset_map_classify_rows):
 * the keys are hashed here with XXH3_128 and put or looked up without a trip through Python.
 */
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "logstore.h"

/* xxHash (BSD-2-Clause, vendored as xxhash.h), compiled into this file only. */
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include "xxhash.h"

/* The key's 16-byte hash as the slot keeps it: XXH3_128 in canonical (big-endian) form, the same
 * bytes as the xxhash package's xxh3_128_digest, so that maps filled from Python and from decoded
 * rows agree. */
static void hash_key(const char *key, size_t len, char *out)
{
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits(key, len));
    memcpy(out, canonical.digest, LS_OFFSET_MAP_HASH_SIZE);
}

static int64_t home_slot(const char *hash, int64_t capacity)
{
    uint64_t h;
    memcpy(&h, hash, sizeof h);
    return (int64_t)(h % (uint64_t)capacity);
}

/* The stored value: offset - base + 1, 0 for an empty slot. */
static uint32_t load_value(const char *slot)
{
    uint32_t v;
    memcpy(&v, slot + LS_OFFSET_MAP_HASH_SIZE, sizeof v);
    return v;
}

static void store_value(char *slot, uint32_t v)
{
    memcpy(slot + LS_OFFSET_MAP_HASH_SIZE, &v, sizeof v);
}

/* The slot holding `hash`, or the empty slot where it would go. The map is never full (max_size
 * < capacity), so the walk ends. */
static char *find(ls_offset_map *m, const char *hash)
{
    int64_t i = home_slot(hash, m->capacity);
    for (;;) {
        char *slot = m->slots + i * LS_OFFSET_MAP_SLOT_SIZE;
        m->probes++;
        if (load_value(slot) == 0 || memcmp(slot, hash, LS_OFFSET_MAP_HASH_SIZE) == 0)
            return slot;
        if (++i == m->capacity)
            i = 0;
    }
}

int ls_offset_map_init(ls_offset_map *m, char *memory, int64_t bytes, int32_t load_factor_permille,
                       int64_t base_offset)
{
    if (!m || !memory || bytes < 2 * LS_OFFSET_MAP_SLOT_SIZE || load_factor_permille < 1 ||
        load_factor_permille > 1000 || base_offset < 0)
        return LS_ERR_ARG;
    m->base_offset = base_offset;
    m->slots = memory;
    m->capacity = bytes / LS_OFFSET_MAP_SLOT_SIZE;
    memset(memory, 0, (size_t)(m->capacity * LS_OFFSET_MAP_SLOT_SIZE));
    m->size = 0;
    /* At least one slot always stays empty, which is what ends every probe walk. */
    int64_t max_size = m->capacity / 1000 * load_factor_permille +
                       m->capacity % 1000 * load_factor_permille / 1000;
    m->max_size = max_size < m->capacity ? max_size : m->capacity - 1;
    m->probes = 0;
    return LS_OK;
}

/* Record hash -> offset: 1 when recorded, 0 when the map cannot take it (a new key while full,
 * or an offset beyond 2^32 - 2 past the base), LS_ERR_ARG for an offset below the base. */
static int put_one(ls_offset_map *m, const char *hash, int64_t offset)
{
    if (offset < m->base_offset)
        return LS_ERR_ARG;
    if (offset - m->base_offset >= (int64_t)UINT32_MAX - 1)
        return 0; /* beyond what one pass can index: the next pass starts there */
    uint32_t value = (uint32_t)(offset - m->base_offset + 1);
    char *slot = find(m, hash);
    uint32_t stored = load_value(slot);
    if (stored == 0) {
        if (m->size >= m->max_size)
            return 0;
        memcpy(slot, hash, LS_OFFSET_MAP_HASH_SIZE);
        m->size++;
    }
    if (value > stored)
        store_value(slot, value);
    return 1;
}

int64_t ls_offset_map_put(ls_offset_map *m, const char *hashes, const int64_t *offsets, int64_t n)
{
    if (!m || !m->slots || n < 0 || (n && (!hashes || !offsets)))
        return LS_ERR_ARG;
    for (int64_t i = 0; i < n; i++) {
        int rc = put_one(m, hashes + i * LS_OFFSET_MAP_HASH_SIZE, offsets[i]);
        if (rc < 0)
            return rc;
        if (rc == 0)
            return i;
    }
    return n;
}

int64_t ls_offset_map_get(ls_offset_map *m, const char *hashes, int64_t *offsets_out, int64_t n)
{
    if (!m || !m->slots || n < 0 || (n && (!hashes || !offsets_out)))
        return LS_ERR_ARG;
    for (int64_t i = 0; i < n; i++) {
        uint32_t value = load_value(find(m, hashes + i * LS_OFFSET_MAP_HASH_SIZE));
        offsets_out[i] = value ? m->base_offset + (int64_t)value - 1 : -1;
    }
    return n;
}

void ls_offset_map_hash(const char *key, int64_t len, char *hash_out)
{
    hash_key(key, len > 0 ? (size_t)len : 0, hash_out);
}

/* Row i's key span, checked against the buffer: 1 with *key set, 0 for a null key, LS_ERR_CORRUPT
 * for a span outside buf. */
static int row_key(const char *buf, int64_t buf_len, const ls_records_out *rows, int64_t i, const char **key)
{
    int32_t pos = rows->key_pos[i], len = rows->key_len[i];
    if (len == -1)
        return 0;
    if (len < -1 || pos < 0 || (int64_t)pos + len > buf_len)
        return LS_ERR_CORRUPT;
    *key = buf + pos;
    return 1;
}

/* Whether offset lies in one of the n sorted, disjoint [first, last] ranges. */
static int in_ranges(const int64_t *ranges, int64_t n, int64_t offset)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) { /* the first range whose last offset is >= offset */
        int64_t mid = lo + (hi - lo) / 2;
        if (ranges[2 * mid + 1] < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && ranges[2 * lo] <= offset;
}

/* Rows are handled CHUNK at a time: their keys hashed and their home slots prefetched first, then
 * put or looked up in order, so that the slots' cache misses (a map is tens of MB, each key's slot
 * a random place in it) overlap instead of being paid one after another. */
#define CHUNK 32

typedef struct {
    int64_t n;                                 /* rows of the chunk */
    int8_t hashed[CHUNK];                      /* row has a key that takes part */
    char hashes[CHUNK][LS_OFFSET_MAP_HASH_SIZE];
} chunk_hashes;

/* Hash the keys of rows [first, first + c->n) that have one and whose offset lies below end and
 * outside the skip ranges, prefetching each one's home slot. LS_OK or LS_ERR_CORRUPT. */
static int hash_chunk(const ls_offset_map *m, const char *buf, int64_t buf_len, const ls_records_out *rows,
                      int64_t first, int64_t end, const int64_t *skip, int64_t n_skip, chunk_hashes *c)
{
    for (int64_t j = 0; j < c->n; j++) {
        const char *key = NULL;
        int64_t offset = rows->offsets[first + j];
        int has_key = row_key(buf, buf_len, rows, first + j, &key);
        if (has_key < 0)
            return has_key;
        c->hashed[j] = has_key && offset < end && !(n_skip && in_ranges(skip, n_skip, offset));
        if (c->hashed[j]) {
            hash_key(key, (size_t)rows->key_len[first + j], c->hashes[j]);
            __builtin_prefetch(m->slots + home_slot(c->hashes[j], m->capacity) * LS_OFFSET_MAP_SLOT_SIZE);
        }
    }
    return LS_OK;
}

static int rows_valid(const ls_offset_map *m, const char *buf, int64_t buf_len, const ls_records_out *rows,
                      int64_t n)
{
    return m && m->slots && rows && n >= 0 && n <= rows->count && buf_len >= 0 && (buf || buf_len == 0) &&
           (n == 0 || (rows->offsets && rows->key_pos && rows->key_len && rows->value_len));
}

int ls_offset_map_put_rows(ls_offset_map *m, const char *buf, int64_t buf_len, const ls_records_out *rows,
                           int64_t n, int64_t end, const int64_t *skip, int64_t n_skip, int64_t *stopped_at)
{
    if (!rows_valid(m, buf, buf_len, rows, n) || !stopped_at || n_skip < 0 || (n_skip && !skip))
        return LS_ERR_ARG;
    *stopped_at = -1;
    chunk_hashes c;
    for (int64_t first = 0; first < n; first += CHUNK) {
        c.n = n - first < CHUNK ? n - first : CHUNK;
        int rc = hash_chunk(m, buf, buf_len, rows, first, end, skip, n_skip, &c);
        if (rc < 0)
            return rc;
        for (int64_t j = 0; j < c.n; j++) {
            if (!c.hashed[j])
                continue;
            rc = put_one(m, c.hashes[j], rows->offsets[first + j]);
            if (rc < 0)
                return rc;
            if (rc == 0) {
                *stopped_at = rows->offsets[first + j];
                return LS_OK;
            }
        }
    }
    return LS_OK;
}

int ls_offset_map_classify_rows(ls_offset_map *m, const char *buf, int64_t buf_len, const ls_records_out *rows,
                                int64_t n, int64_t end, int8_t *codes_out)
{
    if (!rows_valid(m, buf, buf_len, rows, n) || (n && !codes_out))
        return LS_ERR_ARG;
    chunk_hashes c;
    for (int64_t first = 0; first < n; first += CHUNK) {
        c.n = n - first < CHUNK ? n - first : CHUNK;
        int rc = hash_chunk(m, buf, buf_len, rows, first, end, NULL, 0, &c);
        if (rc < 0)
            return rc;
        for (int64_t j = 0; j < c.n; j++) {
            int64_t i = first + j, offset = rows->offsets[i];
            if (c.hashed[j]) {
                uint32_t value = load_value(find(m, c.hashes[j]));
                if (value && offset < m->base_offset + (int64_t)value - 1) {
                    codes_out[i] = LS_ROW_OBSOLETE;
                    continue;
                }
            }
            if (rows->value_len[i] >= 0)
                codes_out[i] = LS_ROW_LIVE;
            else
                codes_out[i] = offset < end ? LS_ROW_TOMBSTONE : LS_ROW_TOMBSTONE_PAST_END;
        }
    }
    return LS_OK;
}
