/* logstore.h -- the C core's one header and the only cffi cdef.
 *
 * This file is read twice: by cffi (ffibuilder.cdef) and by the C compiler, which includes it from
 * every .c file so that each definition is checked against its declaration. It must therefore stay
 * inside the subset of C that cffi parses: integer #defines, typedef'd structs of fixed-width
 * integers and pointers, and function prototypes. No include guards, no #include, no macros with
 * arguments. The .c files include <stdint.h> and <stddef.h> before this header.
 *
 * The C core is pure mechanism over caller-owned buffers: it never opens, truncates, maps or fsyncs
 * a file and never allocates memory. Every length read from a buffer is checked against the bytes
 * that remain before it is used.
 *
 * Byte order: every multi-byte integer of Kafka's format is big-endian.
 * Naming: an "offset" is a logical record number; a "position" is a byte position in a buffer/file.
 */

/* Bumped whenever a struct or a signature below changes; checked by logstore._native at import. */
#define LS_ABI_VERSION 13

/* ---- Error codes (every function returning int/int64 uses negative values from this list) ---- */
#define LS_OK 0
#define LS_ERR_TRUNCATED -1   /* the buffer ends inside a batch, record or varint */
#define LS_ERR_CORRUPT -2     /* a length, count or field is out of its valid range */
#define LS_ERR_CRC -3         /* stored CRC32C differs from the computed one */
#define LS_ERR_MAGIC -4       /* batch magic is not 2 (older formats are not supported) */
#define LS_ERR_NOSPACE -5     /* caller's output buffer/array is too small */
#define LS_ERR_ARG -6         /* invalid argument from the caller (not from disk) */
#define LS_ERR_TOO_LARGE -7   /* batch larger than the caller's max_batch_bytes */
#define LS_ERR_FULL -8        /* appender: the segment or one of its indexes has no room */
#define LS_ERR_ZERO -9        /* scan: the rest of the buffer is zero bytes (preallocated tail) */

/* ---- RecordBatch v2 layout (byte positions inside a batch) ---- */
#define LS_MAGIC 2
#define LS_LOG_OVERHEAD 12              /* baseOffset (8) + batchLength (4) */
#define LS_BATCH_HEADER_SIZE 61
#define LS_BATCH_MIN_LENGTH 49          /* minimal batchLength = header size - log overhead */
#define LS_POS_BASE_OFFSET 0
#define LS_POS_BATCH_LENGTH 8
#define LS_POS_LEADER_EPOCH 12
#define LS_POS_MAGIC 16
#define LS_POS_CRC 17
#define LS_POS_ATTRIBUTES 21            /* the CRC covers [LS_POS_ATTRIBUTES, end of batch) */
#define LS_POS_LAST_OFFSET_DELTA 23
#define LS_POS_BASE_TIMESTAMP 27
#define LS_POS_MAX_TIMESTAMP 35
#define LS_POS_PRODUCER_ID 43
#define LS_POS_PRODUCER_EPOCH 51
#define LS_POS_BASE_SEQUENCE 53
#define LS_POS_RECORDS_COUNT 57
#define LS_POS_RECORDS 61

/* attributes bits */
#define LS_ATTR_COMPRESSION_MASK 7
#define LS_COMPRESSION_NONE 0
#define LS_COMPRESSION_GZIP 1
#define LS_COMPRESSION_SNAPPY 2
#define LS_COMPRESSION_LZ4 3
#define LS_COMPRESSION_ZSTD 4
#define LS_ATTR_TIMESTAMP_TYPE 8        /* 0 = CreateTime, 1 = LogAppendTime */
#define LS_ATTR_TRANSACTIONAL 16
#define LS_ATTR_CONTROL 32
#define LS_ATTR_DELETE_HORIZON 64       /* baseTimestamp holds the delete horizon (KIP-534) */

#define LS_TIMESTAMP_CREATE_TIME 0
#define LS_TIMESTAMP_LOG_APPEND_TIME 1
#define LS_NO_TIMESTAMP -1
#define LS_NO_PRODUCER_ID -1
#define LS_NO_PRODUCER_EPOCH -1
#define LS_NO_SEQUENCE -1
#define LS_NO_PARTITION_LEADER_EPOCH -1

/* A record is at least 7 bytes: length, attributes, timestampDelta, offsetDelta, keyLength,
 * valueLength, headerCount, one byte each. Used to bound record counts read from disk. */
#define LS_RECORD_MIN_SIZE 7
/* Upper bound of a record's framing bytes excluding key, value and headers. */
#define LS_RECORD_MAX_OVERHEAD 41
/* Upper bound of the framing bytes of one header excluding its key and value. */
#define LS_HEADER_MAX_OVERHEAD 10
#define LS_VARINT_MAX_BYTES 10

/* ---- Index files ---- */
#define LS_INDEX_ENTRY_SIZE 8           /* relativeOffset int32 BE, position int32 BE */
#define LS_TIMEINDEX_ENTRY_SIZE 12      /* timestamp int64 BE, relativeOffset int32 BE */

/* ---- Segment names ---- */
#define LS_SEGMENT_NAME_DIGITS 20

/* ======================================================================== */
/* CRC32C (Castagnoli). ls_crc32c uses SSE4.2 when the CPU has it, else the table version.
 * Both extend `crc`, a previously returned value (0 to start): crc32c(a+b) ==
 * ls_crc32c(ls_crc32c(0, a), b). */
uint32_t ls_crc32c(uint32_t crc, const char *buf, size_t len);
uint32_t ls_crc32c_sw(uint32_t crc, const char *buf, size_t len);
int ls_crc32c_hw_available(void);

/* ======================================================================== */
/* Zigzag varints as Kafka writes them (ByteUtils.writeVarlong). encode writes 1..10 bytes to out
 * and returns the count. decode returns the bytes consumed (1..10), LS_ERR_TRUNCATED when buf ends
 * before the last byte, LS_ERR_CORRUPT when no terminating byte appears within 10 bytes. */
int ls_varint_encode(int64_t value, char *out);
int ls_varint_decode(const char *buf, size_t len, int64_t *value);

/* ======================================================================== */
/* The bounds check of a flexible Kafka request's body before kio reads it (flexcheck.c; the
 * program is compiled by logstore.kafka.bounds). A struct's program, at its offset:
 *   nsteps, step * nsteps, ntags, (tag, step) * ntags
 * a step: FIXED n (n bytes) | BYTES (compact string/bytes/records) | ARRAY step (compact array of
 * the step) | ENTITY offset nullable (a struct, after a marker byte when nullable).
 * ls_flex_check walks the struct at `root` over data[pos, len) and returns the position after
 * it, or a negative LS_FLEX_ code with detail[0..1] the numbers of the message (e.g. the items
 * claimed and the bytes left). Reads only inside data and prog; allocates nothing. */
#define LS_FLEX_STEP_FIXED 0
#define LS_FLEX_STEP_BYTES 1
#define LS_FLEX_STEP_ARRAY 2
#define LS_FLEX_STEP_ENTITY 3
#define LS_FLEX_MAX_DEPTH 32
#define LS_FLEX_END -1          /* the data ends inside a fixed-width field or a null marker */
#define LS_FLEX_VARINT_END -2   /* a varint runs past the end */
#define LS_FLEX_VARINT_LONG -3  /* a varint longer than five bytes */
#define LS_FLEX_BYTES -4        /* a string's or bytes' length past the end: detail = (claimed, left) */
#define LS_FLEX_ARRAY -5        /* an array's count past the end: detail = (items, bytes left) */
#define LS_FLEX_TAGS -6         /* a tagged-field count past the end: detail = (count, bytes left) */
#define LS_FLEX_TAG_SIZE -7     /* a tagged field's size past the end: detail = (size, bytes left) */
#define LS_FLEX_TAG_LENGTH -8   /* a known tagged field not as long as its size: detail = (tag, size) */
#define LS_FLEX_DEPTH -9        /* nesting deeper than LS_FLEX_MAX_DEPTH */
#define LS_FLEX_PROGRAM -10     /* a malformed program or arguments */
int64_t ls_flex_check(const int32_t *prog, int64_t prog_len, int64_t root, const char *data, int64_t len,
                      int64_t pos, int64_t *detail);

/* ======================================================================== */
/* Batch header, decoded into host order. */
typedef struct {
    int64_t base_offset;
    int32_t batch_length;
    int32_t partition_leader_epoch;
    int32_t magic;
    uint32_t crc;
    int32_t attributes;
    int32_t last_offset_delta;
    int64_t base_timestamp;
    int64_t max_timestamp;
    int64_t producer_id;
    int32_t producer_epoch;
    int32_t base_sequence;
    int32_t records_count;
} ls_batch_header;

/* Validate the batch at the start of buf[0, len).
 * A batch is valid iff: len >= 61; batchLength >= 49 and 12 + batchLength <= len (else
 * LS_ERR_TRUNCATED when the header is plausible but the buffer is short); 12 + batchLength <=
 * max_batch_bytes when max_batch_bytes > 0 (else LS_ERR_TOO_LARGE); magic == 2 (else LS_ERR_MAGIC);
 * lastOffsetDelta >= 0; 0 <= recordsCount <= lastOffsetDelta + 1; for an uncompressed batch
 * recordsCount * 7 <= batchLength - 49; 0 <= baseOffset <= INT64_MAX - lastOffsetDelta; and CRC32C
 * over [21, 12 + batchLength) equals the stored CRC (else LS_ERR_CRC). Everything else is
 * LS_ERR_CORRUPT.
 * Fills *hdr whenever at least 61 bytes are present (also on error) and *computed_crc when the CRC
 * was computed. Returns the batch size in bytes (12 + batchLength) or a negative LS_ERR_ code. */
int64_t ls_batch_validate(const char *buf, int64_t len, int64_t max_batch_bytes,
                          ls_batch_header *hdr, uint32_t *computed_crc);

/* Parse the 61-byte header only (no CRC check, no range checks beyond len >= 61).
 * Returns LS_OK or LS_ERR_TRUNCATED. */
int ls_batch_header_parse(const char *buf, int64_t len, ls_batch_header *hdr);

/* ======================================================================== */
/* Columnar input for encoding one batch's records. Keys, values and header parts are concatenated
 * into one buffer each, in record order; the *_lens arrays give each item's length, -1 for null
 * (a null value is a tombstone; header keys may not be null). A NULL keys pointer together with a
 * NULL key_lens means every key is null; NULL timestamps means every record has the batch's base
 * timestamp; NULL header_counts means no record has headers; NULL offset_deltas means record i has
 * offsetDelta i, else offset_deltas must be >= 0 and strictly increasing (a compacted batch keeps
 * its records' original offsets). */
typedef struct {
    int32_t count;
    const char *keys;
    const int32_t *key_lens;
    const char *values;
    const int32_t *value_lens;
    const int64_t *timestamps;
    const int32_t *header_counts;
    const char *header_keys;
    const int32_t *header_key_lens;
    const char *header_values;
    const int32_t *header_value_lens;
    const int32_t *offset_deltas;
} ls_records_in;

/* Upper bound of the encoded size of the records section for `in` (no batch header).
 * Returns LS_ERR_ARG when a length is < -1, a key/header key is -1 where not allowed, or the
 * count is < 1. */
int64_t ls_records_bound(const ls_records_in *in);

/* Encode the records section (Kafka Record format, offsetDelta = offset_deltas[i] or i) into out[0, cap).
 * Timestamp deltas are relative to base_timestamp. Returns bytes written, LS_ERR_NOSPACE, or
 * LS_ERR_ARG. */
int64_t ls_records_encode(const ls_records_in *in, int64_t base_timestamp, char *out, int64_t cap);

/* Write the 61-byte header described by *hdr at batch[0, 61) of a batch whose records section
 * already sits at batch[61, total_len), then compute and store the CRC. hdr->batch_length and
 * hdr->crc are outputs; hdr->magic is forced to 2. Returns total_len or LS_ERR_ARG. */
int64_t ls_batch_finish(char *batch, int64_t total_len, ls_batch_header *hdr);

/* One call per uncompressed batch: set hdr->base_timestamp = timestamps[0] (or keep hdr's when
 * timestamps is NULL), hdr->max_timestamp = max of the timestamps, hdr->last_offset_delta =
 * the last offsetDelta, hdr->records_count = count; encode the records at out + 61; finish the header.
 * Attributes come from hdr (the compression bits must be 0 here). Returns the batch size,
 * LS_ERR_NOSPACE or LS_ERR_ARG. */
int64_t ls_batch_encode(const ls_records_in *in, ls_batch_header *hdr, char *out, int64_t cap);

/* ======================================================================== */
/* Columnar output of record decoding. The caller owns the arrays (capacity rows each); decode
 * functions append rows at [count, capacity) and advance count. Positions are byte positions in
 * the buffer passed to the decode call; a length of -1 means null. headers_pos/headers_len delimit
 * the raw header section of each record (header_count entries) for ls_headers_decode.
 * key_views/value_views (16 bytes a row, both or neither; NULL: not written) receive each row's
 * key and value as an Arrow BinaryView view into the decoded buffer (buffer index 0, offset = the
 * position), written while the record's bytes are in cache (see ls_binary_views for the layout). */
typedef struct {
    int32_t capacity;
    int32_t count;
    int64_t *offsets;
    int64_t *timestamps;
    int8_t *timestamp_types;
    int32_t *key_pos;
    int32_t *key_len;
    int32_t *value_pos;
    int32_t *value_len;
    int32_t *headers_pos;
    int32_t *headers_len;
    int32_t *header_count;
    uint8_t *key_views;
    uint8_t *value_views;
    /* Beside the views, all four NULL or all four set (the Arrow columns a read writes in one
     * pass): validity bitmaps of the keys and of the values (bit row set: not null, least
     * significant bit first; bits of rows past count are unspecified), each row's timestamp in
     * microseconds (saturated at the int64 limits, as ls_ms_to_us) and its type as int32. */
    uint8_t *key_valid;
    uint8_t *value_valid;
    int64_t *timestamps_us;
    int32_t *timestamp_types32;
    /* out, with key_valid: null keys and null values among rows [0, count), and the end
     * (position + length) of the furthest key or value longer than 12 bytes among them (0: none,
     * the views need no data buffer). */
    int32_t key_nulls;
    int32_t value_nulls;
    int64_t views_end;
} ls_records_out;

/* Decode the records section buf[0, len) of one batch described by *hdr (records_count records;
 * offsets base_offset + offsetDelta; timestamps base_timestamp + delta, or max_timestamp for every
 * record when the batch is LogAppendTime). Rows with offset < min_offset are skipped.
 * A record section is valid iff it holds exactly records_count records, each record's length
 * covers exactly its fields, every length lies in [-1, remaining] (keys/values) or [0, remaining]
 * (record length, header keys), offsetDelta in [0, lastOffsetDelta] and strictly increasing.
 * Returns the number of rows appended, LS_ERR_NOSPACE if out has too few free rows (nothing is
 * appended then), LS_ERR_TRUNCATED or LS_ERR_CORRUPT (also when records_count * 7 > len, checked
 * before NOSPACE), or LS_ERR_ARG (len > INT32_MAX: positions are int32). */
int64_t ls_records_decode(const char *buf, int64_t len, const ls_batch_header *hdr,
                          int64_t min_offset, ls_records_out *out);

/* Split the raw headers of one record into arrays of (key_pos, key_len, value_pos, value_len),
 * positions relative to buf. Returns header count or a negative LS_ERR_ code. */
int64_t ls_headers_decode(const char *buf, int64_t len, int32_t count, int32_t *key_pos,
                          int32_t *key_len, int32_t *value_pos, int32_t *value_len);

/* Arrow columns from decoded rows (columns.c).
 * ls_gather_binary: copy the n spans buf[pos[i], pos[i] + len[i]) (len -1: null) into data, one
 * after another, writing Arrow's n + 1 int32 offsets, a validity bitmap of (n + 7) / 8 bytes (bit
 * set = not null, LSB first) and the null count. Returns the bytes written, LS_ERR_CORRUPT when a
 * span lies outside buf or a length is below -1, LS_ERR_NOSPACE when data_cap or INT32_MAX bytes
 * would be exceeded, LS_ERR_ARG for unusable arguments.
 * ls_binary_size: the bytes ls_gather_binary will write for these lengths (or LS_ERR_CORRUPT).
 * ls_ms_to_us: milliseconds to microseconds, saturating at the int64 limits.
 * ls_widen_int8: int8 to int32. */
int64_t ls_gather_binary(const char *buf, int64_t buf_len, const int32_t *pos, const int32_t *len,
                         int32_t n, int32_t *offsets, uint8_t *validity, char *data, int64_t data_cap,
                         int32_t *null_count);
int64_t ls_binary_size(const int32_t *len, int32_t n);
/* ls_binary_views: Arrow BinaryView views (16 bytes each: int32 length, then the value itself
 * when it has at most 12 bytes, zero padded, else its first 4 bytes, buffer_index and its int32
 * offset in that data buffer) of the n spans buf[pos[i], pos[i] + len[i]) (len -1: null, an
 * all-zero view), plus the validity bitmap and null count as ls_gather_binary writes them. The
 * data buffer is buf[base, base + data_len): a value longer than 12 bytes must lie inside it.
 * Returns 0, LS_ERR_CORRUPT for a span outside buf or a length below -1, LS_ERR_NOSPACE for a
 * long value outside the data buffer (or at an offset past INT32_MAX), LS_ERR_ARG for unusable
 * arguments.
 * ls_view_span: [lo, hi) covering every span longer than 12 bytes (lo == hi when none): the
 * bytes a data buffer of views of them must hold. Returns 0, LS_ERR_CORRUPT for a span outside
 * buf[0, buf_len) or a length below -1, LS_ERR_ARG for unusable arguments. */
int32_t ls_binary_views(const char *buf, int64_t buf_len, int64_t base, int64_t data_len, const int32_t *pos,
                        const int32_t *len, int32_t n, int32_t buffer_index, uint8_t *views, uint8_t *validity,
                        int32_t *null_count);
int32_t ls_view_span(const int32_t *pos, const int32_t *len, int32_t n, int64_t buf_len, int64_t *lo, int64_t *hi);
/* ls_take_views: copy n views that the decoder wrote (ls_records_out's key_views or value_views,
 * into a buffer whose bytes [0, data_len) Arrow is given as data buffer 0) to views_out, writing
 * the validity bitmap and null count from the lengths len (-1: null). Returns 0, LS_ERR_CORRUPT
 * when a view's length differs from len, LS_ERR_NOSPACE when a long value lies past data_len
 * (the caller copies instead), LS_ERR_ARG for unusable arguments. */
int32_t ls_take_views(const uint8_t *views_in, const int32_t *len, int32_t n, int64_t data_len, uint8_t *views_out,
                      uint8_t *validity, int32_t *null_count);
void ls_ms_to_us(const int64_t *ms, int32_t n, int64_t *us);
void ls_widen_int8(const int8_t *in, int32_t n, int32_t *out);
/* Index of the first of n values that is >= target, or -1 (values in any order). */
int32_t ls_first_at_least(const int64_t *values, int32_t n, int64_t target);

/* Arenas: memory for the Arrow columns a read writes (arena.c). ls_arena_alloc gives at least
 * `size` bytes (ls_arena_size: rounded up to whole 2 MiB), 2 MiB-aligned, of unspecified content:
 * an arena of 2 MiB freed before (a cache of a few), else a new map with MADV_HUGEPAGE (each
 * 2 MiB faults in at once where transparent huge pages are enabled); NULL when size <= 0 or the
 * map fails. ls_arena_free gives back an arena of that `size` (kept for reuse or unmapped).
 * Thread-safe. */
int64_t ls_arena_size(int64_t size);
void *ls_arena_alloc(int64_t size);
void ls_arena_free(void *arena, int64_t size);

/* Batches that a partial decode validated whole (CRC and every record), remembered by position
 * and stored CRC, in buckets of 4 slots (set associative): a later partial decode of the batch at that position whose stored
 * CRC is still the remembered one skips the CRC and walks its records only as far as it returns
 * rows, starting at the nearest mark before the record wanted (the positions of nmarks evenly
 * spaced records, noted by the validating walk; used in batches without offset gaps). A batch
 * replaced at the same position (truncation, then new appends) carries another CRC and is
 * validated again. Every position read from the memo is checked against the batch before use.
 * A partial walk that stops after a batch looks at the next batch's header (its base offset
 * must lie above the batch's last offset: baseOffset lies outside the CRC). With nexts, a
 * remembered batch whose last offset (its header's, as read now) is the one noted when that
 * check passed skips it: one page of the segment fewer per point read. A truncation drops the
 * memo with the batches after it.
 * The caller owns the arrays (slots entries; slots * nmarks marks) and zeroes them to start. */
typedef struct {
    int64_t *positions;        /* per slot: position + 1 of a validated batch; 0 = empty */
    uint32_t *crcs;            /* per slot: that batch's stored CRC */
    int32_t *marks;            /* per slot, nmarks record positions relative to the records */
    int32_t slots;             /* a power of two */
    int32_t nmarks;            /* >= 0 (0: no marks; marks may be NULL) */
    int64_t *nexts;            /* NULL, or per slot: 1 + the batch's last offset once the header
                                  of the batch after it was checked against it; 0 = not yet */
} ls_crc_memo;

/* Cursor for walking consecutive batches of a segment byte range. */
typedef struct {
    int64_t position;          /* in/out: position of the next batch to look at */
    int64_t batches;           /* out: batches consumed (added to) */
    int64_t prev_last_offset;  /* in/out: last offset of the batch before `position` (-1 if
                                  unknown); a batch whose base offset is not above it is
                                  LS_ERR_CORRUPT (offsets only increase) */
    ls_batch_header header;    /* out: header of the batch at `position` when the walk stopped on it */
    uint32_t computed_crc;     /* out: with LS_ERR_CRC */
    int32_t stop;              /* out: one of the LS_STOP_ values */
    int32_t partial;           /* in: 0 = batches come whole (LS_STOP_FULL before a batch whose
                                  records do not fit in out); 1 = a batch's rows are returned up
                                  to out's free rows and the walk stops (LS_STOP_FULL, after the
                                  batch) once out is full: a point read decodes one record */
    ls_crc_memo *memo;         /* in: NULL, or the memo of validated batches (partial decodes) */
} ls_cursor;

#define LS_STOP_END 0          /* position reached len */
#define LS_STOP_FULL 1         /* out has no room for the next batch's records */
#define LS_STOP_COMPRESSED 2   /* next batch is compressed: caller decompresses and decodes it */
#define LS_STOP_MAX_OFFSET 3   /* next batch starts at or after max_offset */
#define LS_STOP_ERROR 4        /* next batch is invalid; the return value says why */

/* Decode every record with min_offset <= offset from consecutive batches in buf[0, len), starting
 * at cur->position. A batch holding such records is validated first (ls_batch_validate with
 * max_batch_bytes, CRC included), and no record of a batch that fails is ever returned. A batch
 * followed by one whose base offset is <= min_offset is skipped on the two headers alone (see
 * skippable() in scan.c), as Kafka's offset translation skips batches, so that damage in a batch
 * the read does not need cannot fail the read. A control batch (LS_ATTR_CONTROL) is validated but
 * its records are never returned. Every batch's base offset must exceed the previous
 * batch's last offset (cur->prev_last_offset), else LS_ERR_CORRUPT.
 * Stops (setting cur->stop) at the end of buf, before a batch whose base offset is >= max_offset
 * (when max_offset >= 0), before a compressed batch, before a batch whose records do not fit in
 * out, or at an invalid batch (cur->position stays at its start and the error code is returned).
 * With cur->partial, a batch's rows are returned only up to out's free rows (the batch is still
 * validated whole, unless cur->memo remembers it: see ls_crc_memo), and the walk stops after the
 * batch that filled out. A memo must have a power-of-two slot count (else LS_ERR_ARG).
 * Returns LS_OK or a negative LS_ERR_ code. */
int ls_segment_decode(const char *buf, int64_t len, int64_t min_offset, int64_t max_offset,
                      int64_t max_batch_bytes, ls_cursor *cur, ls_records_out *out);

/* One record by offset, for reads of a single record (Log.read(offset, max_records=1)): what a
 * segment keeps for them. The caller owns it and the row arrays of `out` (capacity >= 1). */
typedef struct {
    ls_crc_memo *memo;         /* the segment's memo of validated batches, or NULL */
    int64_t max_batch_bytes;   /* as for ls_segment_decode */
    ls_cursor cur;             /* scratch */
    ls_records_out out;        /* out: row 0 is the record */
} ls_point;

/* The first record at or after `offset` (below max_offset when max_offset >= 0) of the segment
 * buf[0, len) whose base offset is base_offset and whose offset index is `index` (`entries`
 * entries of LS_INDEX_ENTRY_SIZE bytes): the index floor entry of `offset` is looked up and
 * checked (the batch at its position must be a magic-2 batch ending exactly at the entry's
 * offset), then ls_segment_decode walks from there as a partial decode of one row with p->memo.
 * Returns 1 with the record as row 0 of p->out; 0 when the general read must decide instead (an
 * entry that does not match its batch, no record at or after `offset` in this segment, a
 * compressed batch first, an invalid batch: the general read reports it); LS_ERR_ARG for unusable
 * arguments. A record is returned only from a batch validated whole (CRC and every record) by
 * this call, or remembered by the memo as validated whole. */
int ls_point_read(const char *buf, int64_t len, const char *index, int64_t entries, int64_t base_offset,
                  int64_t offset, int64_t max_offset, ls_point *p);

/* ======================================================================== */
/* Recovery scan of one segment's bytes. Walks batches from position 0, validating each; stops at
 * the first invalid batch. Rebuilds the sparse indexes exactly as appends build them (see
 * ls_appender): before a batch at position p is counted, if bytes_since_last_entry >
 * index_interval_bytes an offset index entry (last offset - base_offset, p) and a time index entry
 * (max timestamp so far including this batch, the last offset of the batch holding it -
 * base_offset; only when that timestamp is larger than the previous time index entry's) are
 * written, then bytes_since_last_entry restarts at 0; then the batch's size is added to it. A
 * batch whose last offset - base_offset exceeds INT32_MAX is invalid (LS_ERR_CORRUPT).
 * Index output arrays hold index_cap / timeindex_cap entries; when one is full no more entries are
 * written to it and res->index_full is set.
 * Returns LS_OK once *res describes the scan (res->status tells how it ended), or LS_ERR_ARG for an
 * unusable argument (len > INT32_MAX, index_interval_bytes < 0, ...). */
typedef struct {
    int64_t valid_bytes;          /* length of the valid prefix */
    int64_t batches;
    int64_t records;              /* sum of records_count */
    int64_t last_offset;          /* last offset of the last valid batch; -1 if none */
    int64_t max_timestamp;        /* -1 if none */
    int64_t offset_of_max_timestamp;
    int64_t index_entries;
    int64_t timeindex_entries;
    int64_t txn_markers;          /* valid batches with both the control and the transactional
                                     attribute: COMMIT and ABORT markers */
    int32_t index_full;
    int32_t status;               /* LS_OK when the whole buffer was valid, else the error code of
                                     the batch at valid_bytes (LS_ERR_ZERO for an all-zero tail) */
    uint32_t stored_crc;
    uint32_t computed_crc;
} ls_scan_result;

int ls_segment_scan(const char *buf, int64_t len, int64_t base_offset, int64_t index_interval_bytes,
                    int64_t max_batch_bytes, char *index_out, int64_t index_cap,
                    char *timeindex_out, int64_t timeindex_cap, ls_scan_result *res);

/* ======================================================================== */
/* Sparse index search. `index` holds `entries` entries of the given file kind.
 * ls_index_lookup: slot of the largest entry whose relative offset <= target, or -1.
 * ls_timeindex_lookup: slot of the largest entry whose timestamp <= target, or -1.
 * ls_index_check: -1 when the entries are strictly increasing in relative offset and position,
 * positions >= 0 (offset index), or strictly increasing in timestamp and non-decreasing in offset
 * (time index), and every relative offset lies in [0, max_relative_offset]; else the first bad
 * slot. */
int64_t ls_index_lookup(const char *index, int64_t entries, int64_t target_relative_offset);
int64_t ls_timeindex_lookup(const char *index, int64_t entries, int64_t target_timestamp);
int64_t ls_index_check(const char *index, int64_t entries, int is_timeindex,
                       int64_t max_relative_offset);
/* Number of entries in a preallocated index buffer of cap_entries slots: the count of leading
 * slots before the first all-zero slot. An all-zero offset index entry cannot be real (the first
 * batch of a segment never gets an entry, so every entry has position > 0); an all-zero time index
 * entry is only possible in slot 0 and is then dropped, which costs lookups a longer scan but is
 * never wrong, because indexes are sparse hints that reads verify against the log. */
int64_t ls_index_entries(const char *index, int64_t cap_entries, int is_timeindex);

/* ======================================================================== */
/* Appender: the writer of the active segment. The caller maps the preallocated .log, .index and
 * .timeindex files and hands their memory here; appends copy batches into the mapped log and add
 * sparse index entries, so a returned append is in the OS page cache (it survives the death of the
 * process) without a write syscall. The caller serialises appends and publishes `position` to
 * readers only after a call returns, so no reader sees a partial batch.
 * Invariant: log[0, position) holds only complete, valid batches; next_offset = last offset + 1. */
typedef struct {
    char *log;
    int64_t log_capacity;
    int64_t position;
    int64_t base_offset;
    int64_t next_offset;
    char *index;
    int64_t index_capacity;          /* entries */
    int64_t index_entries;
    char *timeindex;
    int64_t timeindex_capacity;      /* entries */
    int64_t timeindex_entries;
    int64_t index_interval_bytes;
    int64_t bytes_since_last_entry;
    int64_t max_timestamp;           /* -1 when empty */
    int64_t offset_of_max_timestamp; /* last offset of the batch holding max_timestamp */
    int64_t last_timeindex_timestamp;/* -1 when the time index is empty */
    int64_t max_batch_bytes;
    int32_t partition_leader_epoch;
    int32_t records;                 /* records appended to this segment (incl. recovered) */
} ls_appender;

/* Append one pre-built batch (batch[0, len) must be a complete valid batch; its CRC is not
 * recomputed because baseOffset and partitionLeaderEpoch lie outside the CRC). Rewrites its
 * baseOffset to a->next_offset and its partitionLeaderEpoch to a->partition_leader_epoch.
 * Index entries follow the rule of ls_segment_scan. Returns the base offset assigned,
 * LS_ERR_FULL (nothing written) when the batch does not fit in log_capacity - position, when
 * either index already holds index_capacity/timeindex_capacity entries, or when the batch's last
 * offset - base_offset would exceed INT32_MAX (or position + len INT32_MAX); LS_ERR_TOO_LARGE when len > max_batch_bytes (when
 * max_batch_bytes > 0; checked before LS_ERR_FULL so that a caller that rolls on FULL cannot
 * loop); LS_ERR_CORRUPT/LS_ERR_TRUNCATED when the batch header is malformed. */
int64_t ls_appender_append_batch(ls_appender *a, const char *batch, int64_t len);

/* As ls_appender_append_batch, but the bytes are not copied into a->log: baseOffset and
 * partitionLeaderEpoch are stamped into the caller's writable `batch`, the bookkeeping (offsets,
 * index entries) is done as if the batch had been copied, and *position receives the position at
 * which the caller must write batch[0, len) itself (with pwrite: for large batches a write
 * syscall into the page cache is several times faster than first-touch stores into fresh mapped
 * pages). The caller must finish that write before publishing a->position to readers, and undo
 * the append (restore position, next_offset and the counters) if the write fails. */
int64_t ls_appender_append_batch_external(ls_appender *a, char *batch, int64_t len,
                                          int64_t *position);

/* Encode one record as a one-record batch straight into the mapped log (the single-append fast
 * path: one C call per record). key/value NULL means null; headers is the already-encoded header
 * section (count varint excluded) of header_count headers, or NULL. attributes must be 0 or
 * LS_ATTR_TIMESTAMP_TYPE and the header section must hold exactly header_count well-formed headers
 * (else LS_ERR_ARG). Returns the offset assigned, LS_ERR_FULL, LS_ERR_TOO_LARGE or LS_ERR_ARG. */
int64_t ls_appender_append_record(ls_appender *a, int64_t timestamp, int32_t attributes,
                                  const char *key, int32_t key_len, const char *value,
                                  int32_t value_len, const char *headers, int32_t headers_len,
                                  int32_t header_count);

/* Append a final time index entry for max_timestamp if it is newer than the last entry (Kafka does
 * this when a segment stops being active). Returns LS_OK or LS_ERR_FULL. */
int ls_appender_seal(ls_appender *a);

/* ======================================================================== */
/* Compaction offset map: key hash -> latest offset, for the cleaner (Kafka's SkimpyOffsetMap).
 * Open addressing with linear probing over caller memory. A slot is the key's 16-byte hash (its
 * xxh3_128) followed by offset - base_offset + 1 as a uint32 in host order (0 marks an empty
 * slot, so zeroed memory is an empty map): 20 bytes per slot, 22.2 bytes of memory per distinct
 * key at the default load factor of 0.9 (Kafka's MD5 + int64 slots take 26.7). One pass indexes
 * at most 2^32 - 2 offsets from its base. */
#define LS_OFFSET_MAP_HASH_SIZE 16
#define LS_OFFSET_MAP_SLOT_SIZE 20

typedef struct {
    char *slots;          /* capacity * LS_OFFSET_MAP_SLOT_SIZE bytes of caller memory */
    int64_t capacity;     /* slots */
    int64_t size;         /* distinct keys held */
    int64_t max_size;     /* new keys are refused beyond this (the load factor bound) */
    int64_t base_offset;  /* offsets are stored relative to this */
    int64_t probes;       /* slots examined by all puts and gets (a health figure) */
} ls_offset_map;

/* Set up an empty map over memory[0, bytes) for offsets from base_offset: zeroes it and sets
 * capacity and max_size = floor(capacity * load_factor_permille / 1000) (at most capacity - 1).
 * Returns LS_OK or LS_ERR_ARG (fewer than 2 slots, a load factor outside [1, 1000], or a
 * negative base). */
int ls_offset_map_init(ls_offset_map *m, char *memory, int64_t bytes, int32_t load_factor_permille,
                       int64_t base_offset);

/* Record hashes[i] -> offsets[i] for i in [0, n) in order; a key already present takes the new
 * offset when it is larger (the later record wins). Stops before the first pair whose key is new
 * while the map holds max_size keys, or whose offset is base_offset + 2^32 - 2 or more. Returns
 * the number of pairs recorded (n when all fit), or LS_ERR_ARG for an offset below base_offset. */
int64_t ls_offset_map_put(ls_offset_map *m, const char *hashes, const int64_t *offsets, int64_t n);

/* Write the offset recorded for each of the n hashes to offsets_out (-1 when absent). Returns n
 * or LS_ERR_ARG. */
int64_t ls_offset_map_get(ls_offset_map *m, const char *hashes, int64_t *offsets_out, int64_t n);

/* The 16-byte hash the map keeps for key[0, len): XXH3_128 in canonical (big-endian) form, the
 * bytes of the xxhash package's xxh3_128_digest. */
void ls_offset_map_hash(const char *key, int64_t len, char *hash_out);

/* Index the first n decoded rows of `rows` (positions relative to buf[0, buf_len)): each row
 * with a key, an offset below `end` and outside the n_skip sorted, disjoint [first, last] offset
 * ranges of `skip` (2 * n_skip values; aborted transactions' batches) records key -> offset, in
 * order. *stopped_at is the offset of the first row the map could not take (see
 * ls_offset_map_put), or -1 when every row was taken. Returns LS_OK, LS_ERR_CORRUPT for a key
 * span outside buf, or LS_ERR_ARG (also for an offset below the map's base). */
int ls_offset_map_put_rows(ls_offset_map *m, const char *buf, int64_t buf_len, const ls_records_out *rows,
                           int64_t n, int64_t end, const int64_t *skip, int64_t n_skip, int64_t *stopped_at);

/* What a cleaning pass does with each of the first n decoded rows, written to codes_out[i]:
 * LS_ROW_OBSOLETE when it has a key, lies below `end` and the map holds a larger offset for its
 * key (Kafka: a later record of the key exists); else LS_ROW_LIVE (a value),
 * LS_ROW_TOMBSTONE (a null value below end: it goes once its batch's delete horizon passed) or
 * LS_ROW_TOMBSTONE_PAST_END (a null value at or past end: kept). Returns LS_OK, LS_ERR_CORRUPT
 * for a key span outside buf, or LS_ERR_ARG. */
#define LS_ROW_OBSOLETE 0
#define LS_ROW_LIVE 1
#define LS_ROW_TOMBSTONE 2
#define LS_ROW_TOMBSTONE_PAST_END 3
int ls_offset_map_classify_rows(ls_offset_map *m, const char *buf, int64_t buf_len, const ls_records_out *rows,
                                int64_t n, int64_t end, int8_t *codes_out);

/* ======================================================================== */
/* Shared partition state, for logs opened by several processes at once. It lives in the partition's
 * `.shared` file (LS_SHARED_SIZE bytes, mapped MAP_SHARED by every process) and describes the log
 * as last published by a writer: the active segment, the appender's state and the offsets. Writers
 * hold an exclusive flock on that file while they change the log, then publish; readers take a
 * consistent snapshot without any lock. Two slots, each guarded by its own sequence number,
 * alternate: a writer that dies half-way through a publish leaves the previous slot current, so a
 * crashed process can never make readers wait or see a torn view.
 *
 * The page also holds a 32-bit notification counter (a futex word on Linux) that every publish and
 * every ls_notify bumps; ls_notify_wait sleeps until it changes. Waiters register first
 * (ls_notify_enter) so that a publisher knows whether a wake-up call is needed. The same page
 * layout serves a single process (memory from ffi.new) for its long-polls. */
#define LS_SHARED_SIZE 4096
#define LS_SHARED_MAGIC_VERSION 1

typedef struct {
    int64_t generation;              /* bumped whenever segments are created, deleted, replaced
                                        or truncated: readers then reload the directory */
    int64_t active_base;             /* base offset of the active segment */
    int64_t position;                /* bytes of complete batches in the active segment */
    int64_t next_offset;
    int64_t index_entries;
    int64_t timeindex_entries;
    int64_t bytes_since_last_entry;
    int64_t max_timestamp;
    int64_t offset_of_max_timestamp;
    int64_t last_timeindex_timestamp;
    int64_t records;                 /* records appended to the active segment since activation */
    int64_t log_start_offset;
    int64_t recovery_point;
    int64_t flushed_offset;          /* offsets below are fsynced (by any process) */
    int64_t high_watermark;          /* -1 when not set */
    int64_t partition_leader_epoch;
} ls_shared_view;

/* Format `page` (len >= LS_SHARED_SIZE) and publish *v. Returns LS_OK or LS_ERR_ARG. */
int ls_shared_init(char *page, int64_t len, const ls_shared_view *v);
/* Consistent snapshot of the current view. Lock-free; retries while a live writer is mid-publish.
 * Returns LS_OK, LS_ERR_ARG (len too small) or LS_ERR_CORRUPT (not a formatted page). */
int ls_shared_read(const char *page, int64_t len, ls_shared_view *out);
/* Publish *v as the current view, then bump the notification counter and wake waiters. The caller
 * holds the writers' lock. Returns LS_OK, LS_ERR_ARG or LS_ERR_CORRUPT. */
int ls_shared_publish(char *page, int64_t len, const ls_shared_view *v);
/* The "a change of the directory layout is under way" flag: set before a writer starts one,
 * cleared by the publish that ends it. Found set by the next writer, it means the previous one
 * died half-way, and the directory must be reloaded and the active segment recovered. */
void ls_shared_set_dirty(char *page, int32_t dirty);
int32_t ls_shared_dirty(const char *page);

/* Copy the appender's state into the view's active-segment fields (active_base, position,
 * next_offset, index and time index counts, bytes_since_last_entry, timestamps, records (plus
 * `records_before`, the records the segment held when the appender was set up), epoch), and back.
 * ls_appender_adopt leaves log/index pointers and capacities alone. */
void ls_view_from_appender(ls_shared_view *v, const ls_appender *a, int64_t records_before);
void ls_appender_adopt(ls_appender *a, const ls_shared_view *v);

/* Notification counter. ls_notify_enter registers a waiter and returns the counter; the caller then
 * checks its condition and, if it must wait, calls ls_notify_wait with that value, and finally
 * ls_notify_leave (always, also when it did not wait). ls_notify_wait returns 1 when the counter
 * changed (or on a spurious wake-up), 0 on timeout (timeout_us < 0: no timeout). ls_notify bumps
 * the counter and wakes every waiter. */
uint32_t ls_notify_enter(char *page);
void ls_notify_leave(char *page);
int ls_notify_wait(char *page, uint32_t seen, int64_t timeout_us);
void ls_notify(char *page);
uint32_t ls_notify_counter(const char *page);

/* ======================================================================== */
/* Kafka's default partitioner hash: murmur2 (seed 0x9747b28c) of the key, as
 * org.apache.kafka.common.utils.Utils.murmur2; the partition is (hash & 0x7fffffff) % partitions. */
int32_t ls_murmur2(const char *key, int64_t len);
