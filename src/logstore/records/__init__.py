"""Records and batches: Kafka's RecordBatch v2 through the C core, the codecs and their framings, Arrow columns."""
