"""The library's clients over a store: producer, consumer (groups across processes), the durable queue."""
