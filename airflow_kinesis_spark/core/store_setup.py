"""Setting up the checkpoint table: creation, deletion protection, point-in-time recovery, TTL.

:func:`ensure_table` (``DynamoDBCheckpointStore.ensure_table`` in ``core.store`` calls it with the
store's client, table, key and settings) creates the table on first use (on-demand billing,
``DeletionProtectionEnabled`` unless turned off), waits for it to be ``ACTIVE``, turns on
point-in-time recovery of a table it created (:func:`enable_point_in_time_recovery`: retried while
DynamoDB still sets up the new table's continuous backups, a warning otherwise), logs once per
process how a table it did not create is protected (:func:`log_protection`: nothing is changed),
enables TTL on the batch log's ``expires_at`` (:func:`ensure_ttl`: best effort) and writes the head
item of one (stream, consumer) unless it exists.

Log lines keep the store's logger (``airflow_kinesis_spark.core.store``), where they were written
before this module held them: logging configurations and tests filter on it. This module does not
import ``core.store``.

No Airflow import.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from airflow_kinesis_spark.core.chunks import TTL_ATTRIBUTE
from airflow_kinesis_spark.core.head import _now

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# The store's logger, not this module's: see the module docstring.
log = logging.getLogger("airflow_kinesis_spark.core.store")

__all__ = ["BACKUPS_RETRY_SECONDS", "ensure_table", "enable_point_in_time_recovery", "log_protection", "ensure_ttl"]

#: Seconds between ``UpdateContinuousBackups`` attempts on a new table whose continuous backups are
#: not set up yet (``ContinuousBackupsUnavailableException``, DynamoDB API reference).
BACKUPS_RETRY_SECONDS = 2.0
#: Seconds between two ``DescribeTable`` calls of the waiter for a new table to be ``ACTIVE``.
TABLE_WAIT_DELAY = 0.5

# (endpoint, table) pairs whose protection settings this process has logged (see log_protection).
_logged_tables: set[tuple[str | None, str]] = set()
_logged_tables_lock = threading.Lock()


def _on_off(value: bool | None) -> str:
    return "unknown" if value is None else ("on" if value else "off")


def _error_code(err: Exception) -> str:
    """An AWS error's code (``AccessDeniedException``), or the exception's class name."""
    if isinstance(err, ClientError):
        return str(err.response.get("Error", {}).get("Code") or type(err).__name__)
    return type(err).__name__


def ensure_table(
    client: DynamoDBClient, table_name: str, pk: str, stream_name: str, consumer_name: str, *, deletion_protection: bool,
    point_in_time_recovery: bool, wait_seconds: float = 120.0, backups_retry_seconds: float = BACKUPS_RETRY_SECONDS,
) -> None:  # fmt: skip
    """Create the table if it does not exist, enable its TTL on ``expires_at`` (the batch log's
    retention, see :func:`ensure_ttl`), then the head item (key ``pk``, ``HEAD``).

    A table this call creates gets on-demand billing, deletion protection (CreateTable's
    ``DeletionProtectionEnabled``, unless ``deletion_protection=False``) and, once it is
    ``ACTIVE``, point-in-time recovery (unless ``point_in_time_recovery=False``; see
    :func:`enable_point_in_time_recovery`: a failure there is a warning, not an error). A table
    that exists, or that another process created at the same time, is left as its owner
    configured it; its settings are logged at INFO once per process (see :func:`log_protection`).

    :param wait_seconds: how long to wait for the table to become ``ACTIVE``; for a table this
        call created, also how long to keep retrying ``UpdateContinuousBackups`` while DynamoDB
        answers ``ContinuousBackupsUnavailableException`` (backups of a new table still being set up).
    :param backups_retry_seconds: seconds between those retries (``core.store`` passes its
        ``BACKUPS_RETRY_SECONDS``, looked up there at each call).
    :raises TimeoutError: if the table is not ``ACTIVE`` within ``wait_seconds``.
    """
    created = False
    try:
        table = client.describe_table(TableName=table_name)["Table"]
    except client.exceptions.ResourceNotFoundException:
        log.info(
            "creating checkpoint table %s (on-demand billing, deletion protection %s, point-in-time recovery %s)",
            table_name, _on_off(deletion_protection), _on_off(point_in_time_recovery),
        )  # fmt: skip
        request: dict[str, Any] = {
            "TableName": table_name,
            "AttributeDefinitions": [
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            "BillingMode": "PAY_PER_REQUEST",
        }
        if deletion_protection:
            # Only when asked for: DynamoDB's default is off, and emulators that predate the
            # parameter then see the request they know.
            request["DeletionProtectionEnabled"] = True
        try:
            client.create_table(**request)
            created = True
        except client.exceptions.ResourceInUseException:
            pass  # created concurrently: its creator configures it
        table = {"TableStatus": "CREATING"}
    if table["TableStatus"] != "ACTIVE":  # botocore's waiter: DescribeTable until ACTIVE
        from botocore.exceptions import WaiterError

        try:
            # botocore sleeps a fractional Delay as given; its service model (and so the stubs) says integer
            config: Any = {"Delay": TABLE_WAIT_DELAY, "MaxAttempts": max(1, math.ceil(wait_seconds / TABLE_WAIT_DELAY))}
            client.get_waiter("table_exists").wait(TableName=table_name, WaiterConfig=config)
        except WaiterError as err:
            raise TimeoutError(f"checkpoint table {table_name} not ACTIVE after {wait_seconds}s ({err})") from err
        table = client.describe_table(TableName=table_name)["Table"]
    if not created:
        log_protection(client, table_name, table)
    elif point_in_time_recovery:
        enable_point_in_time_recovery(client, table_name, wait_seconds, retry_seconds=backups_retry_seconds)
    ensure_ttl(client, table_name)
    try:
        client.put_item(
            TableName=table_name,
            Item={
                "pk": {"S": pk},
                "sk": {"S": "HEAD"},
                "committed_batch_id": {"N": "0"},
                "stream_name": {"S": stream_name},
                "consumer_name": {"S": consumer_name},
                "created_at": {"S": _now()},
            },
            ConditionExpression="attribute_not_exists(pk)",
        )
    except client.exceptions.ConditionalCheckFailedException:
        pass


def enable_point_in_time_recovery(
    client: DynamoDBClient, table_name: str, wait_seconds: float, *, retry_seconds: float = BACKUPS_RETRY_SECONDS
) -> None:
    """Turn on point-in-time recovery of ``table_name``, a table the store just created.

    ``UpdateContinuousBackups`` with ``PointInTimeRecoveryEnabled``. DynamoDB may answer
    ``ContinuousBackupsUnavailableException`` for a short while after a table is created (its
    continuous backups are still being set up; DynamoDB API reference): retried every
    ``retry_seconds`` for up to ``wait_seconds``. Best effort otherwise: any other error (e.g. a
    role without ``dynamodb:UpdateContinuousBackups``, or an emulator without the action) is
    logged as a warning that names the action, and the run goes on without it.

    :param wait_seconds: how long to keep retrying while backups are unavailable.
    :param retry_seconds: seconds between those retries (:data:`BACKUPS_RETRY_SECONDS`).
    """
    from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

    retrying = Retrying(
        retry=retry_if_exception_type(client.exceptions.ContinuousBackupsUnavailableException),
        wait=wait_fixed(retry_seconds), stop=stop_after_delay(max(0.0, wait_seconds - retry_seconds)), reraise=True,
    )  # fmt: skip
    try:
        retrying(client.update_continuous_backups, TableName=table_name,
                 PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True})  # fmt: skip
        log.info("point-in-time recovery enabled on checkpoint table %s", table_name)
        return
    except (ClientError, BotoCoreError) as err:  # still unavailable when the time was up, or refused
        failure: Exception = err
    log.warning(
        "could not enable point-in-time recovery on the new checkpoint table %s (%s): the table works "
        "without it, but cannot be restored to an earlier time. Grant dynamodb:UpdateContinuousBackups on "
        "it and turn it on (UpdateContinuousBackups), or create stores with point_in_time_recovery=False "
        "to not ask for it: %s", table_name, _error_code(failure), failure,
    )  # fmt: skip


def log_protection(client: DynamoDBClient, table_name: str, table: Mapping[str, Any]) -> None:
    """Log, at INFO and once per process and table, how a table this store did not create is protected.

    Deletion protection comes from the ``DescribeTable`` answer at hand (``table``);
    point-in-time recovery costs one ``DescribeContinuousBackups`` call. Nothing is changed. A
    failed call (e.g. a role without ``dynamodb:DescribeContinuousBackups``) only makes the
    logged status ``unknown``.

    :param table: the table's description (``DescribeTable``'s ``Table``).
    """
    key = (getattr(getattr(client, "meta", None), "endpoint_url", None), table_name)
    with _logged_tables_lock:
        if key in _logged_tables:
            return
        _logged_tables.add(key)
    flag = table.get("DeletionProtectionEnabled")
    deletion = _on_off(flag if isinstance(flag, bool) else None)
    try:
        backups = client.describe_continuous_backups(TableName=table_name)["ContinuousBackupsDescription"]
        status = str(backups.get("PointInTimeRecoveryDescription", {}).get("PointInTimeRecoveryStatus", "unknown"))
        pitr = {"ENABLED": "on", "DISABLED": "off"}.get(status, status.lower())
    except (ClientError, BotoCoreError) as err:
        pitr = f"unknown (DescribeContinuousBackups: {_error_code(err)})"
    log.info(
        "checkpoint table %s exists, left as configured: deletion protection %s, point-in-time recovery %s",
        table_name, deletion, pitr,
    )  # fmt: skip


def ensure_ttl(client: DynamoDBClient, table_name: str) -> None:
    """Enable the TTL of table ``table_name`` on :data:`TTL_ATTRIBUTE` unless it is on already.

    ``DescribeTimeToLive`` first; ``UpdateTimeToLive`` only when TTL is ``DISABLED`` (a new
    table, or one created before the retention existed). "Already enabled" (a concurrent
    enabler) is success. Best effort otherwise: the retention only saves storage, so an error
    (e.g. a role without ``dynamodb:DescribeTimeToLive`` / ``dynamodb:UpdateTimeToLive``, or
    TTL on another attribute) is logged as a warning and the old batches are simply kept.
    """
    try:
        ttl = client.describe_time_to_live(TableName=table_name).get("TimeToLiveDescription", {})
        status, attribute = ttl.get("TimeToLiveStatus", "DISABLED"), ttl.get("AttributeName")
        if status in ("ENABLED", "ENABLING"):
            if attribute != TTL_ATTRIBUTE:
                log.warning(
                    "checkpoint table %s has TTL on attribute %s, not %s: old batches of the batch log "
                    "will not be deleted", table_name, attribute, TTL_ATTRIBUTE,
                )  # fmt: skip
            return
        if status == "DISABLING":
            log.warning("checkpoint table %s: TTL is being disabled; not re-enabling it now", table_name)
            return
        log.info("enabling TTL on attribute %s of checkpoint table %s", TTL_ATTRIBUTE, table_name)
        client.update_time_to_live(
            TableName=table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
        )
    except client.exceptions.ClientError as err:
        message = str(err.response.get("Error", {}).get("Message", ""))
        if "already enabled" in message.lower():
            log.info("TTL of checkpoint table %s is already enabled", table_name)
            return
        log.warning(
            "could not enable TTL on attribute %s of checkpoint table %s (old batches of the batch log "
            "will be kept): %s", TTL_ATTRIBUTE, table_name, err,
        )  # fmt: skip
