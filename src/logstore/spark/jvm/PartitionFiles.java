package logstore.spark.jvm;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.stream.Stream;

/**
 * Read-only view of one partition directory {@code <root>/<topic>-<partition>} (see
 * {@link StoreFiles}): the same answers as {@code logstore.store.views.PartitionView} for a
 * partition without a remote tier. Thread-safety: immutable; any thread.
 */
final class PartitionFiles {
    private static final int TAIL_CHUNK = 256 << 10;
    private static final long MAX_RELATIVE = Integer.MAX_VALUE;

    final StoreFiles store;
    final String topic;
    final int partition;
    final Path dir;

    PartitionFiles(StoreFiles store, String topic, int partition) {
        this.store = store;
        this.topic = topic;
        this.partition = partition;
        this.dir = store.root.resolve(topic + "-" + partition);
    }

    /** Base offsets of the live segments, ascending (none for a partition without a directory). */
    List<Long> segments() {
        List<Long> out = new ArrayList<>();
        try (Stream<Path> files = Files.list(dir)) {
            files.forEach(p -> {
                long base = StoreFiles.segmentBase(p.getFileName().toString(), ".log");
                if (base >= 0) {
                    out.add(base);
                }
            });
        } catch (NoSuchFileException e) {
            return out;
        } catch (IOException e) {
            throw new IllegalStateException(dir + ": cannot list: " + e, e);
        }
        Collections.sort(out);
        return out;
    }

    Path file(long base, String suffix) {
        return dir.resolve(StoreFiles.segmentName(base) + suffix);
    }

    /** The first readable offset: the first segment's base, or the checkpointed log start past it. */
    long logStart(List<Long> segments) {
        if (segments.isEmpty()) {
            return 0;
        }
        Long start = store.checkpoint(StoreFiles.LOG_START_OFFSET_CHECKPOINT, topic, partition);
        return Math.max(segments.get(0), start == null ? 0 : start);
    }

    /** The log end: its offset, the last segment (-1: none) and the position after its last valid batch. */
    long[] logEnd(List<Long> segments) {
        if (segments.isEmpty()) {
            return new long[] {0, -1, 0};
        }
        long base = segments.get(segments.size() - 1);
        long hint = indexFloor(base, 1L << 62);
        try (FileChannel ch = FileChannel.open(file(base, ".log"), StandardOpenOption.READ)) {
            long start = hint < ch.size() ? hint : 0;
            long[] end = validEnd(ch, base, start);
            if (end[1] == start && start > 0) {
                end = validEnd(ch, base, 0); // the index pointed at no valid batch: walk from the start
            }
            return new long[] {end[0], base, end[1]};
        } catch (IOException e) {
            throw new IllegalStateException(file(base, ".log") + ": " + e, e);
        }
    }

    /**
     * The offset after the valid batches from {@code start} (a batch boundary) and the position
     * after them, read with positional reads a chunk at a time: a torn tail, the zero tail of the
     * active segment or an invalid batch ends them, as do offsets that do not increase. The rule
     * is the store's ({@code ls_segment_scan}): a batch valid by {@link Batches#check}, above the
     * one before, ending at or after the segment's base and within 2^31-1 offsets of it, and, when
     * uncompressed, with a valid records section ({@link Batches#recordsError}).
     */
    static long[] validEnd(FileChannel ch, long base, long start) throws IOException {
        long position = start;
        long last = -1;
        int want = TAIL_CHUNK;
        while (true) {
            byte[] data = StoreFiles.pread(ch, position, want);
            int p = 0;
            int next = TAIL_CHUNK;
            boolean done = false;
            while (p < data.length) {
                long size = Batches.check(data, p, data.length - p);
                if (size == Batches.TRUNCATED) {
                    // The chunk ends inside a batch: read on, the whole of it, if the file can hold it.
                    long need = data.length - p >= Batches.HEADER_SIZE ? Batches.claimed(data, p) : Batches.HEADER_SIZE;
                    done = data.length < want || need > Integer.MAX_VALUE - 16 || position + p + need > ch.size();
                    next = (int) Math.max(TAIL_CHUNK, Math.min(need, Integer.MAX_VALUE - 16));
                    break;
                }
                if (size < 0 || Batches.baseOffset(data, p) <= last || Batches.lastOffset(data, p) < base
                        || Batches.lastOffset(data, p) - base > MAX_RELATIVE || !recordsValid(data, p, (int) size)) {
                    done = true; // an invalid batch, or the zero tail
                    break;
                }
                last = Batches.lastOffset(data, p);
                p += (int) size;
            }
            position += p;
            if (done || (p >= data.length && data.length < want)) {
                break;
            }
            want = next;
        }
        return new long[] {last >= 0 ? last + 1 : base, position};
    }

    /** Whether the records section of the CRC-valid batch at {@code p} is valid (a compressed one is not inflated here). */
    private static boolean recordsValid(byte[] b, int p, int size) {
        return (Batches.i16(b, p + Batches.POS_ATTRIBUTES) & Batches.COMPRESSION_MASK) != 0
            || Batches.recordsError(b, p + Batches.HEADER_SIZE, p + size, Batches.i32(b, p + Batches.POS_RECORDS_COUNT),
                Batches.i32(b, p + Batches.POS_LAST_OFFSET_DELTA)) == null;
    }

    /** The end of what consumers may read: the log end, capped by a checkpointed high watermark. */
    long highWatermark(long logEndOffset) {
        Long hw = store.checkpoint(StoreFiles.REPLICATION_OFFSET_CHECKPOINT, topic, partition);
        return hw == null ? logEndOffset : Math.min(logEndOffset, Math.max(hw, 0));
    }

    /** Offset index entries (relative offset, position) that pass the sanity check; empty when it fails. */
    private int[][] offsetIndex(long base) {
        byte[] data = StoreFiles.readEntries(file(base, ".index"), 8);
        if (data == null) {
            return new int[0][];
        }
        List<int[]> out = new ArrayList<>();
        int prevRel = -1;
        int prevPos = -1;
        for (int p = 0; p + 8 <= data.length; p += 8) {
            int rel = Batches.i32(data, p);
            int pos = Batches.i32(data, p + 4);
            if (rel == 0 && pos == 0) {
                break; // the zero tail of a preallocated index
            }
            if (rel <= prevRel || pos < 0 || rel < 0 || (out.size() > 0 && pos <= prevPos)) {
                return new int[0][];
            }
            out.add(new int[] {rel, pos});
            prevRel = rel;
            prevPos = pos;
        }
        return out.toArray(new int[0][]);
    }

    /** A batch boundary at or before {@code offset} in the segment at {@code base} (0 without an index entry). */
    long indexFloor(long base, long offset) {
        long rel = Math.min(offset - base, MAX_RELATIVE);
        if (rel < 0) {
            return 0;
        }
        long position = 0;
        for (int[] e : offsetIndex(base)) {
            if (e[0] > rel) {
                break;
            }
            position = e[1];
        }
        return position;
    }

    /** The segment holding {@code offset} and a batch boundary at or before it: {segment, position}. */
    long[] seek(long offset, List<Long> segments) {
        if (segments.isEmpty()) {
            return new long[] {0, 0};
        }
        long holder = segments.get(0);
        for (long base : segments) {
            if (base <= offset) {
                holder = base;
            } else {
                break;
            }
        }
        return new long[] {holder, indexFloor(holder, offset)};
    }

    /** Every offset index entry of every segment as {offset, segment, position} (where a read may start). */
    List<long[]> indexPositions(List<Long> segments) {
        List<long[]> out = new ArrayList<>();
        for (long base : segments) {
            out.add(new long[] {base, base, 0});
            for (int[] e : offsetIndex(base)) {
                out.add(new long[] {base + e[0], base, e[1]});
            }
        }
        return out;
    }

    /** Time index entries {timestamp, offset} that pass the sanity check; null without an index file. */
    private long[][] timeIndex(long base) {
        byte[] data = StoreFiles.readEntries(file(base, ".timeindex"), 12);
        if (data == null) {
            return null;
        }
        List<long[]> out = new ArrayList<>();
        long prevTs = Long.MIN_VALUE;
        int prevRel = -1;
        for (int p = 0; p + 12 <= data.length; p += 12) {
            long ts = Batches.i64(data, p);
            int rel = Batches.i32(data, p + 8);
            if (ts == 0 && rel == 0) {
                break;
            }
            if (rel < prevRel || rel < 0 || (out.size() > 0 && ts <= prevTs)) {
                return new long[0][];
            }
            out.add(new long[] {ts, base + rel});
            prevTs = ts;
            prevRel = rel;
        }
        return out.toArray(new long[0][]);
    }

    /**
     * Bounds on the first offset whose record has a timestamp at least {@code timestamp} (Kafka's
     * ListOffsets), from the time indexes alone: it lies in [low, high] (high -1: up to the log end).
     */
    long[] timestampBounds(long timestamp, List<Long> segments) {
        long low = segments.isEmpty() ? 0 : segments.get(0);
        for (long base : segments) {
            long[][] index = timeIndex(base);
            if (index == null || index.length == 0) {
                low = base;
                continue;
            }
            long[] last = index[index.length - 1];
            if (last[0] < timestamp) {
                low = last[1];
                continue;
            }
            int slot = -1;
            long below = timestamp == Long.MIN_VALUE ? timestamp : timestamp - 1; // (clamped, as PartitionView)
            for (int i = 0; i < index.length && index[i][0] <= below; i++) {
                slot = i;
            }
            low = Math.max(low, slot >= 0 ? index[slot][1] : base);
            return new long[] {low, index[slot + 1][1]};
        }
        return new long[] {low, -1};
    }
}
