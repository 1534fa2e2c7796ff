"""Protection of the checkpoint table against moto: deletion protection and point-in-time recovery.

A table ``ensure_table`` creates gets both (unless turned off); a table that exists is left as its
owner configured it. moto (5.x) implements ``DeletionProtectionEnabled`` on ``CreateTable`` and
``DescribeTable``, refuses ``DeleteTable`` on a protected table (``ValidationException``), and
implements ``UpdateContinuousBackups`` / ``DescribeContinuousBackups`` (PITR starts ``DISABLED``).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from botocore.exceptions import ClientError
from tests.conftest import aws_connection
from tests.helpers import checkpoints_after, make_plan, open_shards, reports_for

import airflow_kinesis_spark.core.store as store_module
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.hooks.dynamodb import DynamoDBCheckpointHook

pytestmark = pytest.mark.integration

KEY = {
    "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}],
    "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
    "BillingMode": "PAY_PER_REQUEST",
}


class RecordingClient:
    """The real client, recording every call's arguments; chosen operations fail (a list: in turn)."""

    def __init__(self, client: Any, fail: dict[str, list[Exception]] | None = None) -> None:
        self._client = client
        self.fail = {name: list(errors) for name, errors in (fail or {}).items()}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not callable(method) or name in ("get_paginator", "can_paginate", "get_waiter"):
            return method  # a waiter's calls go through the real client: not recorded

        def call(**kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            if self.fail.get(name):
                raise self.fail[name].pop(0)
            return method(**kwargs)

        return call

    def called(self, name: str) -> list[dict[str, Any]]:
        return [kwargs for op, kwargs in self.calls if op == name]


def deletion_protection(client: Any, table: str) -> bool:
    return client.describe_table(TableName=table)["Table"]["DeletionProtectionEnabled"]


def pitr_status(client: Any, table: str) -> str:
    backups = client.describe_continuous_backups(TableName=table)["ContinuousBackupsDescription"]
    return backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"]


def error(client: Any, code: str, operation: str, message: str = "") -> ClientError:
    """The modelled exception class for ``code`` when the client has one (as botocore raises it)."""
    cls = getattr(client.exceptions, code, ClientError)
    return cls({"Error": {"Code": code, "Message": message or code}}, operation)


def commit_one_batch(store: DynamoDBCheckpointStore) -> None:
    plan = make_plan(1, open_shards(2), stream_name=store.stream_name, consumer_name=store.consumer_name)
    store.begin(plan, "run-a")
    checkpoints = checkpoints_after(plan, 10)
    store.record_report(1, "run-a", reports_for(plan, checkpoints))
    store.commit(plan, checkpoints, "run-a")


# -- a table ensure_table creates ---------------------------------------------------------------------


def test_a_new_table_has_deletion_protection_and_pitr(dynamodb, unique_name):
    client = RecordingClient(dynamodb)
    DynamoDBCheckpointStore(client, unique_name, "orders", "lake").ensure_table()
    assert client.called("create_table")[0]["DeletionProtectionEnabled"] is True
    assert deletion_protection(dynamodb, unique_name) is True
    assert pitr_status(dynamodb, unique_name) == "ENABLED"
    assert client.called("update_continuous_backups") == [
        {"TableName": unique_name, "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True}}
    ]


def test_with_both_off_a_new_table_has_neither(dynamodb, unique_name):
    client = RecordingClient(dynamodb)
    store = DynamoDBCheckpointStore(client, unique_name, "orders", "lake", point_in_time_recovery=False, deletion_protection=False)
    store.ensure_table()
    assert "DeletionProtectionEnabled" not in client.called("create_table")[0]
    assert deletion_protection(dynamodb, unique_name) is False
    assert pitr_status(dynamodb, unique_name) == "DISABLED"
    assert client.called("update_continuous_backups") == []
    assert store.head().committed_batch_id == 0


@pytest.mark.parametrize(("pitr", "protect"), [(True, False), (False, True)])
def test_each_setting_is_independent(dynamodb, unique_name, pitr, protect):
    DynamoDBCheckpointStore(dynamodb, unique_name, "orders", "lake", point_in_time_recovery=pitr, deletion_protection=protect).ensure_table()
    assert deletion_protection(dynamodb, unique_name) is protect
    assert pitr_status(dynamodb, unique_name) == ("ENABLED" if pitr else "DISABLED")


def test_delete_table_on_a_protected_table_fails(dynamodb, unique_name):
    DynamoDBCheckpointStore(dynamodb, unique_name, "orders", "lake").ensure_table()
    with pytest.raises(ClientError) as caught:
        dynamodb.delete_table(TableName=unique_name)
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "DeletionProtectionEnabled" in caught.value.response["Error"]["Message"]
    assert dynamodb.describe_table(TableName=unique_name)["Table"]["TableStatus"] == "ACTIVE"
    # the way out, as documented: turn protection off first
    dynamodb.update_table(TableName=unique_name, DeletionProtectionEnabled=False)
    dynamodb.delete_table(TableName=unique_name)
    with pytest.raises(dynamodb.exceptions.ResourceNotFoundException):
        dynamodb.describe_table(TableName=unique_name)


def test_delete_table_without_protection_succeeds(dynamodb, unique_name):
    # the counterpart of the test above: moto does enforce the flag, it does not refuse every delete
    DynamoDBCheckpointStore(dynamodb, unique_name, "orders", "lake", deletion_protection=False).ensure_table()
    dynamodb.delete_table(TableName=unique_name)
    with pytest.raises(dynamodb.exceptions.ResourceNotFoundException):
        dynamodb.describe_table(TableName=unique_name)


# -- PITR could not be enabled ---------------------------------------------------------------------------


def test_pitr_access_denied_is_a_warning_naming_the_action(dynamodb, unique_name, caplog):
    denied = error(dynamodb, "AccessDeniedException", "UpdateContinuousBackups", "not authorized to perform")
    client = RecordingClient(dynamodb, fail={"update_continuous_backups": [denied]})
    with caplog.at_level(logging.WARNING, logger=store_module.__name__):
        store = DynamoDBCheckpointStore(client, unique_name, "orders", "lake")
        store.ensure_table()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "dynamodb:UpdateContinuousBackups" in warnings[0] and unique_name in warnings[0]
    assert "AccessDeniedException" in warnings[0]
    assert len(client.called("update_continuous_backups")) == 1  # denied is not retried
    assert pitr_status(dynamodb, unique_name) == "DISABLED"
    assert deletion_protection(dynamodb, unique_name) is True  # the table is made all the same
    commit_one_batch(store)  # and the run goes on
    assert store.head().committed_batch_id == 1


def test_pitr_is_retried_while_the_new_tables_backups_are_unavailable(dynamodb, unique_name, monkeypatch, caplog):
    monkeypatch.setattr(store_module, "BACKUPS_RETRY_SECONDS", 0.01)
    unavailable = [error(dynamodb, "ContinuousBackupsUnavailableException", "UpdateContinuousBackups") for _ in range(2)]
    client = RecordingClient(dynamodb, fail={"update_continuous_backups": unavailable})
    with caplog.at_level(logging.WARNING, logger=store_module.__name__):
        DynamoDBCheckpointStore(client, unique_name, "orders", "lake").ensure_table()
    assert len(client.called("update_continuous_backups")) == 3
    assert pitr_status(dynamodb, unique_name) == "ENABLED"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_pitr_retries_stop_after_wait_seconds_with_a_warning(dynamodb, unique_name, monkeypatch, caplog):
    monkeypatch.setattr(store_module, "BACKUPS_RETRY_SECONDS", 0.05)
    unavailable = [error(dynamodb, "ContinuousBackupsUnavailableException", "UpdateContinuousBackups") for _ in range(1000)]
    client = RecordingClient(dynamodb, fail={"update_continuous_backups": unavailable})
    with caplog.at_level(logging.WARNING, logger=store_module.__name__):
        store = DynamoDBCheckpointStore(client, unique_name, "orders", "lake")
        store.ensure_table(wait_seconds=0.3)
    attempts = len(client.called("update_continuous_backups"))
    assert 2 <= attempts <= 8  # about wait_seconds / BACKUPS_RETRY_SECONDS, not 1000
    assert any("ContinuousBackupsUnavailableException" in r.getMessage() and "dynamodb:UpdateContinuousBackups" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)  # fmt: skip
    assert store.head().committed_batch_id == 0  # the head item was written after it


# -- a table that exists ---------------------------------------------------------------------------------


def test_an_existing_unprotected_table_is_not_modified(dynamodb, unique_name, caplog):
    dynamodb.create_table(TableName=unique_name, **KEY)  # made by its owner, without either
    client = RecordingClient(dynamodb)
    with caplog.at_level(logging.INFO, logger=store_module.__name__):
        store = DynamoDBCheckpointStore(client, unique_name, "orders", "lake")  # defaults: both on
        store.ensure_table()
    assert deletion_protection(dynamodb, unique_name) is False
    assert pitr_status(dynamodb, unique_name) == "DISABLED"
    assert [op for op, _ in client.calls if op in ("create_table", "update_table", "update_continuous_backups")] == []
    assert any(
        f"checkpoint table {unique_name} exists, left as configured: deletion protection off, point-in-time recovery off"
        in r.getMessage() for r in caplog.records if r.levelno == logging.INFO
    )
    assert store.head().committed_batch_id == 0


def test_an_existing_protected_table_is_not_modified_by_a_store_that_would_not_protect(dynamodb, unique_name, caplog):
    dynamodb.create_table(TableName=unique_name, DeletionProtectionEnabled=True, **KEY)
    dynamodb.update_continuous_backups(TableName=unique_name, PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True})
    client = RecordingClient(dynamodb)
    with caplog.at_level(logging.INFO, logger=store_module.__name__):
        DynamoDBCheckpointStore(client, unique_name, "orders", "lake", point_in_time_recovery=False, deletion_protection=False).ensure_table()
    assert deletion_protection(dynamodb, unique_name) is True
    assert pitr_status(dynamodb, unique_name) == "ENABLED"
    assert [op for op, _ in client.calls if op in ("update_table", "update_continuous_backups")] == []
    assert any("deletion protection on, point-in-time recovery on" in r.getMessage() for r in caplog.records)


def test_a_table_created_concurrently_is_left_to_its_creator(dynamodb, unique_name):
    # Another process creates the table (unprotected) between our DescribeTable and our CreateTable.
    class RacingClient(RecordingClient):
        def __getattr__(self, name: str) -> Any:
            if name == "create_table":
                def create_table(**kwargs: Any) -> Any:
                    self.calls.append(("create_table", kwargs))
                    dynamodb.create_table(TableName=unique_name, **KEY)
                    return dynamodb.create_table(**kwargs)  # ResourceInUseException

                return create_table
            return super().__getattr__(name)

    client = RacingClient(dynamodb)
    store = DynamoDBCheckpointStore(client, unique_name, "orders", "lake")
    store.ensure_table()
    assert len(client.called("create_table")) == 1
    assert client.called("update_continuous_backups") == []
    assert deletion_protection(dynamodb, unique_name) is False
    assert pitr_status(dynamodb, unique_name) == "DISABLED"
    assert store.head().committed_batch_id == 0


def test_an_existing_tables_settings_are_described_once_per_process(dynamodb, unique_name, caplog):
    DynamoDBCheckpointStore(dynamodb, unique_name, "orders", "lake").ensure_table()  # created here: no description
    client = RecordingClient(dynamodb)
    with caplog.at_level(logging.INFO, logger=store_module.__name__):
        for consumer in ("lake", "lake", "audit"):
            DynamoDBCheckpointStore(client, unique_name, "orders", consumer).ensure_table()
    assert len(client.called("describe_continuous_backups")) == 1
    described = [r for r in caplog.records if "left as configured" in r.getMessage()]
    assert len(described) == 1
    assert "deletion protection on, point-in-time recovery on" in described[0].getMessage()


def test_describe_continuous_backups_denied_logs_unknown_and_goes_on(dynamodb, unique_name, caplog):
    dynamodb.create_table(TableName=unique_name, **KEY)
    denied = error(dynamodb, "AccessDeniedException", "DescribeContinuousBackups")
    client = RecordingClient(dynamodb, fail={"describe_continuous_backups": [denied]})
    with caplog.at_level(logging.INFO, logger=store_module.__name__):
        store = DynamoDBCheckpointStore(client, unique_name, "orders", "lake")
        store.ensure_table()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("point-in-time recovery unknown (DescribeContinuousBackups: AccessDeniedException)" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    commit_one_batch(store)
    assert store.head().committed_batch_id == 1


# -- arguments ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["point_in_time_recovery", "deletion_protection"])
@pytest.mark.parametrize("value", ["False", 0, None])
def test_settings_must_be_bools(dynamodb, name, value):
    # a templated "False" would be truthy: refuse it rather than protect (or not) by accident
    with pytest.raises(TypeError, match=f"{name} must be a bool"):
        DynamoDBCheckpointStore(dynamodb, "checkpoints", "orders", "lake", **{name: value})


def test_defaults_are_on(dynamodb):
    store = DynamoDBCheckpointStore(dynamodb, "checkpoints", "orders", "lake")
    assert (store.point_in_time_recovery, store.deletion_protection) == (True, True)


def test_the_hook_passes_the_settings_to_the_store(monkeypatch, moto_endpoint, dynamodb, unique_name):
    monkeypatch.setenv("AIRFLOW_CONN_AWS_PROTECTION", aws_connection(moto_endpoint))
    hook = DynamoDBCheckpointHook(aws_conn_id="aws_protection")
    off = hook.get_store(unique_name, "orders", "lake", point_in_time_recovery=False, deletion_protection=False)
    assert (off.point_in_time_recovery, off.deletion_protection) == (False, False)
    off.ensure_table()
    assert deletion_protection(dynamodb, unique_name) is False
    assert pitr_status(dynamodb, unique_name) == "DISABLED"
    on = hook.get_store(f"{unique_name}_on", "orders", "lake")
    on.ensure_table()
    assert deletion_protection(dynamodb, f"{unique_name}_on") is True
    assert pitr_status(dynamodb, f"{unique_name}_on") == "ENABLED"
