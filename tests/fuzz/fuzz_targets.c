/* fuzz_targets.c -- fuzz targets for the parsers of logstore's C core: everything that reads
 * bytes that came from disk or the network.
 *
 * One file, one LLVMFuzzerTestOneInput per target, chosen at compile time with -DFUZZ_<NAME>:
 *   FUZZ_BATCH    ls_batch_header_parse, ls_batch_validate, ls_records_decode, ls_headers_decode
 *   FUZZ_SEGMENT  ls_segment_decode (offset window from the input) and ls_segment_scan
 *   FUZZ_INDEX    ls_index_entries, ls_index_check, ls_index_lookup, ls_timeindex_lookup
 *   FUZZ_VARINT   ls_varint_decode, and encode/decode round trips of what it decodes
 *   FUZZ_COLUMNS  ls_gather_binary / ls_binary_size with spans taken from the input
 *   FUZZ_FLEXCHECK ls_flex_check, the program and the request both taken from the input
 * Built with clang -fsanitize=fuzzer,address,undefined by `make fuzz`, or with gcc and
 * fuzz_driver.c (corpus replay plus random mutations) by tests/fuzz/test_fuzz_smoke.py.
 * A target must never crash, never read outside its input and never allocate from a length it
 * read; the sanitizers check the first two, the fixed-size buffers below the third. */
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "logstore.h"

#define ROWS 4096

static int64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

static void decode_headers(const char *buf, int64_t len, const ls_records_out *out)
{
    int32_t kp[64], kl[64], vp[64], vl[64];
    for (int32_t i = 0; i < out->count; i++) {
        int32_t count = out->header_count[i];
        if (count <= 0 || count > 64)
            continue;
        int64_t pos = out->headers_pos[i], hlen = out->headers_len[i];
        if (pos < 0 || hlen < 0 || pos > len || hlen > len - pos)
            abort(); /* the decoder promised spans inside the buffer */
        ls_headers_decode(buf + pos, hlen, count, kp, kl, vp, vl);
    }
}

static void check_spans(const ls_records_out *out, int64_t len)
{
    for (int32_t i = 0; i < out->count; i++) {
        if (out->key_len[i] >= 0 && (out->key_pos[i] < 0 || out->key_pos[i] + (int64_t)out->key_len[i] > len))
            abort();
        if (out->value_len[i] >= 0 && (out->value_pos[i] < 0 || out->value_pos[i] + (int64_t)out->value_len[i] > len))
            abort();
    }
}

typedef struct {
    int64_t offsets[ROWS], timestamps[ROWS];
    int8_t types[ROWS];
    int32_t key_pos[ROWS], key_len[ROWS], value_pos[ROWS], value_len[ROWS];
    int32_t headers_pos[ROWS], headers_len[ROWS], header_count[ROWS];
} rows_t;

static void init_out(ls_records_out *out, rows_t *r)
{
    memset(out, 0, sizeof *out);
    out->capacity = ROWS;
    out->offsets = r->offsets;
    out->timestamps = r->timestamps;
    out->timestamp_types = r->types;
    out->key_pos = r->key_pos;
    out->key_len = r->key_len;
    out->value_pos = r->value_pos;
    out->value_len = r->value_len;
    out->headers_pos = r->headers_pos;
    out->headers_len = r->headers_len;
    out->header_count = r->header_count;
}

static rows_t rows;

#if defined(FUZZ_BATCH)
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    ls_batch_header hdr;
    uint32_t crc = 0;
    ls_batch_header_parse(buf, (int64_t)size, &hdr);
    int64_t n = ls_batch_validate(buf, (int64_t)size, 0, &hdr, &crc);
    /* Decode the records section whether or not the CRC matched: a mutated batch with a
     * recomputed CRC reaches the record parser, so the parser must stand on its own. */
    if (size >= LS_BATCH_HEADER_SIZE && (n > 0 || ls_batch_header_parse(buf, (int64_t)size, &hdr) == LS_OK)) {
        ls_records_out out;
        init_out(&out, &rows);
        int64_t body = (int64_t)size - LS_BATCH_HEADER_SIZE;
        if (ls_records_decode(buf + LS_BATCH_HEADER_SIZE, body, &hdr, 0, &out) >= 0) {
            check_spans(&out, body);
            decode_headers(buf + LS_BATCH_HEADER_SIZE, body, &out);
        }
    }
    return 0;
}
#elif defined(FUZZ_SEGMENT)
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 16)
        return 0;
    int64_t min_offset = rd64(data) & 0xffff, max_offset = (rd64(data + 8) & 0xffff) - 1;
    const char *buf = (const char *)data + 16;
    int64_t len = (int64_t)size - 16;
    ls_cursor cur;
    memset(&cur, 0, sizeof cur);
    cur.prev_last_offset = -1;
    ls_records_out out;
    for (int round = 0; round < 64; round++) {
        init_out(&out, &rows);
        int rc = ls_segment_decode(buf, len, min_offset, max_offset, 1 << 20, &cur, &out);
        check_spans(&out, len);
        decode_headers(buf, len, &out);
        if (rc < 0 || cur.stop != LS_STOP_FULL)
            break;
    }
    /* Partial reads with a memo: the first pass validates and remembers, the second trusts
     * what it remembered; then every slot is made to trust whatever header sits at a position
     * taken from the input, with marks from the input, so that trusted walks over arbitrary
     * bytes are exercised too (they must stay inside the buffer whatever the memo says). */
    static int64_t positions[8];
    static uint32_t crcs[8];
    static int32_t marks[8 * 4];
    static int64_t nexts[8];
    ls_crc_memo memo = {positions, crcs, marks, 8, 4, nexts};
    memset(positions, 0, sizeof positions);
    memset(nexts, 0, sizeof nexts);
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 2) {
            for (int s = 0; s < 8; s++) {
                int64_t at = len > 0 ? (int64_t)((uint32_t)rd64(data) * 31u + (uint32_t)s * 977u) % len : 0;
                positions[s] = at + 1;
                nexts[s] = (int64_t)(rd64(data) ^ rd64(data + 8)) >> (s * 7); /* anything: never a position */
                crcs[s] = len - at >= LS_BATCH_HEADER_SIZE ? (uint32_t)rd64((const uint8_t *)buf + at + 9) : 0;
            }
            for (int m = 0; m < 8 * 4; m++)
                marks[m] = (int32_t)(rd64(data + 8) >> (m % 32)) ^ m;
        }
        memset(&cur, 0, sizeof cur);
        cur.prev_last_offset = -1;
        cur.partial = 1;
        cur.memo = &memo;
        for (int round = 0; round < 16; round++) {
            init_out(&out, &rows);
            out.capacity = 1 + round % 3;
            int rc = ls_segment_decode(buf, len, min_offset + round, max_offset, 1 << 20, &cur, &out);
            check_spans(&out, len);
            decode_headers(buf, len, &out);
            if (rc < 0 || cur.stop != LS_STOP_FULL)
                break;
        }
    }
    static char index[8 * 256], timeindex[12 * 256];
    ls_scan_result res;
    ls_segment_scan(buf, len, min_offset, 64, 1 << 20, index, 256, timeindex, 256, &res);
    /* Point reads (ls_point_read) through the index the scan rebuilt, then through entries taken
     * from the input itself (arbitrary positions and offsets), with the memo as the passes above
     * left it: a row must lie inside the buffer. */
    ls_point point;
    memset(&point, 0, sizeof point);
    point.memo = &memo;
    point.max_batch_bytes = 1 << 20;
    for (int k = 0; k < 4; k++) {
        const char *entries = k < 2 ? index : buf;
        int64_t n = k < 2 ? res.index_entries : (len / LS_INDEX_ENTRY_SIZE < 8 ? len / LS_INDEX_ENTRY_SIZE : 8);
        init_out(&point.out, &rows);
        int rc = ls_point_read(buf, len, entries, n, min_offset >> (k % 2), min_offset + k, max_offset, &point);
        if (rc == 1)
            check_spans(&point.out, len);
    }
    return 0;
}
#elif defined(FUZZ_INDEX)
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8)
        return 0;
    int64_t target = rd64(data);
    const char *index = (const char *)data + 8;
    int64_t len = (int64_t)size - 8;
    int64_t entries = ls_index_entries(index, len / 8, 0);
    if (entries < 0 || entries > len / 8)
        abort();
    ls_index_check(index, entries, 0, INT32_MAX);
    int64_t slot = ls_index_lookup(index, entries, target);
    if (slot < -1 || slot >= entries)
        abort();
    int64_t tentries = ls_index_entries(index, len / 12, 1);
    if (tentries < 0 || tentries > len / 12)
        abort();
    ls_index_check(index, tentries, 1, INT32_MAX);
    slot = ls_timeindex_lookup(index, tentries, target);
    if (slot < -1 || slot >= tentries)
        abort();
    return 0;
}
#elif defined(FUZZ_VARINT)
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t pos = 0;
    while (pos < size) {
        int64_t value;
        int n = ls_varint_decode((const char *)data + pos, size - pos, &value);
        if (n <= 0)
            break;
        if ((size_t)n > size - pos)
            abort();
        char again[16];
        int m = ls_varint_encode(value, again);
        int64_t back;
        if (m <= 0 || m > 10 || ls_varint_decode(again, (size_t)m, &back) != m || back != value)
            abort();
        pos += (size_t)n;
    }
    return 0;
}
#elif defined(FUZZ_COLUMNS)
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The first half of the input is (pos, len) pairs, the second the buffer they point into. */
    int32_t n = (int32_t)(size / 2 / 8);
    if (n > 512)
        n = 512;
    int32_t pos[512], len[512], offsets[513];
    uint8_t validity[64];
    for (int32_t i = 0; i < n; i++) {
        pos[i] = (int32_t)((uint32_t)data[8 * i] << 24 | (uint32_t)data[8 * i + 1] << 16 | (uint32_t)data[8 * i + 2] << 8 | data[8 * i + 3]);
        len[i] = (int32_t)((uint32_t)data[8 * i + 4] << 24 | (uint32_t)data[8 * i + 5] << 16 | (uint32_t)data[8 * i + 6] << 8 | data[8 * i + 7]);
    }
    const char *buf = (const char *)data + size / 2;
    int64_t buf_len = (int64_t)(size - size / 2);
    int64_t need = ls_binary_size(len, n);
    static char out[1 << 16];
    int32_t nulls = 0;
    int64_t cap = need < 0 ? 0 : need > (int64_t)sizeof out ? (int64_t)sizeof out : need;
    int64_t rc = ls_gather_binary(buf, buf_len, pos, len, n, offsets, validity, out, cap, &nulls);
    if (rc > cap)
        abort();
    return 0;
}
#elif defined(FUZZ_FLEXCHECK)
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A 2-byte count of program words, the words (big-endian int32), then the request body.
     * The seeds hold the programs bounds.py compiles for real requests and those requests. */
    if (size < 2)
        return 0;
    size_t words = (size_t)data[0] << 8 | data[1];
    if (words > 1024 || 2 + 4 * words > size)
        return 0;
    int32_t prog[1024];
    for (size_t i = 0; i < words; i++) {
        const uint8_t *p = data + 2 + 4 * i;
        prog[i] = (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
    }
    const char *body = (const char *)data + 2 + 4 * words;
    int64_t len = (int64_t)(size - 2 - 4 * words), detail[2];
    int64_t end = ls_flex_check(prog, (int64_t)words, 0, body, len, 0, detail);
    if (end > len)
        abort(); /* the walk promised a position inside the request */
    if (end < 0 && (end < LS_FLEX_PROGRAM || end > LS_FLEX_END))
        abort();
    return 0;
}
#else
#error "define one of FUZZ_BATCH, FUZZ_SEGMENT, FUZZ_INDEX, FUZZ_VARINT, FUZZ_COLUMNS, FUZZ_FLEXCHECK"
#endif
