package logstore.spark.jvm;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/** The source's schema (Spark's Kafka source's, as {@code logstore.spark.options.SCHEMA}). Thread-safe: constants. */
final class Schemas {
    private Schemas() {
    }

    static final StructType HEADER = new StructType(new StructField[] {
        DataTypes.createStructField("key", DataTypes.StringType, true),
        DataTypes.createStructField("value", DataTypes.BinaryType, true)});

    static StructType source(boolean headers) {
        List<StructField> fields = new ArrayList<>(List.of(
            DataTypes.createStructField("key", DataTypes.BinaryType, true),
            DataTypes.createStructField("value", DataTypes.BinaryType, true),
            DataTypes.createStructField("topic", DataTypes.StringType, true),
            DataTypes.createStructField("partition", DataTypes.IntegerType, true),
            DataTypes.createStructField("offset", DataTypes.LongType, true),
            DataTypes.createStructField("timestamp", DataTypes.TimestampType, true),
            DataTypes.createStructField("timestampType", DataTypes.IntegerType, true)));
        if (headers) {
            fields.add(DataTypes.createStructField("headers", DataTypes.createArrayType(HEADER, true), true));
        }
        return new StructType(fields.toArray(new StructField[0]));
    }

    /**
     * The columns a read builds: the source's, or those a user-specified schema names (each with
     * the source's type for it, in any order, each once), as {@code plan.schema_columns}.
     */
    static StructType columns(StructType given, boolean headers) {
        StructType full = source(headers);
        if (given == null || given.equals(full)) {
            return full;
        }
        StructType all = source(true);
        List<String> wrong = new ArrayList<>();
        Set<String> seen = new HashSet<>();
        boolean twice = false;
        for (StructField f : given.fields()) {
            DataType known = null;
            for (StructField k : all.fields()) {
                if (k.name().equals(f.name())) {
                    known = k.dataType();
                }
            }
            if (known == null || !sameType(known, f.dataType())) {
                wrong.add(f.name() + ":" + f.dataType().simpleString());
            }
            twice |= !seen.add(f.name());
        }
        if (!wrong.isEmpty() || given.fields().length == 0 || twice) {
            throw new IllegalArgumentException("a user-specified schema must name columns of the logstore source's schema "
                + all.simpleString() + " with their types, each once; got " + given.simpleString()
                + (wrong.isEmpty() ? "" : " (" + String.join(", ", wrong) + " not in the source's schema)"));
        }
        return given;
    }

    private static boolean sameType(DataType a, DataType b) {
        return a.asNullable().equals(b.asNullable());
    }
}
