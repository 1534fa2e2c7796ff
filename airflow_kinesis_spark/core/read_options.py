"""How the readers read: the service's documented per-shard limits, the readers' settings
(:class:`ReadOptions`, handed from the operators to the Spark job), and the botocore hook that
lets the readers retry their own throttling (:func:`own_throttling`).

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GET_RECORDS_MAX_LIMIT",
    "GET_RECORDS_MAX_BYTES",
    "MIN_CALL_INTERVAL_S",
    "READ_BYTES_PER_SECOND",
    "ReadOptions",
    "THROTTLING_ERRORS",
    "own_throttling",
]

#: GetRecords returns at most 10,000 records per call (Kinesis API reference, GetRecords).
GET_RECORDS_MAX_LIMIT = 10_000
#: GetRecords may be called 5 times per second per shard (Kinesis API reference, GetRecords).
MIN_CALL_INTERVAL_S = 0.2
#: A shard serves at most 2 MiB of data per second to GetRecords; a call that returns B bytes
#: uses B / 2 MiB seconds of the shard's budget, so after a 10 MiB response the next 5 seconds
#: of calls are throttled (Kinesis API reference, GetRecords).
READ_BYTES_PER_SECOND = 2 * 1024 * 1024
#: GetRecords returns at most 10 MiB per call (Kinesis API reference, GetRecords).
GET_RECORDS_MAX_BYTES = 10 * 1024 * 1024
#: What the adaptive ``Limit`` aims a response at: two seconds of a shard's read budget. Larger
#: responses amortise each call's round trip over more data (the pause before the next call is
#: counted from when the response arrived); smaller ones hold less in memory.
TARGET_RESPONSE_BYTES = 4 * 1024 * 1024
#: Seconds added to each pause: the next call must not reach the service before the pause ends,
#: whatever the network did to the previous one.
PACING_MARGIN_S = 0.05
#: ``Limit`` of a range's first GetRecords, before any record size is known: 100 records of the
#: KPL's default 50 KiB aggregates are about 5 MiB, well under the 10 MiB a response may hold.
INITIAL_LIMIT = 100


@dataclass(frozen=True)
class ReadOptions:
    """How the job's readers read: the one place for these settings and their defaults.

    :param limit: ``Limit`` of each GetRecords call, 1..10,000 (Kinesis API reference, GetRecords).
    :param min_call_interval: seconds between two GetRecords calls on one shard (0.2: the
        service's 5 calls per second per shard).
    :param read_bytes_per_second: per-shard read budget the readers pace themselves to (bytes
        per second; default 2 MiB/s, the service's per-shard limit), or ``None`` for no pacing.
    :param read_tasks: Spark tasks reading the ranges, or ``None`` for Spark's default parallelism.
    :raises ValueError: a value out of range, naming the field.
    """

    limit: int = GET_RECORDS_MAX_LIMIT
    min_call_interval: float = MIN_CALL_INTERVAL_S
    read_bytes_per_second: float | None = READ_BYTES_PER_SECOND
    read_tasks: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or not 1 <= self.limit <= GET_RECORDS_MAX_LIMIT:
            raise ValueError(f"ReadOptions.limit must be 1..10,000 (GetRecords Limit); got {self.limit!r}")
        if not self.min_call_interval >= 0:
            raise ValueError(f"ReadOptions.min_call_interval must be >= 0 seconds; got {self.min_call_interval!r}")
        if self.read_bytes_per_second is not None and not self.read_bytes_per_second > 0:
            raise ValueError(
                f"ReadOptions.read_bytes_per_second must be > 0 (bytes per second per shard) or None; got {self.read_bytes_per_second!r}"
            )
        if self.read_tasks is not None and (isinstance(self.read_tasks, bool) or not isinstance(self.read_tasks, int) or self.read_tasks < 1):
            raise ValueError(f"ReadOptions.read_tasks must be a positive integer or None; got {self.read_tasks!r}")

    def job_options(self, records_expected: bool) -> dict[str, Any]:
        """What the Spark job's ``run`` takes as ``options`` (JSON-safe)."""
        return {
            "limit": self.limit,
            "min_call_interval": self.min_call_interval,
            "read_bytes_per_second": self.read_bytes_per_second,
            "read_tasks": self.read_tasks,
            "records_expected": records_expected,
        }

    def job_args(self, records_expected: bool) -> list[str]:
        """The same as the job's command-line arguments (``--limit ...``); ``0`` stands for ``None``."""
        args = [
            "--limit", str(self.limit), "--min-call-interval", str(self.min_call_interval),
            "--read-bytes-per-second", str(self.read_bytes_per_second or 0), "--read-tasks", str(self.read_tasks or 0),
        ]  # fmt: skip
        return [*args, "--records-expected"] if records_expected else args


#: Errors that mean "slow down", retried with exponential backoff and full jitter (but see
#: :data:`~airflow_kinesis_spark.core.reader.READ_BUDGET_ERROR`).
THROTTLING_ERRORS = frozenset(
    {"ProvisionedThroughputExceededException", "KMSThrottlingException", "LimitExceededException"}
)
#: Reader operations whose throttling errors reach :class:`~airflow_kinesis_spark.core.reader.ShardReader` at once (:func:`own_throttling`).
READER_OPERATIONS = ("GetRecords", "GetShardIterator", "SubscribeToShard")


def own_throttling(client: Any) -> Any:
    """Let the readers retry the throttling errors of their own calls; returns ``client``.

    botocore's retry modes retry ``ProvisionedThroughputExceededException`` within the call, with
    exponential backoff of up to 20 s (standard mode), out of :class:`~airflow_kinesis_spark.core.reader.ShardReader`'s sight: the
    report's ``throttled_calls`` then says 0, and on a shared stream the reader that drew the long
    waits leaves the shard idle and falls behind the others. This registers a first
    ``needs-retry`` handler for :data:`READER_OPERATIONS` that raises a throttling error response
    (:data:`THROTTLING_ERRORS`) as the client's modeled exception at once; every other error
    (lost connections, 5xx, ...) keeps the client's own retries. Other operations are untouched.
    Idempotent (one handler per client and operation).

    :param client: a boto3 (synchronous) Kinesis client.
    """
    events = client.meta.events
    service = client.meta.service_model.service_id.hyphenize()

    def raise_throttling(response: Any = None, operation: Any = None, **_: Any) -> None:
        if response is None:  # no response (a connection error): the client's retries
            return None
        parsed = response[1]
        code = parsed.get("Error", {}).get("Code", "") if isinstance(parsed, Mapping) else ""
        if code in THROTTLING_ERRORS:
            raise client.exceptions.from_code(code)(parsed, operation.name)
        return None

    for operation in READER_OPERATIONS:
        events.register_first(f"needs-retry.{service}.{operation}", raise_throttling,
                              unique_id=f"airflow-kinesis-spark-own-throttling-{operation}")  # fmt: skip
    return client
