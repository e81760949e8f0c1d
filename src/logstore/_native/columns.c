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
