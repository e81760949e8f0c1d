/* murmur2.c -- the 32-bit MurmurHash2 variant Kafka's default partitioner uses for keyed records
 * (seed 0x9747b28c, little-endian 4-byte blocks), so that a key lands in the partition a Kafka
 * client would pick. Unsigned arithmetic throughout: Java's int overflow wraps, C's signed does not. */
#include <stdint.h>
#include <stddef.h>
#include "logstore.h"

int32_t ls_murmur2(const char *key, int64_t len)
{
    const uint32_t m = 0x5bd1e995u;
    const unsigned char *data = (const unsigned char *)key;
    if (len < 0 || (len > 0 && key == NULL))
        return 0;
    uint32_t h = 0x9747b28cu ^ (uint32_t)len;
    int64_t blocks = len / 4;
    for (int64_t i = 0; i < blocks; i++) {
        const unsigned char *p = data + 4 * i;
        uint32_t k = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const unsigned char *tail = data + 4 * blocks;
    switch (len & 3) {
    case 3:
        h ^= (uint32_t)tail[2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)tail[1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)tail[0];
        h *= m;
        break;
    default:
        break;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}
