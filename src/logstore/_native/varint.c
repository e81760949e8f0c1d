/* varint.c -- Kafka's zigzag varints (ByteUtils.writeVarlong / readVarlong) for callers outside
 * the C core; the core itself uses the inline helpers of ls_internal.h.
 */
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "logstore.h"
#include "ls_internal.h"

int ls_varint_encode(int64_t value, char *out) { return ls_varint_put(out, value); }

int ls_varint_decode(const char *buf, size_t len, int64_t *value)
{
    if (len == 0)
        return LS_ERR_TRUNCATED;
    const char *p = buf;
    int rc = ls_read_varlong(&p, buf + len, value);
    return rc < 0 ? rc : (int)(p - buf);
}
