"""Consumer groups as Kafka keeps them: committed offsets, membership records, the group coordinator."""
