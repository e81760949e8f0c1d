/* fuzz_driver.c -- runs a fuzz target without libFuzzer (gcc, for make test): every file of a
 * corpus directory as it is, then random mutations of them (bit flips, byte sets, truncations,
 * insertions, splices) until a time budget is spent. Deterministic for a given seed. Prints the
 * number of executions; a crash is a sanitizer report and a non-zero exit.
 * Usage: fuzz_driver CORPUS_DIR SECONDS SEED */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_INPUT (1 << 20)
#define MAX_FILES 4096

static uint64_t rng_state;

static uint64_t next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s CORPUS_DIR SECONDS SEED\n", argv[0]);
        return 2;
    }
    double budget = atof(argv[2]);
    rng_state = strtoull(argv[3], NULL, 10) | 1;
    static uint8_t *inputs[MAX_FILES];
    static size_t sizes[MAX_FILES];
    int count = 0;
    DIR *dir = opendir(argv[1]);
    if (!dir) {
        perror(argv[1]);
        return 2;
    }
    struct dirent *e;
    char path[4096];
    while ((e = readdir(dir)) && count < MAX_FILES) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        uint8_t *buf = malloc(FUZZ_MAX_INPUT);
        size_t n = fread(buf, 1, FUZZ_MAX_INPUT, f);
        fclose(f);
        inputs[count] = buf;
        sizes[count++] = n;
    }
    closedir(dir);
    if (count == 0) {
        fprintf(stderr, "%s: empty corpus\n", argv[1]);
        return 2;
    }
    long execs = 0;
    for (int i = 0; i < count; i++, execs++)
        LLVMFuzzerTestOneInput(inputs[i], sizes[i]);
    static uint8_t work[FUZZ_MAX_INPUT + 64];
    double deadline = now() + budget;
    while (now() < deadline) {
        for (int k = 0; k < 256; k++, execs++) {
            int i = (int)(next() % (uint64_t)count);
            size_t n = sizes[i];
            memcpy(work, inputs[i], n);
            int edits = 1 + (int)(next() % 8);
            for (int m = 0; m < edits; m++) {
                switch (next() % 6) {
                case 0: /* flip a bit */
                    if (n)
                        work[next() % n] ^= (uint8_t)(1u << (next() % 8));
                    break;
                case 1: /* an interesting byte */
                    if (n) {
                        static const uint8_t special[] = {0, 1, 0x7f, 0x80, 0xff, 0xfe};
                        work[next() % n] = special[next() % sizeof special];
                    }
                    break;
                case 2: /* truncate */
                    if (n)
                        n = (size_t)(next() % n);
                    break;
                case 3: /* insert a byte */
                    if (n < FUZZ_MAX_INPUT) {
                        size_t at = n ? (size_t)(next() % (n + 1)) : 0;
                        memmove(work + at + 1, work + at, n - at);
                        work[at] = (uint8_t)next();
                        n++;
                    }
                    break;
                case 4: { /* splice in a piece of another input */
                    int j = (int)(next() % (uint64_t)count);
                    if (sizes[j] && n) {
                        size_t from = (size_t)(next() % sizes[j]), at = (size_t)(next() % n);
                        size_t len = (size_t)(next() % 64);
                        if (len > sizes[j] - from)
                            len = sizes[j] - from;
                        if (len > n - at)
                            len = n - at;
                        memcpy(work + at, inputs[j] + from, len);
                    }
                    break;
                }
                default: /* a 32-bit field set to an extreme */
                    if (n >= 4) {
                        static const uint32_t extremes[] = {0, 0x7fffffffu, 0x80000000u, 0xffffffffu, 61, 12};
                        size_t at = (size_t)(next() % (n - 3));
                        uint32_t v = extremes[next() % 6];
                        work[at] = (uint8_t)(v >> 24);
                        work[at + 1] = (uint8_t)(v >> 16);
                        work[at + 2] = (uint8_t)(v >> 8);
                        work[at + 3] = (uint8_t)v;
                    }
                    break;
                }
            }
            LLVMFuzzerTestOneInput(work, n);
        }
    }
    printf("%ld\n", execs);
    return 0;
}
