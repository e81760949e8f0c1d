/* index.c -- Kafka's sparse .index and .timeindex files.
 *
 * Offset index entry: relativeOffset int32 BE, position int32 BE (8 bytes).
 * Time index entry: timestamp int64 BE, relativeOffset int32 BE (12 bytes).
 * Lookups are binary searches and assume a checked index (ls_index_check); on an unchecked one
 * they still only read inside [0, entries) and return some slot or -1.
 */
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "logstore.h"
#include "ls_internal.h"

int64_t ls_index_lookup(const char *index, int64_t entries, int64_t target_relative_offset)
{
    if (!index || entries <= 0)
        return -1;
    int64_t lo = 0, hi = entries - 1, found = -1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (ls_load_i32(index + mid * LS_INDEX_ENTRY_SIZE) <= target_relative_offset) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

int64_t ls_timeindex_lookup(const char *index, int64_t entries, int64_t target_timestamp)
{
    if (!index || entries <= 0)
        return -1;
    int64_t lo = 0, hi = entries - 1, found = -1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (ls_load_i64(index + mid * LS_TIMEINDEX_ENTRY_SIZE) <= target_timestamp) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

/* An offset index is valid iff relative offsets and positions strictly increase (each entry marks
 * a different batch), positions are >= 0, and every relative offset lies in
 * [0, max_relative_offset]. A time index is valid iff timestamps strictly increase (appends only
 * add an entry for a newer timestamp), relative offsets do not decrease, and every relative
 * offset lies in that range. */
int64_t ls_index_check(const char *index, int64_t entries, int is_timeindex,
                       int64_t max_relative_offset)
{
    if (entries < 0 || (!index && entries))
        return LS_ERR_ARG;
    int64_t prev_rel = -1, prev_key = INT64_MIN;
    for (int64_t i = 0; i < entries; i++) {
        int64_t rel, key;
        if (is_timeindex) {
            const char *e = index + i * LS_TIMEINDEX_ENTRY_SIZE;
            key = ls_load_i64(e);
            rel = ls_load_i32(e + 8);
            if (rel < prev_rel)
                return i;
        } else {
            const char *e = index + i * LS_INDEX_ENTRY_SIZE;
            rel = ls_load_i32(e);
            key = ls_load_i32(e + 4);
            if (rel <= prev_rel || key < 0)
                return i;
        }
        if (rel < 0 || rel > max_relative_offset || (i > 0 && key <= prev_key))
            return i;
        prev_rel = rel;
        prev_key = key;
    }
    return -1;
}

int64_t ls_index_entries(const char *index, int64_t cap_entries, int is_timeindex)
{
    if (cap_entries < 0 || (!index && cap_entries))
        return LS_ERR_ARG;
    const int64_t size = is_timeindex ? LS_TIMEINDEX_ENTRY_SIZE : LS_INDEX_ENTRY_SIZE;
    for (int64_t i = 0; i < cap_entries; i++) {
        const char *e = index + i * size;
        uint64_t head;
        memcpy(&head, e, 8);
        if (head == 0 && (!is_timeindex || ls_load_be32(e + 8) == 0))
            return i;
    }
    return cap_entries;
}
