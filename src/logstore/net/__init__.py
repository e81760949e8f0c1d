"""The network layer: one event-driven listener for every protocol, its workers and its purgatory. Knows no logs."""
