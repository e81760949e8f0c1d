"""Kafka's transactions: the transaction state records of ``__transaction_state`` and the transaction coordinator."""
