/* crc32c.c -- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as Kafka's Crc32C.
 *
 * ls_crc32c(crc, buf, len) extends a CRC previously returned for the bytes before buf (0 for the
 * empty prefix); the pre- and post-inversion happen inside. Both paths compute the same function:
 * the software path (slicing-by-8) runs everywhere; the hardware path (SSE4.2 crc32 instruction,
 * three interleaved streams on large buffers) is chosen at load time when the CPU supports it.
 * All tables are filled by a load-time constructor, before any call can happen, so the functions
 * are thread-safe and never allocate.
 */
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "logstore.h"
#include "ls_internal.h"

#define POLY 0x82f63b78u

/* sw_table[k][b] is the CRC contribution of byte b followed by k zero bytes. */
static uint32_t sw_table[8][256];

LS_INLINE uint64_t load_le64(const unsigned char *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

uint32_t ls_crc32c_sw(uint32_t crc, const char *buf, size_t len)
{
    const unsigned char *p = (const unsigned char *)buf;
    crc = ~crc;
    while (len >= 8) {
        uint64_t w = load_le64(p) ^ crc;
        crc = sw_table[7][w & 0xff] ^ sw_table[6][(w >> 8) & 0xff] ^
              sw_table[5][(w >> 16) & 0xff] ^ sw_table[4][(w >> 24) & 0xff] ^
              sw_table[3][(w >> 32) & 0xff] ^ sw_table[2][(w >> 40) & 0xff] ^
              sw_table[1][(w >> 48) & 0xff] ^ sw_table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = sw_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static void sw_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = n;
        for (int k = 0; k < 8; k++)
            crc = (crc & 1) ? (crc >> 1) ^ POLY : crc >> 1;
        sw_table[0][n] = crc;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = sw_table[0][n];
        for (int k = 1; k < 8; k++) {
            crc = sw_table[0][crc & 0xff] ^ (crc >> 8);
            sw_table[k][n] = crc;
        }
    }
}

#if defined(__x86_64__)
#include <nmmintrin.h>

#define HW_LONG 8192
#define HW_SHORT 256

static int hw_available;

/* zeros_long/zeros_short map a raw CRC register to the register after HW_LONG / HW_SHORT zero
 * bytes, one table per register byte; they join the three independent streams. */
static uint32_t zeros_long[4][256];
static uint32_t zeros_short[4][256];

/* Product of the 32x32 GF(2) matrix mat (columns) and vec. */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1)
            sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        square[n] = gf2_times(mat, mat[n]);
}

/* Fills zeros[][] with the operator that appends len (a power of two >= 2) zero bytes. */
static void zeros_init(uint32_t zeros[4][256], size_t len)
{
    uint32_t op[32], sq[32];
    op[0] = POLY; /* one zero bit */
    for (int n = 1; n < 32; n++)
        op[n] = 1u << (n - 1);
    for (size_t bits = 1; bits < len * 8; bits <<= 1) {
        gf2_square(sq, op);
        memcpy(op, sq, sizeof op);
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++)
            zeros[k][n] = gf2_times(op, n << (8 * k));
}

LS_INLINE uint32_t zeros_apply(uint32_t zeros[4][256], uint32_t crc)
{
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

LS_INLINE uint64_t load_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Three streams of `block` bytes each per round: the crc32 instruction has a latency of three
 * cycles and a throughput of one, so independent streams keep it busy. */
#define HW_ROUNDS(block, zeros)                                                                    \
    while (len >= 3 * (size_t)(block)) {                                                           \
        uint64_t c1 = 0, c2 = 0;                                                                   \
        const unsigned char *stop = p + (block);                                                   \
        do {                                                                                       \
            c0 = _mm_crc32_u64(c0, load_u64(p));                                                   \
            c1 = _mm_crc32_u64(c1, load_u64(p + (block)));                                         \
            c2 = _mm_crc32_u64(c2, load_u64(p + 2 * (block)));                                     \
            p += 8;                                                                                \
        } while (p < stop);                                                                        \
        c0 = zeros_apply(zeros, (uint32_t)c0) ^ (uint32_t)c1;                                      \
        c0 = zeros_apply(zeros, (uint32_t)c0) ^ (uint32_t)c2;                                      \
        p += 2 * (block);                                                                          \
        len -= 3 * (size_t)(block);                                                                \
    }

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const char *buf,
                                                             size_t len)
{
    const unsigned char *p = (const unsigned char *)buf;
    uint64_t c0 = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        len--;
    }
    HW_ROUNDS(HW_LONG, zeros_long)
    HW_ROUNDS(HW_SHORT, zeros_short)
    for (; len >= 8; len -= 8, p += 8)
        c0 = _mm_crc32_u64(c0, load_u64(p));
    for (; len; len--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}

__attribute__((constructor)) static void crc32c_init(void)
{
    sw_init();
    zeros_init(zeros_long, HW_LONG);
    zeros_init(zeros_short, HW_SHORT);
    __builtin_cpu_init();
    hw_available = __builtin_cpu_supports("sse4.2") ? 1 : 0;
}

uint32_t ls_crc32c(uint32_t crc, const char *buf, size_t len)
{
    return hw_available ? crc32c_hw(crc, buf, len) : ls_crc32c_sw(crc, buf, len);
}

int ls_crc32c_hw_available(void) { return hw_available; }

#else /* no hardware path on this architecture */

__attribute__((constructor)) static void crc32c_init(void) { sw_init(); }

uint32_t ls_crc32c(uint32_t crc, const char *buf, size_t len)
{
    return ls_crc32c_sw(crc, buf, len);
}

int ls_crc32c_hw_available(void) { return 0; }

#endif
