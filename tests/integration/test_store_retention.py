"""Batch-log retention of DynamoDBCheckpointStore against moto: TTL on ``expires_at``, old batches marked."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from tests.conftest import make_client
from tests.helpers import checkpoints_after, make_plan, open_shards, reports_for

import airflow_kinesis_spark.core.store as store_module
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import Checkpoint
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

pytestmark = pytest.mark.integration


def new_store(
    client: Any, table: str, stream: str, *, keep_batches: int = 100, consumer: str = "lake"
) -> DynamoDBCheckpointStore:
    store = DynamoDBCheckpointStore(client, table, stream, consumer, keep_batches=keep_batches)
    store.ensure_table()
    return store


@pytest.fixture(scope="module")
def dynamodb_module(moto_endpoint):
    """A DynamoDB client for the module's shared table."""
    return make_client("dynamodb", moto_endpoint)


@pytest.fixture(scope="module")
def table(dynamodb_module) -> str:
    """A table shared by the module's tests (created once); each test uses its own stream name."""
    name = f"retention-{uuid.uuid4().hex[:8]}"
    new_store(dynamodb_module, name, "bootstrap")
    return name


def all_items(store: DynamoDBCheckpointStore) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in store.client.get_paginator("query").paginate(
        TableName=store.table_name,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": store.pk}},
        ConsistentRead=True,
    ):
        out.extend(page["Items"])
    return out


def batch_of(item: dict[str, Any]) -> int | None:
    sk = item["sk"]["S"]
    return int(sk.split("#")[1]) if sk.startswith("BATCH#") else None


def expiry_by_batch(store: DynamoDBCheckpointStore) -> dict[int, set[str | None]]:
    """Batch id -> the ``expires_at`` values of its chunk items (``None``: not marked)."""
    out: dict[int, set[str | None]] = {}
    for item in all_items(store):
        batch_id = batch_of(item)
        if batch_id is not None:
            out.setdefault(batch_id, set()).add(item.get("expires_at", {}).get("N"))
    return out


def run_batches(store: DynamoDBCheckpointStore, first: int, last: int, owner: str = "run-a", shards: int = 2,
                checkpoints: dict[str, Checkpoint] | None = None) -> tuple[BatchPlan, dict[str, Checkpoint]]:
    """begin → record_report → commit of batches ``first..last``; the last plan and checkpoints."""
    plan = None
    for batch_id in range(first, last + 1):
        plan = make_plan(batch_id, open_shards(shards), checkpoints, stream_name=store.stream_name,
                         consumer_name=store.consumer_name)  # fmt: skip
        store.begin(plan, owner)
        checkpoints = checkpoints_after(plan, 10 * batch_id)
        store.record_report(batch_id, owner, reports_for(plan, checkpoints))
        store.commit(plan, checkpoints, owner)
    assert plan is not None and checkpoints is not None
    return plan, checkpoints


# -- keep_batches ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [0, -1])
def test_keep_batches_below_one_is_rejected(dynamodb, keep):
    with pytest.raises(ValueError, match=r"keep_batches must be >= 1"):
        DynamoDBCheckpointStore(dynamodb, "checkpoints", "orders", "lake", keep_batches=keep)


@pytest.mark.parametrize("keep", [2.5, "10", True])
def test_keep_batches_must_be_an_int(dynamodb, keep):
    with pytest.raises(TypeError, match="keep_batches must be an int"):
        DynamoDBCheckpointStore(dynamodb, "checkpoints", "orders", "lake", keep_batches=keep)


def test_keep_batches_defaults_to_100(dynamodb):
    assert DynamoDBCheckpointStore(dynamodb, "checkpoints", "orders", "lake").keep_batches == 100


# -- TTL on the table -------------------------------------------------------------------------------------


def ttl_of(client: Any, table: str) -> dict[str, Any]:
    return client.describe_time_to_live(TableName=table)["TimeToLiveDescription"]


def test_a_new_table_has_ttl_on_expires_at(dynamodb, unique_name):
    new_store(dynamodb, unique_name, "orders")
    ttl = ttl_of(dynamodb, unique_name)
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "expires_at")


def test_an_existing_table_without_ttl_gets_it(dynamodb, unique_name):
    # a table created by a version without retention
    dynamodb.create_table(
        TableName=unique_name,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )
    assert ttl_of(dynamodb, unique_name)["TimeToLiveStatus"] == "DISABLED"
    new_store(dynamodb, unique_name, "orders")
    ttl = ttl_of(dynamodb, unique_name)
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "expires_at")


class CountingClient:
    """The real client, counting (and optionally failing) chosen operations."""

    def __init__(self, client: Any, fail: dict[str, Exception] | None = None) -> None:
        self._client = client
        self.fail = dict(fail or {})
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not callable(method) or name in ("get_paginator", "can_paginate", "get_waiter"):
            return method  # a waiter's calls go through the real client: not counted

        def call(**kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in self.fail:
                raise self.fail[name]
            return method(**kwargs)

        return call


def test_ensure_table_describes_ttl_first_and_enables_it_once(dynamodb, unique_name):
    client = CountingClient(dynamodb)
    new_store(client, unique_name, "orders")
    new_store(client, unique_name, "orders")
    assert client.calls["describe_time_to_live"] == 2
    assert client.calls["update_time_to_live"] == 1  # the second call found it enabled


def test_ttl_already_enabled_error_is_tolerated(dynamodb, unique_name, caplog):
    # DescribeTimeToLive said DISABLED, but another process enabled it meanwhile
    already = ClientError(
        {"Error": {"Code": "ValidationException", "Message": "TimeToLive is already enabled"}}, "UpdateTimeToLive"
    )
    client = CountingClient(dynamodb, fail={"update_time_to_live": already})
    with caplog.at_level("WARNING", logger=store_module.__name__):
        store = new_store(client, unique_name, "orders")
    assert client.calls["update_time_to_live"] == 1
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert store.head().committed_batch_id == 0  # the head was created after it


def test_ttl_not_permitted_is_a_warning_not_a_failure(dynamodb, unique_name, caplog):
    # a role with the pre-retention least IAM policy (no dynamodb:*TimeToLive)
    denied = ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not authorized"}}, "DescribeTimeToLive")
    client = CountingClient(dynamodb, fail={"describe_time_to_live": denied})
    with caplog.at_level("WARNING", logger=store_module.__name__):
        store = new_store(client, unique_name, "orders")
    assert "update_time_to_live" not in client.calls
    assert any("could not enable TTL" in r.getMessage() for r in caplog.records)
    run_batches(store, 1, 1)
    assert store.head().committed_batch_id == 1


# -- marking old batches ----------------------------------------------------------------------------------


def test_after_five_commits_with_keep_two_batches_1_to_3_expire(dynamodb_module, table, unique_name):
    store = new_store(dynamodb_module, table, unique_name, keep_batches=2)
    before = int(time.time())
    plan, checkpoints = run_batches(store, 1, 5, shards=3)
    after = int(time.time())

    expiry = expiry_by_batch(store)
    assert sorted(expiry) == [1, 2, 3, 4, 5]
    for batch_id in (1, 2, 3):
        assert None not in expiry[batch_id], f"batch {batch_id} has unmarked chunk items"
        assert all(before <= int(v) <= after for v in expiry[batch_id])  # epoch seconds, "now"
    for batch_id in (4, 5):
        assert expiry[batch_id] == {None}, f"batch {batch_id} was marked"
    kinds = {item["sk"]["S"].split("#")[2] for item in all_items(store) if batch_of(item) in (1, 2, 3)}
    assert kinds == {"PLAN", "REPORT", "CKPT"}  # every kind of chunk item

    others = [item for item in all_items(store) if batch_of(item) is None]
    assert {item["sk"]["S"].split("#")[0] for item in others} == {"HEAD", "LEASE"}
    assert all("expires_at" not in item for item in others)

    ttl = ttl_of(dynamodb_module, table)
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "expires_at")

    reader = DynamoDBCheckpointStore(dynamodb_module, table, unique_name, "lake")
    assert reader.committed_checkpoints() == checkpoints
    assert reader.committed_plan() == plan
    assert reader.head().committed_batch_id == 5


def test_keep_one_never_marks_the_committed_or_the_pending_batch(dynamodb_module, table, unique_name):
    store = new_store(dynamodb_module, table, unique_name, keep_batches=1)
    plan, checkpoints = run_batches(store, 1, 3)
    store.begin(make_plan(4, open_shards(2), checkpoints, stream_name=unique_name), "run-a")
    pending = make_plan(4, open_shards(2), checkpoints, stream_name=unique_name)
    store.record_report(4, "run-a", reports_for(pending, checkpoints_after(pending, 99)))

    expiry = expiry_by_batch(store)
    head = store.head()
    assert (head.committed_batch_id, head.pending_batch_id) == (3, 4)
    assert None not in expiry[1] and None not in expiry[2]
    assert expiry[3] == {None}  # the committed batch
    assert expiry[4] == {None}  # the pending batch
    marked = {b for b, values in expiry.items() if values != {None}}
    assert max(marked) <= head.committed_batch_id - store.keep_batches
    assert store.committed_checkpoints() == checkpoints
    assert store.committed_plan() == plan
    assert store.pending_plan() == pending
    assert store.pending_report() == reports_for(pending, checkpoints_after(pending, 99))


def test_marked_items_keep_their_first_expiry(dynamodb_module, table, unique_name):
    store = new_store(dynamodb_module, table, unique_name, keep_batches=1)
    _, checkpoints = run_batches(store, 1, 2)
    first = expiry_by_batch(store)[1]
    assert None not in first
    time.sleep(1.1)
    run_batches(store, 3, 4, checkpoints=checkpoints)
    assert expiry_by_batch(store)[1] == first  # not pushed back by later commits


class NoMarkingClient:
    """The real client, but every ``expires_at`` update fails (a connection lost on the way)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def update_item(self, **kwargs: Any) -> Any:
        if "expires" in kwargs["UpdateExpression"]:
            self.refused += 1
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
        return self._client.update_item(**kwargs)


def test_a_failed_marking_never_fails_the_commit_and_the_retried_commit_marks(dynamodb_module, table, unique_name, caplog):
    store = new_store(dynamodb_module, table, unique_name, keep_batches=1)
    _, checkpoints = run_batches(store, 1, 1)
    client = NoMarkingClient(dynamodb_module)
    flaky = DynamoDBCheckpointStore(client, table, unique_name, "lake", keep_batches=1)
    plan2 = make_plan(2, open_shards(2), checkpoints, stream_name=unique_name)
    flaky.begin(plan2, "run-a")
    checkpoints2 = checkpoints_after(plan2, 50)
    with caplog.at_level("WARNING", logger=store_module.__name__):
        flaky.commit(plan2, checkpoints2, "run-a")  # does not raise
    assert client.refused == 1  # gave up at the first error: the next commit retries
    assert any("could not mark the batch log of batches <= 1" in r.getMessage() for r in caplog.records)
    assert store.head().committed_batch_id == 2
    assert expiry_by_batch(store)[1] == {None}

    # the idempotent path of a retried commit marks them
    store.commit(plan2, checkpoints2, "run-a")
    assert None not in expiry_by_batch(store)[1]
    assert expiry_by_batch(store)[2] == {None}
    assert store.committed_checkpoints() == checkpoints2


def test_many_chunks_and_other_consumers(dynamodb_module, table, unique_name, monkeypatch):
    monkeypatch.setattr(store_module, "CHUNK_CHARS", 500)
    lake = new_store(dynamodb_module, table, unique_name, keep_batches=1)
    audit = new_store(dynamodb_module, table, unique_name, keep_batches=1, consumer="audit")
    _, audit_checkpoints = run_batches(audit, 1, 1, shards=20)
    run_batches(lake, 1, 3, shards=20)

    items = [i for i in all_items(lake) if batch_of(i) in (1, 2)]
    assert len(items) > 20
    assert all("expires_at" in i for i in items)
    assert expiry_by_batch(audit) == {1: {None}}  # another consumer's log on the same table is its own
    assert audit.committed_checkpoints() == audit_checkpoints


def test_rewind_commits_count_as_batches(dynamodb_module, table, unique_name):
    store = new_store(dynamodb_module, table, unique_name, keep_batches=2)
    _, checkpoints = run_batches(store, 1, 2)
    batch_id = store.rewind({}, "cli")
    assert batch_id == 3
    expiry = expiry_by_batch(store)
    assert None not in expiry[1]
    assert expiry[2] == {None} and expiry[3] == {None}
    assert store.committed_checkpoints() == {}
