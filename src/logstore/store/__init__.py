"""The store: a data directory of topics (:class:`~logstore.store.store.LogStore`), Kafka log directories, read-only views."""
