/* offsetmap.c -- the cleaner's key -> latest offset map (open addressing, linear probing).
 *
 * Invariant: every key present sits in the probe run that starts at its home slot (first 8 bytes
 * of the hash mod capacity) without an empty slot in between; keys are never removed, so the
 * invariant holds for the life of a map. A slot keeps 96 bits of the key's hash: two keys of the
 * log share a slot only on a collision of those bits (2^-96 per pair).
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

static int64_t load_offset(const char *slot)
{
    int64_t v;
    memcpy(&v, slot + LS_OFFSET_MAP_STORED_HASH_SIZE, sizeof v);
    return v;
}

static void store_offset(char *slot, int64_t v)
{
    memcpy(slot + LS_OFFSET_MAP_STORED_HASH_SIZE, &v, sizeof v);
}

/* The slot holding `hash`, or the empty slot where it would go. The map is never full (max_size
 * < capacity), so the walk ends. */
static char *find(ls_offset_map *m, const char *hash)
{
    int64_t i = home_slot(hash, m->capacity);
    for (;;) {
        char *slot = m->slots + i * LS_OFFSET_MAP_SLOT_SIZE;
        m->probes++;
        if (load_offset(slot) == 0 || memcmp(slot, hash, LS_OFFSET_MAP_STORED_HASH_SIZE) == 0)
            return slot;
        if (++i == m->capacity)
            i = 0;
    }
}

int ls_offset_map_init(ls_offset_map *m, char *memory, int64_t bytes, int32_t load_factor_permille)
{
    if (!m || !memory || bytes < 2 * LS_OFFSET_MAP_SLOT_SIZE || load_factor_permille < 1 ||
        load_factor_permille > 1000)
        return LS_ERR_ARG;
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
        if (offsets[i] < 0 || offsets[i] == INT64_MAX)
            return LS_ERR_ARG;
        const char *hash = hashes + i * LS_OFFSET_MAP_HASH_SIZE;
        char *slot = find(m, hash);
        int64_t stored = load_offset(slot);
        if (stored == 0) {
            if (m->size >= m->max_size)
                return i;
            memcpy(slot, hash, LS_OFFSET_MAP_STORED_HASH_SIZE);
            m->size++;
        }
        if (offsets[i] + 1 > stored)
            store_offset(slot, offsets[i] + 1);
    }
    return n;
}

int64_t ls_offset_map_get(ls_offset_map *m, const char *hashes, int64_t *offsets_out, int64_t n)
{
    if (!m || !m->slots || n < 0 || (n && (!hashes || !offsets_out)))
        return LS_ERR_ARG;
    for (int64_t i = 0; i < n; i++)
        offsets_out[i] = load_offset(find(m, hashes + i * LS_OFFSET_MAP_HASH_SIZE)) - 1;
    return n;
}
