package logstore.spark.jvm;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A store read through the JVM reader ({@link LogstoreScanBuilder}), written and streamed through
 * the Python source's table, made when first needed (see {@link LogstoreProvider}).
 *
 * <p>Thread-safety: used by one query's planning on the driver.
 */
final class LogstoreTable implements SupportsRead, SupportsWrite {
    private final StructType schema;
    private final Transform[] partitioning;
    private final Map<String, String> options;
    private Table python;

    LogstoreTable(StructType schema, Transform[] partitioning, Map<String, String> options) {
        this.schema = schema;
        this.partitioning = partitioning;
        this.options = options;
    }

    /** The Python source's table over the same options. */
    Table python() {
        if (python == null) {
            python = LogstoreProvider.pythonTable(schema, partitioning, options);
        }
        return python;
    }

    @Override
    public String name() {
        return LogstoreProvider.NAME;
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
        return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
        Set<TableCapability> out = EnumSet.of(TableCapability.BATCH_READ);
        try {
            out.addAll(python().capabilities());
        } catch (RuntimeException e) {
            // No Python source in this session: batch reads only (writes and streams fail on use).
        }
        return out;
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap scanOptions) {
        return new LogstoreScanBuilder(schema, scanOptions, this);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        return ((SupportsWrite) python()).newWriteBuilder(info);
    }
}
