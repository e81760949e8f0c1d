/* columns.c -- turn decoded record columns into Arrow buffers.
 *
 * ls_records_decode leaves keys and values where they lie in the batch bytes, as (position,
 * length) pairs. An Arrow binary column wants them contiguous, with n + 1 int32 offsets and a
 * validity bitmap (bit i set = row i not null, least significant bit first). These functions do
 * that copy, checking every span against the buffer it claims to come from, so that a caller who
 * passes columns from one buffer and bytes from another gets an error, never a read out of bounds. */
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include "logstore.h"

int64_t ls_gather_binary(const char *buf, int64_t buf_len, const int32_t *pos, const int32_t *len,
                         int32_t n, int32_t *offsets, uint8_t *validity, char *data, int64_t data_cap,
                         int32_t *null_count)
{
    if (buf_len < 0 || n < 0 || data_cap < 0 || (n > 0 && (pos == NULL || len == NULL))
        || offsets == NULL || validity == NULL || null_count == NULL || (data_cap > 0 && data == NULL))
        return LS_ERR_ARG;
    int64_t total = 0;
    int32_t nulls = 0;
    memset(validity, 0, (size_t)((n + 7) / 8));
    offsets[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t l = len[i];
        if (l < 0) {
            if (l != -1)
                return LS_ERR_CORRUPT;
            nulls++;
        } else {
            int64_t p = pos[i];
            if (p < 0 || p > buf_len || l > buf_len - p)
                return LS_ERR_CORRUPT;
            if (l > data_cap - total || total + l > INT32_MAX)
                return LS_ERR_NOSPACE;
            if (l > 0)
                memcpy(data + total, buf + p, (size_t)l);
            total += l;
            validity[i >> 3] |= (uint8_t)(1u << (i & 7));
        }
        offsets[i + 1] = (int32_t)total;
    }
    *null_count = nulls;
    return total;
}

int32_t ls_binary_views(const char *buf, int64_t buf_len, int64_t base, int64_t data_len, const int32_t *pos,
                        const int32_t *len, int32_t n, int32_t buffer_index, uint8_t *views, uint8_t *validity,
                        int32_t *null_count)
{
    if (buf_len < 0 || n < 0 || base < 0 || data_len < 0 || data_len > buf_len - base || buffer_index < 0
        || (n > 0 && (buf == NULL || pos == NULL || len == NULL || views == NULL)) || validity == NULL
        || null_count == NULL)
        return LS_ERR_ARG;
    int32_t nulls = 0;
    memset(validity, 0, (size_t)((n + 7) / 8));
    for (int32_t i = 0; i < n; i++) {
        uint8_t *v = views + (size_t)i * 16;
        int64_t l = len[i];
        memset(v, 0, 16);
        if (l < 0) {
            if (l != -1)
                return LS_ERR_CORRUPT;
            nulls++;
            continue;
        }
        int64_t p = pos[i];
        if (p < 0 || p > buf_len || l > buf_len - p)
            return LS_ERR_CORRUPT;
        int32_t l32 = (int32_t)l;
        memcpy(v, &l32, 4);
        if (l <= 12) {
            if (l > 0)
                memcpy(v + 4, buf + p, (size_t)l);
        } else {
            if (p < base || p - base > data_len - l || p - base > INT32_MAX)
                return LS_ERR_NOSPACE;  /* not in the data buffer: the caller copies instead */
            int32_t at = (int32_t)(p - base);
            memcpy(v + 4, buf + p, 4);
            memcpy(v + 8, &buffer_index, 4);
            memcpy(v + 12, &at, 4);
        }
        validity[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
    *null_count = nulls;
    return 0;
}

int32_t ls_view_span(const int32_t *pos, const int32_t *len, int32_t n, int64_t buf_len, int64_t *lo, int64_t *hi)
{
    if (n < 0 || buf_len < 0 || (n > 0 && (pos == NULL || len == NULL)) || lo == NULL || hi == NULL)
        return LS_ERR_ARG;
    int64_t a = INT64_MAX, b = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t l = len[i];
        if (l < -1 || (l >= 0 && (pos[i] < 0 || (int64_t)pos[i] + l > buf_len)))
            return LS_ERR_CORRUPT;
        if (l > 12) {
            if (pos[i] < a)
                a = pos[i];
            if (pos[i] + l > b)
                b = pos[i] + l;
        }
    }
    if (a > b)
        a = b;
    *lo = a;
    *hi = b;
    return 0;
}

int32_t ls_take_views(const uint8_t *views_in, const int32_t *len, int32_t n, int64_t data_len, uint8_t *views_out,
                      uint8_t *validity, int32_t *null_count)
{
    if (n < 0 || data_len < 0 || (n > 0 && (views_in == NULL || len == NULL || views_out == NULL))
        || validity == NULL || null_count == NULL)
        return LS_ERR_ARG;
    int32_t nulls = 0;
    memset(validity, 0, (size_t)((n + 7) / 8));
    for (int32_t i = 0; i < n; i++) {
        const uint8_t *v = views_in + (size_t)i * 16;
        int32_t l, at;
        memcpy(&l, v, 4);
        if (len[i] < 0) {
            if (len[i] != -1 || l != 0)
                return LS_ERR_CORRUPT;
            nulls++;
        } else {
            if (l != len[i])
                return LS_ERR_CORRUPT;
            if (l > 12) {
                memcpy(&at, v + 12, 4);
                if (at < 0 || at > data_len - l)
                    return LS_ERR_NOSPACE;
            }
            validity[i >> 3] |= (uint8_t)(1u << (i & 7));
        }
    }
    if (n > 0)
        memcpy(views_out, views_in, (size_t)n * 16);
    *null_count = nulls;
    return 0;
}

int64_t ls_binary_size(const int32_t *len, int32_t n)
{
    if (n < 0 || (n > 0 && len == NULL))
        return LS_ERR_ARG;
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (len[i] < -1)
            return LS_ERR_CORRUPT;
        if (len[i] > 0)
            total += len[i];
    }
    return total;
}

void ls_ms_to_us(const int64_t *ms, int32_t n, int64_t *us)
{
    const int64_t limit = INT64_MAX / 1000;
    for (int32_t i = 0; i < n; i++) {
        int64_t t = ms[i];
        us[i] = t > limit ? INT64_MAX : t < -limit ? INT64_MIN : t * 1000;
    }
}

void ls_widen_int8(const int8_t *in, int32_t n, int32_t *out)
{
    for (int32_t i = 0; i < n; i++)
        out[i] = in[i];
}

int32_t ls_first_at_least(const int64_t *values, int32_t n, int64_t target)
{
    for (int32_t i = 0; i < n; i++)
        if (values[i] >= target)
            return i;
    return -1;
}
