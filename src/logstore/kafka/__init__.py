"""Kafka's protocol: the wire codec, the APIs over a store, authentication, the server and a small client."""
