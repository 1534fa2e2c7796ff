"""DynamoDBCheckpointStore against moto's DynamoDB over HTTP: batch log, head, fencing, atomic commit."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
from tests.helpers import PLAN_NOW, checkpoints_after, make_plan, open_shards, reports_for, sequence_number, shard_id

import airflow_kinesis_spark.core.store as store_module
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import Checkpoint, Sentinel
from airflow_kinesis_spark.core.names import validate_table_name
from airflow_kinesis_spark.core.head import Head
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.exceptions import BatchLeaseHeldError, CheckpointConflictError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shared_table() -> dict[str, str]:
    return {}


@pytest.fixture
def store(dynamodb, shared_table, unique_name) -> DynamoDBCheckpointStore:
    """A store on a table shared by the module's tests (created once), under its own stream name.

    Each (stream, consumer) has its own head, so the tests do not see each other; tests of table
    creation use a table of their own.
    """
    if "name" not in shared_table:
        shared_table["name"] = f"checkpoints-{uuid.uuid4().hex[:8]}"
        DynamoDBCheckpointStore(dynamodb, shared_table["name"], "bootstrap", "lake").ensure_table()
    s = DynamoDBCheckpointStore(dynamodb, shared_table["name"], unique_name, "lake")
    s.ensure_table()
    return s


def plan_for(
    store: DynamoDBCheckpointStore,
    batch_id: int,
    shards: list,
    checkpoints: dict[str, Checkpoint] | None = None,
    *,
    consumer_name: str | None = None,
) -> BatchPlan:
    return make_plan(
        batch_id,
        shards,
        checkpoints,
        stream_name=store.stream_name,
        consumer_name=consumer_name or store.consumer_name,
    )


def other(store: DynamoDBCheckpointStore, client: Any = None, consumer: str | None = None) -> DynamoDBCheckpointStore:
    """Another process's view of the same table (its own store object)."""
    return DynamoDBCheckpointStore(
        client or store.client, store.table_name, store.stream_name, consumer or store.consumer_name
    )


def items(store: DynamoDBCheckpointStore, prefix: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in store.client.get_paginator("query").paginate(
        TableName=store.table_name,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
        ExpressionAttributeValues={":pk": {"S": store.pk}, ":p": {"S": prefix}},
        ConsistentRead=True,
    ):
        out.extend(page["Items"])
    return out


def raw_head(store: DynamoDBCheckpointStore) -> dict[str, Any]:
    return store.client.get_item(TableName=store.table_name, Key=store._key("HEAD"), ConsistentRead=True)["Item"]


def run_batch(store: DynamoDBCheckpointStore, plan: BatchPlan, owner: str, last_index: int) -> dict[str, Checkpoint]:
    """begin → record_report → commit; returns the committed checkpoints."""
    store.begin(plan, owner)
    checkpoints = checkpoints_after(plan, last_index)
    store.record_report(plan.batch_id, owner, reports_for(plan, checkpoints))
    store.commit(plan, checkpoints, owner)
    return checkpoints


# -- table ------------------------------------------------------------------------------------------


def test_ensure_table_creates_on_demand_table_and_head(dynamodb, unique_name):
    s = DynamoDBCheckpointStore(dynamodb, unique_name, "orders", "lake")
    with pytest.raises(dynamodb.exceptions.ResourceNotFoundException):
        dynamodb.describe_table(TableName=unique_name)
    s.ensure_table()
    table = dynamodb.describe_table(TableName=unique_name)["Table"]
    assert table["TableStatus"] == "ACTIVE"
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert {k["AttributeName"]: k["KeyType"] for k in table["KeySchema"]} == {"pk": "HASH", "sk": "RANGE"}
    # protected by default (the settings: tests/integration/test_store_protection.py)
    assert table["DeletionProtectionEnabled"] is True
    backups = dynamodb.describe_continuous_backups(TableName=unique_name)["ContinuousBackupsDescription"]
    assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"
    assert s.head() == Head()
    assert raw_head(s)["committed_batch_id"] == {"N": "0"}


def test_ensure_table_is_idempotent_and_keeps_state(dynamodb, unique_name):
    store = DynamoDBCheckpointStore(dynamodb, unique_name, "orders", "lake")
    store.ensure_table()
    store.ensure_table()
    plan = plan_for(store, 1, open_shards(2))
    committed = run_batch(store, plan, "run-a", 10)
    store.ensure_table()
    other(store).ensure_table()
    assert store.head().committed_batch_id == 1
    assert store.committed_checkpoints() == committed
    # ListTables answers at most 100 names a page (DynamoDB API reference): page through all of them
    names = [t for page in dynamodb.get_paginator("list_tables").paginate() for t in page["TableNames"]]
    assert [t for t in names if t == unique_name] == [unique_name]


def test_second_consumer_on_existing_table_gets_its_own_head(store):
    run_batch(store, plan_for(store, 1, open_shards(1)), "run-a", 10)
    second = other(store, consumer="audit")
    second.ensure_table()
    assert second.head() == Head()
    assert second.committed_checkpoints() == {}


@pytest.mark.parametrize("name", ["ab", "has space", "x" * 256, "naïve", "a/b"])
def test_invalid_table_names_rejected(dynamodb, name):
    with pytest.raises(ValueError, match="3-255 characters"):
        DynamoDBCheckpointStore(dynamodb, name, "orders", "lake")
    with pytest.raises(ValueError):
        validate_table_name(name)


# -- begin / pending plan ----------------------------------------------------------------------------


def test_begin_persists_the_plan(store):
    plan = plan_for(store, 1, open_shards(3))
    assert store.pending_plan() is None
    store.begin(plan, "run-a")
    head = store.head()
    assert head.pending_batch_id == 1
    assert head.pending_owner == head.pending_plan_owner == "run-a"
    assert head.committed_batch_id == 0
    assert store.pending_plan() == plan
    assert other(store).pending_plan() == plan  # another process reads the same plan
    assert store.committed_checkpoints() == {}


def test_second_begin_while_pending_names_the_pending_batch_and_owner(store):
    store.begin(plan_for(store, 1, open_shards(2)), "run-a")
    with pytest.raises(CheckpointConflictError) as info:
        other(store).begin(plan_for(store, 1, open_shards(3)), "run-b")
    err = info.value
    message = str(err)
    assert "pending batch is 1" in message
    assert "run-a" in message
    assert "run-b" in message  # and who was refused
    assert err.other_owner == "run-a"
    assert err.pending_batch_id == 1
    assert err.committed_batch_id == 0
    # the pending plan is re-used, never replaced
    assert store.pending_plan() == plan_for(store, 1, open_shards(2))
    assert store.head().pending_owner == "run-a"


def test_begin_of_a_later_batch_while_pending_conflicts(store):
    store.begin(plan_for(store, 1, open_shards(2)), "run-a")
    with pytest.raises(CheckpointConflictError):
        store.begin(plan_for(store, 2, open_shards(2)), "run-a")
    assert store.head().pending_batch_id == 1


def test_begin_must_follow_the_committed_batch(store):
    with pytest.raises(CheckpointConflictError):
        store.begin(plan_for(store, 2, open_shards(1)), "run-a")  # batch 1 was never committed
    assert store.head().pending_batch_id is None
    run_batch(store, plan_for(store, 1, open_shards(1)), "run-a", 10)
    with pytest.raises(CheckpointConflictError):
        store.begin(plan_for(store, 1, open_shards(1)), "run-b")  # batch 1 is already committed
    store.begin(plan_for(store, 2, open_shards(1)), "run-b")
    assert store.head().pending_batch_id == 2


# -- take over (fencing) --------------------------------------------------------------------------------


def test_take_over_fences_the_old_owner(store):
    plan = plan_for(store, 1, open_shards(3))
    store.begin(plan, "run-a")
    new = other(store)
    head = new.take_over(1, "run-b", lease_seconds=0)
    assert head.pending_owner == "run-b"
    assert head.pending_plan_owner == "run-a"
    assert new.pending_plan() == plan  # the retry re-uses the plan

    checkpoints = checkpoints_after(plan, 20)
    with pytest.raises(CheckpointConflictError) as info:
        store.record_report(1, "run-a", reports_for(plan, checkpoints))
    assert info.value.other_owner == "run-b"
    with pytest.raises(CheckpointConflictError) as info:
        store.commit(plan, checkpoints, "run-a")
    assert "run-b" in str(info.value)
    assert store.head().committed_batch_id == 0
    assert store.committed_checkpoints() == {}

    new.record_report(1, "run-b", reports_for(plan, checkpoints))
    assert new.pending_report() == reports_for(plan, checkpoints)
    new.commit(plan, checkpoints, "run-b")
    head = store.head()
    assert head.committed_batch_id == 1
    assert head.committed_owner == "run-b"
    assert head.pending_batch_id is None
    assert store.committed_checkpoints() == checkpoints


def test_new_owner_can_commit_with_the_old_owners_report(store):
    plan = plan_for(store, 1, open_shards(2))
    store.begin(plan, "run-a")
    checkpoints = checkpoints_after(plan, 5)
    store.record_report(1, "run-a", reports_for(plan, checkpoints))
    new = other(store)
    new.take_over(1, "run-b", lease_seconds=0)
    # output was complete: commit without re-writing
    assert new.pending_report() == reports_for(plan, checkpoints)
    new.commit(plan, checkpoints, "run-b")
    assert store.committed_checkpoints() == checkpoints


def test_take_over_of_a_batch_that_is_not_pending_conflicts(store):
    with pytest.raises(CheckpointConflictError):
        store.take_over(1, "run-b", lease_seconds=0)
    run_batch(store, plan_for(store, 1, open_shards(1)), "run-a", 1)
    with pytest.raises(CheckpointConflictError):
        store.take_over(1, "run-b", lease_seconds=0)
    assert store.head().committed_owner == "run-a"


# -- commit ----------------------------------------------------------------------------------------------


def test_commit_moves_committed_batch_and_checkpoints(store):
    plan = plan_for(store, 1, open_shards(4))
    store.begin(plan, "run-a")
    checkpoints = checkpoints_after(plan, 100)
    checkpoints[shard_id(3)] = Checkpoint(Sentinel.SHARD_END)
    checkpoints[shard_id(2)] = Checkpoint.at(sequence_number(7), 3)
    store.commit(plan, checkpoints, "run-a")
    head = store.head()
    assert head.committed_batch_id == 1
    assert head.committed_owner == "run-a"
    assert head.pending_batch_id is None and head.pending_owner is None and head.pending_report_owner is None
    assert store.pending_plan() is None
    assert store.committed_checkpoints() == checkpoints
    assert other(store).committed_checkpoints() == checkpoints

    plan2 = plan_for(store, 2, open_shards(4), checkpoints)
    assert plan2.shard_ids == [shard_id(0), shard_id(1), shard_id(2)]  # shard 3 is at SHARD_END
    checkpoints2 = checkpoints_after(plan2, 200)
    store.begin(plan2, "run-a")
    assert store.committed_checkpoints() == checkpoints  # a pending batch changes nothing
    store.commit(plan2, checkpoints2, "run-a")
    assert store.head().committed_batch_id == 2
    assert store.committed_checkpoints() == checkpoints2
    assert store.committed_checkpoints()[shard_id(3)] == Checkpoint(Sentinel.SHARD_END)


def test_commit_without_begin_conflicts(store):
    plan = plan_for(store, 1, open_shards(1))
    with pytest.raises(CheckpointConflictError):
        store.commit(plan, checkpoints_after(plan, 1), "run-a")
    assert store.committed_checkpoints() == {}


def test_commit_is_idempotent_for_the_same_owner(store):
    plan = plan_for(store, 1, open_shards(3))
    store.begin(plan, "run-a")
    checkpoints = checkpoints_after(plan, 9)
    store.commit(plan, checkpoints, "run-a")
    committed_at = raw_head(store)["committed_at"]
    store.commit(plan, checkpoints, "run-a")  # returns quietly
    assert raw_head(store)["committed_at"] == committed_at
    assert store.head().committed_batch_id == 1
    assert store.committed_checkpoints() == checkpoints


def test_repeated_commit_never_changes_committed_checkpoints(store):
    # MONO: checkpoints only move forward, and only through conditional writes. A second commit
    # call for a batch that is already committed must not rewrite what the head points at.
    plan = plan_for(store, 1, open_shards(3))
    store.begin(plan, "run-a")
    checkpoints = checkpoints_after(plan, 9)
    store.commit(plan, checkpoints, "run-a")
    different = checkpoints_after(plan, 500)
    try:
        store.commit(plan, different, "run-a")
    except CheckpointConflictError:
        pass
    assert store.committed_checkpoints() == checkpoints


def test_commit_by_another_owner_after_commit_conflicts(store):
    plan = plan_for(store, 1, open_shards(2))
    checkpoints = run_batch(store, plan, "run-a", 3)
    with pytest.raises(CheckpointConflictError) as info:
        other(store).commit(plan, checkpoints_after(plan, 99), "run-b")
    assert "run-a" in str(info.value)
    assert store.committed_checkpoints() == checkpoints


@pytest.mark.parametrize(
    "error",
    [
        EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:9"),
    ],
    ids=["connection", "read-timeout"],
)
def test_ambiguous_commit_is_completed_by_a_retry(store, error):
    class AmbiguousCommitClient:
        """Applies the first commit update on the server, then fails on the way back."""

        def __init__(self, client: Any) -> None:
            self._client = client
            self.commit_updates: list[str] = []

        def __getattr__(self, name: str) -> Any:
            return getattr(self._client, name)

        def update_item(self, **kwargs: Any) -> Any:
            is_commit = kwargs["UpdateExpression"].startswith("SET committed_batch_id")
            result = self._client.update_item(**kwargs)  # raises on a failed condition
            if is_commit:
                self.commit_updates.append(kwargs["ExpressionAttributeValues"][":n"]["N"])
                if len(self.commit_updates) == 1:
                    raise error
            return result

    client = AmbiguousCommitClient(store.client)
    flaky = other(store, client=client)
    plan = plan_for(store, 1, open_shards(5))
    flaky.begin(plan, "run-a")
    checkpoints = checkpoints_after(plan, 40)
    with pytest.raises(type(error)):
        flaky.commit(plan, checkpoints, "run-a")
    assert store.head().committed_batch_id == 1  # it did apply
    committed_at = raw_head(store)["committed_at"]

    flaky.commit(plan, checkpoints, "run-a")  # the retry returns quietly
    assert client.commit_updates == ["1"]  # applied once
    assert raw_head(store)["committed_at"] == committed_at
    head = store.head()
    assert (head.committed_batch_id, head.committed_owner, head.pending_batch_id) == (1, "run-a", None)
    assert store.committed_checkpoints() == checkpoints
    # and the next batch follows normally
    plan2 = plan_for(store, 2, open_shards(5), checkpoints)
    run_batch(store, plan2, "run-a", 80)
    assert store.head().committed_batch_id == 2


# -- large batches -------------------------------------------------------------------------------------


def test_small_chunks_round_trip(store, monkeypatch):
    monkeypatch.setattr(store_module, "CHUNK_CHARS", 1000)
    plan = plan_for(store, 1, open_shards(150))
    store.begin(plan, "run-a")
    plan_chunks = items(store, "BATCH#00000000000000000001#PLAN#run-a#")
    assert len(plan_chunks) > 20
    assert {int(i["chunks"]["N"]) for i in plan_chunks} == {len(plan_chunks)}
    assert store.pending_plan() == plan
    checkpoints = checkpoints_after(plan, 1000, sub=2)
    reports = reports_for(plan, checkpoints)
    store.record_report(1, "run-a", reports)
    assert store.pending_report() == reports
    store.commit(plan, checkpoints, "run-a")
    assert len(items(store, "BATCH#00000000000000000001#CKPT#run-a#")) > 10
    assert store.committed_checkpoints() == checkpoints


def test_plan_and_report_of_3000_shards_round_trip(store):
    # Real CHUNK_CHARS: several items, each under DynamoDB's 400 KB item limit (moto enforces it).
    plan = plan_for(store, 1, open_shards(3000))
    store.begin(plan, "run-a")
    chunks = items(store, "BATCH#00000000000000000001#PLAN#")
    assert len(chunks) >= 3
    assert all(len(i["body"]["S"]) <= store_module.CHUNK_CHARS for i in chunks)
    assert other(store).pending_plan() == plan
    reports = reports_for(plan, checkpoints_after(plan, 7))
    store.record_report(1, "run-a", reports)
    assert other(store).pending_report() == reports
    # (not committed here: the KCL-style mirror writes one item per shard, 3,000 sequential puts)


def test_commit_of_150_shards_is_atomic(store):
    shards = open_shards(150)
    plan1 = plan_for(store, 1, shards)
    batch1 = run_batch(store, plan1, "run-a", 1_000)
    committed = store.committed_checkpoints()
    assert len(committed) == 150
    assert committed == batch1
    assert all(committed[shard_id(n)] == Checkpoint.at(sequence_number(1_000 + n)) for n in range(150))

    # batch 2 over the same 150 shards; another writer takes it over before the first commits
    plan2 = plan_for(store, 2, shards, committed)
    assert len(plan2.ranges) == 150
    store.begin(plan2, "run-a")
    other(store).take_over(2, "run-b", lease_seconds=0)
    batch2 = checkpoints_after(plan2, 5_000)
    with pytest.raises(CheckpointConflictError) as info:
        store.commit(plan2, batch2, "run-a")
    assert "run-b" in str(info.value)
    assert info.value.other_owner == "run-b"
    after = other(store).committed_checkpoints()
    assert after == batch1  # none of the 150 moved
    assert sum(after[s] != batch1[s] for s in after) == 0
    head = store.head()
    assert (head.committed_batch_id, head.pending_batch_id, head.pending_owner) == (1, 2, "run-b")
    # the KCL-style mirror did not move either
    leases = {i["leaseKey"]["S"]: i for i in items(store, "LEASE#")}
    assert len(leases) == 150
    assert {i["batchId"]["N"] for i in leases.values()} == {"1"}


def test_commit_of_150_shards_loses_to_a_concurrent_commit(store):
    shards = open_shards(150)
    batch1 = run_batch(store, plan_for(store, 1, shards), "run-a", 1_000)
    plan2 = plan_for(store, 2, shards, batch1)
    store.begin(plan2, "run-a")
    rival = other(store)
    rival.take_over(2, "run-b", lease_seconds=0)
    theirs = checkpoints_after(plan2, 3_000)
    rival.commit(plan2, theirs, "run-b")
    ours = checkpoints_after(plan2, 9_000)
    with pytest.raises(CheckpointConflictError) as info:
        store.commit(plan2, ours, "run-a")
    assert "run-b" in str(info.value)
    assert store.committed_checkpoints() == theirs  # all 150 from the winner, none from us
    assert store.head().committed_owner == "run-b"


# -- consumers and the KCL-style mirror ------------------------------------------------------------------


def test_two_consumers_on_one_table_never_see_each_others_checkpoints(store):
    lake = store
    audit = other(store, consumer="audit")
    audit.ensure_table()
    shards = open_shards(3)
    lake_plan = plan_for(store, 1, shards, consumer_name="lake")
    audit_plan = plan_for(store, 1, shards, consumer_name="audit")
    lake.begin(lake_plan, "run-l")
    assert audit.pending_plan() is None
    audit.begin(audit_plan, "run-x")  # no conflict with the other consumer's pending batch
    lake_ckpts = checkpoints_after(lake_plan, 10)
    audit_ckpts = checkpoints_after(audit_plan, 50)
    lake.commit(lake_plan, lake_ckpts, "run-l")
    assert audit.committed_checkpoints() == {}
    assert audit.head().committed_batch_id == 0
    audit.commit(audit_plan, audit_ckpts, "run-x")
    assert lake.committed_checkpoints() == lake_ckpts
    assert audit.committed_checkpoints() == audit_ckpts
    lake_leases = {i["leaseKey"]["S"]: i["checkpoint"]["S"] for i in items(lake, "LEASE#")}
    audit_leases = {i["leaseKey"]["S"]: i["checkpoint"]["S"] for i in items(audit, "LEASE#")}
    assert lake_leases == {k: v.position.sequence_number for k, v in lake_ckpts.items()}
    assert audit_leases == {k: v.position.sequence_number for k, v in audit_ckpts.items()}


def test_same_consumer_of_two_streams_is_separate(store):
    run_batch(store, plan_for(store, 1, open_shards(2)), "run-a", 10)
    clicks = DynamoDBCheckpointStore(store.client, store.table_name, "clicks", store.consumer_name)
    clicks.ensure_table()
    assert clicks.committed_checkpoints() == {}
    assert clicks.head() == Head()


def test_kcl_style_lease_items_after_commit(store):
    shards = open_shards(5)
    plan = plan_for(store, 1, shards)
    store.begin(plan, "run-a")
    checkpoints = {
        shard_id(0): Checkpoint.at(sequence_number(11)),
        shard_id(1): Checkpoint.at(sequence_number(12), 4),
        shard_id(2): Checkpoint(Sentinel.SHARD_END),
        shard_id(3): Checkpoint(Sentinel.TRIM_HORIZON),
        shard_id(4): Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=PLAN_NOW),
    }
    assert items(store, "LEASE#") == []
    store.commit(plan, checkpoints, "run-a")
    leases = {i["leaseKey"]["S"]: i for i in items(store, "LEASE#")}
    assert set(leases) == {shard_id(n) for n in range(5)}
    assert leases[shard_id(0)]["checkpoint"] == {"S": sequence_number(11)}
    assert leases[shard_id(0)]["checkpointSubSequenceNumber"] == {"N": "0"}
    assert leases[shard_id(1)]["checkpoint"] == {"S": sequence_number(12)}
    assert leases[shard_id(1)]["checkpointSubSequenceNumber"] == {"N": "4"}
    assert leases[shard_id(2)]["checkpoint"] == {"S": "SHARD_END"}
    assert leases[shard_id(3)]["checkpoint"] == {"S": "TRIM_HORIZON"}
    assert leases[shard_id(4)]["checkpoint"] == {"S": "AT_TIMESTAMP"}
    assert leases[shard_id(4)]["checkpointTimestamp"] == {"S": "2024-05-01T12:00:00.125Z"}
    assert "checkpointTimestamp" not in leases[shard_id(0)]
    for item in leases.values():
        assert item["sk"]["S"] == f"LEASE#{item['leaseKey']['S']}"
        assert item["batchId"] == {"N": "1"}
        assert item["leaseOwner"] == {"S": "lake"}
        assert item["checkpoint"]["S"] in ("SHARD_END", "TRIM_HORIZON", "AT_TIMESTAMP") or len(item["checkpoint"]["S"]) == 56

    # the next batch moves the mirror forward
    plan2 = plan_for(store, 2, shards, checkpoints)
    assert shard_id(2) not in plan2.shard_ids
    store.begin(plan2, "run-a")
    checkpoints2 = checkpoints_after(plan2, 90)
    store.commit(plan2, checkpoints2, "run-a")
    leases = {i["leaseKey"]["S"]: i for i in items(store, "LEASE#")}
    assert leases[shard_id(0)]["checkpoint"] == {"S": checkpoints2[shard_id(0)].position.sequence_number}
    assert leases[shard_id(0)]["batchId"] == {"N": "2"}
    assert leases[shard_id(2)]["checkpoint"] == {"S": "SHARD_END"}  # not planned, untouched
    assert leases[shard_id(2)]["batchId"] == {"N": "1"}


def test_the_kcl_style_mirror_of_250_shards_takes_10_calls_and_never_moves_back(store):
    """The ``LEASE#`` mirror of 250 shards is 10 ``BatchWriteItem`` calls (at most 25 items each),
    not 250 ``PutItem`` calls; a retried commit of the committed batch writes the same items
    again; a retried commit of a batch older than the committed one writes nothing."""
    shards = open_shards(250)
    plan = plan_for(store, 1, shards)
    store.begin(plan, "run-a")
    checkpoints = checkpoints_after(plan, 100)
    calls: list[str] = []
    for operation in ("BatchWriteItem", "PutItem"):
        store.client.meta.events.register(f"before-call.dynamodb.{operation}", lambda operation=operation, **_: calls.append(operation))

    store.commit(plan, checkpoints, "run-a")

    assert calls == ["PutItem"] + ["BatchWriteItem"] * 10, calls  # the checkpoints' chunk, then the mirror
    leases = {i["leaseKey"]["S"]: i for i in items(store, "LEASE#")}
    assert {k: v["checkpoint"]["S"] for k, v in leases.items()} == {k: v.position.sequence_number for k, v in checkpoints.items()}
    assert {i["batchId"]["N"] for i in leases.values()} == {"1"}

    calls.clear()
    store.commit(plan, checkpoints, "run-a")  # a retried commit: already applied, the mirror again
    assert calls == ["BatchWriteItem"] * 10
    assert {i["leaseKey"]["S"]: i for i in items(store, "LEASE#")} == leases

    plan2 = plan_for(store, 2, shards, checkpoints)
    checkpoints2 = run_batch(store, plan2, "run-a", 500)
    later = {i["leaseKey"]["S"]: i for i in items(store, "LEASE#")}
    assert {k: v["checkpoint"]["S"] for k, v in later.items()} == {k: v.position.sequence_number for k, v in checkpoints2.items()}
    calls.clear()
    with pytest.raises(CheckpointConflictError):  # a retried commit of batch 1, after batch 2
        store.commit(plan, checkpoints, "run-a")
    assert calls == []
    assert {i["leaseKey"]["S"]: i for i in items(store, "LEASE#")} == later


def test_a_live_lease_blocks_take_over_and_an_expired_one_does_not(dynamodb, unique_name):
    from airflow_kinesis_spark.exceptions import BatchLeaseHeldError

    now = [time.time()]  # the stores' clock, moved by the test instead of sleeping
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake", clock=lambda: now[0])
    store.ensure_table()
    plan = make_plan(1, open_shards(2))
    store.begin(plan, "run-a")
    with pytest.raises(BatchLeaseHeldError, match=r"being run by run-a \(last heartbeat .*s ago, lease 60s\): it may be "
                       r"taken over in (59|60)s") as held:
        store.take_over(1, "run-b", lease_seconds=60)
    assert 58 < held.value.seconds_left <= 60  # the error tells when the batch can be taken over
    store.heartbeat(1, "run-a")
    now[0] += 59.0
    with pytest.raises(BatchLeaseHeldError):
        store.take_over(1, "run-b", lease_seconds=60)  # 59 s after the last heartbeat: still alive
    now[0] += 1.5
    store.take_over(1, "run-b", lease_seconds=60)  # run-a stopped renewing: its lease expired
    with pytest.raises(CheckpointConflictError, match="renew the lease on batch 1"):
        store.heartbeat(1, "run-a")  # fenced
    store.heartbeat(1, "run-b")


def test_the_store_calls_the_boto3_client_it_was_given(dynamodb, unique_name):
    # No retry wrapper of its own: botocore retries per the client's config, the store none.
    store = DynamoDBCheckpointStore(dynamodb, unique_name, "orders", "lake")
    assert store.client is dynamodb
    assert not hasattr(store_module, "_RetryingClient")
    assert DynamoDBCheckpointStore(None, unique_name, "orders", "lake").client is None  # request building only


# -- hold_lease (the heartbeat loop) ---------------------------------------------------------------------


def lease_threads(batch_id: int) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"lease-batch-{batch_id}" and t.is_alive()]


def seize(store: DynamoDBCheckpointStore, batch_id: int, owner: str) -> None:
    """Another run takes the batch over as if the holder's lease had expired (``lease_seconds=0``).

    Retried: a renewal landing in the same millisecond makes the heartbeat not yet "stale".
    """
    for _ in range(5):
        try:
            other(store).take_over(batch_id, owner, lease_seconds=0)
            return
        except CheckpointConflictError:
            time.sleep(0.01)
    raise AssertionError(f"{owner} could not take batch {batch_id} over")


@pytest.fixture
def lease_store(dynamodb, unique_name) -> DynamoDBCheckpointStore:
    """A store on a table of its own (lease threads of different tests never share a batch id's head)."""
    s = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_lease", unique_name, "lake")
    s.ensure_table()
    return s


def test_hold_lease_keeps_the_heartbeat_fresh(lease_store):
    store = lease_store
    store.begin(plan_for(store, 1, open_shards(2)), "run-a")
    began = store.head().pending_heartbeat
    lost: list[CheckpointConflictError] = []
    with store.hold_lease(1, "run-a", lease_seconds=0.6, on_lost=lost.append):
        assert len(lease_threads(1)) == 1
        time.sleep(1.5)  # well past the lease: only the renewals keep it
        with pytest.raises(BatchLeaseHeldError, match="being run by run-a"):
            other(store).take_over(1, "run-b", lease_seconds=0.6)
        assert store.head().pending_heartbeat > began
    assert lost == []
    assert lease_threads(1) == []  # stopped and joined
    head = store.head()
    assert (head.pending_batch_id, head.pending_owner) == (1, "run-a")
    assert head.pending_heartbeat > 0  # a normal exit keeps the lease (the commit follows)


def test_hold_lease_taken_over_calls_on_lost_and_raises_on_exit(lease_store):
    store = lease_store
    store.begin(plan_for(store, 1, open_shards(2)), "run-a")
    lost: list[CheckpointConflictError] = []
    called = threading.Event()

    def on_lost(err: CheckpointConflictError) -> None:  # where the caller kills its Spark job
        lost.append(err)
        called.set()

    with pytest.raises(CheckpointConflictError) as info:
        with store.hold_lease(1, "run-a", lease_seconds=0.6, on_lost=on_lost):
            seize(store, 1, "run-b")
            assert called.wait(timeout=5), "on_lost was not called after the take-over"
            heartbeat = store.head().pending_heartbeat
            time.sleep(0.5)  # renewing stopped: nothing touches run-b's lease any more
            assert store.head().pending_heartbeat == heartbeat
    assert len(lost) == 1 and info.value is lost[0]
    assert info.value.other_owner == "run-b"
    assert "renew the lease on batch 1" in str(info.value)
    assert lease_threads(1) == []
    assert store.head().pending_owner == "run-b"


def test_hold_lease_lost_and_body_failed_raises_the_conflict_and_releases_nothing(lease_store):
    store = lease_store
    store.begin(plan_for(store, 1, open_shards(1)), "run-a")
    called = threading.Event()
    with pytest.raises(CheckpointConflictError) as info:
        with store.hold_lease(1, "run-a", lease_seconds=0.3, on_lost=lambda err: called.set()):
            seize(store, 1, "run-b")
            assert called.wait(timeout=5)
            raise RuntimeError("spark-submit exited with 137")  # killed by on_lost
    assert info.value.__suppress_context__  # raised "from None": the job's failure is a consequence
    head = store.head()
    assert head.pending_owner == "run-b"
    assert head.pending_heartbeat > 0  # run-b's lease was not released by run-a
    with pytest.raises(BatchLeaseHeldError):
        other(store).take_over(1, "run-c", lease_seconds=60)


def test_hold_lease_body_failure_releases_the_lease(lease_store):
    store = lease_store
    store.begin(plan_for(store, 1, open_shards(2)), "run-a")
    lost: list[CheckpointConflictError] = []
    with pytest.raises(RuntimeError, match="job failed"):
        with store.hold_lease(1, "run-a", lease_seconds=60, on_lost=lost.append):
            raise RuntimeError("job failed")
    assert lost == []
    assert lease_threads(1) == []
    assert store.head().pending_heartbeat == 0
    # the retry takes over at once, although the lease (60 s) would not have expired yet
    head = other(store).take_over(1, "run-b", lease_seconds=60)
    assert head.pending_owner == "run-b"


def test_hold_lease_retries_a_failed_heartbeat(lease_store, caplog):
    class FlakyClient:
        """Fails the first heartbeat update on the way there (nothing applied)."""

        def __init__(self, client: Any) -> None:
            self._client = client
            self.failed = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self._client, name)

        def update_item(self, **kwargs: Any) -> Any:
            if kwargs["UpdateExpression"] == "SET pending_heartbeat = :hb" and not self.failed:
                self.failed += 1
                raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
            return self._client.update_item(**kwargs)

    client = FlakyClient(lease_store.client)
    store = other(lease_store, client=client)
    store.begin(plan_for(store, 1, open_shards(1)), "run-a")
    lost: list[CheckpointConflictError] = []
    with caplog.at_level("WARNING", logger=store_module.__name__):
        with store.hold_lease(1, "run-a", lease_seconds=0.6, on_lost=lost.append):
            time.sleep(1.5)
            with pytest.raises(BatchLeaseHeldError):  # the later renewals kept it
                other(lease_store).take_over(1, "run-b", lease_seconds=0.6)
    assert client.failed == 1
    assert lost == []
    assert any("could not renew the lease on batch 1" in r.getMessage() for r in caplog.records)


def test_hold_lease_without_on_lost_still_raises(lease_store):
    store = lease_store
    store.begin(plan_for(store, 1, open_shards(1)), "run-a")
    with pytest.raises(CheckpointConflictError):
        with store.hold_lease(1, "run-a", lease_seconds=0.3):
            seize(store, 1, "run-b")
            time.sleep(0.6)  # at least one renewal after the take-over


@pytest.mark.parametrize("lease_seconds", [0, -1.0])
def test_hold_lease_rejects_a_lease_that_is_not_positive(lease_store, lease_seconds):
    with pytest.raises(ValueError, match="lease_seconds must be > 0"):
        with lease_store.hold_lease(1, "run-a", lease_seconds=lease_seconds):
            pass
    assert lease_threads(1) == []


# -- hold_hand_off (the planning run's lease until the job's driver claims the batch) ----------------


def test_hold_hand_off_keeps_the_lease_until_the_driver_claims_then_leaves_it_to_the_driver(lease_store):
    store = lease_store
    store.begin(plan_for(store, 1, open_shards(2)), "run-a")
    with store.hold_hand_off(1, "run-a", lease_seconds=0.6):
        assert [t for t in threading.enumerate() if t.name == "hand-off-batch-1" and t.is_alive()]
        time.sleep(1.5)  # the driver is starting, well past the lease: only the renewals keep it
        with pytest.raises(BatchLeaseHeldError, match="being run by run-a"):
            other(store).take_over(1, "run-b", lease_seconds=0.6)
        head = other(store).claim(1, "run-a", "run-a/driver-1", lease_seconds=0.6)  # the driver claims at any time
        assert head.pending_owner == "run-a/driver-1"
        claimed = head.pending_heartbeat
        time.sleep(1.0)  # renewing stopped at the claim: the driver's lease is its own
        assert store.head().pending_heartbeat == claimed
        assert store.head().pending_owner == "run-a/driver-1"
    assert not [t for t in threading.enumerate() if t.name == "hand-off-batch-1" and t.is_alive()]
    time.sleep(0.7)  # the driver died without renewing: a retry may take the batch over
    assert other(store).take_over(1, "run-b", lease_seconds=0.6).pending_owner == "run-b"
