package logstore.spark.jvm;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * One input partition: the records {@code start <= offset < end} of {@code topic-partition} in
 * the store at {@code root}, as {@code logstore.spark.plan.OffsetRange}. {@code segment} and
 * {@code position} say where to start reading (-1: seek); {@code findStartTs} / {@code findEndTs}
 * (null: none) make the reader begin at / stop before the first record whose timestamp is at
 * least that; {@code stopSegment} / {@code stopPosition} (-1: none) bound the bytes read when
 * {@code end} is the log end. Immutable, serializable.
 */
final class OffsetRange implements InputPartition {
    private static final long serialVersionUID = 1L;

    final String root;
    final String topic;
    final int partition;
    final long start;
    final long end;
    final long segment;
    final long position;
    final Long findStartTs;
    final Long findEndTs;
    final boolean failOnDataLoss;
    final long stopSegment;
    final long stopPosition;

    OffsetRange(String root, String topic, int partition, long start, long end, long segment, long position,
                Long findStartTs, Long findEndTs, boolean failOnDataLoss, long stopSegment, long stopPosition) {
        this.root = root;
        this.topic = topic;
        this.partition = partition;
        this.start = start;
        this.end = end;
        this.segment = segment;
        this.position = position;
        this.findStartTs = findStartTs;
        this.findEndTs = findEndTs;
        this.failOnDataLoss = failOnDataLoss;
        this.stopSegment = stopSegment;
        this.stopPosition = stopPosition;
    }

    OffsetRange from(long newStart, long newSegment, long newPosition, Long newFindStartTs) {
        return new OffsetRange(root, topic, partition, newStart, end, newSegment, newPosition, newFindStartTs, findEndTs,
            failOnDataLoss, stopSegment, stopPosition);
    }

    OffsetRange until(long newEnd, Long newFindEndTs) {
        return new OffsetRange(root, topic, partition, start, newEnd, segment, position, findStartTs, newFindEndTs,
            failOnDataLoss, stopSegment, stopPosition);
    }

    @Override
    public String toString() {
        return topic + "-" + partition + " [" + start + ", " + end + ")";
    }
}
