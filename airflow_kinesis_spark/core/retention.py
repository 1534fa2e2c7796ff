"""The batch log's retention: the chunk items of old batches marked to expire.

The batch log keeps the last ``keep_batches`` batches (:data:`DEFAULT_KEEP_BATCHES` by default,
counted back from the committed one, itself included) and the pending one. After each commit
(``DynamoDBCheckpointStore.commit`` in ``core.store``), :func:`expire_old_batches` sets
``expires_at`` (``core.chunks.TTL_ATTRIBUTE``) on the chunk items of every older batch, and
DynamoDB's TTL (enabled by ``core.store_setup.ensure_ttl``) deletes them, typically within a few
days (DynamoDB developer guide, "Using time to live"). The head and the ``LEASE#`` items never
expire. Best effort: an error is a warning, and the next commit retries.

Log lines keep the store's logger (``airflow_kinesis_spark.core.store``), where they were written
before this module held them: logging configurations and tests filter on it. This module does not
import ``core.store``.

No Airflow import.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from airflow_kinesis_spark.core.chunks import TTL_ATTRIBUTE, batch_prefix

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# The store's logger, not this module's: see the module docstring.
log = logging.getLogger("airflow_kinesis_spark.core.store")

__all__ = ["DEFAULT_KEEP_BATCHES", "expire_old_batches"]

#: Batches of the batch log kept by default (see ``DynamoDBCheckpointStore(keep_batches=...)``).
DEFAULT_KEEP_BATCHES = 100


def expire_old_batches(client: DynamoDBClient, table_name: str, pk: str, keep_batches: int, committed_batch_id: int) -> int:
    """Mark the chunk items of every batch ``<= committed_batch_id - keep_batches`` to expire.

    One ``Query`` (boto3 paginator) over the batch-log keys of ``pk`` (one stream and consumer) up
    to that batch, of the items without ``expires_at`` (keys only), then one ``UpdateItem`` each
    setting ``expires_at`` to now (epoch seconds). An item deleted meanwhile is not recreated.
    The committed batch and the pending one (``committed_batch_id + 1``) are above the bound
    since ``keep_batches >= 1``; ``HEAD`` and ``LEASE#`` keys are outside the key range.

    Note: a filter does not reduce what the ``Query`` reads (DynamoDB developer guide, "Filter
    expressions for Query"): marked items are read again until TTL deleted them.

    Best effort: never raises; an error is logged as a warning and the next commit retries.

    :returns: the number of items marked.
    """
    last = committed_batch_id - keep_batches
    if last < 1:
        return 0
    # Keys of batch ``last`` are ``BATCH#{last:020d}#{kind}#...``: the kind (ASCII) sorts below
    # U+FFFF, and every key of batch last + 1 sorts above the bound (20 digits, zero-padded).
    low, high = batch_prefix(0), batch_prefix(last) + "\uffff"
    marked = 0
    try:
        now = int(time.time())
        pages = client.get_paginator("query").paginate(
            TableName=table_name,
            KeyConditionExpression="pk = :pk AND sk BETWEEN :low AND :high",
            FilterExpression="attribute_not_exists(#expires)",
            ProjectionExpression="pk, sk",
            ExpressionAttributeNames={"#expires": TTL_ATTRIBUTE},
            ExpressionAttributeValues={":pk": {"S": pk}, ":low": {"S": low}, ":high": {"S": high}},
        )
        for page in pages:
            for item in page.get("Items", []):
                try:
                    client.update_item(
                        TableName=table_name,
                        Key={"pk": item["pk"], "sk": item["sk"]},
                        UpdateExpression="SET #expires = :now",
                        ConditionExpression="attribute_exists(sk) AND attribute_not_exists(#expires)",
                        ExpressionAttributeNames={"#expires": TTL_ATTRIBUTE},
                        ExpressionAttributeValues={":now": {"N": str(now)}},
                    )
                    marked += 1
                except client.exceptions.ConditionalCheckFailedException:
                    pass  # deleted or marked meanwhile
    except Exception as err:  # noqa: BLE001 - retention is housekeeping; it never fails a commit
        log.warning(
            "could not mark the batch log of batches <= %d to expire (marked %d items; the next commit "
            "retries): %s", last, marked, err,
        )  # fmt: skip
        return marked
    if marked:
        log.info("batch log: %d chunk items of batches <= %d marked to expire (keep_batches %d)",
                 marked, last, keep_batches)  # fmt: skip
    return marked
