"""Kafka's error codes: the one home of the integers that Kafka's protocol carries as ``error_code``.

:class:`ErrorCode` is kio's ``IntEnum``, generated from Kafka's message specs
(``org.apache.kafka.common.protocol.Errors``): each member is the code's int under Kafka's name in
lower case, with Kafka's ``retriable`` flag, so it goes wherever an int goes (a response field,
a comparison with a code read off the wire):

>>> ErrorCode.not_leader_or_follower == 6
True
>>> ErrorCode(58).name
'sasl_authentication_failed'

Beside it, :func:`code_for` is the one mapping from logstore's exceptions to Kafka's codes, as
Kafka's ``Errors.forException``.

Importing this module loads kio, about 300 ms on this project's machine (kio's primitive types
import hypothesis): only modules that speak Kafka's protocol import it at module level, and
nothing on the path of ``import logstore`` or of the CLI's local commands may
(``tests/unit/test_import_cost.py`` checks ``import logstore``).

Thread-safety: immutable.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from .errors import (
    CorruptRecordError,
    InvalidConfigError,
    InvalidPartitionsError,
    InconsistentTopicIdError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    LogstoreError,
    NotLeaderOrFollowerError,
    OffsetMovedToTieredStorageError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RecordTooLargeError,
    RequestTimedOutError,
    TransactionCoordinatorFencedError,
    UnknownTopicOrPartitionError,
    UnsupportedCodecError,
    UnknownTopicIdError,
)

__all__ = ["ErrorCode", "code_for"]

#: logstore's exceptions that Kafka has a code for. A subclass listed here wins over its base
#: (InvalidProducerEpochError and OutOfOrderSequenceError are InvalidRecordErrors).
_EXCEPTION_CODES: dict[type[LogstoreError], ErrorCode] = {
    CorruptRecordError: ErrorCode.corrupt_message,
    RecordTooLargeError: ErrorCode.message_too_large,
    OutOfOrderSequenceError: ErrorCode.out_of_order_sequence_number,
    InvalidProducerEpochError: ErrorCode.invalid_producer_epoch,
    InvalidRecordError: ErrorCode.invalid_record,
    InvalidTxnStateError: ErrorCode.invalid_txn_state,
    TransactionCoordinatorFencedError: ErrorCode.transaction_coordinator_fenced,
    ProducerFencedError: ErrorCode.producer_fenced,
    NotLeaderOrFollowerError: ErrorCode.not_leader_or_follower,
    RequestTimedOutError: ErrorCode.request_timed_out,
    InvalidPartitionsError: ErrorCode.invalid_partitions,
    InvalidConfigError: ErrorCode.invalid_config,
    UnknownTopicOrPartitionError: ErrorCode.unknown_topic_or_partition,
    UnsupportedCodecError: ErrorCode.unsupported_compression_type,
    UnknownTopicIdError: ErrorCode.unknown_topic_id,
    InconsistentTopicIdError: ErrorCode.inconsistent_topic_id,
    OffsetMovedToTieredStorageError: ErrorCode.offset_moved_to_tiered_storage,
}


def code_for(exc: BaseException) -> ErrorCode:
    """Kafka's error code for ``exc``: that of the most specific class in its MRO that has one,
    else ``unknown_server_error`` (as Kafka's ``Errors.forException``).

    >>> code_for(OutOfOrderSequenceError(7, 0, 5, 5, 3))
    <ErrorCode.out_of_order_sequence_number: 45>
    >>> code_for(KeyError("x"))
    <ErrorCode.unknown_server_error: -1>
    """
    for cls in type(exc).__mro__:
        code = _EXCEPTION_CODES.get(cls)
        if code is not None:
            return code
    return ErrorCode.unknown_server_error
