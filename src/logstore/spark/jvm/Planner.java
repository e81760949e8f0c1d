package logstore.spark.jvm;

import java.io.File;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.TreeMap;
import java.util.regex.Pattern;
import java.util.regex.PatternSyntaxException;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * A batch read's options and pushed filters into {@link OffsetRange}s, on the driver: the same
 * options, checks, messages and planning as {@code logstore.spark.options} and
 * {@code logstore.spark.plan.Planner} (ranges from segment file names, sparse index entries and
 * the batch headers after the last one; split at offset index entries, never inside the offsets
 * where a timestamp search runs).
 *
 * <p>Thread-safety: one per scan, on the driver.
 */
final class Planner {
    static final long EARLIEST = -2;
    static final long LATEST = -1;
    static final Set<String> READ_OPTIONS = Set.of("path", "subscribe", "subscribepattern", "assign", "startingoffsets",
        "endingoffsets", "startingtimestamp", "endingtimestamp", "failondataloss", "includeheaders", "minpartitions",
        "maxrecordsperpartition", "maxoffsetspertrigger", "pruneonpushdown", "kafka.isolation.level", "remotestorage",
        "reader");
    private static final ObjectMapper JSON = new ObjectMapper();

    final Map<String, String> opts = new HashMap<>();
    final String root;
    final StoreFiles store;
    final List<String[]> partitions; // {topic, partition}
    final boolean includeHeaders;
    final boolean failOnDataLoss;
    final Long minPartitions;
    final Long maxRecords;
    final Long startTs;
    final Long endTs;
    final Map<String, Long> starting;
    final Map<String, Long> ending;

    // pushed filters (exact ones narrow these; timestampLow only prunes)
    Set<String> onlyTopics;
    Set<Integer> onlyPartitions;
    long offsetLow = 0;
    long offsetHigh = Long.MAX_VALUE;
    Long timestampLow;

    Planner(Map<String, String> raw) {
        for (Map.Entry<String, String> e : raw.entrySet()) {
            opts.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
        }
        TreeSet<String> unknown = new TreeSet<>();
        for (String k : opts.keySet()) {
            if (!READ_OPTIONS.contains(k) && !(k.startsWith("remotestorage.") && k.length() > "remotestorage.".length())) {
                unknown.add(k);
            }
        }
        if (!unknown.isEmpty()) {
            TreeSet<String> known = new TreeSet<>(READ_OPTIONS);
            known.add("remotestorage.<name>");
            throw new IllegalArgumentException("unknown option(s) " + String.join(", ", unknown)
                + " for the logstore source; known: " + String.join(", ", known));
        }
        if (opts.getOrDefault("path", "").isEmpty()) {
            throw new IllegalArgumentException("option 'path' (the store's root directory) is required");
        }
        root = new File(opts.get("path")).getAbsolutePath();
        store = new StoreFiles(new File(root).toPath());
        partitions = topicPartitions();
        includeHeaders = bool("includeheaders", false);
        failOnDataLoss = bool("failondataloss", true);
        minPartitions = integer("minpartitions", 1);
        maxRecords = integer("maxrecordsperpartition", 1);
        if (integer("maxoffsetspertrigger", 1) != null) {
            throw new IllegalArgumentException("option 'maxOffsetsPerTrigger' applies to streaming queries only");
        }
        startTs = integer("startingtimestamp", Long.MIN_VALUE);
        endTs = integer("endingtimestamp", Long.MIN_VALUE);
        starting = perPartition("startingoffsets", EARLIEST, false);
        ending = perPartition("endingoffsets", LATEST, true);
        bool("pruneonpushdown", false); // (checked; the JVM reader always prunes: its pushdown is per scan)
        String isolation = opts.getOrDefault("kafka.isolation.level", "read_uncommitted").strip().toLowerCase(Locale.ROOT);
        if (!isolation.equals("read_uncommitted") && !isolation.equals("read_committed")) {
            throw new IllegalArgumentException("option 'kafka.isolation.level' must be read_uncommitted or read_committed, "
                + "not '" + isolation + "'");
        }
    }

    // ------------------------------------------------------------------ options
    private boolean bool(String name, boolean dflt) {
        String v = opts.get(name);
        if (v == null) {
            return dflt;
        }
        String w = v.strip().toLowerCase(Locale.ROOT);
        if (w.equals("true") || w.equals("false")) {
            return w.equals("true");
        }
        throw new IllegalArgumentException("option '" + name + "' must be true or false, got '" + v + "'");
    }

    private Long integer(String name, long minimum) {
        String v = opts.get(name);
        if (v == null) {
            return null;
        }
        long n;
        try {
            n = Long.parseLong(v.strip());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("option '" + name + "' must be an integer, got '" + v + "'");
        }
        if (n < minimum) {
            throw new IllegalArgumentException("option '" + name + "' must be at least " + minimum + ", got " + n);
        }
        return n;
    }

    private JsonNode json(String name) {
        try {
            return JSON.readTree(opts.get(name));
        } catch (JsonProcessingException e) {
            throw new IllegalArgumentException("option '" + name + "' is not valid JSON (" + e.getOriginalMessage()
                + "): '" + opts.get(name) + "'");
        }
    }

    private static String key(String topic, int partition) {
        return topic + "\u0000" + partition;
    }

    private List<String[]> topicPartitions() {
        List<String> given = new ArrayList<>();
        for (String k : new String[] {"subscribe", "subscribepattern", "assign"}) {
            if (opts.containsKey(k)) {
                given.add(k);
            }
        }
        if (given.size() != 1) {
            throw new IllegalArgumentException("exactly one of the options 'subscribe', 'subscribePattern' and 'assign' "
                + "is required, got " + given.size());
        }
        TreeMap<String, String[]> out = new TreeMap<>();
        List<String> topics = new ArrayList<>();
        switch (given.get(0)) {
            case "assign": {
                JsonNode spec = json("assign");
                boolean ok = spec.isObject();
                for (Iterator<JsonNode> it = spec.elements(); ok && it.hasNext(); ) {
                    ok = it.next().isArray();
                }
                if (!ok) {
                    throw new IllegalArgumentException("option 'assign' must be JSON like {\"topic\":[0,1]}, got '"
                        + opts.get("assign") + "'");
                }
                for (Map.Entry<String, JsonNode> e : spec.properties()) {
                    int count = store.partitions(e.getKey());
                    for (JsonNode p : e.getValue()) {
                        if (!p.isIntegralNumber() || p.asLong() < 0 || p.asLong() >= count) {
                            throw new IllegalArgumentException("option 'assign': topic '" + e.getKey() + "' has partitions 0.."
                                + (count - 1) + ", got " + p);
                        }
                        out.put(sortKey(e.getKey(), p.asInt()), new String[] {e.getKey(), Integer.toString(p.asInt())});
                    }
                }
                return new ArrayList<>(out.values());
            }
            case "subscribe":
                for (String t : opts.get("subscribe").split(",")) {
                    if (!t.strip().isEmpty()) {
                        topics.add(t.strip());
                    }
                }
                if (topics.isEmpty()) {
                    throw new IllegalArgumentException("option 'subscribe' names no topic");
                }
                break;
            default: {
                Pattern pattern;
                try {
                    pattern = Pattern.compile(opts.get("subscribepattern"));
                } catch (PatternSyntaxException e) {
                    throw new IllegalArgumentException("option 'subscribePattern' is not a valid pattern: " + e.getMessage());
                }
                for (String t : store.topics()) {
                    if (pattern.matcher(t).matches()) {
                        topics.add(t);
                    }
                }
            }
        }
        for (String t : topics) {
            int count = store.partitions(t);
            for (int p = 0; p < count; p++) {
                out.put(sortKey(t, p), new String[] {t, Integer.toString(p)});
            }
        }
        return new ArrayList<>(out.values());
    }

    private static String sortKey(String topic, int p) {
        return topic + "\u0000" + String.format("%010d", p);
    }

    private Map<String, Long> perPartition(String name, long dflt, boolean latestAllowed) {
        Map<String, Long> out = new LinkedHashMap<>();
        for (String[] tp : partitions) {
            out.put(key(tp[0], Integer.parseInt(tp[1])), dflt);
        }
        String value = opts.get(name);
        if (value == null) {
            return out;
        }
        String word = value.strip().toLowerCase(Locale.ROOT);
        if (word.equals("earliest") || word.equals("latest")) {
            if (word.equals("latest") != latestAllowed) {
                throw new IllegalArgumentException("option '" + name + "' cannot be '" + word + "' for this query");
            }
            out.replaceAll((k, v) -> word.equals("earliest") ? EARLIEST : LATEST);
            return out;
        }
        JsonNode spec = json(name);
        if (!spec.isObject()) {
            throw new IllegalArgumentException("option '" + name + "' must be 'earliest', 'latest' or JSON like "
                + "{\"topic\":{\"0\":23}}, got '" + value + "'");
        }
        for (Map.Entry<String, JsonNode> t : spec.properties()) {
            if (!t.getValue().isObject()) {
                throw new IllegalArgumentException("option '" + name + "': topic '" + t.getKey()
                    + "' needs an object of partition: offset");
            }
            for (Map.Entry<String, JsonNode> e : t.getValue().properties()) {
                int p;
                try {
                    p = Integer.parseInt(e.getKey().strip());
                } catch (NumberFormatException x) {
                    throw new IllegalArgumentException("option '" + name + "': '" + e.getKey() + "' is not a partition number");
                }
                String k = key(t.getKey(), p);
                if (!out.containsKey(k)) {
                    throw new IllegalArgumentException("option '" + name + "' names " + t.getKey() + "-" + e.getKey()
                        + ", which the query does not read");
                }
                JsonNode o = e.getValue();
                if (!o.isIntegralNumber() || o.asLong() < -2) {
                    throw new IllegalArgumentException("option '" + name + "': offset " + o + " of " + t.getKey() + "-"
                        + e.getKey() + " must be >= 0, -2 (earliest) or -1 (latest)");
                }
                if ((o.asLong() == EARLIEST && latestAllowed) || (o.asLong() == LATEST && !latestAllowed)) {
                    throw new IllegalArgumentException("option '" + name + "': offset " + o.asLong() + " of " + t.getKey()
                        + "-" + e.getKey() + " is not allowed here");
                }
                out.put(k, o.asLong());
            }
        }
        return out;
    }

    // ------------------------------------------------------------------ planning
    /** The input partitions of the read, after the pushed filters. */
    List<OffsetRange> plan() {
        List<OffsetRange> ranges = new ArrayList<>();
        for (String[] tp : partitions) {
            int p = Integer.parseInt(tp[1]);
            if ((onlyTopics == null || onlyTopics.contains(tp[0])) && (onlyPartitions == null || onlyPartitions.contains(p))) {
                OffsetRange r = bounds(tp[0], p);
                if (r != null) {
                    ranges.add(r);
                }
            }
        }
        return split(ranges);
    }

    private OffsetRange bounds(String topic, int p) {
        PartitionFiles view = store.partition(topic, p);
        List<Long> segments = view.segments();
        long logStart = view.logStart(segments);
        long[] logEnd = view.logEnd(segments);
        long high = view.highWatermark(logEnd[0]);
        long wanted = starting.get(key(topic, p));
        long start = wanted == EARLIEST ? logStart : wanted == LATEST ? high : wanted;
        Long findStart = null;
        Long findEnd = null;
        if (startTs != null) {
            start = Math.max(view.timestampBounds(startTs, segments)[0], logStart);
            findStart = startTs;
        }
        if (start > high) {
            throw new IllegalArgumentException("starting offset " + start + " of " + topic + "-" + p + " is past its end (" + high + ")");
        }
        if (start < logStart) {
            if (failOnDataLoss) {
                throw new IllegalStateException(topic + "-" + p + ": starting offset " + start + " is below the log start "
                    + logStart + " (deleted); set failOnDataLoss=false to skip to it");
            }
            start = logStart;
        }
        long wantedEnd = ending.get(key(topic, p));
        long end = wantedEnd == LATEST ? high : wantedEnd;
        if (end > high) {
            throw new IllegalArgumentException("ending offset " + end + " of " + topic + "-" + p + " is past its end (" + high + ")");
        }
        if (endTs != null) {
            long bound = view.timestampBounds(endTs, segments)[1];
            end = Math.min(end, bound < 0 ? high : bound + 1);
            findEnd = endTs;
        }
        if (timestampLow != null && findStart == null) {
            start = Math.max(start, view.timestampBounds(timestampLow, segments)[0]);
        }
        start = Math.max(start, offsetLow);
        end = Math.min(end, offsetHigh);
        if (end < start && wantedEnd != LATEST && offsetHigh == Long.MAX_VALUE && endTs == null) {
            throw new IllegalArgumentException("ending offset " + end + " of " + topic + "-" + p + " is before its starting offset " + start);
        }
        if (end <= start) {
            return null;
        }
        boolean atLogEnd = end == logEnd[0] && logEnd[1] >= 0;
        return new OffsetRange(root, topic, p, start, end, -1, 0, findStart, findEnd, failOnDataLoss,
            atLogEnd ? logEnd[1] : -1, atLogEnd ? logEnd[2] : 0);
    }

    private List<OffsetRange> split(List<OffsetRange> ranges) {
        long[] pieces = new long[ranges.size()];
        Arrays.fill(pieces, 1);
        long total = 0;
        long sum = 0;
        for (int i = 0; i < ranges.size(); i++) {
            long count = ranges.get(i).end - ranges.get(i).start;
            total += count;
            if (maxRecords != null) {
                pieces[i] = Math.max(1, (count + maxRecords - 1) / maxRecords);
            }
            sum += pieces[i];
        }
        if (minPartitions != null && sum < minPartitions && total > 0) {
            for (int i = 0; i < ranges.size(); i++) {
                long count = ranges.get(i).end - ranges.get(i).start;
                pieces[i] = Math.max(pieces[i], (long) Math.ceil((double) minPartitions * count / total));
            }
        }
        List<OffsetRange> out = new ArrayList<>();
        for (int i = 0; i < ranges.size(); i++) {
            out.addAll(splitOne(ranges.get(i), pieces[i]));
        }
        return out;
    }

    private List<OffsetRange> splitOne(OffsetRange r, long pieces) {
        PartitionFiles view = store.partition(r.topic, r.partition);
        List<Long> segments = view.segments();
        long[] first = view.seek(r.start, segments);
        OffsetRange head = r.from(r.start, first[0], first[1], r.findStartTs);
        if (pieces <= 1) {
            return List.of(head);
        }
        // Boundaries at index entries (a read may start there without decoding what precedes),
        // never inside the offsets where a timestamp search runs: above the upper bound of the
        // starting timestamp's first record, at or below the lower bound of the ending one's.
        long floor = r.start;
        if (r.findStartTs != null) {
            long bound = view.timestampBounds(r.findStartTs, segments)[1];
            if (bound < 0) {
                return List.of(head);
            }
            floor = bound + 1;
        }
        long ceiling = r.findEndTs != null ? view.timestampBounds(r.findEndTs, segments)[0] : Long.MAX_VALUE;
        List<long[]> points = new ArrayList<>();
        for (long[] pt : view.indexPositions(segments)) {
            if (floor < pt[0] && pt[0] < r.end && pt[0] <= ceiling) {
                points.add(pt);
            }
        }
        if (points.isEmpty()) {
            return List.of(head);
        }
        List<long[]> cuts = new ArrayList<>();
        double step = (double) (r.end - r.start) / pieces;
        for (long k = 1; k < pieces; k++) {
            double target = r.start + k * step;
            int i = 0;
            while (i < points.size() && points.get(i)[0] < target) {
                i++;
            }
            i = Math.min(i, points.size() - 1);
            if (cuts.isEmpty() || points.get(i)[0] > cuts.get(cuts.size() - 1)[0]) {
                cuts.add(points.get(i));
            }
        }
        List<OffsetRange> out = new ArrayList<>();
        OffsetRange begin = head;
        for (long[] cut : cuts) {
            out.add(begin.until(cut[0], null));
            begin = r.from(cut[0], cut[1], cut[2], null);
        }
        out.add(begin);
        out.removeIf(x -> x.end <= x.start);
        return out;
    }
}
