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
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_kinesis_spark.core.chunks import item_key
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.pool import pool_threads
from airflow_kinesis_spark.core.positions import Checkpoint, format_timestamp

# The store's logger, not this module's: see the module docstring.
log = logging.getLogger("airflow_kinesis_spark.core.store")

__all__ = ["BATCH_WRITE_MAX_ITEMS", "BATCH_WRITE_ATTEMPTS", "mirror_leases"]

#: Put requests per ``BatchWriteItem`` call (DynamoDB API reference, BatchWriteItem: up to 25).
BATCH_WRITE_MAX_ITEMS = 25
#: Attempts of a ``BatchWriteItem`` call's unprocessed items (the service returns them when a
#: partition's throughput is exceeded; botocore does not retry them), 0.05 s, 0.1 s, ... apart.
BATCH_WRITE_ATTEMPTS = 5


def mirror_leases(
    client: Any, table_name: str, pk: str, consumer_name: str, plan: BatchPlan, checkpoints: Mapping[str, Checkpoint]
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
    """
    puts = []
    for shard_id in sorted({r.shard_id for r in plan.ranges}):
        checkpoint = checkpoints.get(shard_id)
        if checkpoint is None:  # not among the batch's checkpoints (e.g. retired): nothing to mirror
            continue
        position = checkpoint.position
        item = {
            **item_key(pk, f"LEASE#{shard_id}"),
            "leaseKey": {"S": shard_id},
            "leaseOwner": {"S": consumer_name},
            "checkpoint": {"S": position.sequence_number if position else checkpoint.sentinel.value},  # type: ignore[union-attr]
            "checkpointSubSequenceNumber": {"N": str((position.sub_sequence_number or 0) if position else 0)},
            "batchId": {"N": str(plan.batch_id)},
        }
        if checkpoint.timestamp is not None:
            item["checkpointTimestamp"] = {"S": format_timestamp(checkpoint.timestamp)}
        puts.append(item)

    def write(chunk: list[dict[str, Any]]) -> None:
        requests = [{"PutRequest": {"Item": item}} for item in chunk]
        try:
            for attempt in range(BATCH_WRITE_ATTEMPTS):
                if attempt:
                    time.sleep(0.05 * 2 ** (attempt - 1))
                unprocessed = client.batch_write_item(RequestItems={table_name: requests}).get("UnprocessedItems", {})
                requests = unprocessed.get(table_name, [])
                if not requests:
                    return
            log.warning("could not update the KCL-style lease mirror of %d shards (unprocessed after %d attempts)",
                        len(requests), BATCH_WRITE_ATTEMPTS)  # fmt: skip
        except Exception as err:  # noqa: BLE001 - the mirror is derived data
            log.warning("could not update the KCL-style lease mirror of %d shards (%s ... %s): %s",
                        len(chunk), chunk[0]["leaseKey"]["S"], chunk[-1]["leaseKey"]["S"], err)  # fmt: skip

    chunks = [puts[i : i + BATCH_WRITE_MAX_ITEMS] for i in range(0, len(puts), BATCH_WRITE_MAX_ITEMS)]
    if chunks:
        with ThreadPoolExecutor(max_workers=pool_threads(client, len(chunks))) as pool:
            list(pool.map(write, chunks))
