"""Domain exceptions of the provider.

No Airflow import: these are raised in Spark executors too. Every exception pickles and
unpickles to an equal message (Spark ships task errors between processes).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "KinesisSparkError",
    "TableCommitError",
    "StreamAccessDeniedError",
    "StreamNotFoundError",
    "CheckpointConflictError",
    "BatchLeaseHeldError",
    "DataLossError",
    "CorruptAggregateError",
    "ReportValidationError",
    "DeadLetterLimitError",
    "EndpointUnreachableError",
    "OutputTrustError",
    "PendingPlanMismatchError",
    "ReportNotRecordedError",
    "OutputOwnedError",
    "OutputAheadError",
    "WindowAheadError",
    "PlanBindingError",
    "CheckpointStoreCorruptError",
]


class KinesisSparkError(Exception):
    """Base class. ``fields`` are kept so the error pickles with its message intact.

    ``retryable`` says whether a retry of the task can help: ``True`` (the default) for what may
    pass (a lease still held, a report not recorded yet, an endpoint down), ``False`` for what a
    retry finds again (a lost conditional write, a plan or report that does not fit, records that
    would be lost, a table that refuses the batch, a corrupt item). The operators map errors by
    this attribute alone (``airflow_kinesis_spark.failures.task_errors``).
    """

    retryable: bool = True

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), self.fields))


def _rebuild(cls: type[KinesisSparkError], message: str, fields: dict[str, Any]) -> KinesisSparkError:
    err = cls.__new__(cls)
    KinesisSparkError.__init__(err, message, **fields)
    return err


class StreamNotFoundError(KinesisSparkError):
    """The stream does not exist where the client looked (names stream, region and endpoint)."""

    @classmethod
    def for_client(cls, stream_name: str, client: Any, *, account: str | None = None) -> StreamNotFoundError:
        region = getattr(getattr(client, "meta", None), "region_name", None)
        endpoint = getattr(getattr(client, "meta", None), "endpoint_url", None)
        shared = (
            f" For a stream of account {account} (another account's), its resource-based policy must allow this "
            "connection's principal: Kinesis answers a stream it may not see as not found." if account else ""
        )
        return cls(
            f"Kinesis stream {stream_name!r} does not exist in region {region!r} at endpoint "
            f"{endpoint!r}. Check the stream name, and the region and endpoint_url of the AWS "
            f"connection (extras 'region_name', 'endpoint_url').{shared}",
            stream_name=stream_name,
            region=region,
            endpoint=endpoint,
            account=account,
        )


class StreamAccessDeniedError(KinesisSparkError):
    """Kinesis refused a call on a stream to the connection's principal (``AccessDeniedException``):
    names the stream, its account for a stream ARN, the call and the policies to check."""

    @classmethod
    def for_call(cls, stream: str, account: str | None, operation: str, detail: str) -> StreamAccessDeniedError:
        where = f"in account {account} " if account else ""
        return cls(
            f"Kinesis refused {operation} on stream {stream!r} {where}to this connection's principal ({detail}). "
            "The principal's IAM policy must allow kinesis:DescribeStreamSummary, kinesis:ListShards, "
            "kinesis:GetShardIterator and kinesis:GetRecords on the stream's ARN"
            + (f"; for a stream of another account ({account}), the stream's resource-based policy (Kinesis "
               "PutResourcePolicy) must allow them to this principal as well, and the stream must be named by its ARN"
               if account else "")
            + " (docs/iam.md).",
            stream_name=stream, account=account, operation=operation,
        )  # fmt: skip


class CheckpointConflictError(KinesisSparkError):
    """A conditional write on the checkpoint store lost to another writer. Never retried blindly."""

    retryable = False


class BatchLeaseHeldError(KinesisSparkError):
    """Another run holds the pending batch and its lease is alive. Retryable: wait for it."""


class DataLossError(KinesisSparkError):
    """Records would be skipped (trim horizon passed, shard vanished unread). Needs ``allow_data_loss``."""

    retryable = False


class PendingPlanMismatchError(KinesisSparkError):
    """The pending plan stored in the checkpoint table is not what this task would plan (another
    stream, consumer, checkpoint table or output location). Nothing is read or written; a retry
    cannot help until the pending batch is discarded or the task's settings are put back."""

    retryable = False


class CorruptAggregateError(KinesisSparkError):
    """A KPL-aggregated Kinesis record failed its MD5 check or did not parse."""


class ReportValidationError(KinesisSparkError):
    """The Spark job's per-shard report does not match the batch plan; nothing is committed."""

    retryable = False


class DeadLetterLimitError(ReportValidationError):
    """More of a batch's (or window's) records did not decode than ``max_dead_letter_fraction``
    allows: most likely a wrong record format or schema, not bad records. Nothing is committed;
    the batch stays pending, and a retry with the same settings finds the same. Fields:
    ``batch_id``, ``records``, ``dead_letters``, ``kinds`` (error kind -> count of the ranges'
    reports), ``limit``."""


class EndpointUnreachableError(KinesisSparkError):
    """An endpoint a connection points at does not answer (names the connection, service and endpoint).

    Raised by the first use of a connection (see ``core.admin.check_endpoint``), before anything
    is read or written.
    """


class OutputTrustError(KinesisSparkError):
    """The table library (delta-rs, pyiceberg) would not trust the TLS certificate of the output
    location's S3 endpoint, which the storage options' CA bundle (``verify``'s path) signs: neither
    library takes a CA bundle, they trust the system's CA certificates or the worker's
    ``SSL_CERT_FILE``. Found before the job runs; nothing is read or written. A retry cannot help.
    Fields: ``location``, ``endpoint``, ``ca_bundle``, ``library``."""

    retryable = False


class ReportNotRecordedError(KinesisSparkError):
    """A commit found the pending batch without a recorded report: its job has not finished, or
    ended without recording one. Nothing is committed. Retryable: the commit succeeds once the job
    (or a re-run of it) records the report."""


class TableCommitError(KinesisSparkError):
    """A table commit (Iceberg, Delta) failed for a reason a retry does not mend: the batch's
    files do not fit the table's schema or partitioning, or a window cannot replace its rows.
    Nothing is committed; the batch stays pending."""

    retryable = False


class OutputOwnedError(TableCommitError):
    """The output root or table belongs to another (stream, consumer), or is declared shared by
    one side and not the other (``shared_output``). Found before anything is read; nothing is
    written. Fields: ``output``, ``owner`` (what the output records), ``wanted`` (this task's)."""


class OutputAheadError(TableCommitError):
    """The output (a committed Parquet record, an Iceberg snapshot or a Delta version) holds a
    batch of this stream and consumer that the checkpoint store has not committed: the store was
    re-created, reset or restored, or another store writes the same output. Found before the job
    runs; nothing is read, written or deleted. Fields: ``output``, ``batch_id`` (the output's),
    ``committed_batch_id`` (the store's), ``plan_created_at``."""


class WindowAheadError(TableCommitError):
    """A window into a consumer's own output reaches past what the consumer has committed: its
    rows would be added again by a later incremental batch. Found before anything is read.
    Fields: ``window_end``, ``committed_until`` (the earliest time every shard of the window is
    committed up to, ``None`` when unknown), ``shards`` (shard id -> its committed position)."""


class PlanBindingError(KinesisSparkError):
    """A job found a stored plan that is not the one the worker checked (BOUND): another digest,
    stream, consumer, batch or output location. Nothing is read or written; a retry of the same
    job cannot help. Fields: ``batch_id``, ``problems`` (one line each)."""

    retryable = False


class CheckpointStoreCorruptError(KinesisSparkError):
    """An item of the checkpoint table is not what the provider writes there: an attribute missing
    or of another DynamoDB type, a number that is not a whole number in range, a chunk missing or
    not JSON, a plan, report or checkpoint that does not parse. The table is state anyone with
    write access can change, so nothing is read past such an item: no checkpoint moves, no batch is
    begun, committed or discarded from it. A retry cannot help.

    Fields: ``table_name``, ``pk`` and ``sk`` (the item's key), ``field`` (a path into the item:
    ``committed_batch_id``, ``body``, ``ranges[2].start_checkpoint.type``), ``problem``.
    """

    retryable = False

    @classmethod
    def for_item(
        cls, table_name: str | None, pk: str, sk: str, field: str, problem: str, *, what: str, fix: str
    ) -> CheckpointStoreCorruptError:
        """The error for ``field`` of item (``pk``, ``sk``), which holds ``what`` (e.g. "the plan of
        pending batch 7"); ``fix`` (a sentence without its full stop) says how to mend it."""
        table = repr(table_name) if table_name else "(unnamed)"
        return cls(
            f"Checkpoint table {table}: item pk {pk!r}, sk {sk!r} ({what}) is corrupt: field {field!r}: {problem}. "
            f"Nothing was planned, committed or discarded from it. To fix it, {fix}. Whoever may write the table's "
            "items can plant such an item: check who can (docs/security.md, 'Who can write the checkpoint table').",
            table_name=table_name, pk=pk, sk=sk, field=field, problem=problem,
        )  # fmt: skip
