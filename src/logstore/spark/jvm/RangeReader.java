package logstore.spark.jvm;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.zip.GZIPInputStream;

import com.github.luben.zstd.ZstdInputStreamNoFinalizer;
import net.jpountz.lz4.LZ4FrameInputStream;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.types.UTF8String;
import org.xerial.snappy.Snappy;
import org.xerial.snappy.SnappyInputStream;

/**
 * An executor's side of a read: one {@link OffsetRange} decoded into Spark columnar batches, as
 * {@code logstore.spark.read.read_range} decodes it into Arrow.
 *
 * <p>The segment files are read with positional reads into a window of {@code WINDOW} bytes (never
 * mapped: a writer may trim the active segment under a map); every batch walked is validated
 * before any of its rows is given: length, magic and CRC32C ({@link Batches#check}), and its
 * records section ({@link Batches#recordsError}, after inflating a compressed one) before any
 * column is sized for its record count. A batch's claimed length is checked against the
 * segment's readable bytes before a window is sized for it. An invalid
 * batch ends the segment when every byte from it to the segment's readable end is zero (the
 * preallocated tail of an active segment), else it fails the task naming the file and position.
 * Control batches give no rows. Compressed batches are inflated with the JDK (gzip), snappy-java
 * (Kafka's xerial framing, or a raw block), lz4-java (the LZ4 frame) and zstd-jni, to at most
 * {@link #MAX_DECOMPRESSED} bytes; an empty records section is no records, whatever the codec
 * (the cleaner leaves such batches). Segments deleted while the read runs are the offsets they
 * held gone: an error with failOnDataLoss, else skipped, as {@code PartitionView.scan}. Only the
 * columns of the read schema are built; a batch of rows is handed on once it holds at least
 * {@code ROWS} (whole record batches: its vectors grow to fit the last one).
 *
 * <p>Thread-safety: one per task; not shared.
 */
final class RangeReader implements PartitionReader<ColumnarBatch> {
    static final int ROWS = 8192;
    private static final int WINDOW = 8 << 20;
    /**
     * The largest records section a compressed batch may inflate to (a decompression-bomb guard):
     * the Python source's bound, {@code logstore.records.batch.MAX_DECOMPRESSED_BYTES} (the pair is
     * checked equal by tests/spark/test_spark_jvm.py).
     */
    static final int MAX_DECOMPRESSED = 256 << 20;
    private static final byte[] XERIAL = {(byte) 0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0};
    private static final int KEY = 0;
    private static final int VALUE = 1;
    private static final int TOPIC = 2;
    private static final int PARTITION = 3;
    private static final int OFFSET = 4;
    private static final int TIMESTAMP = 5;
    private static final int TIMESTAMP_TYPE = 6;
    private static final int HEADERS = 7;

    private final OffsetRange r;
    private final int[] kinds;
    private final ColumnVector[] vectors;
    private final WritableColumnVector[] writable;
    private final ColumnarBatch batch;
    private final PartitionFiles view;
    private List<Long> segments;
    private long[] hint;
    private Long findStart;
    private long start;
    private int rows;
    private boolean done;
    private long reached;

    // the segment being read
    private int segmentIndex = -1;
    private FileChannel channel;
    private Path path;
    private long limit;
    private long position;
    private byte[] window = new byte[0];
    private long windowStart;
    private int windowLength;
    private byte[] inflated = new byte[1 << 16];

    RangeReader(OffsetRange r, StructType schema) {
        this.r = r;
        StructField[] fields = schema.fields();
        kinds = new int[fields.length];
        vectors = new ColumnVector[fields.length];
        writable = new WritableColumnVector[fields.length];
        for (int i = 0; i < fields.length; i++) {
            String name = fields[i].name();
            kinds[i] = List.of("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
                .indexOf(name);
            if (kinds[i] == TOPIC) {
                ConstantColumnVector c = new ConstantColumnVector(Integer.MAX_VALUE, fields[i].dataType());
                c.setUtf8String(UTF8String.fromString(r.topic));
                vectors[i] = c;
            } else if (kinds[i] == PARTITION) {
                ConstantColumnVector c = new ConstantColumnVector(Integer.MAX_VALUE, fields[i].dataType());
                c.setInt(r.partition);
                vectors[i] = c;
            } else {
                writable[i] = new OnHeapColumnVector(ROWS, fields[i].dataType());
                vectors[i] = writable[i];
            }
        }
        batch = new ColumnarBatch(vectors);
        view = new StoreFiles(Path.of(r.root)).partition(r.topic, r.partition);
        segments = view.segments();
        findStart = r.findStartTs;
        start = r.start;
        long logStart = view.logStart(segments);
        if (segments.isEmpty() || start < logStart) {
            if (r.failOnDataLoss) {
                throw new IllegalStateException(r.topic + "-" + r.partition + ": offsets from " + start
                    + " are gone (the log starts at " + logStart + ")");
            }
            start = logStart; // the records are gone: read what is left of the range
        }
        done = start >= r.end || segments.isEmpty();
        reached = start;
        hint = r.segment >= 0 && start == r.start && segments.contains(r.segment)
            ? new long[] {r.segment, r.position} : view.seek(start, segments);
    }

    @Override
    public boolean next() throws IOException {
        for (WritableColumnVector w : writable) {
            if (w != null) {
                w.reset();
            }
        }
        rows = 0;
        while (!done && rows < ROWS) {
            if (channel == null && !openNext()) {
                done = true;
                if (reached < r.end && segmentIndex >= segments.size() && r.failOnDataLoss) {
                    throw new IllegalStateException(r.topic + "-" + r.partition + ": the log ends at offset " + reached
                        + ", before the planned end " + r.end + " (truncated since it was planned?)");
                }
                break;
            }
            if (!step()) {
                closeSegment();
            }
        }
        if (done) {
            closeSegment();
        }
        batch.setNumRows(rows);
        return rows > 0;
    }

    /** Opens the next segment to read; false when there is none. */
    private boolean openNext() throws IOException {
        while (++segmentIndex < segments.size()) {
            long base = segments.get(segmentIndex);
            if (base < hint[0]) {
                continue;
            }
            if (base >= r.end) {
                done = true;
                return false;
            }
            path = view.file(base, ".log");
            try {
                channel = FileChannel.open(path, StandardOpenOption.READ);
            } catch (NoSuchFileException e) {
                // Deleted (retention) or merged into another segment (the cleaner) since it was
                // listed: list again and go on from it, as PartitionView.scan does. Offsets below
                // the new log start are gone: an error with failOnDataLoss, else skipped.
                relist(Math.max(start, base), base);
                if (done) {
                    return false;
                }
                continue;
            }
            if (base == r.stopSegment) {
                limit = r.stopPosition;
            } else if (segmentIndex < segments.size() - 1) {
                limit = channel.size();
            } else {
                limit = view.logEnd(segments)[2];
            }
            reached = Math.max(reached, base);
            position = base == hint[0] ? hint[1] : 0;
            if (position > limit) {
                position = 0;
            }
            windowLength = 0;
            windowStart = position;
            return true;
        }
        return false;
    }

    /** Lists the segments again after the one at {@code missing} went, to read on from {@code next}. */
    private void relist(long next, long missing) {
        segments = view.segments();
        if (segments.contains(missing)) {
            throw new IllegalStateException(path + " is listed but cannot be opened (logstore JVM reader)");
        }
        long logStart = view.logStart(segments);
        if (segments.isEmpty() || next < logStart) {
            if (r.failOnDataLoss) {
                throw new IllegalStateException(r.topic + "-" + r.partition + ": offsets from " + next
                    + " are gone (the log starts at " + logStart + "; deleted during the read)");
            }
            next = logStart;
        }
        start = next;
        if (segments.isEmpty() || start >= r.end) {
            done = true;
        }
        hint = view.seek(start, segments);
        segmentIndex = -1;
    }

    private void closeSegment() throws IOException {
        if (channel != null) {
            channel.close();
            channel = null;
        }
    }

    /** Makes the window hold the bytes from {@code position} on, at least {@code need} of them when the segment has them. */
    private void fill(long need) throws IOException {
        int want = (int) Math.min(Math.max(WINDOW, need), limit - position);
        if (window.length < want) {
            window = new byte[want];
        }
        int got = 0;
        while (got < want) {
            int n = channel.read(java.nio.ByteBuffer.wrap(window, got, want - got), position + got);
            if (n < 0) {
                break;
            }
            got += n;
        }
        windowStart = position;
        windowLength = got;
    }

    /** Reads the next batch of the segment into the vectors; false at the segment's end. */
    private boolean step() throws IOException {
        if (position >= limit) {
            return false;
        }
        boolean inside = position >= windowStart && position - windowStart <= windowLength;
        int at = inside ? (int) (position - windowStart) : 0;
        boolean whole = inside && windowLength - at >= Batches.HEADER_SIZE
            && Batches.claimed(window, at) <= windowLength - at;
        if (!whole && (position != windowStart || windowStart + windowLength < limit)) {
            long need = Batches.HEADER_SIZE;
            if (inside && windowLength - at >= Batches.HEADER_SIZE) {
                long claimed = Batches.claimed(window, at);
                // A window is sized only for a batch the segment can hold (its bytes up to the
                // readable end, below 2 GiB as a segment is) and whose header can be one: a flipped
                // length field makes the batch invalid, never a huge read.
                if (claimed >= Batches.HEADER_SIZE && window[at + Batches.POS_MAGIC] == 2 && claimed <= limit - position) {
                    need = claimed;
                }
            }
            fill(need);
            at = 0;
        }
        int avail = windowLength - at;
        long size = Batches.check(window, at, avail);
        if (size < 0) {
            if (zeroTail()) {
                return false;
            }
            throw new IllegalStateException("Record is corrupt in " + path + " at position " + position + ": "
                + Batches.reason(window, at, avail) + " (logstore JVM reader)");
        }
        long base = Batches.baseOffset(window, at);
        if (base >= r.end) {
            done = true;
            return false;
        }
        long last = Batches.lastOffset(window, at);
        int attributes = Batches.i16(window, at + Batches.POS_ATTRIBUTES);
        if (last >= start && (attributes & Batches.ATTR_CONTROL) == 0) {
            decode(at, (int) size, attributes);
        }
        reached = Math.max(reached, last + 1);
        position += size;
        if (reached >= r.end) {
            done = true;
        }
        return !done;
    }

    /** Whether every byte from {@code position} to the segment's readable end is zero. */
    private boolean zeroTail() throws IOException {
        long p = position;
        byte[] chunk = new byte[1 << 20];
        while (p < limit) {
            byte[] got = StoreFiles.pread(channel, p, (int) Math.min(chunk.length, limit - p));
            if (got.length == 0) {
                return true;
            }
            if (!Batches.allZero(got, 0, got.length)) {
                return false;
            }
            p += got.length;
        }
        return true;
    }

    private void decode(int at, int size, int attributes) throws IOException {
        byte[] b = window;
        int p = at + Batches.HEADER_SIZE;
        int e = at + size;
        int codec = attributes & Batches.COMPRESSION_MASK;
        if (codec != 0) {
            int n = inflate(codec, b, p, e - p);
            b = inflated;
            p = 0;
            e = n;
        }
        long base = Batches.baseOffset(window, at);
        boolean logAppend = (attributes & Batches.ATTR_TIMESTAMP_TYPE) != 0;
        long baseTs = Batches.i64(window, at + Batches.POS_BASE_TIMESTAMP);
        long maxTs = Batches.i64(window, at + Batches.POS_MAX_TIMESTAMP);
        int count = Batches.i32(window, at + Batches.POS_RECORDS_COUNT);
        String invalid = Batches.recordsError(b, p, e, count, Batches.i32(window, at + Batches.POS_LAST_OFFSET_DELTA));
        if (invalid != null) {
            throw corrupt(at, (codec != 0 ? "(inflated) " : "") + invalid);
        }
        // The walk above bounded every length below (and count by the section's bytes): the
        // checks that follow guard the decoding itself.
        for (WritableColumnVector w : writable) {
            if (w != null) {
                w.reserve(rows + count);
            }
        }
        int[] cursor = {p};
        for (int i = 0; i < count; i++) {
            int length = varint(b, cursor, e, at);
            if (length <= 0 || length > e - cursor[0]) {
                throw corrupt(at, "record " + i + " of length " + length + " overruns its batch");
            }
            int re = cursor[0] + length;
            cursor[0]++; // attributes
            long tsDelta = varlong(b, cursor, re, at);
            long offset = base + varint(b, cursor, re, at);
            int keyLength = varint(b, cursor, re, at);
            int key = cursor[0];
            if (keyLength < -1 || keyLength > re - key) {
                throw corrupt(at, "record " + i + " has impossible field lengths");
            }
            cursor[0] += Math.max(keyLength, 0);
            int valueLength = varint(b, cursor, re, at);
            int value = cursor[0];
            if (valueLength < -1 || valueLength > re - value) {
                throw corrupt(at, "record " + i + " has impossible field lengths");
            }
            cursor[0] += Math.max(valueLength, 0);
            int headers = varint(b, cursor, re, at);
            int headersAt = cursor[0];
            if (headers < 0) {
                throw corrupt(at, "record " + i + " has impossible field lengths");
            }
            if (offset < start) {
                cursor[0] = re;
                continue;
            }
            if (offset >= r.end) {
                done = true;
                return;
            }
            long ts = logAppend ? maxTs : baseTs + tsDelta;
            if (findStart != null) {
                if (ts < findStart) {
                    cursor[0] = re;
                    continue;
                }
                findStart = null;
            }
            if (r.findEndTs != null && ts >= r.findEndTs) {
                done = true;
                return;
            }
            for (int c = 0; c < kinds.length; c++) {
                WritableColumnVector w = writable[c];
                switch (kinds[c]) {
                    case KEY:
                        if (keyLength < 0) {
                            w.putNull(rows);
                        } else {
                            w.putByteArray(rows, b, key, keyLength);
                        }
                        break;
                    case VALUE:
                        if (valueLength < 0) {
                            w.putNull(rows);
                        } else {
                            w.putByteArray(rows, b, value, valueLength);
                        }
                        break;
                    case OFFSET:
                        w.putLong(rows, offset);
                        break;
                    case TIMESTAMP:
                        w.putLong(rows, ts * 1000);
                        break;
                    case TIMESTAMP_TYPE:
                        w.putInt(rows, logAppend ? 1 : 0);
                        break;
                    case HEADERS:
                        putHeaders(w, b, headersAt, headers, re, at);
                        break;
                    default:
                        break;
                }
            }
            rows++;
            cursor[0] = re;
        }
    }

    private void putHeaders(WritableColumnVector w, byte[] b, int p, int count, int re, int at) {
        WritableColumnVector structs = w.arrayData();
        int first = structs.getElementsAppended();
        int[] cursor = {p};
        for (int h = 0; h < count; h++) {
            int keyLength = varint(b, cursor, re, at);
            if (keyLength < 0 || keyLength > re - cursor[0]) {
                throw corrupt(at, "a header key overruns its record");
            }
            int key = cursor[0];
            cursor[0] += keyLength;
            int valueLength = varint(b, cursor, re, at);
            if (valueLength < -1 || valueLength > re - cursor[0]) {
                throw corrupt(at, "a header value overruns its record");
            }
            structs.appendStruct(false);
            structs.getChild(0).appendByteArray(b, key, keyLength);
            WritableColumnVector values = structs.getChild(1);
            if (valueLength < 0) {
                values.appendNull();
            } else {
                values.appendByteArray(b, cursor[0], valueLength);
                cursor[0] += valueLength;
            }
        }
        w.putArray(rows, first, count);
    }

    private IllegalStateException corrupt(int at, String reason) {
        return new IllegalStateException("Record is corrupt in " + path + " at position " + (windowStart + at) + ": "
            + reason + " (logstore JVM reader)");
    }

    private int varint(byte[] b, int[] cursor, int end, int at) {
        int p = cursor[0];
        long v = varlong(b, cursor, end, at);
        if (v < Integer.MIN_VALUE || v > Integer.MAX_VALUE) {
            throw corrupt(at, "a varint out of range " + where(b, p));
        }
        return (int) v;
    }

    /** Where byte {@code p} of {@code b} lies, in words: a file position, or a byte of the inflated records. */
    private String where(byte[] b, int p) {
        return b == window ? "at file position " + (windowStart + p) : "at byte " + p + " of the inflated records";
    }

    /** A zigzag varlong at {@code cursor[0]} (moved past it), bounded by {@code end}, in the batch at {@code at}. */
    private long varlong(byte[] b, int[] cursor, int end, int at) {
        int p = cursor[0];
        if (p < end && b[p] >= 0) {
            // One byte: most fields of a record (its attributes' neighbours, deltas, short
            // lengths, the header count). This path halved the decode's share of a JFR profile.
            cursor[0] = p + 1;
            return (b[p] >>> 1) ^ -(b[p] & 1);
        }
        long raw = 0;
        int shift = 0;
        while (true) {
            if (p >= end || shift > 63) {
                throw corrupt(at, "a varint runs past its record " + where(b, p));
            }
            byte x = b[p++];
            raw |= (long) (x & 0x7f) << shift;
            if (x >= 0) {
                break;
            }
            shift += 7;
        }
        cursor[0] = p;
        return (raw >>> 1) ^ -(raw & 1);
    }

    /** Inflates a compressed batch's records into {@code inflated}; returns their length. */
    private int inflate(int codec, byte[] b, int p, int n) throws IOException {
        if (n == 0) {
            return 0; // an empty records section (a batch the cleaner emptied): no records, whatever the codec
        }
        try {
            if (codec == 2 && !startsWith(b, p, n, XERIAL)) {
                int length = Snappy.uncompressedLength(b, p, n);
                if (length < 0 || length > MAX_DECOMPRESSED) {
                    throw new IOException("the snappy block declares " + Integer.toUnsignedString(length)
                        + " bytes, above the limit of " + MAX_DECOMPRESSED);
                }
                grow(length);
                return Snappy.uncompress(b, p, n, inflated, 0);
            }
            InputStream raw = new ByteArrayInputStream(b, p, n);
            InputStream in;
            switch (codec) {
                case 1:
                    in = new GZIPInputStream(raw, 1 << 16);
                    break;
                case 2:
                    in = new SnappyInputStream(raw);
                    break;
                case 3:
                    in = new LZ4FrameInputStream(raw);
                    break;
                case 4:
                    in = new ZstdInputStreamNoFinalizer(raw);
                    break;
                default:
                    throw new IOException("unknown compression codec " + codec);
            }
            try (InputStream stream = in) {
                int total = 0;
                while (true) {
                    if (total == inflated.length) {
                        if (total > MAX_DECOMPRESSED) {
                            throw new IOException("the records inflate to more than the limit of " + MAX_DECOMPRESSED + " bytes");
                        }
                        grow((int) Math.min(total * 2L, MAX_DECOMPRESSED + 1L));
                    }
                    int got = stream.read(inflated, total, inflated.length - total);
                    if (got < 0) {
                        return total;
                    }
                    total += got;
                }
            }
        } catch (IOException | RuntimeException e) {
            throw new IllegalStateException("Record is corrupt in " + path + " at position " + position
                + ": cannot decompress the batch (codec " + codec + "): " + e + " (logstore JVM reader)", e);
        }
    }

    /** Makes {@code inflated} hold at least {@code length} bytes (at most MAX_DECOMPRESSED + 1: the caller's bound). */
    private void grow(int length) {
        if (inflated.length < length) {
            byte[] bigger = new byte[(int) Math.max(length, Math.min(inflated.length * 2L, MAX_DECOMPRESSED + 1L))];
            System.arraycopy(inflated, 0, bigger, 0, inflated.length);
            inflated = bigger;
        }
    }

    private static boolean startsWith(byte[] b, int p, int n, byte[] prefix) {
        if (n < prefix.length) {
            return false;
        }
        for (int i = 0; i < prefix.length; i++) {
            if (b[p + i] != prefix[i]) {
                return false;
            }
        }
        return true;
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() throws IOException {
        closeSegment();
        batch.close();
    }
}
