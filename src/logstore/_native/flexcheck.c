/* flexcheck.c -- the bounds check of a flexible Kafka request before kio reads it (the walk of
 * logstore.kafka.bounds, in C): every compact array's count, string's and bytes' length and
 * tagged field's size must fit in the bytes left, each array item taking at least one byte.
 *
 * The walk follows a program that bounds.py compiles once per message class from the class's
 * schema (see logstore.h for its layout). The program is this process's own; the data is a
 * peer's, and every length read from it is checked against the bytes left before it is used.
 * Nothing is allocated. Nesting is bounded (LS_FLEX_MAX_DEPTH) whatever the program says.
 */
#include <stdint.h>
#include <stddef.h>

#include "logstore.h"

typedef struct {
    const int32_t *prog;
    int64_t prog_len;
    const uint8_t *data;
    int64_t *detail;
} walker;

static int64_t fail(const walker *w, int64_t code, int64_t a, int64_t b)
{
    w->detail[0] = a;
    w->detail[1] = b;
    return code;
}

/* An unsigned varint of at most five bytes at data[*pos, end): its value, *pos moved past it. */
static int64_t uvarint(const walker *w, int64_t *pos, int64_t end, int64_t *value)
{
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
        if (shift > 28)
            return fail(w, LS_FLEX_VARINT_LONG, 0, 0);
        if (*pos >= end)
            return fail(w, LS_FLEX_VARINT_END, 0, 0);
        uint8_t byte = w->data[(*pos)++];
        v |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *value = (int64_t)v;
            return 0;
        }
    }
}

/* The length in program words of the step at pc, or a negative LS_FLEX_PROGRAM. */
static int64_t step_words(const walker *w, int64_t pc, int depth)
{
    if (depth > LS_FLEX_MAX_DEPTH || pc < 0 || pc >= w->prog_len)
        return LS_FLEX_PROGRAM;
    switch (w->prog[pc]) {
    case LS_FLEX_STEP_FIXED:
        return 2;
    case LS_FLEX_STEP_BYTES:
        return 1;
    case LS_FLEX_STEP_ARRAY: {
        int64_t item = step_words(w, pc + 1, depth + 1);
        return item < 0 ? item : 1 + item;
    }
    case LS_FLEX_STEP_ENTITY:
        return 3;
    default:
        return LS_FLEX_PROGRAM;
    }
}

static int64_t walk_struct(const walker *w, int64_t at, int64_t pos, int64_t end, int depth);

/* Walk the step at pc over data[pos, end): the position after it, or a negative LS_FLEX_ code. */
static int64_t walk_step(const walker *w, int64_t pc, int64_t pos, int64_t end, int depth)
{
    if (depth > LS_FLEX_MAX_DEPTH)
        return fail(w, LS_FLEX_DEPTH, 0, 0);
    if (pc < 0 || pc >= w->prog_len)
        return fail(w, LS_FLEX_PROGRAM, pc, 0);
    int64_t n, rc;
    switch (w->prog[pc]) {
    case LS_FLEX_STEP_FIXED:
        if (pc + 1 >= w->prog_len || w->prog[pc + 1] < 1) /* (every step takes a byte: the walk is linear) */
            return fail(w, LS_FLEX_PROGRAM, pc, 0);
        if (w->prog[pc + 1] > end - pos)
            return fail(w, LS_FLEX_END, 0, 0);
        return pos + w->prog[pc + 1];
    case LS_FLEX_STEP_BYTES: /* compact string, bytes or records: length + 1, 0 for null */
        if ((rc = uvarint(w, &pos, end, &n)) < 0)
            return rc;
        if (n && n - 1 > end - pos)
            return fail(w, LS_FLEX_BYTES, n - 1, end - pos);
        return pos + (n ? n - 1 : 0);
    case LS_FLEX_STEP_ARRAY: /* compact array: count + 1, 0 for null; each item at least a byte */
        if ((rc = uvarint(w, &pos, end, &n)) < 0)
            return rc;
        if (n && n - 1 > end - pos)
            return fail(w, LS_FLEX_ARRAY, n - 1, end - pos);
        for (int64_t i = 1; i < n; i++) {
            if ((pos = walk_step(w, pc + 1, pos, end, depth + 1)) < 0)
                return pos;
        }
        return pos;
    case LS_FLEX_STEP_ENTITY: /* a struct, a nullable one after a marker byte (0xFF: null) */
        if (pc + 2 >= w->prog_len)
            return fail(w, LS_FLEX_PROGRAM, pc, 0);
        if (w->prog[pc + 2]) {
            if (pos >= end)
                return fail(w, LS_FLEX_END, 0, 0);
            if (w->data[pos++] == 0xFF)
                return pos;
        }
        return walk_struct(w, w->prog[pc + 1], pos, end, depth + 1);
    default:
        return fail(w, LS_FLEX_PROGRAM, pc, 0);
    }
}

/* Walk the struct whose program starts at `at`: its steps, then its tagged fields. */
static int64_t walk_struct(const walker *w, int64_t at, int64_t pos, int64_t end, int depth)
{
    if (depth > LS_FLEX_MAX_DEPTH)
        return fail(w, LS_FLEX_DEPTH, 0, 0);
    if (at < 0 || at >= w->prog_len || w->prog[at] < 0)
        return fail(w, LS_FLEX_PROGRAM, at, 0);
    int64_t pc = at + 1;
    for (int32_t i = 0; i < w->prog[at]; i++) {
        if ((pos = walk_step(w, pc, pos, end, depth)) < 0)
            return pos;
        int64_t words = step_words(w, pc, depth);
        if (words < 0)
            return fail(w, LS_FLEX_PROGRAM, pc, 0);
        pc += words;
    }
    if (pc >= w->prog_len || w->prog[pc] < 0)
        return fail(w, LS_FLEX_PROGRAM, pc, 0);
    int64_t tags_at = pc, count, rc;
    if ((rc = uvarint(w, &pos, end, &count)) < 0)
        return rc;
    if (count > end - pos)
        return fail(w, LS_FLEX_TAGS, count, end - pos);
    for (int64_t i = 0; i < count; i++) {
        int64_t tag, size;
        if ((rc = uvarint(w, &pos, end, &tag)) < 0 || (rc = uvarint(w, &pos, end, &size)) < 0)
            return rc;
        if (size > end - pos)
            return fail(w, LS_FLEX_TAG_SIZE, size, end - pos);
        /* A known tag's value is walked within its size; an unknown one is skipped. */
        int64_t t = tags_at + 1;
        for (int32_t k = 0; k < w->prog[tags_at]; k++) {
            if (t >= w->prog_len)
                return fail(w, LS_FLEX_PROGRAM, t, 0);
            int64_t words = step_words(w, t + 1, depth);
            if (words < 0)
                return fail(w, LS_FLEX_PROGRAM, t, 0);
            if (w->prog[t] == tag) {
                int64_t after = walk_step(w, t + 1, pos, pos + size, depth);
                if (after < 0)
                    return after;
                if (after != pos + size)
                    return fail(w, LS_FLEX_TAG_LENGTH, tag, size);
                break;
            }
            t += 1 + words;
        }
        pos += size;
    }
    return pos;
}

int64_t ls_flex_check(const int32_t *prog, int64_t prog_len, int64_t root, const char *data, int64_t len,
                      int64_t pos, int64_t *detail)
{
    int64_t scratch[2];
    walker w = {prog, prog_len, (const uint8_t *)data, detail ? detail : scratch};
    w.detail[0] = w.detail[1] = 0;
    if (!prog || prog_len < 0 || len < 0 || pos < 0 || pos > len || (!data && len))
        return fail(&w, LS_FLEX_PROGRAM, 0, 0);
    return walk_struct(&w, root, pos, len, 0);
}
