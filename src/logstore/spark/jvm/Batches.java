package logstore.spark.jvm;

import java.util.zip.CRC32C;

/**
 * Kafka's record batch format (magic 2), as {@code _native/batch.c} checks it: the header's
 * fields and the rule of a valid batch. A batch at a position is valid iff the bytes hold its
 * 61-byte header, its length is at least the header's rest, its magic is 2, the bytes hold all
 * of it, the CRC32C of its bytes from the attributes on matches the stored one, its record count
 * and last offset delta agree ({@code 0 <= count <= delta + 1}), an uncompressed batch's records
 * section can hold its count ({@code count * RECORD_MIN_SIZE}) and its base offset is
 * non-negative. A records section is valid as {@code ls_records_walk} rules ({@link #recordsError}).
 * Thread-safety: pure functions.
 */
final class Batches {
    private Batches() {
    }

    static final int LOG_OVERHEAD = 12;
    static final int HEADER_SIZE = 61;
    static final int POS_LENGTH = 8;
    static final int POS_MAGIC = 16;
    static final int POS_CRC = 17;
    static final int POS_ATTRIBUTES = 21;
    static final int POS_LAST_OFFSET_DELTA = 23;
    static final int POS_BASE_TIMESTAMP = 27;
    static final int POS_MAX_TIMESTAMP = 35;
    static final int POS_PRODUCER_ID = 43;
    static final int POS_RECORDS_COUNT = 57;
    static final int COMPRESSION_MASK = 7;
    static final int ATTR_TIMESTAMP_TYPE = 8;
    static final int ATTR_TRANSACTIONAL = 16;
    static final int ATTR_CONTROL = 32;
    /** The smallest record (LS_RECORD_MIN_SIZE): its length, attributes, deltas, lengths and header count. */
    static final int RECORD_MIN_SIZE = 7;

    /** Not enough bytes for the batch (its header, or the length it claims). */
    static final long TRUNCATED = -1;
    /** An invalid batch (a bad length, magic, CRC or field); see {@link #reason}. */
    static final long INVALID = -2;

    static long i64(byte[] b, int p) {
        return ((long) i32(b, p) << 32) | (i32(b, p + 4) & 0xffffffffL);
    }

    static int i32(byte[] b, int p) {
        return (b[p] << 24) | ((b[p + 1] & 0xff) << 16) | ((b[p + 2] & 0xff) << 8) | (b[p + 3] & 0xff);
    }

    static int i16(byte[] b, int p) {
        return (short) (((b[p] & 0xff) << 8) | (b[p + 1] & 0xff));
    }

    static long baseOffset(byte[] b, int p) {
        return i64(b, p);
    }

    static long lastOffset(byte[] b, int p) {
        return i64(b, p) + i32(b, p + POS_LAST_OFFSET_DELTA);
    }

    /** The bytes the batch at {@code p} claims (its length field plus the log overhead). */
    static long claimed(byte[] b, int p) {
        return LOG_OVERHEAD + (long) i32(b, p + POS_LENGTH);
    }

    /** The CRC32C a batch's bytes have (from the attributes to its end). */
    static int crc(byte[] b, int p, int size) {
        CRC32C crc = new CRC32C();
        crc.update(b, p + POS_ATTRIBUTES, size - POS_ATTRIBUTES);
        return (int) crc.getValue();
    }

    /**
     * The size of the valid batch at {@code p} among {@code len} bytes, {@link #TRUNCATED} when
     * they do not hold it (its header, or the size it claims), else {@link #INVALID}.
     */
    static long check(byte[] b, int p, int len) {
        if (len < HEADER_SIZE) {
            return TRUNCATED;
        }
        long size = claimed(b, p);
        if (size < HEADER_SIZE || b[p + POS_MAGIC] != 2) {
            return INVALID;
        }
        if (size > len) {
            return TRUNCATED;
        }
        if (crc(b, p, (int) size) != i32(b, p + POS_CRC)) {
            return INVALID;
        }
        int delta = i32(b, p + POS_LAST_OFFSET_DELTA);
        int count = i32(b, p + POS_RECORDS_COUNT);
        long base = baseOffset(b, p);
        if (delta < 0 || count < 0 || count > (long) delta + 1 || base < 0 || base > Long.MAX_VALUE - delta) {
            return INVALID;
        }
        if ((i16(b, p + POS_ATTRIBUTES) & COMPRESSION_MASK) == 0 && (long) count * RECORD_MIN_SIZE > size - HEADER_SIZE) {
            return INVALID;
        }
        return size;
    }

    /** Why the batch at {@code p} of {@code len} bytes is invalid, in words (for the error). */
    static String reason(byte[] b, int p, int len) {
        if (len < HEADER_SIZE) {
            return "truncated batch header (" + len + " bytes)";
        }
        long size = claimed(b, p);
        if (size < HEADER_SIZE) {
            return "batch length " + (size - LOG_OVERHEAD) + " is below the minimum";
        }
        if (b[p + POS_MAGIC] != 2) {
            return "unsupported magic " + b[p + POS_MAGIC];
        }
        if (size > len) {
            return "batch of " + size + " bytes truncated at " + len;
        }
        int stored = i32(b, p + POS_CRC);
        int computed = crc(b, p, (int) size);
        if (stored != computed) {
            return String.format("CRC mismatch (stored crc = 0x%08x, computed crc = 0x%08x)", stored, computed);
        }
        return "invalid batch header fields";
    }

    /** A record field out of its bounds (a message for {@link #recordsError}). */
    private static final class Bad extends Exception {
        private static final long serialVersionUID = 1L;

        Bad(String message) {
            super(message, null, false, false);
        }
    }

    /**
     * Why the records section {@code [from, end)} of a batch of {@code count} records and last
     * offset delta {@code lod} is invalid, naming the record and its byte in the section; null
     * when it is valid. The rule is ls_records_walk's: the section holds exactly {@code count}
     * records, each record's length lies in [0, remaining] and covers exactly its fields,
     * key/value lengths lie in [-1, remaining in the record], offset deltas lie in [0, lod] and
     * strictly increase, header counts are at least 0 and every header is well formed. Lengths
     * are compared as {@code len > end - pos} (no sum can wrap).
     */
    static String recordsError(byte[] b, int from, int end, int count, int lod) {
        if (count < 0 || (long) count * RECORD_MIN_SIZE > end - from) {
            return "a count of " + count + " records cannot fit in a records section of " + (end - from) + " bytes";
        }
        int[] c = {from};
        long prev = -1;
        for (int i = 0; i < count; i++) {
            int at = c[0];
            try {
                int length = varint32(b, c, end, "length");
                if (length < 0 || length > end - c[0]) {
                    throw new Bad("length " + length + " overruns the records section");
                }
                int re = c[0] + length;
                if (length == 0) {
                    throw new Bad("an empty record");
                }
                c[0]++; // attributes
                skipVarlong(b, c, re);
                int delta = varint32(b, c, re, "offset delta");
                if (delta <= prev || delta > lod) {
                    throw new Bad("offset delta " + delta + " does not lie above the previous one (" + prev
                        + ") and within the last offset delta " + lod);
                }
                prev = delta;
                skipBytes(b, c, re, varint32(b, c, re, "key length"), "key");
                skipBytes(b, c, re, varint32(b, c, re, "value length"), "value");
                int headers = varint32(b, c, re, "header count");
                if (headers < 0 || headers > (re - c[0]) / 2) {
                    throw new Bad("header count " + headers + " overruns the record");
                }
                for (int h = 0; h < headers; h++) {
                    int keyLength = varint32(b, c, re, "header key length");
                    if (keyLength < 0) {
                        throw new Bad("header key length " + keyLength);
                    }
                    skipBytes(b, c, re, keyLength, "header key");
                    skipBytes(b, c, re, varint32(b, c, re, "header value length"), "header value");
                }
                if (c[0] != re) {
                    throw new Bad("its fields end " + (re - c[0]) + " bytes before its length does");
                }
            } catch (Bad e) {
                return "record " + i + " at byte " + (at - from) + " of the records section: " + e.getMessage();
            }
        }
        if (c[0] != end) {
            return (end - c[0]) + " bytes follow the last of the " + count + " records (at byte " + (c[0] - from)
                + " of the records section)";
        }
        return null;
    }

    private static void skipBytes(byte[] b, int[] c, int end, int length, String what) throws Bad {
        if (length < -1 || length > end - c[0]) {
            throw new Bad(what + " length " + length + " overruns the record");
        }
        c[0] += Math.max(length, 0);
    }

    /** A zigzag varint of at most 5 bytes and 32 bits at {@code c[0]} (moved past it), bounded by {@code end}. */
    private static int varint32(byte[] b, int[] c, int end, String what) throws Bad {
        long z = 0;
        int p = c[0];
        for (int shift = 0; shift < 35; shift += 7) {
            if (p >= end) {
                throw new Bad("the " + what + " varint runs past its bounds");
            }
            byte x = b[p++];
            z |= (long) (x & 0x7f) << shift;
            if (x >= 0) {
                if (z > 0xffffffffL) {
                    throw new Bad("the " + what + " varint exceeds 32 bits");
                }
                c[0] = p;
                int u = (int) z;
                return (u >>> 1) ^ -(u & 1);
            }
        }
        throw new Bad("the " + what + " varint is longer than 5 bytes");
    }

    private static void skipVarlong(byte[] b, int[] c, int end) throws Bad {
        int p = c[0];
        for (int i = 0; i < 10; i++) {
            if (p >= end) {
                break;
            }
            if (b[p++] >= 0) {
                c[0] = p;
                return;
            }
        }
        throw new Bad("the timestamp delta varint runs past the record");
    }

    static boolean allZero(byte[] b, int from, int to) {
        for (int i = from; i < to; i++) {
            if (b[i] != 0) {
                return false;
            }
        }
        return true;
    }
}
