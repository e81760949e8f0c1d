"""Tiered storage (KIP-405): sealed segments copied to an object store and read back."""
