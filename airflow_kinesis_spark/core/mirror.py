"""The KCL-style lease mirror: one ``LEASE#{shard id}`` item per shard, for people and tools.

After each commit (``DynamoDBCheckpointStore.commit`` in ``core.store``), :func:`mirror_leases`
writes, for every shard the batch planned, an item in the Kinesis Client Library's attribute names:
``leaseKey`` (the shard id), ``leaseOwner`` (the consumer), ``checkpoint`` and
``checkpointSubSequenceNumber``, plus ``batchId`` and, for ``AT_TIMESTAMP``,
``checkpointTimestamp``. The mirror is derived data: not authoritative (the head is what the
protocol reads), written after the commit, never expiring; a failure is a warning.

Log lines keep the store's logger (``airflow_kinesis_spark.core.store``), where they were written
before this module held them: logging configurations and tests filter on it. This module does not
import ``core.store``.

No Airflow import.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_exponential

from airflow_kinesis_spark.core.chunks import item_key
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.pool import pool_threads
from airflow_kinesis_spark.core.positions import Checkpoint, format_timestamp

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# The store's logger, not this module's: see the module docstring.
log = logging.getLogger("airflow_kinesis_spark.core.store")

__all__ = ["BATCH_WRITE_MAX_ITEMS", "BATCH_WRITE_ATTEMPTS", "BATCH_WRITE_FIRST_PAUSE", "mirror_leases"]

#: Put requests per ``BatchWriteItem`` call (DynamoDB API reference, BatchWriteItem: up to 25).
BATCH_WRITE_MAX_ITEMS = 25
#: Attempts of a ``BatchWriteItem`` call's unprocessed items (the service returns them when a
#: partition's throughput is exceeded; botocore does not retry them), 0.05 s, 0.1 s, ... apart
#: (DynamoDB API reference, BatchWriteItem: retry unprocessed items with exponential backoff).
BATCH_WRITE_ATTEMPTS = 5
#: Seconds before the second attempt; each later pause doubles it.
BATCH_WRITE_FIRST_PAUSE = 0.05


def mirror_leases(
    client: DynamoDBClient, table_name: str, pk: str, consumer_name: str, plan: BatchPlan, checkpoints: Mapping[str, Checkpoint]
) -> None:
    """Write the per-shard KCL-style items of the planned shards. Best effort: never raises.

    Called by ``DynamoDBCheckpointStore.commit`` (``core.store``) only once the head shows this
    batch committed (just now, or by an earlier attempt), so the mirror moves forward: a retried
    commit of an older batch is a conflict and writes nothing. The items go in
    ``BatchWriteItem`` calls of up to :data:`BATCH_WRITE_MAX_ITEMS` (25: the service's limit),
    on as many threads as the client pools connections (``core.pool``): 256 shards take 11
    calls, not 256 (a conditional ``PutItem`` per item cost the emulator as much as reading
    the batch; ``TransactWriteItems`` takes conditions, at twice the write capacity). No
    per-item condition: two runs of one consumer that commit within the moment between the
    head update and the write could leave an item one batch behind until the next commit;
    the mirror is for people and tools, the head is what the protocol reads.

    Items a call leaves unprocessed (``UnprocessedItems``) are written again, with tenacity, up
    to :data:`BATCH_WRITE_ATTEMPTS` calls, :data:`BATCH_WRITE_FIRST_PAUSE` seconds apart and
    doubling; any left after that, and a call that fails, are a warning.
    """
    puts = []
    for shard_id in sorted({r.shard_id for r in plan.ranges}):
        checkpoint = checkpoints.get(shard_id)
        if checkpoint is None:  # not among the batch's checkpoints (e.g. retired): nothing to mirror
            continue
        position = checkpoint.position
        if position is not None:
            kcl_checkpoint, kcl_sub = position.sequence_number, position.sub_sequence_number or 0
        else:
            assert checkpoint.sentinel is not None, "a checkpoint without a position has a sentinel"
            kcl_checkpoint, kcl_sub = checkpoint.sentinel.value, 0
        item = {
            **item_key(pk, f"LEASE#{shard_id}"),
            "leaseKey": {"S": shard_id},
            "leaseOwner": {"S": consumer_name},
            "checkpoint": {"S": kcl_checkpoint},
            "checkpointSubSequenceNumber": {"N": str(kcl_sub)},
            "batchId": {"N": str(plan.batch_id)},
        }
        if checkpoint.timestamp is not None:
            item["checkpointTimestamp"] = {"S": format_timestamp(checkpoint.timestamp)}
        puts.append(item)

    def write(chunk: list[dict[str, Any]]) -> None:
        requests: list[Any] = [{"PutRequest": {"Item": item}} for item in chunk]

        def put() -> list[Any]:  # the requests still unprocessed after this call
            nonlocal requests
            unprocessed = client.batch_write_item(RequestItems={table_name: requests}).get("UnprocessedItems", {})
            requests = unprocessed.get(table_name, [])
            return requests

        # tenacity: again while items are left, up to BATCH_WRITE_ATTEMPTS calls; a failed call
        # is not retried (botocore's retries are behind it); the last answer is kept when
        # items are still left (retry_error_callback), not an error.
        retrying = Retrying(retry=retry_if_result(bool), stop=stop_after_attempt(BATCH_WRITE_ATTEMPTS),
                            wait=wait_exponential(multiplier=BATCH_WRITE_FIRST_PAUSE),
                            retry_error_callback=lambda state: state.outcome.result() if state.outcome else requests)  # fmt: skip
        try:
            left = retrying(put)
            if left:
                log.warning("could not update the KCL-style lease mirror of %d shards (unprocessed after %d attempts)",
                            len(left), BATCH_WRITE_ATTEMPTS)  # fmt: skip
        except Exception as err:  # noqa: BLE001 - the mirror is derived data
            log.warning("could not update the KCL-style lease mirror of %d shards (%s ... %s): %s",
                        len(chunk), chunk[0]["leaseKey"]["S"], chunk[-1]["leaseKey"]["S"], err)  # fmt: skip

    chunks = [puts[i : i + BATCH_WRITE_MAX_ITEMS] for i in range(0, len(puts), BATCH_WRITE_MAX_ITEMS)]
    if chunks:
        with ThreadPoolExecutor(max_workers=pool_threads(client, len(chunks))) as pool:
            list(pool.map(write, chunks))
