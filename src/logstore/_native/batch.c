/* batch.c -- one RecordBatch v2: header, validation, record encoding and record decoding.
 *
 * A record (inside a batch, after the 61-byte header) is: varint length of the rest, int8
 * attributes, varlong timestampDelta, varint offsetDelta, varint keyLength (-1 = null) + key,
 * varint valueLength (-1 = null) + value, varint headerCount, then per header varint keyLength
 * (>= 0) + key, varint valueLength (-1 = null) + value. All varints are zigzag; every int32 field
 * must decode into the int32 range.
 */
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "logstore.h"
#include "ls_internal.h"

static const char ls_empty[1];

/* ---- header ---- */

void ls_header_load(const char *b, ls_batch_header *h)
{
    h->base_offset = ls_load_i64(b + LS_POS_BASE_OFFSET);
    h->batch_length = ls_load_i32(b + LS_POS_BATCH_LENGTH);
    h->partition_leader_epoch = ls_load_i32(b + LS_POS_LEADER_EPOCH);
    h->magic = (int8_t)b[LS_POS_MAGIC];
    h->crc = ls_load_be32(b + LS_POS_CRC);
    h->attributes = ls_load_i16(b + LS_POS_ATTRIBUTES);
    h->last_offset_delta = ls_load_i32(b + LS_POS_LAST_OFFSET_DELTA);
    h->base_timestamp = ls_load_i64(b + LS_POS_BASE_TIMESTAMP);
    h->max_timestamp = ls_load_i64(b + LS_POS_MAX_TIMESTAMP);
    h->producer_id = ls_load_i64(b + LS_POS_PRODUCER_ID);
    h->producer_epoch = ls_load_i16(b + LS_POS_PRODUCER_EPOCH);
    h->base_sequence = ls_load_i32(b + LS_POS_BASE_SEQUENCE);
    h->records_count = ls_load_i32(b + LS_POS_RECORDS_COUNT);
}

int ls_batch_header_parse(const char *buf, int64_t len, ls_batch_header *hdr)
{
    if (len < LS_BATCH_HEADER_SIZE)
        return LS_ERR_TRUNCATED;
    if (!buf || !hdr)
        return LS_ERR_ARG;
    ls_header_load(buf, hdr);
    return LS_OK;
}

/* Order of checks: size and magic first (they decide how many bytes the batch claims), then the
 * CRC (a torn or bit-flipped batch reports LS_ERR_CRC with both CRCs), then the field ranges of a
 * CRC-valid header (LS_ERR_CORRUPT). Beyond the contract's list, baseOffset + lastOffsetDelta must
 * not exceed INT64_MAX, so that every record offset of a valid batch is representable. */
int64_t ls_batch_validate(const char *buf, int64_t len, int64_t max_batch_bytes,
                          ls_batch_header *hdr, uint32_t *computed_crc)
{
    return ls_batch_check(buf, len, max_batch_bytes, hdr, computed_crc, 1);
}

int64_t ls_batch_check(const char *buf, int64_t len, int64_t max_batch_bytes, ls_batch_header *hdr,
                       uint32_t *computed_crc, int verify_crc)
{
    ls_batch_header local;
    if (!hdr)
        hdr = &local;
    if (len < LS_BATCH_HEADER_SIZE)
        return LS_ERR_TRUNCATED;
    if (!buf)
        return LS_ERR_ARG;
    ls_header_load(buf, hdr);
    if (hdr->batch_length < LS_BATCH_MIN_LENGTH)
        return LS_ERR_CORRUPT;
    if (hdr->magic != LS_MAGIC)
        return LS_ERR_MAGIC;
    int64_t size = (int64_t)LS_LOG_OVERHEAD + hdr->batch_length;
    if (max_batch_bytes > 0 && size > max_batch_bytes)
        return LS_ERR_TOO_LARGE;
    if (size > len)
        return LS_ERR_TRUNCATED;
    if (verify_crc) {
        uint32_t crc = ls_crc32c(0, buf + LS_POS_ATTRIBUTES, (size_t)(size - LS_POS_ATTRIBUTES));
        if (computed_crc)
            *computed_crc = crc;
        if (crc != hdr->crc)
            return LS_ERR_CRC;
    }
    int64_t lod = hdr->last_offset_delta;
    if (lod < 0 || hdr->records_count < 0 || hdr->records_count > lod + 1)
        return LS_ERR_CORRUPT;
    if ((hdr->attributes & LS_ATTR_COMPRESSION_MASK) == LS_COMPRESSION_NONE &&
        (int64_t)hdr->records_count * LS_RECORD_MIN_SIZE > size - LS_BATCH_HEADER_SIZE)
        return LS_ERR_CORRUPT;
    if (hdr->base_offset < 0 || hdr->base_offset > INT64_MAX - lod)
        return LS_ERR_CORRUPT;
    return size;
}

/* ---- record decoding ---- */

/* Any framing error inside a record's declared length means the length does not cover its
 * fields: LS_ERR_CORRUPT, never LS_ERR_TRUNCATED. */
#define FIELD(call)                                                                                \
    do {                                                                                           \
        if ((call) != LS_OK)                                                                       \
            return LS_ERR_CORRUPT;                                                                 \
    } while (0)

/* Walks `count` headers in [*pp, end): header keys in [0, remaining], values in [-1, remaining].
 * Fills the arrays (positions relative to base) when key_pos is non-NULL. */
static int headers_walk(const char **pp, const char *end, const char *base, int32_t count,
                        int32_t *key_pos, int32_t *key_len, int32_t *value_pos,
                        int32_t *value_len)
{
    const char *p = *pp;
    for (int32_t j = 0; j < count; j++) {
        int32_t kl, vl;
        FIELD(ls_read_varint32(&p, end, &kl));
        if (kl < 0 || kl > end - p)
            return LS_ERR_CORRUPT;
        const char *k = p;
        p += kl;
        FIELD(ls_read_varint32(&p, end, &vl));
        if (vl < -1 || vl > end - p)
            return LS_ERR_CORRUPT;
        if (key_pos) {
            key_pos[j] = (int32_t)(k - base);
            key_len[j] = kl;
            value_pos[j] = (int32_t)(p - base);
            value_len[j] = vl;
        }
        if (vl > 0)
            p += vl;
    }
    *pp = p;
    return LS_OK;
}

int ls_headers_check(const char *buf, int64_t len, int32_t count)
{
    const char *p = buf, *end = buf + len;
    if (count < 0 || (int64_t)count * 2 > len)
        return LS_ERR_CORRUPT;
    if (headers_walk(&p, end, buf, count, NULL, NULL, NULL, NULL) != LS_OK || p != end)
        return LS_ERR_CORRUPT;
    return LS_OK;
}

/* A records section is valid iff it holds exactly records_count records; each record's length
 * lies in [0, remaining] and covers exactly its fields; key/value lengths lie in [-1, remaining
 * in the record]; offsetDelta lies in [0, lastOffsetDelta] and strictly increases; header counts
 * are >= 0 and every header is well formed. The section running out before the last record (or
 * inside a record length varint) is LS_ERR_TRUNCATED; anything else is LS_ERR_CORRUPT. */
/* One Arrow BinaryView view (ls_binary_views' layout) of the l bytes at p, at position at of the
 * decoded buffer (data buffer 0); l -1 (null): all zero. The bytes lie in a validated record. */
static inline void write_view(uint8_t *view, const char *p, int32_t l, int32_t at)
{
    memset(view, 0, 16);
    if (l < 0)
        return;
    memcpy(view, &l, 4);
    if (l <= 12) {
        if (l > 0)
            memcpy(view + 4, p, (size_t)l);
    } else {
        memcpy(view + 4, p, 4);
        memcpy(view + 12, &at, 4);
    }
}

/* Bit `bit` of row's byte of a validity bitmap set (valid) or cleared (null, counted). */
static inline void set_valid(uint8_t *bits, int64_t row, uint8_t bit, int valid, int32_t *nulls)
{
    if (valid) {
        bits[row >> 3] |= bit;
    } else {
        bits[row >> 3] &= (uint8_t)~bit;
        (*nulls)++;
    }
}

int64_t ls_records_walk(const char *buf, int64_t start, int64_t end, const ls_batch_header *hdr,
                        int64_t min_offset, const ls_walk *walk, ls_records_out *out)
{
    const int64_t max_rows = walk ? walk->max_rows : INT64_MAX;
    const int trusted = walk && walk->trusted;
    int32_t *marks = walk && walk->nmarks > 0 ? walk->marks : NULL;
    int32_t n = hdr->records_count, lod = hdr->last_offset_delta;
    int64_t base = hdr->base_offset;
    if (n < 0 || lod < 0 || n > (int64_t)lod + 1 || base < 0 || base > INT64_MAX - lod)
        return LS_ERR_CORRUPT;
    const int log_append = (hdr->attributes & LS_ATTR_TIMESTAMP_TYPE) != 0;
    const uint64_t base_ts = (uint64_t)hdr->base_timestamp;
    const char *p = buf + start, *e = buf + end;
    int64_t row = out ? out->count : 0;
    const int64_t first_row = row;
    /* The Arrow columns beside the views, with their counts: committed with out->count. */
    const int arrow = out && out->key_views && out->value_views && out->key_valid && out->value_valid
                      && out->timestamps_us && out->timestamp_types32;
    int32_t key_nulls = arrow && row ? out->key_nulls : 0, value_nulls = arrow && row ? out->value_nulls : 0;
    int64_t views_end = arrow && row ? out->views_end : 0;
    int64_t prev_delta = -1;
    int32_t i = 0;
    const int32_t stride = marks && n > 0 ? (int32_t)(((int64_t)n + walk->nmarks - 1) / walk->nmarks) : 0;
    if (trusted && n == (int64_t)lod + 1 && min_offset > base) {
        /* A validated batch with as many records as offset deltas has the deltas 0, 1, ...:
         * the record wanted is number min_offset - base, reached from the mark before it on the
         * record lengths alone (a walk from the start chases ~250 dependent loads through
         * memory for a 1000-record batch). */
        int64_t skip = min_offset - base < n ? min_offset - base : n;
        if (stride > 0) {
            int32_t m = (int32_t)((skip < n ? skip : n - 1) / stride);
            int64_t at = marks[m];
            if (at >= 0 && at < end - start) {
                p = buf + start + at;
                i = m * stride;
                /* The walk chases one record length to the next, so each cache line it needs
                 * is a miss in turn. Ask for the lines up to about the record wanted at once,
                 * estimated between this mark and the next (a prefetch never faults). */
                int64_t next = m + 1 < walk->nmarks ? marks[m + 1] : end - start;
                if (next <= at || next > end - start)
                    next = end - start;
                int64_t ahead = (next - at) * (skip - i) / stride + 256;
                const char *stop = p + (ahead < next - at ? ahead : next - at);
                for (const char *q = p; q < stop; q += 64)
                    __builtin_prefetch(q);
            }
        }
        for (; i < skip; i++) {
            int32_t rec_len;
            int rc = ls_read_varint32(&p, e, &rec_len);
            if (rc != LS_OK)
                return rc;
            if (rec_len < 0 || rec_len > e - p)
                return LS_ERR_CORRUPT;
            p += rec_len;
        }
        prev_delta = i - 1;
    }

    for (; i < n; i++) {
        int32_t rec_len, od, kl, vl, hc;
        int64_t ts_delta;
        if (stride > 0 && !trusted && i % stride == 0)
            marks[i / stride] = (int32_t)(p - (buf + start));
        int rc = ls_read_varint32(&p, e, &rec_len);
        if (rc != LS_OK)
            return rc;
        if (rec_len < 0)
            return LS_ERR_CORRUPT;
        if (rec_len > e - p)
            return LS_ERR_TRUNCATED;
        const char *re = p + rec_len;
        if (p >= re)
            return LS_ERR_CORRUPT;
        /* The fields are read through f; the next record starts at re whatever they say (a
         * record that does not end exactly at re fails below), so the walk to the next record
         * does not wait for this one's fields. */
        const char *f = p + 1; /* record attributes: unused by Kafka, any value */
        p = re;
        FIELD(ls_read_varlong(&f, re, &ts_delta));
        FIELD(ls_read_varint32(&f, re, &od));
        if (od <= prev_delta || od > lod)
            return LS_ERR_CORRUPT;
        prev_delta = od;
        if (trusted && base + od < min_offset)
            continue; /* a record before the one wanted, in a batch validated before */
        FIELD(ls_read_varint32(&f, re, &kl));
        if (kl < -1 || kl > re - f)
            return LS_ERR_CORRUPT;
        const char *k = f;
        if (kl > 0)
            f += kl;
        FIELD(ls_read_varint32(&f, re, &vl));
        if (vl < -1 || vl > re - f)
            return LS_ERR_CORRUPT;
        const char *v = f;
        if (vl > 0)
            f += vl;
        FIELD(ls_read_varint32(&f, re, &hc));
        if (hc < 0 || hc > (re - f) / 2)
            return LS_ERR_CORRUPT;
        const char *h = f;
        if (hc > 0 && headers_walk(&f, re, buf, hc, NULL, NULL, NULL, NULL) != LS_OK)
            return LS_ERR_CORRUPT;
        if (f != re)
            return LS_ERR_CORRUPT;

        int64_t offset = base + od;
        if (out && offset >= min_offset && row - first_row < max_rows) {
            out->offsets[row] = offset;
            if (log_append) {
                out->timestamps[row] = hdr->max_timestamp;
                out->timestamp_types[row] = LS_TIMESTAMP_LOG_APPEND_TIME;
            } else {
                out->timestamps[row] = (int64_t)(base_ts + (uint64_t)ts_delta);
                out->timestamp_types[row] = LS_TIMESTAMP_CREATE_TIME;
            }
            out->key_pos[row] = (int32_t)(k - buf);
            out->key_len[row] = kl;
            out->value_pos[row] = (int32_t)(v - buf);
            out->value_len[row] = vl;
            if (out->key_views && out->value_views) {
                write_view(out->key_views + (size_t)row * 16, k, kl, (int32_t)(k - buf));
                write_view(out->value_views + (size_t)row * 16, v, vl, (int32_t)(v - buf));
            }
            if (arrow) {
                const uint8_t bit = (uint8_t)(1u << (row & 7));
                const int64_t t = out->timestamps[row];
                out->timestamps_us[row] = t > INT64_MAX / 1000 ? INT64_MAX : t < -(INT64_MAX / 1000) ? INT64_MIN : t * 1000;
                out->timestamp_types32[row] = out->timestamp_types[row];
                set_valid(out->key_valid, row, bit, kl >= 0, &key_nulls);
                set_valid(out->value_valid, row, bit, vl >= 0, &value_nulls);
                if (kl > 12 && (k - buf) + kl > views_end)
                    views_end = (k - buf) + kl;
                if (vl > 12 && (v - buf) + vl > views_end)
                    views_end = (v - buf) + vl;
            }
            out->headers_pos[row] = (int32_t)(h - buf);
            out->headers_len[row] = (int32_t)(re - h);
            out->header_count[row] = hc;
            row++;
            if (trusted && row - first_row == max_rows) {
                out->count = (int32_t)row;
                if (arrow) {
                    out->key_nulls = key_nulls;
                    out->value_nulls = value_nulls;
                    out->views_end = views_end;
                }
                return row - first_row;
            }
        }
    }
    if (p != e)
        return LS_ERR_CORRUPT;
    if (out) {
        out->count = (int32_t)row;
        if (arrow) {
            out->key_nulls = key_nulls;
            out->value_nulls = value_nulls;
            out->views_end = views_end;
        }
    }
    return row - first_row;
}

/* out is usable iff its arrays exist and 0 <= count <= capacity. */
int ls_records_out_ok(const ls_records_out *out)
{
    return out && out->count >= 0 && out->count <= out->capacity && out->offsets &&
           out->timestamps && out->timestamp_types && out->key_pos && out->key_len &&
           out->value_pos && out->value_len && out->headers_pos && out->headers_len &&
           out->header_count;
}

int64_t ls_records_decode(const char *buf, int64_t len, const ls_batch_header *hdr,
                          int64_t min_offset, ls_records_out *out)
{
    /* Positions are int32: a section longer than INT32_MAX cannot be described. */
    if (!hdr || !ls_records_out_ok(out) || len < 0 || len > INT32_MAX || (!buf && len))
        return LS_ERR_ARG;
    if (!buf)
        buf = ls_empty;
    /* Checked before NOSPACE so that a caller never grows its arrays for an impossible count. */
    if (hdr->records_count < 0 || (int64_t)hdr->records_count * LS_RECORD_MIN_SIZE > len)
        return LS_ERR_CORRUPT;
    if (hdr->records_count > out->capacity - out->count)
        return LS_ERR_NOSPACE;
    return ls_records_walk(buf, 0, len, hdr, min_offset, NULL, out);
}

int64_t ls_headers_decode(const char *buf, int64_t len, int32_t count, int32_t *key_pos,
                          int32_t *key_len, int32_t *value_pos, int32_t *value_len)
{
    if (count < 0 || len < 0 || len > INT32_MAX || (!buf && len) ||
        (count > 0 && (!key_pos || !key_len || !value_pos || !value_len)))
        return LS_ERR_ARG;
    if (!buf)
        buf = ls_empty;
    if ((int64_t)count * 2 > len)
        return LS_ERR_CORRUPT;
    const char *p = buf, *end = buf + len;
    int rc = headers_walk(&p, end, buf, count, key_pos, key_len, value_pos, value_len);
    if (rc != LS_OK)
        return rc;
    return p == end ? count : LS_ERR_CORRUPT;
}

/* ---- record encoding ---- */

/* The input is valid iff count >= 1, value_lens is present, every key/value/header value length
 * is >= -1, every header key length is >= 0, every header count is >= 0, and every positive length
 * has its data buffer. */
#define IN_KEY_LEN(in, i) ((in)->key_lens ? (in)->key_lens[i] : -1)
#define POS(x) ((x) > 0 ? (int64_t)(x) : 0)

static int in_header_ok(const ls_records_in *in, int64_t hidx)
{
    int32_t hk = in->header_key_lens[hidx], hv = in->header_value_lens[hidx];
    return hk >= 0 && hv >= -1 && (hk == 0 || in->header_keys) && (hv <= 0 || in->header_values);
}

static int in_record_ok(const ls_records_in *in, int32_t i)
{
    int32_t kl = IN_KEY_LEN(in, i), vl = in->value_lens[i];
    int32_t hc = in->header_counts ? in->header_counts[i] : 0;
    return kl >= -1 && vl >= -1 && hc >= 0 && (kl <= 0 || in->keys) && (vl <= 0 || in->values) &&
           (hc == 0 || (in->header_key_lens && in->header_value_lens));
}

int64_t ls_records_bound(const ls_records_in *in)
{
    if (!in || in->count < 1 || !in->value_lens)
        return LS_ERR_ARG;
    int64_t total = 0, hidx = 0;
    for (int32_t i = 0; i < in->count; i++) {
        if (!in_record_ok(in, i))
            return LS_ERR_ARG;
        total += LS_RECORD_MAX_OVERHEAD + POS(IN_KEY_LEN(in, i)) + POS(in->value_lens[i]);
        int32_t hc = in->header_counts ? in->header_counts[i] : 0;
        for (int32_t j = 0; j < hc; j++, hidx++) {
            if (!in_header_ok(in, hidx))
                return LS_ERR_ARG;
            total += LS_HEADER_MAX_OVERHEAD + in->header_key_lens[hidx] +
                     POS(in->header_value_lens[hidx]);
        }
    }
    return total;
}

LS_INLINE char *put_bytes(char *w, const char *src, int32_t len)
{
    w += ls_varint_put(w, len);
    if (len > 0) {
        memcpy(w, src, (size_t)len);
        w += len;
    }
    return w;
}

int64_t ls_records_encode(const ls_records_in *in, int64_t base_timestamp, char *out, int64_t cap)
{
    if (!in || in->count < 1 || !in->value_lens || cap < 0 || (!out && cap))
        return LS_ERR_ARG;
    int64_t used = 0, koff = 0, voff = 0, hkoff = 0, hvoff = 0, hidx = 0;
    int32_t prev_od = -1;
    for (int32_t i = 0; i < in->count; i++) {
        if (!in_record_ok(in, i))
            return LS_ERR_ARG;
        int32_t od = in->offset_deltas ? in->offset_deltas[i] : i;
        if (od <= prev_od)
            return LS_ERR_ARG;
        prev_od = od;
        int32_t kl = IN_KEY_LEN(in, i), vl = in->value_lens[i];
        int32_t hc = in->header_counts ? in->header_counts[i] : 0;
        int64_t ts = in->timestamps ? in->timestamps[i] : base_timestamp;
        int64_t delta = (int64_t)((uint64_t)ts - (uint64_t)base_timestamp);

        int64_t body = 1 + ls_varint_size(delta) + ls_varint_size(od) + ls_varint_size(kl) +
                       POS(kl) + ls_varint_size(vl) + POS(vl) + ls_varint_size(hc);
        for (int32_t j = 0; j < hc; j++) {
            if (!in_header_ok(in, hidx + j))
                return LS_ERR_ARG;
            int32_t hk = in->header_key_lens[hidx + j], hv = in->header_value_lens[hidx + j];
            body += ls_varint_size(hk) + hk + ls_varint_size(hv) + POS(hv);
        }
        if (body > INT32_MAX)
            return LS_ERR_ARG;
        if (ls_varint_size(body) + body > cap - used)
            return LS_ERR_NOSPACE;

        char *w = out + used;
        w += ls_varint_put(w, body);
        *w++ = 0; /* attributes */
        w += ls_varint_put(w, delta);
        w += ls_varint_put(w, od);
        w = put_bytes(w, kl > 0 ? in->keys + koff : NULL, kl);
        w = put_bytes(w, vl > 0 ? in->values + voff : NULL, vl);
        w += ls_varint_put(w, hc);
        for (int32_t j = 0; j < hc; j++, hidx++) {
            int32_t hk = in->header_key_lens[hidx], hv = in->header_value_lens[hidx];
            w = put_bytes(w, hk > 0 ? in->header_keys + hkoff : NULL, hk);
            w = put_bytes(w, hv > 0 ? in->header_values + hvoff : NULL, hv);
            hkoff += hk;
            hvoff += POS(hv);
        }
        koff += POS(kl);
        voff += POS(vl);
        used = w - out;
    }
    return used;
}

/* Stores every field of *hdr except crc, forcing magic = 2 and batchLength = size - 12. */
static void header_store(char *b, int64_t size, ls_batch_header *hdr)
{
    hdr->magic = LS_MAGIC;
    hdr->batch_length = (int32_t)(size - LS_LOG_OVERHEAD);
    ls_store_be64(b + LS_POS_BASE_OFFSET, (uint64_t)hdr->base_offset);
    ls_store_be32(b + LS_POS_BATCH_LENGTH, (uint32_t)hdr->batch_length);
    ls_store_be32(b + LS_POS_LEADER_EPOCH, (uint32_t)hdr->partition_leader_epoch);
    b[LS_POS_MAGIC] = LS_MAGIC;
    ls_store_be16(b + LS_POS_ATTRIBUTES, (uint16_t)hdr->attributes);
    ls_store_be32(b + LS_POS_LAST_OFFSET_DELTA, (uint32_t)hdr->last_offset_delta);
    ls_store_be64(b + LS_POS_BASE_TIMESTAMP, (uint64_t)hdr->base_timestamp);
    ls_store_be64(b + LS_POS_MAX_TIMESTAMP, (uint64_t)hdr->max_timestamp);
    ls_store_be64(b + LS_POS_PRODUCER_ID, (uint64_t)hdr->producer_id);
    ls_store_be16(b + LS_POS_PRODUCER_EPOCH, (uint16_t)hdr->producer_epoch);
    ls_store_be32(b + LS_POS_BASE_SEQUENCE, (uint32_t)hdr->base_sequence);
    ls_store_be32(b + LS_POS_RECORDS_COUNT, (uint32_t)hdr->records_count);
}

/* A header can be written iff the size fits batchLength (int32) and the int16 fields fit int16. */
int64_t ls_batch_finish(char *batch, int64_t total_len, ls_batch_header *hdr)
{
    if (!batch || !hdr || total_len < LS_BATCH_HEADER_SIZE ||
        total_len - LS_LOG_OVERHEAD > INT32_MAX || hdr->attributes < INT16_MIN ||
        hdr->attributes > INT16_MAX || hdr->producer_epoch < INT16_MIN ||
        hdr->producer_epoch > INT16_MAX)
        return LS_ERR_ARG;
    header_store(batch, total_len, hdr);
    hdr->crc = ls_crc32c(0, batch + LS_POS_ATTRIBUTES, (size_t)(total_len - LS_POS_ATTRIBUTES));
    ls_store_be32(batch + LS_POS_CRC, hdr->crc);
    return total_len;
}

int64_t ls_batch_encode(const ls_records_in *in, ls_batch_header *hdr, char *out, int64_t cap)
{
    if (!in || !hdr || in->count < 1 || (hdr->attributes & LS_ATTR_COMPRESSION_MASK) ||
        cap < 0 || (!out && cap))
        return LS_ERR_ARG;
    if (cap < LS_BATCH_HEADER_SIZE)
        return LS_ERR_NOSPACE;
    int64_t base_ts = hdr->base_timestamp, max_ts = base_ts;
    if (in->timestamps) {
        base_ts = max_ts = in->timestamps[0];
        for (int32_t i = 1; i < in->count; i++)
            if (in->timestamps[i] > max_ts)
                max_ts = in->timestamps[i];
    }
    int64_t n = ls_records_encode(in, base_ts, out + LS_BATCH_HEADER_SIZE,
                                  cap - LS_BATCH_HEADER_SIZE);
    if (n < 0)
        return n;
    hdr->base_timestamp = base_ts;
    hdr->max_timestamp = max_ts;
    hdr->last_offset_delta = in->offset_deltas ? in->offset_deltas[in->count - 1] : in->count - 1;
    hdr->records_count = in->count;
    return ls_batch_finish(out, LS_BATCH_HEADER_SIZE + n, hdr);
}
