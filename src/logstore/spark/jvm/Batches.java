package logstore.spark.jvm;

import java.util.zip.CRC32C;

/**
 * Kafka's record batch format (magic 2), as {@code _native/batch.c} checks it: the header's
 * fields and the rule of a valid batch. A batch at a position is valid iff the bytes hold its
 * 61-byte header, its length is at least the header's rest, its magic is 2, the bytes hold all
 * of it, the CRC32C of its bytes from the attributes on matches the stored one, its record count
 * and last offset delta agree ({@code 0 <= count <= delta + 1}) and its base offset is
 * non-negative. Thread-safety: pure functions.
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

    static boolean allZero(byte[] b, int from, int to) {
        for (int i = from; i < to; i++) {
            if (b[i] != 0) {
                return false;
            }
        }
        return true;
    }
}
