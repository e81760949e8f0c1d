package logstore.spark.jvm;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * Read-only view of a logstore data directory, as {@code logstore.store.views.StoreView} and
 * {@code PartitionView} read it: topics from {@code .topics/}, a partition's segments from its
 * {@code .log} file names, its log start from the segments and {@code log-start-offset-checkpoint},
 * its log end from the valid batches (CRC checked) after the last offset index entry of its last
 * segment, its high watermark capped by {@code replication-offset-checkpoint}, offsets and
 * timestamps mapped to byte positions through the sparse {@code .index} and {@code .timeindex}.
 *
 * <p>Never opens a file for writing, takes no lock and repairs nothing; files are read with
 * positional reads, never mapped (a writer may trim the active segment's preallocated tail, and a
 * map touched past a file's new end faults). Indexes are hints: one that fails its sanity check
 * reads as empty. Thread-safety: immutable; any thread.
 */
final class StoreFiles {
    static final String TOPICS_DIR = ".topics";
    static final String REMOTE_STORAGE_FILE = ".remote-storage";
    static final String REMOTE_LOG_METADATA_TOPIC = "__remote_log_metadata";
    static final String LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint";
    static final String REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint";
    private static final Pattern LEGAL_TOPIC = Pattern.compile("[a-zA-Z0-9._-]{1,249}");
    private static final int SEGMENT_NAME_DIGITS = 20;
    private static final int INDEX_CHUNK_ENTRIES = 512;
    private static final int INDEX_CHUNK_MAX = 1 << 20;

    final Path root;

    StoreFiles(Path root) {
        this.root = root;
    }

    /** Topic names, sorted, internal ones ({@code __...}) left out. */
    List<String> topics() {
        List<String> out = new ArrayList<>();
        try (Stream<Path> files = Files.list(root.resolve(TOPICS_DIR))) {
            files.map(p -> p.getFileName().toString())
                .filter(n -> LEGAL_TOPIC.matcher(n).matches() && !n.equals(".") && !n.equals("..") && !n.startsWith("__"))
                .sorted().forEach(out::add);
        } catch (IOException e) {
            throw new IllegalStateException(root + ": cannot list " + TOPICS_DIR + "/: " + e, e);
        }
        return out;
    }

    /** The partition count of a topic (its topic file's {@code partitions}). */
    int partitions(String topic) {
        if (!LEGAL_TOPIC.matcher(topic).matches() || topic.equals(".") || topic.equals("..")) {
            throw new IllegalArgumentException("invalid topic name '" + topic + "'");
        }
        Map<String, String> props;
        Path file = root.resolve(TOPICS_DIR).resolve(topic);
        try {
            props = properties(file);
        } catch (NoSuchFileException e) {
            throw new IllegalArgumentException("topic '" + topic + "' does not exist in " + root);
        } catch (IOException e) {
            throw new IllegalStateException(file + ": " + e, e);
        }
        try {
            return Integer.parseInt(props.get("partitions").trim());
        } catch (RuntimeException e) {
            throw new IllegalStateException(file + ": no usable 'partitions' entry");
        }
    }

    PartitionFiles partition(String topic, int partition) {
        return new PartitionFiles(this, topic, partition);
    }

    /** Java properties, the subset logstore writes ({@code key=value} lines, {@code #} comments). */
    static Map<String, String> properties(Path file) throws IOException {
        Map<String, String> out = new HashMap<>();
        for (String line : new String(Files.readAllBytes(file), StandardCharsets.UTF_8).split("\n")) {
            line = line.strip();
            int eq = line.indexOf('=');
            if (line.isEmpty() || line.startsWith("#") || line.startsWith("!") || eq < 0) {
                continue;
            }
            out.put(line.substring(0, eq).strip(), line.substring(eq + 1).strip());
        }
        return out;
    }

    /** The offset a checkpoint file of the store records for a partition, null when none (or unreadable: a hint). */
    Long checkpoint(String name, String topic, int partition) {
        List<String> lines;
        try {
            lines = List.of(new String(Files.readAllBytes(root.resolve(name)), StandardCharsets.UTF_8).split("\n"));
        } catch (IOException e) {
            return null;
        }
        try {
            if (lines.size() < 2 || Integer.parseInt(lines.get(0)) != 0 || Integer.parseInt(lines.get(1)) != lines.size() - 2) {
                return null;
            }
            Long found = null;
            for (String line : lines.subList(2, lines.size())) {
                String[] f = line.split(" ");
                if (f.length != 3) {
                    return null;
                }
                if (f[0].equals(topic) && Integer.parseInt(f[1]) == partition) {
                    found = Long.parseLong(f[2]);
                }
            }
            return found;
        } catch (NumberFormatException e) {
            return null;
        }
    }

    /** The base offset a segment file name stands for ({@code 00000000000000000042.log}), -1 when not one. */
    static long segmentBase(String name, String suffix) {
        if (!name.endsWith(suffix) || name.length() != SEGMENT_NAME_DIGITS + suffix.length()) {
            return -1;
        }
        for (int i = 0; i < SEGMENT_NAME_DIGITS; i++) {
            if (name.charAt(i) < '0' || name.charAt(i) > '9') {
                return -1;
            }
        }
        try {
            return Long.parseLong(name.substring(0, SEGMENT_NAME_DIGITS));
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    static String segmentName(long base) {
        return String.format("%0" + SEGMENT_NAME_DIGITS + "d", base);
    }

    /** Up to {@code n} bytes of a file from {@code position} (fewer at its end). */
    static byte[] pread(FileChannel ch, long position, int n) throws IOException {
        ByteBuffer buf = ByteBuffer.allocate(n);
        while (buf.hasRemaining()) {
            int got = ch.read(buf, position + buf.position());
            if (got < 0) {
                break;
            }
        }
        byte[] out = new byte[buf.position()];
        System.arraycopy(buf.array(), 0, out, 0, out.length);
        return out;
    }

    /**
     * The entries of an index file of {@code entrySize}-byte entries up to its first all-zero one
     * (the zero tail of a preallocated index is never read whole: chunks of growing size, as far
     * as the entries in use), or null when it does not exist or cannot be read (an index is a hint).
     */
    static byte[] readEntries(Path path, int entrySize) {
        try (FileChannel ch = FileChannel.open(path, StandardOpenOption.READ)) {
            long size = Math.min(ch.size(), Integer.MAX_VALUE - 16);
            size -= size % entrySize;
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            int chunk = INDEX_CHUNK_ENTRIES * entrySize;
            for (long position = 0; position < size; position += chunk, chunk = Math.min(chunk * 2, INDEX_CHUNK_MAX)) {
                chunk -= chunk % entrySize;
                byte[] got = pread(ch, position, (int) Math.min(chunk, size - position));
                int whole = got.length - got.length % entrySize;
                for (int i = 0; i < whole; i += entrySize) {
                    if (Batches.allZero(got, i, i + entrySize)) {
                        out.write(got, 0, i);
                        return out.toByteArray();
                    }
                }
                out.write(got, 0, whole);
                if (whole < chunk) {
                    break; // the file was cut meanwhile
                }
            }
            return out.toByteArray();
        } catch (NoSuchFileException e) {
            return null;
        } catch (IOException e) {
            return null; // (an index is a hint)
        }
    }
}
