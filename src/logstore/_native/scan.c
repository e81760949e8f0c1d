/* scan.c -- walking the consecutive batches of a segment: decoding for reads, validation and index
 * rebuilding for crash recovery.
 *
 * Segment positions are int32 in index entries and in ls_records_out, so both walks accept
 * buffers of at most INT32_MAX bytes (Kafka's segment.bytes is an int as well).
 */
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "logstore.h"
#include "ls_internal.h"

int ls_all_zero(const char *buf, int64_t len)
{
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, buf + i, 8);
        if (w)
            return 0;
    }
    for (; i < len; i++)
        if (buf[i])
            return 0;
    return 1;
}

/* A batch can be skipped without validation iff its header is present with magic 2 and a
 * batchLength that fits in the buffer, and the header of the batch right after it is present
 * too, with magic 2, a base offset above this batch's and not above min_offset. The records of
 * the skipped batch are then all below min_offset whatever its own (unchecked) lastOffsetDelta
 * says, and a damaged batchLength cannot carry the walk past the batch holding min_offset: it
 * would land on a position whose header fails these checks, and the batch is validated (and its
 * CRC, computed over the claimed length, fails). Returns the size, or 0 to validate instead. */
static int64_t skippable(const char *b, int64_t avail, int64_t min_offset, ls_batch_header *hdr)
{
    if (avail < LS_BATCH_HEADER_SIZE)
        return 0;
    ls_header_load(b, hdr);
    int64_t size = (int64_t)LS_LOG_OVERHEAD + hdr->batch_length;
    if (hdr->magic != LS_MAGIC || hdr->batch_length < LS_BATCH_MIN_LENGTH ||
        size + LS_BATCH_HEADER_SIZE > avail || hdr->base_offset < 0)
        return 0;
    ls_batch_header next;
    ls_header_load(b + size, &next);
    if (next.magic != LS_MAGIC || next.base_offset <= hdr->base_offset || next.base_offset > min_offset)
        return 0;
    return size;
}

static int memo_ok(const ls_crc_memo *memo)
{
    return !memo || (memo->positions && memo->crcs && memo->slots > 0 &&
                     (memo->slots & (memo->slots - 1)) == 0 && memo->nmarks >= 0 &&
                     (memo->nmarks == 0 || memo->marks));
}

/* The memo is 4-way set associative: a batch's position hashes to a bucket of MEMO_WAYS
 * consecutive slots (fewer when the memo has fewer slots). Direct mapping made two batches that
 * share a slot evict each other on every alternate read, each eviction a CRC of the batch. */
#define MEMO_WAYS 4

static int32_t memo_bucket(const ls_crc_memo *memo, int64_t position, int32_t *ways)
{
    *ways = memo->slots < MEMO_WAYS ? memo->slots : MEMO_WAYS;
    int32_t slot = (int32_t)(((uint64_t)position * 0x9E3779B97F4A7C15ull) >> 32) & (memo->slots - 1);
    return slot & ~(*ways - 1);
}

/* The slot remembering the batch at `position` with this stored CRC, or -1. */
static int32_t memo_find(const ls_crc_memo *memo, int64_t position, uint32_t stored_crc)
{
    int32_t ways, b = memo_bucket(memo, position, &ways);
    for (int32_t i = 0; i < ways; i++)
        if (memo->positions[b + i] == position + 1 && memo->crcs[b + i] == stored_crc)
            return b + i;
    return -1;
}

/* The slot to remember the batch at `position` in: the one that held that position, else an
 * empty one, else one picked by the stored CRC (random replacement). */
static int32_t memo_claim(const ls_crc_memo *memo, int64_t position, uint32_t stored_crc)
{
    int32_t ways, b = memo_bucket(memo, position, &ways), empty = -1;
    for (int32_t i = 0; i < ways; i++) {
        if (memo->positions[b + i] == position + 1)
            return b + i;
        if (memo->positions[b + i] == 0 && empty < 0)
            empty = b + i;
    }
    return empty >= 0 ? empty : b + (int32_t)(stored_crc % (uint32_t)ways);
}

int ls_segment_decode(const char *buf, int64_t len, int64_t min_offset, int64_t max_offset,
                      int64_t max_batch_bytes, ls_cursor *cur, ls_records_out *out)
{
    if (!cur || !ls_records_out_ok(out) || len < 0 || len > INT32_MAX || (!buf && len) ||
        cur->position < 0 || cur->position > len || !memo_ok(cur->memo))
        return LS_ERR_ARG;
    ls_batch_header *hdr = &cur->header;
    for (;;) {
        int64_t pos = cur->position;
        if (pos == len) {
            cur->stop = LS_STOP_END;
            return LS_OK;
        }
        const char *b = buf + pos;
        /* The max_offset bound is checked on the raw header so that batches past it are never
         * validated (they are not part of this read). */
        if (max_offset >= 0 && len - pos >= LS_BATCH_HEADER_SIZE) {
            ls_header_load(b, hdr);
            if (hdr->base_offset >= max_offset) {
                cur->stop = LS_STOP_MAX_OFFSET;
                return LS_OK;
            }
        }
        int64_t size = skippable(b, len - pos, min_offset, hdr);
        int skipped = size > 0, trusted = 0;
        int32_t slot = -1;
        if (!skipped) {
            if (cur->partial && cur->memo && len - pos >= LS_BATCH_HEADER_SIZE) {
                ls_header_load(b, hdr);
                slot = memo_find(cur->memo, pos, hdr->crc);
                trusted = slot >= 0;
            }
            size = ls_batch_check(b, len - pos, max_batch_bytes, hdr, &cur->computed_crc, !trusted);
        }
        if (size < 0) {
            cur->stop = LS_STOP_ERROR;
            return (int)size;
        }
        if (hdr->base_offset <= cur->prev_last_offset) {
            cur->stop = LS_STOP_ERROR;
            return LS_ERR_CORRUPT;
        }
        /* Control batches (transaction markers, leader changes) are validated like any batch
         * but hold no user records: a read passes over them, as Kafka's consumers do. */
        if (!skipped && !(hdr->attributes & LS_ATTR_CONTROL) &&
            hdr->base_offset + hdr->last_offset_delta >= min_offset) {
            if (hdr->attributes & LS_ATTR_COMPRESSION_MASK) {
                cur->stop = LS_STOP_COMPRESSED;
                return LS_OK;
            }
            int64_t room = (int64_t)out->capacity - out->count;
            if (cur->partial ? room == 0 : hdr->records_count > room) {
                cur->stop = LS_STOP_FULL;
                return LS_OK;
            }
            ls_walk walk = {room, trusted, NULL, 0};
            if (cur->partial && cur->memo) {
                if (!trusted) {
                    slot = memo_claim(cur->memo, pos, hdr->crc);
                    cur->memo->positions[slot] = 0; /* its marks are rewritten below */
                    if (cur->memo->nexts)
                        cur->memo->nexts[slot] = 0;
                }
                if (cur->memo->nmarks > 0) {
                    walk.marks = cur->memo->marks + (int64_t)slot * cur->memo->nmarks;
                    walk.nmarks = cur->memo->nmarks;
                }
            }
            int64_t n = ls_records_walk(buf, pos + LS_BATCH_HEADER_SIZE, pos + size, hdr,
                                        min_offset, &walk, out);
            if (n < 0) {
                cur->stop = LS_STOP_ERROR;
                return (int)n;
            }
            if (cur->partial && cur->memo && !trusted) {
                /* validated whole: CRC, every record, marks */
                cur->memo->positions[slot] = pos + 1;
                cur->memo->crcs[slot] = hdr->crc;
            }
        }
        /* A skipped batch's lastOffsetDelta is unchecked: only its base offset is trusted. */
        cur->prev_last_offset = skipped ? hdr->base_offset : hdr->base_offset + hdr->last_offset_delta;
        cur->position = pos + size;
        cur->batches++;
        if (cur->partial && out->count == out->capacity) {
            /* The baseOffset lies outside the CRC: one damaged upwards makes the batch overlap
             * the next, which a walk over whole batches finds at the next batch. A partial walk
             * stops here, so it looks at the next header: its base offset must lie above. */
            int64_t last = cur->prev_last_offset;
            int64_t *next_checked = slot >= 0 && cur->memo && cur->memo->nexts ? &cur->memo->nexts[slot] : NULL;
            if (last == INT64_MAX)
                next_checked = NULL; /* (a damaged base offset: nothing can follow; no note of it) */
            if (len - cur->position >= LS_BATCH_HEADER_SIZE &&
                !(trusted && next_checked && *next_checked == last + 1)) {
                ls_header_load(buf + cur->position, hdr);
                if (hdr->magic == LS_MAGIC && hdr->base_offset <= last) {
                    cur->stop = LS_STOP_ERROR;
                    return LS_ERR_CORRUPT;
                }
                if (next_checked && hdr->magic == LS_MAGIC)
                    *next_checked = last + 1; /* a batch follows, above this one */
            }
            cur->stop = LS_STOP_FULL;
            return LS_OK;
        }
    }
}

int ls_point_read(const char *buf, int64_t len, const char *index, int64_t entries, int64_t base_offset,
                  int64_t offset, int64_t max_offset, ls_point *p)
{
    if (!p)
        return LS_ERR_ARG;
    p->out.count = 0;
    if (len < 0 || len > INT32_MAX || (!buf && len) || entries < 0 || (!index && entries) ||
        !ls_records_out_ok(&p->out) || p->out.capacity < 1)
        return LS_ERR_ARG;
    if (offset < base_offset || len == 0)
        return 0;
    int64_t position = 0;
    int64_t rel = offset - base_offset;
    int64_t slot = ls_index_lookup(index, entries, rel > INT32_MAX ? INT32_MAX : rel);
    if (slot >= 0) {
        const char *e = index + slot * LS_INDEX_ENTRY_SIZE;
        int64_t entry_offset = base_offset + ls_load_i32(e);
        position = ls_load_i32(e + 4);
        if (position < 0 || position > len - LS_BATCH_HEADER_SIZE)
            return 0;
        if (position > 0) {
            ls_batch_header h;
            ls_header_load(buf + position, &h);
            if (h.magic != LS_MAGIC || h.last_offset_delta < 0 || h.base_offset < 0 ||
                h.base_offset > INT64_MAX - h.last_offset_delta ||
                h.base_offset + h.last_offset_delta != entry_offset)
                return 0;
        }
    }
    ls_cursor *cur = &p->cur;
    memset(cur, 0, sizeof *cur);
    cur->position = position;
    cur->prev_last_offset = -1;
    cur->partial = 1;
    cur->memo = p->memo;
    int32_t capacity = p->out.capacity;
    p->out.capacity = 1;
    int rc = ls_segment_decode(buf, len, offset, max_offset, p->max_batch_bytes, cur, &p->out);
    p->out.capacity = capacity;
    return rc == LS_OK && p->out.count == 1 ? 1 : 0;
}

/* A segment prefix is valid iff it is a sequence of batches each of which passes
 * ls_batch_validate, has (when uncompressed) a valid records section, starts after the previous
 * batch's last offset, ends at or after the segment's base offset, and whose last offset is within
 * INT32_MAX of it. Returns LS_OK once res describes the scan (res->status says how it ended), or
 * LS_ERR_ARG for an unusable argument. */
int ls_segment_scan(const char *buf, int64_t len, int64_t base_offset, int64_t index_interval_bytes,
                    int64_t max_batch_bytes, char *index_out, int64_t index_cap,
                    char *timeindex_out, int64_t timeindex_cap, ls_scan_result *res)
{
    if (!res)
        return LS_ERR_ARG;
    memset(res, 0, sizeof *res);
    res->last_offset = -1;
    res->max_timestamp = -1;
    res->offset_of_max_timestamp = -1;
    if (len < 0 || len > INT32_MAX || (!buf && len) || base_offset < 0 ||
        index_interval_bytes < 0 || index_cap < 0 || timeindex_cap < 0 ||
        (!index_out && index_cap) || (!timeindex_out && timeindex_cap)) {
        res->status = LS_ERR_ARG;
        return LS_ERR_ARG;
    }
    int64_t pos = 0, since_entry = 0, last_entry_ts = -1;
    while (pos < len) {
        ls_batch_header h;
        uint32_t crc = 0;
        int64_t size = ls_batch_validate(buf + pos, len - pos, max_batch_bytes, &h, &crc);
        int64_t last = 0;
        if (size >= 0) {
            last = h.base_offset + h.last_offset_delta;
            if (h.base_offset <= res->last_offset || last < base_offset ||
                last - base_offset > INT32_MAX)
                size = LS_ERR_CORRUPT;
            else if (!(h.attributes & LS_ATTR_COMPRESSION_MASK)) {
                int64_t rc = ls_records_walk(buf, pos + LS_BATCH_HEADER_SIZE, pos + size, &h, 0, NULL,
                                             NULL);
                if (rc < 0)
                    size = rc;
            }
        }
        if (size < 0) {
            if (len - pos >= LS_BATCH_HEADER_SIZE)
                res->stored_crc = h.crc;
            res->computed_crc = crc;
            res->status = ls_all_zero(buf + pos, len - pos) ? LS_ERR_ZERO : (int32_t)size;
            break;
        }
        if (h.max_timestamp > res->max_timestamp) {
            res->max_timestamp = h.max_timestamp;
            res->offset_of_max_timestamp = last;
        }
        if (since_entry > index_interval_bytes) {
            if (res->index_entries < index_cap)
                ls_index_put(index_out, res->index_entries++, last - base_offset, pos);
            else
                res->index_full = 1;
            if (res->max_timestamp > last_entry_ts) {
                if (res->timeindex_entries < timeindex_cap) {
                    ls_timeindex_put(timeindex_out, res->timeindex_entries++, res->max_timestamp,
                                     res->offset_of_max_timestamp - base_offset);
                    last_entry_ts = res->max_timestamp;
                } else {
                    res->index_full = 1;
                }
            }
            since_entry = 0;
        }
        since_entry += size;
        pos += size;
        res->batches++;
        if ((h.attributes & (LS_ATTR_CONTROL | LS_ATTR_TRANSACTIONAL)) ==
            (LS_ATTR_CONTROL | LS_ATTR_TRANSACTIONAL))
            res->txn_markers++;
        res->records += h.records_count;
        res->last_offset = last;
    }
    res->valid_bytes = pos;
    return LS_OK;
}
