/* appender.c -- the writer of the active segment, over caller-mapped log and index memory.
 *
 * Invariants kept by every successful append: log[0, position) is a sequence of complete valid
 * batches with increasing offsets; next_offset = last offset + 1; position + every batch stays
 * within log_capacity and INT32_MAX; index and time index entries follow ls_segment_scan's rule,
 * so a recovery scan of a log written in one activation rebuilds them byte for byte (a reopened
 * segment restarts bytes_since_last_entry at 0, as Kafka does, which only changes where later
 * sparse entries fall). A failed append writes nothing.
 */
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "logstore.h"
#include "ls_internal.h"

/* The appender's state is usable iff its buffers exist and its counters are in range. */
static int state_ok(const ls_appender *a)
{
    return a && a->log && a->position >= 0 && a->position <= a->log_capacity &&
           a->base_offset >= 0 && a->next_offset >= a->base_offset && a->index_entries >= 0 &&
           a->timeindex_entries >= 0 && a->index_interval_bytes >= 0 && a->records >= 0 &&
           (a->index || a->index_capacity <= 0) && (a->timeindex || a->timeindex_capacity <= 0);
}

/* A batch of `size` bytes, last offset delta `lod` and `count` records fits iff the log has room
 * (also below INT32_MAX, positions being int32), neither index is full, and its last relative
 * offset and the record count stay within int32. */
static int fits(const ls_appender *a, int64_t size, int32_t lod, int32_t count)
{
    return size <= a->log_capacity - a->position && size <= INT32_MAX - a->position &&
           a->index_entries < a->index_capacity && a->timeindex_entries < a->timeindex_capacity &&
           a->next_offset - a->base_offset <= (int64_t)INT32_MAX - lod &&
           a->records <= INT32_MAX - count;
}

/* Accounts for the batch just written at position: Kafka's LogSegment.append bookkeeping. */
static void commit(ls_appender *a, int64_t size, int64_t last, int64_t max_ts, int32_t count)
{
    if (max_ts > a->max_timestamp) {
        a->max_timestamp = max_ts;
        a->offset_of_max_timestamp = last;
    }
    if (a->bytes_since_last_entry > a->index_interval_bytes) {
        ls_index_put(a->index, a->index_entries++, last - a->base_offset, a->position);
        if (a->max_timestamp > a->last_timeindex_timestamp) {
            ls_timeindex_put(a->timeindex, a->timeindex_entries++, a->max_timestamp,
                             a->offset_of_max_timestamp - a->base_offset);
            a->last_timeindex_timestamp = a->max_timestamp;
        }
        a->bytes_since_last_entry = 0;
    }
    a->bytes_since_last_entry += size;
    a->position += size;
    a->next_offset = last + 1;
    a->records += count;
}

/* Checks a pre-built batch against the appender: returns LS_OK or the error to report. */
static int64_t batch_admissible(const ls_appender *a, const char *batch, int64_t len,
                                ls_batch_header *h)
{
    if (!state_ok(a) || !batch || len < 0)
        return LS_ERR_ARG;
    if (len < LS_BATCH_HEADER_SIZE)
        return LS_ERR_TRUNCATED;
    if (a->max_batch_bytes > 0 && len > a->max_batch_bytes)
        return LS_ERR_TOO_LARGE;
    ls_header_load(batch, h);
    if (h->magic != LS_MAGIC || h->batch_length < LS_BATCH_MIN_LENGTH)
        return LS_ERR_CORRUPT;
    if ((int64_t)LS_LOG_OVERHEAD + h->batch_length != len)
        return (int64_t)LS_LOG_OVERHEAD + h->batch_length > len ? LS_ERR_TRUNCATED : LS_ERR_CORRUPT;
    if (h->last_offset_delta < 0 || h->records_count < 0 ||
        h->records_count > (int64_t)h->last_offset_delta + 1)
        return LS_ERR_CORRUPT;
    if (!fits(a, len, h->last_offset_delta, h->records_count))
        return LS_ERR_FULL;
    return LS_OK;
}

int64_t ls_appender_append_batch(ls_appender *a, const char *batch, int64_t len)
{
    ls_batch_header h;
    int64_t rc = batch_admissible(a, batch, len, &h);
    if (rc != LS_OK)
        return rc;
    char *b = a->log + a->position;
    int64_t base = a->next_offset;
    memcpy(b, batch, (size_t)len);
    ls_store_be64(b + LS_POS_BASE_OFFSET, (uint64_t)base);
    ls_store_be32(b + LS_POS_LEADER_EPOCH, (uint32_t)a->partition_leader_epoch);
    commit(a, len, base + h.last_offset_delta, h.max_timestamp, h.records_count);
    return base;
}

int64_t ls_appender_append_batch_external(ls_appender *a, char *batch, int64_t len,
                                          int64_t *position)
{
    ls_batch_header h;
    if (!position)
        return LS_ERR_ARG;
    int64_t rc = batch_admissible(a, batch, len, &h);
    if (rc != LS_OK)
        return rc;
    int64_t base = a->next_offset;
    ls_store_be64(batch + LS_POS_BASE_OFFSET, (uint64_t)base);
    ls_store_be32(batch + LS_POS_LEADER_EPOCH, (uint32_t)a->partition_leader_epoch);
    *position = a->position;
    commit(a, len, base + h.last_offset_delta, h.max_timestamp, h.records_count);
    return base;
}

/* The one-record batch: attributes 0 or LogAppendTime only; key/value NULL for null; headers
 * (when not NULL) must be exactly header_count well-formed headers. */
int64_t ls_appender_append_record(ls_appender *a, int64_t timestamp, int32_t attributes,
                                  const char *key, int32_t key_len, const char *value,
                                  int32_t value_len, const char *headers, int32_t headers_len,
                                  int32_t header_count)
{
    if (!state_ok(a) || (attributes & ~LS_ATTR_TIMESTAMP_TYPE))
        return LS_ERR_ARG;
    int32_t kl = key ? key_len : -1, vl = value ? value_len : -1;
    if ((key && key_len < 0) || (value && value_len < 0))
        return LS_ERR_ARG;
    int32_t hl = 0;
    if (headers) {
        if (headers_len < 0 || ls_headers_check(headers, headers_len, header_count) != LS_OK)
            return LS_ERR_ARG;
        hl = headers_len;
    } else if (header_count != 0) {
        return LS_ERR_ARG;
    }

    /* attributes, timestampDelta 0, offsetDelta 0: one byte each */
    int64_t body = 3 + ls_varint_size(kl) + (kl > 0 ? kl : 0) + ls_varint_size(vl) +
                   (vl > 0 ? vl : 0) + ls_varint_size(header_count) + hl;
    if (body > INT32_MAX)
        return LS_ERR_TOO_LARGE;
    int64_t size = LS_BATCH_HEADER_SIZE + ls_varint_size(body) + body;
    if (size - LS_LOG_OVERHEAD > INT32_MAX ||
        (a->max_batch_bytes > 0 && size > a->max_batch_bytes))
        return LS_ERR_TOO_LARGE;
    if (!fits(a, size, 0, 1))
        return LS_ERR_FULL;

    char *b = a->log + a->position;
    int64_t offset = a->next_offset;
    ls_store_be64(b + LS_POS_BASE_OFFSET, (uint64_t)offset);
    ls_store_be32(b + LS_POS_BATCH_LENGTH, (uint32_t)(size - LS_LOG_OVERHEAD));
    ls_store_be32(b + LS_POS_LEADER_EPOCH, (uint32_t)a->partition_leader_epoch);
    b[LS_POS_MAGIC] = LS_MAGIC;
    ls_store_be16(b + LS_POS_ATTRIBUTES, (uint16_t)attributes);
    ls_store_be32(b + LS_POS_LAST_OFFSET_DELTA, 0);
    ls_store_be64(b + LS_POS_BASE_TIMESTAMP, (uint64_t)timestamp);
    ls_store_be64(b + LS_POS_MAX_TIMESTAMP, (uint64_t)timestamp);
    ls_store_be64(b + LS_POS_PRODUCER_ID, (uint64_t)(int64_t)LS_NO_PRODUCER_ID);
    ls_store_be16(b + LS_POS_PRODUCER_EPOCH, (uint16_t)(int16_t)LS_NO_PRODUCER_EPOCH);
    ls_store_be32(b + LS_POS_BASE_SEQUENCE, (uint32_t)(int32_t)LS_NO_SEQUENCE);
    ls_store_be32(b + LS_POS_RECORDS_COUNT, 1);

    char *w = b + LS_BATCH_HEADER_SIZE;
    w += ls_varint_put(w, body);
    w[0] = w[1] = w[2] = 0;
    w += 3;
    w += ls_varint_put(w, kl);
    if (kl > 0) {
        memcpy(w, key, (size_t)kl);
        w += kl;
    }
    w += ls_varint_put(w, vl);
    if (vl > 0) {
        memcpy(w, value, (size_t)vl);
        w += vl;
    }
    w += ls_varint_put(w, header_count);
    if (hl > 0)
        memcpy(w, headers, (size_t)hl);
    ls_store_be32(b + LS_POS_CRC,
                  ls_crc32c(0, b + LS_POS_ATTRIBUTES, (size_t)(size - LS_POS_ATTRIBUTES)));

    commit(a, size, offset, timestamp, 1);
    return offset;
}

int ls_appender_seal(ls_appender *a)
{
    if (!state_ok(a))
        return LS_ERR_ARG;
    if (a->max_timestamp <= a->last_timeindex_timestamp)
        return LS_OK;
    if (a->timeindex_entries >= a->timeindex_capacity)
        return LS_ERR_FULL;
    ls_timeindex_put(a->timeindex, a->timeindex_entries++, a->max_timestamp,
                     a->offset_of_max_timestamp - a->base_offset);
    a->last_timeindex_timestamp = a->max_timestamp;
    return LS_OK;
}
