/* ls_internal.h -- helpers shared by the C core's .c files (not part of the cffi cdef).
 *
 * Big-endian loads/stores go through memcpy, so they are valid at any alignment. Varint readers
 * take [p, end) and never read at or past end. Zigzag is done on unsigned values, so no signed
 * arithmetic can overflow.
 */
#ifndef LS_INTERNAL_H
#define LS_INTERNAL_H

/* Include after <stdint.h>, <stddef.h>, <string.h> and "logstore.h" (which has no guard and must
 * be included exactly once per file). */

#define LS_INLINE static inline __attribute__((always_inline))
#define LS_LIKELY(x) __builtin_expect(!!(x), 1)
#define LS_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- big-endian loads and stores ---- */

LS_INLINE uint16_t ls_load_be16(const char *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap16(v);
#endif
    return v;
}

LS_INLINE uint32_t ls_load_be32(const char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

LS_INLINE uint64_t ls_load_be64(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

LS_INLINE void ls_store_be16(char *p, uint16_t v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap16(v);
#endif
    memcpy(p, &v, 2);
}

LS_INLINE void ls_store_be32(char *p, uint32_t v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, 4);
}

LS_INLINE void ls_store_be64(char *p, uint64_t v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

/* Signed views of the loads (two's complement conversion, defined by GCC and Clang). */
LS_INLINE int16_t ls_load_i16(const char *p) { return (int16_t)ls_load_be16(p); }
LS_INLINE int32_t ls_load_i32(const char *p) { return (int32_t)ls_load_be32(p); }
LS_INLINE int64_t ls_load_i64(const char *p) { return (int64_t)ls_load_be64(p); }

/* ---- zigzag varints ---- */

LS_INLINE uint64_t ls_zigzag64(int64_t v)
{
    uint64_t u = (uint64_t)v;
    return (u << 1) ^ (0 - (u >> 63));
}

LS_INLINE int64_t ls_unzigzag64(uint64_t z) { return (int64_t)((z >> 1) ^ (0 - (z & 1))); }

/* Bytes of the varint encoding of v (1..10). */
LS_INLINE int ls_varint_size(int64_t v)
{
    uint64_t z = ls_zigzag64(v) | 1;
    int bits = 64 - __builtin_clzll(z);
    return (bits + 6) / 7;
}

/* Writes the varint of v at out (room for LS_VARINT_MAX_BYTES is the caller's duty); returns the
 * byte count. */
LS_INLINE int ls_varint_put(char *out, int64_t v)
{
    uint64_t z = ls_zigzag64(v);
    int n = 0;
    while (z >= 0x80) {
        out[n++] = (char)(unsigned char)(z | 0x80);
        z >>= 7;
    }
    out[n++] = (char)(unsigned char)z;
    return n;
}

/* Reads a varlong (at most 10 bytes) from [*pp, end). On success stores the value, advances *pp
 * and returns LS_OK; else LS_ERR_TRUNCATED (end reached first) or LS_ERR_CORRUPT (no terminating
 * byte within 10 bytes). Bits beyond 64 in the tenth byte are dropped, as Kafka's readVarlong
 * does. */
LS_INLINE int ls_read_varlong(const char **pp, const char *end, int64_t *value)
{
    const unsigned char *p = (const unsigned char *)*pp;
    const unsigned char *e = (const unsigned char *)end;
    if (LS_LIKELY(e - p >= 2 && (p[0] < 0x80 || p[1] < 0x80))) {
        /* one or two bytes (a record's timestamp delta mostly): no loop */
        uint64_t z = p[0] & 0x7f;
        int n = 1;
        if (p[0] >= 0x80) {
            z |= (uint64_t)p[1] << 7;
            n = 2;
        }
        *value = ls_unzigzag64(z);
        *pp = (const char *)(p + n);
        return LS_OK;
    }
    uint64_t z = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p >= e)
            return LS_ERR_TRUNCATED;
        unsigned b = *p++;
        z |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80) {
            *value = ls_unzigzag64(z);
            *pp = (const char *)p;
            return LS_OK;
        }
    }
    return LS_ERR_CORRUPT;
}

/* Reads a varint that must decode into the int32 range (at most 5 bytes, zigzag value <=
 * UINT32_MAX). Returns LS_OK, LS_ERR_TRUNCATED, or LS_ERR_CORRUPT for anything longer or out of
 * range. */
LS_INLINE int ls_read_varint32(const char **pp, const char *end, int32_t *value)
{
    const unsigned char *p = (const unsigned char *)*pp;
    const unsigned char *e = (const unsigned char *)end;
    if (LS_LIKELY(p < e && *p < 0x80)) {
        uint32_t z = *p;
        *value = (int32_t)((z >> 1) ^ (0u - (z & 1)));
        *pp = (const char *)(p + 1);
        return LS_OK;
    }
    if (LS_LIKELY(e - p >= 2 && p[1] < 0x80)) {
        /* two bytes (a record's length, a 200-byte value's, an offset delta past 63) */
        uint32_t z = (uint32_t)(p[0] & 0x7f) | (uint32_t)p[1] << 7;
        *value = (int32_t)((z >> 1) ^ (0u - (z & 1)));
        *pp = (const char *)(p + 2);
        return LS_OK;
    }
    uint64_t z = 0;
    for (int shift = 0; shift < 35; shift += 7) {
        if (p >= e)
            return LS_ERR_TRUNCATED;
        unsigned b = *p++;
        z |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80) {
            if (z > UINT32_MAX)
                return LS_ERR_CORRUPT;
            uint32_t z32 = (uint32_t)z;
            *value = (int32_t)((z32 >> 1) ^ (0u - (z32 & 1)));
            *pp = (const char *)p;
            return LS_OK;
        }
    }
    return LS_ERR_CORRUPT;
}

/* ---- index entries ---- */

LS_INLINE void ls_index_put(char *index, int64_t slot, int64_t relative_offset, int64_t position)
{
    char *e = index + slot * LS_INDEX_ENTRY_SIZE;
    ls_store_be32(e, (uint32_t)relative_offset);
    ls_store_be32(e + 4, (uint32_t)position);
}

LS_INLINE void ls_timeindex_put(char *index, int64_t slot, int64_t timestamp,
                                int64_t relative_offset)
{
    char *e = index + slot * LS_TIMEINDEX_ENTRY_SIZE;
    ls_store_be64(e, (uint64_t)timestamp);
    ls_store_be32(e + 8, (uint32_t)relative_offset);
}

/* ---- shared between modules ---- */

/* Fills *hdr from the 61 header bytes at buf (no checks). */
void ls_header_load(const char *buf, ls_batch_header *hdr);

/* How ls_records_walk reads one batch, beyond checking it (see ls_crc_memo in logstore.h). */
typedef struct {
    int64_t max_rows;   /* rows to append at most */
    int trusted;        /* the batch was validated whole before: the walk ends once max_rows rows
                           are appended, records below min_offset are passed over on their length
                           (every length still checked against the section), and for a batch
                           with as many records as offset deltas the walk starts at a mark */
    int32_t *marks;     /* NULL, or nmarks record positions (relative to the section) of records
                           0, stride, 2 * stride, ... (stride = ceil(records_count / nmarks)):
                           written by a walk that is not trusted, read by one that is (and
                           checked against the section before use) */
    int32_t nmarks;
} ls_walk;

/* Checks the framing of an uncompressed records section [buf + start, buf + end) against *hdr and,
 * when out is non-NULL, appends the rows with offset >= min_offset (positions relative to buf); the
 * caller has checked that out has records_count (or walk->max_rows) free rows. walk may be NULL
 * (every row, batch not trusted). Returns rows appended (0 when out is NULL) or LS_ERR_TRUNCATED /
 * LS_ERR_CORRUPT; on error out->count is unchanged. */
int64_t ls_records_walk(const char *buf, int64_t start, int64_t end, const ls_batch_header *hdr,
                        int64_t min_offset, const ls_walk *walk, ls_records_out *out);

/* ls_batch_validate, with the CRC computed and compared only when verify_crc is non-zero. */
int64_t ls_batch_check(const char *buf, int64_t len, int64_t max_batch_bytes, ls_batch_header *hdr,
                       uint32_t *computed_crc, int verify_crc);

/* LS_OK when buf[0, len) holds exactly `count` well-formed headers, else LS_ERR_CORRUPT. */
int ls_headers_check(const char *buf, int64_t len, int32_t count);

/* 1 when out's arrays exist and 0 <= count <= capacity. */
int ls_records_out_ok(const ls_records_out *out);

/* 1 when buf[0, len) holds only zero bytes. */
int ls_all_zero(const char *buf, int64_t len);

#endif
