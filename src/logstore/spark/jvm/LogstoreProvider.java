package logstore.spark.jvm;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.stream.Stream;

import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The "logstore" format on the JVM: {@code spark.read.format("logstore")} with this jar on
 * {@code spark.jars} reads a store's segment files in the executors' JVMs, as columnar batches.
 *
 * <p>Spark 4.3 resolves a format name through Java's {@code DataSourceRegister} services first and
 * looks at Python data sources only when none matches, so with the jar on the classpath this
 * provider answers every {@code format("logstore")}: batch reads, streaming reads and writes. It
 * reads batches itself and hands the rest to the Python source ({@code logstore.spark.source},
 * registered by the {@code pyspark_logstore} module or {@code spark.dataSource.register}): writes
 * through the Python table's write builder, streaming reads through its micro-batch stream. The
 * option {@code reader} says who reads a batch: {@code auto} (default) the JVM unless the read
 * needs what only the Python source does (a tiered store, whose older segments live in an object
 * store; a Kafka log directory; {@code kafka.isolation.level=read_committed}), {@code jvm} the
 * JVM or a clear error, {@code python} the Python source.
 *
 * <p>Thread-safety: Spark creates a provider per lookup; it holds no state.
 */
public final class LogstoreProvider implements TableProvider, DataSourceRegister {
    static final String NAME = "logstore";

    @Override
    public String shortName() {
        return NAME;
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        String headers = options.getOrDefault("includeHeaders", "false").trim().toLowerCase(Locale.ROOT);
        return Schemas.source(headers.equals("true"));
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        Map<String, String> forPython = new HashMap<>();
        String reader = "auto";
        for (Map.Entry<String, String> e : properties.entrySet()) {
            if (e.getKey().equalsIgnoreCase("reader")) {
                reader = e.getValue().trim().toLowerCase(Locale.ROOT);
            } else {
                forPython.put(e.getKey(), e.getValue());
            }
        }
        if (!reader.equals("auto") && !reader.equals("jvm") && !reader.equals("python")) {
            throw new IllegalArgumentException("option 'reader' must be auto, jvm or python, got '" + reader + "'");
        }
        String pythonOnly = reader.equals("python") ? "" : pythonOnly(forPython);
        if (reader.equals("python") || (reader.equals("auto") && pythonOnly != null)) {
            return pythonTable(schema, partitioning, forPython);
        }
        if (pythonOnly != null) {
            throw new IllegalArgumentException("the JVM reader of the logstore source cannot read this: " + pythonOnly
                + "; the Python source reads it (option reader=python, or reader=auto to choose by itself)");
        }
        return new LogstoreTable(schema, partitioning, forPython);
    }

    /** The Python source's table (writes, streaming reads, and the batch reads the JVM leaves to it). */
    static Table pythonTable(StructType schema, Transform[] partitioning, Map<String, String> options) {
        PythonDataSourceV2 python = new PythonDataSourceV2();
        python.setShortName(NAME);
        try {
            return python.getTable(schema, partitioning, options);
        } catch (RuntimeException e) {
            throw new IllegalStateException("the logstore Python data source (logstore.spark.source, registered by the "
                + "pyspark_logstore module or spark.dataSource.register) is not available in this Spark session: "
                + e.getMessage(), e);
        }
    }

    /**
     * Why only the Python source can read a batch with these options, or null when the JVM can.
     * Reads the store's directory listing and topic files only.
     */
    static String pythonOnly(Map<String, String> options) {
        String path = null;
        for (Map.Entry<String, String> e : options.entrySet()) {
            String key = e.getKey().toLowerCase(Locale.ROOT);
            if (key.equals("path")) {
                path = e.getValue();
            } else if (key.equals("remotestorage") || key.startsWith("remotestorage.")) {
                return "option " + e.getKey() + " names a remote tier (tiered storage)";
            } else if (key.equals("kafka.isolation.level") && e.getValue().trim().equalsIgnoreCase("read_committed")) {
                return "kafka.isolation.level=read_committed";
            }
        }
        if (path == null || path.isEmpty()) {
            return null; // (the JVM reader's options raise the missing path)
        }
        Path root = new File(path).getAbsoluteFile().toPath();
        if (!Files.isDirectory(root.resolve(StoreFiles.TOPICS_DIR))) {
            return root + " has no " + StoreFiles.TOPICS_DIR + "/ (a Kafka log directory, or no store)";
        }
        if (Files.exists(root.resolve(StoreFiles.REMOTE_STORAGE_FILE))) {
            return "the store at " + root + " has a remote tier (" + StoreFiles.REMOTE_STORAGE_FILE
                + ": tiered storage keeps older segments in an object store)";
        }
        if (Files.exists(root.resolve(StoreFiles.TOPICS_DIR).resolve(StoreFiles.REMOTE_LOG_METADATA_TOPIC))) {
            return "the store at " + root + " has remote segments (" + StoreFiles.REMOTE_LOG_METADATA_TOPIC + ")";
        }
        try (Stream<Path> topics = Files.list(root.resolve(StoreFiles.TOPICS_DIR))) {
            for (Path topic : (Iterable<Path>) topics::iterator) {
                Map<String, String> props;
                try {
                    props = StoreFiles.properties(topic);
                } catch (IOException e) {
                    continue;
                }
                if ("true".equalsIgnoreCase(props.getOrDefault("remote.storage.enable", "false").trim())) {
                    return "topic " + topic.getFileName() + " of " + root + " has remote.storage.enable=true (tiered storage)";
                }
            }
        } catch (IOException e) {
            return null; // (the JVM reader reports the unreadable store)
        }
        return null;
    }
}
