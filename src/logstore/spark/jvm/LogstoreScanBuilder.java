package logstore.spark.jvm;

import java.sql.Timestamp;
import java.time.Instant;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.IsNotNull;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A batch scan of the JVM reader: column pruning ({@code SupportsPushDownRequiredColumns}: only
 * the columns the query uses are built) and filter pushdown ({@code SupportsPushDownFilters}:
 * predicates on {@code topic}, {@code partition} and {@code offset} applied exactly by the
 * planner, a lower bound on {@code timestamp} pruning through the time indexes while Spark still
 * applies it), as {@code logstore.spark.plan.Planner.push}. A streaming read is the Python
 * source's micro-batch stream (see {@link LogstoreProvider}).
 *
 * <p>Thread-safety: one per query's planning, on the driver.
 */
final class LogstoreScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownFilters {
    private static final Set<String> NEVER_NULL = Set.of("topic", "partition", "offset", "timestamp", "timestampType");

    private final StructType tableSchema;
    private final Map<String, String> options;
    private final LogstoreTable table;
    private StructType required;
    private Filter[] pushed = new Filter[0];
    private Filter[] postScan = new Filter[0];

    LogstoreScanBuilder(StructType tableSchema, CaseInsensitiveStringMap options, LogstoreTable table) {
        this.tableSchema = tableSchema;
        this.options = new HashMap<>(options.asCaseSensitiveMap());
        this.table = table;
        this.required = tableSchema;
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
        required = requiredSchema;
    }

    @Override
    public Filter[] pushFilters(Filter[] filters) {
        List<Filter> kept = new ArrayList<>();
        List<Filter> done = new ArrayList<>();
        for (Filter f : filters) {
            (exact(f) ? done : kept).add(f);
        }
        pushed = done.toArray(new Filter[0]);
        postScan = kept.toArray(new Filter[0]);
        return postScan;
    }

    /** Whether the planner applies {@code f} exactly (by applying it, later, in {@link #narrow}). */
    private static boolean exact(Filter f) {
        if (f instanceof IsNotNull) {
            return NEVER_NULL.contains(((IsNotNull) f).attribute());
        }
        String column = attribute(f);
        Object v = value(f);
        if ("topic".equals(column)) {
            return (f instanceof EqualTo && v instanceof String) || (f instanceof In && allOf((Object[]) v, String.class));
        }
        if ("partition".equals(column)) {
            return (v instanceof Integer && !(f instanceof In)) || (f instanceof In && allOf((Object[]) v, Integer.class));
        }
        if ("offset".equals(column)) {
            return v instanceof Long && (f instanceof EqualTo || f instanceof GreaterThan || f instanceof GreaterThanOrEqual
                || f instanceof LessThan || f instanceof LessThanOrEqual);
        }
        return false;
    }

    private static boolean allOf(Object[] values, Class<?> kind) {
        for (Object x : values) {
            if (!kind.isInstance(x)) {
                return false;
            }
        }
        return true;
    }

    private static String attribute(Filter f) {
        if (f instanceof EqualTo) {
            return ((EqualTo) f).attribute();
        } else if (f instanceof GreaterThan) {
            return ((GreaterThan) f).attribute();
        } else if (f instanceof GreaterThanOrEqual) {
            return ((GreaterThanOrEqual) f).attribute();
        } else if (f instanceof LessThan) {
            return ((LessThan) f).attribute();
        } else if (f instanceof LessThanOrEqual) {
            return ((LessThanOrEqual) f).attribute();
        } else if (f instanceof In) {
            return ((In) f).attribute();
        }
        return null;
    }

    private static Object value(Filter f) {
        if (f instanceof EqualTo) {
            return ((EqualTo) f).value();
        } else if (f instanceof GreaterThan) {
            return ((GreaterThan) f).value();
        } else if (f instanceof GreaterThanOrEqual) {
            return ((GreaterThanOrEqual) f).value();
        } else if (f instanceof LessThan) {
            return ((LessThan) f).value();
        } else if (f instanceof LessThanOrEqual) {
            return ((LessThanOrEqual) f).value();
        } else if (f instanceof In) {
            return ((In) f).values();
        }
        return null;
    }

    /** A timestamp filter literal as ms since the epoch, null when unusable. */
    private static Long millis(Object v) {
        if (v instanceof Timestamp) {
            return ((Timestamp) v).toInstant().toEpochMilli();
        } else if (v instanceof Instant) {
            return ((Instant) v).toEpochMilli();
        } else if (v instanceof LocalDateTime) {
            return ((LocalDateTime) v).toInstant(ZoneOffset.UTC).toEpochMilli();
        }
        return null;
    }

    /**
     * The planner narrowed by the filters it applies exactly ({@code exact}), or pruned by those
     * Spark applies after the scan: a lower bound on timestamp, the range of an offset IN list.
     */
    static void narrow(Planner planner, Filter[] filters, boolean exact) {
        for (Filter f : filters) {
            String column = attribute(f);
            Object v = value(f);
            if (!exact) {
                if ("offset".equals(column) && f instanceof In && ((Object[]) v).length > 0
                        && allOf((Object[]) v, Long.class)) {
                    long low = Long.MAX_VALUE;
                    long high = Long.MIN_VALUE;
                    for (Object x : (Object[]) v) {
                        low = Math.min(low, (Long) x);
                        high = Math.max(high, (Long) x);
                    }
                    planner.offsetLow = Math.max(planner.offsetLow, low);
                    planner.offsetHigh = Math.min(planner.offsetHigh, high == Long.MAX_VALUE ? high : high + 1);
                } else if ("timestamp".equals(column)
                        && (f instanceof GreaterThan || f instanceof GreaterThanOrEqual || f instanceof EqualTo)) {
                    Long ms = millis(v);
                    if (ms != null) {
                        planner.timestampLow = planner.timestampLow == null ? ms : Math.max(planner.timestampLow, ms);
                    }
                }
                continue;
            }
            if (f instanceof IsNotNull) {
                continue;
            }
            if ("topic".equals(column) || "partition".equals(column)) {
                Set<Object> values = new HashSet<>();
                if (f instanceof In) {
                    values.addAll(List.of((Object[]) v));
                } else if (f instanceof EqualTo) {
                    values.add(v);
                } else {
                    for (String[] tp : planner.partitions) {
                        int p = Integer.parseInt(tp[1]);
                        int x = (Integer) v;
                        if ((f instanceof GreaterThan && p > x) || (f instanceof GreaterThanOrEqual && p >= x)
                                || (f instanceof LessThan && p < x) || (f instanceof LessThanOrEqual && p <= x)) {
                            values.add(p);
                        }
                    }
                }
                if ("topic".equals(column)) {
                    Set<String> topics = new HashSet<>();
                    values.forEach(x -> topics.add((String) x));
                    if (planner.onlyTopics != null) {
                        topics.retainAll(planner.onlyTopics);
                    }
                    planner.onlyTopics = topics;
                } else {
                    Set<Integer> parts = new HashSet<>();
                    values.forEach(x -> parts.add((Integer) x));
                    if (planner.onlyPartitions != null) {
                        parts.retainAll(planner.onlyPartitions);
                    }
                    planner.onlyPartitions = parts;
                }
            } else if ("offset".equals(column) && v instanceof Long) {
                long x = (Long) v;
                if (f instanceof EqualTo) {
                    planner.offsetLow = Math.max(planner.offsetLow, x);
                    planner.offsetHigh = Math.min(planner.offsetHigh, x == Long.MAX_VALUE ? x : x + 1);
                } else if (f instanceof GreaterThan) {
                    planner.offsetLow = Math.max(planner.offsetLow, x == Long.MAX_VALUE ? x : x + 1);
                } else if (f instanceof GreaterThanOrEqual) {
                    planner.offsetLow = Math.max(planner.offsetLow, x);
                } else if (f instanceof LessThan) {
                    planner.offsetHigh = Math.min(planner.offsetHigh, x);
                } else if (f instanceof LessThanOrEqual) {
                    planner.offsetHigh = Math.min(planner.offsetHigh, x == Long.MAX_VALUE ? x : x + 1);
                }
            }
        }
    }

    @Override
    public Filter[] pushedFilters() {
        return pushed;
    }

    @Override
    public Scan build() {
        return new LogstoreScan(tableSchema, required, options, pushed, table).withPostScanFilters(postScan);
    }

    /** The scan: planned when Spark asks for its batch (streaming goes to the Python source). */
    static final class LogstoreScan implements Scan, Batch {
        private final StructType tableSchema;
        private final StructType required;
        private final Map<String, String> options;
        private final Filter[] pushed;
        private final LogstoreTable table;
        private Filter[] postScan = new Filter[0];
        private InputPartition[] planned;

        LogstoreScan(StructType tableSchema, StructType required, Map<String, String> options, Filter[] pushed,
                     LogstoreTable table) {
            this.tableSchema = tableSchema;
            this.required = required;
            this.options = options;
            this.pushed = pushed;
            this.table = table;
        }

        /** Timestamp filters Spark applies after the scan, which prune through the time index here. */
        LogstoreScan withPostScanFilters(Filter[] filters) {
            postScan = filters;
            return this;
        }

        @Override
        public StructType readSchema() {
            return required;
        }

        @Override
        public String description() {
            return "LogstoreJvmScan[" + options.getOrDefault("subscribe", options.getOrDefault("assign",
                options.getOrDefault("subscribePattern", ""))) + "]";
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
            Map<String, String> forPython = new HashMap<>(options);
            forPython.keySet().removeIf(k -> k.equalsIgnoreCase("reader"));
            return ((SupportsRead) table.python()).newScanBuilder(new CaseInsensitiveStringMap(forPython)).build()
                .toMicroBatchStream(checkpointLocation);
        }

        @Override
        public InputPartition[] planInputPartitions() {
            if (planned == null) {
                Planner planner = new Planner(options);
                Schemas.columns(tableSchema, planner.includeHeaders);
                narrow(planner, pushed, true);
                narrow(planner, postScan, false);
                planned = planner.plan().toArray(new InputPartition[0]);
            }
            return planned;
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new ReaderFactory(required);
        }
    }

    /** Makes each input partition's columnar reader on its executor. Serializable; stateless. */
    static final class ReaderFactory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        private final StructType schema;

        ReaderFactory(StructType schema) {
            this.schema = schema;
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            return new RangeReader((OffsetRange) partition, schema);
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new IllegalStateException("the logstore JVM reader reads columnar batches only");
        }
    }
}
