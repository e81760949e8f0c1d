/* offsetmap.c -- the cleaner's key -> latest offset map (open addressing, linear probing).
 *
 * Invariant: every key present sits in the probe run that starts at its home slot (first 8 bytes
 * of the hash mod capacity) without an empty slot in between; keys are never removed, so the
 * invariant holds for the life of a map. A slot keeps the key's whole 128-bit hash: two keys of
 * the log share a slot only on a hash collision (2^-128 per pair).
 */
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "logstore.h"

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

int64_t ls_offset_map_put(ls_offset_map *m, const char *hashes, const int64_t *offsets, int64_t n)
{
    if (!m || !m->slots || n < 0 || (n && (!hashes || !offsets)))
        return LS_ERR_ARG;
    for (int64_t i = 0; i < n; i++) {
        if (offsets[i] < m->base_offset)
            return LS_ERR_ARG;
        if (offsets[i] - m->base_offset >= (int64_t)UINT32_MAX - 1)
            return i; /* beyond what one pass can index: the next pass starts there */
        uint32_t value = (uint32_t)(offsets[i] - m->base_offset + 1);
        const char *hash = hashes + i * LS_OFFSET_MAP_HASH_SIZE;
        char *slot = find(m, hash);
        uint32_t stored = load_value(slot);
        if (stored == 0) {
            if (m->size >= m->max_size)
                return i;
            memcpy(slot, hash, LS_OFFSET_MAP_HASH_SIZE);
            m->size++;
        }
        if (value > stored)
            store_value(slot, value);
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
