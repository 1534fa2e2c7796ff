"""Nothing planted in the checkpoint table can redirect, destroy or skip data (issue #28, item 6).

The checkpoint table is state anyone with write access can change. Every item the store parses
(the head, the chunks of a plan, a report or the checkpoints, a window's items) that is not what
the provider writes fails with one ``CheckpointStoreCorruptError`` naming the table, the item
(``pk``, ``sk``), the field and the fix, never with a bare ``KeyError``/``ValueError`` or by being
read as something else; and nothing moves: no checkpoint, no pending batch. Against moto over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream
from tests.helpers import checkpoints_after, make_plan, open_shards, reports_for

import airflow_kinesis_spark.core.store as store_module
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.protocol import IncrementalSettings, prepare_incremental
from airflow_kinesis_spark.core.chunks import join_chunks
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.exceptions import CheckpointStoreCorruptError

pytestmark = pytest.mark.integration

RESTORE = "point-in-time recovery"
DISCARD = "kinesis-spark discard-pending"


@pytest.fixture
def store(dynamodb, unique_name) -> DynamoDBCheckpointStore:
    """A store on the table ``{stream}_ckpt`` (the operators' tests find it by that name)."""
    s = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "lake")
    s.ensure_table()
    return s


def plan_for(store: DynamoDBCheckpointStore, batch_id: int, checkpoints: dict | None = None) -> BatchPlan:
    return make_plan(batch_id, open_shards(2), checkpoints, stream_name=store.stream_name, consumer_name="lake")


def committed(store: DynamoDBCheckpointStore) -> BatchPlan:
    """Batch 1 committed by ``run-a`` (plan, report and checkpoints in the batch log)."""
    plan = plan_for(store, 1)
    store.begin(plan, "run-a")
    checkpoints = checkpoints_after(plan, 10)
    store.record_report(1, "run-a", reports_for(plan, checkpoints))
    store.commit(plan, checkpoints, "run-a")
    return plan


def pending(store: DynamoDBCheckpointStore, *, report: bool = True) -> BatchPlan:
    """Batch 1 committed, batch 2 begun by ``run-b`` and, with ``report``, its report recorded."""
    committed(store)
    plan = plan_for(store, 2, store.committed_checkpoints())
    store.begin(plan, "run-b")
    if report:
        store.record_report(2, "run-b", reports_for(plan, checkpoints_after(plan, 20)))
    return plan


def chunk_sk(batch_id: int, kind: str, owner: str, number: int = 0) -> str:
    return f"BATCH#{batch_id:020d}#{kind}#{owner}#{number:05d}"


def items(store: DynamoDBCheckpointStore) -> list[dict[str, Any]]:
    """Every item of the store's (stream, consumer), as DynamoDB holds them."""
    out: list[dict[str, Any]] = []
    for page in store.client.get_paginator("query").paginate(
        TableName=store.table_name, KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": store.pk}}, ConsistentRead=True,
    ):  # fmt: skip
        out.extend(page["Items"])
    return sorted(out, key=lambda i: i["sk"]["S"])


@contextmanager
def nothing_moves(store: DynamoDBCheckpointStore) -> Iterator[None]:
    """Every item of the consumer (head, batch log, lease mirror) is the same afterwards."""
    before = items(store)
    yield
    assert items(store) == before, "an item of the checkpoint table changed"


def set_attribute(store: DynamoDBCheckpointStore, sk: str, name: str, value: dict[str, Any] | None) -> None:
    """Plant ``value`` (a DynamoDB attribute value; ``None``: remove the attribute) in item ``sk``."""
    if value is None:
        store.client.update_item(TableName=store.table_name, Key=store._key(sk), UpdateExpression="REMOVE #a",
                                 ExpressionAttributeNames={"#a": name})  # fmt: skip
    else:
        store.client.update_item(TableName=store.table_name, Key=store._key(sk), UpdateExpression="SET #a = :v",
                                 ExpressionAttributeNames={"#a": name}, ExpressionAttributeValues={":v": value})  # fmt: skip


def payload(store: DynamoDBCheckpointStore, sk: str) -> Any:
    item = store.client.get_item(TableName=store.table_name, Key=store._key(sk), ConsistentRead=True)["Item"]
    return json.loads(item["body"]["S"])


def plant(store: DynamoDBCheckpointStore, sk: str, change: Callable[[Any], Any] | Any) -> None:
    """Rewrite the JSON of a one-chunk payload: ``change`` edits it in place, or (not a function)
    is the new payload."""
    if callable(change):
        data = payload(store, sk)
        change(data)
    else:
        data = change
    set_attribute(store, sk, "body", {"S": json.dumps(data)})


def assert_names(err: CheckpointStoreCorruptError, store: DynamoDBCheckpointStore, sk: str, field: str, fix: str) -> None:
    message = str(err)
    assert f"Checkpoint table {store.table_name!r}" in message
    assert f"pk {store.pk!r}, sk {sk!r}" in message
    assert f"field {field!r}" in message
    assert fix in message and "docs/security.md" in message
    assert (err.table_name, err.pk, err.sk, err.field) == (store.table_name, store.pk, sk, field)


# -- the head ---------------------------------------------------------------------------------------


def test_a_head_without_its_committed_batch_id_is_corrupt_not_batch_0(store):
    """Read as "nothing committed", the next run would plan every shard from its initial position."""
    committed(store)
    set_attribute(store, "HEAD", "committed_batch_id", None)
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.head()
    assert_names(info.value, store, "HEAD", "committed_batch_id", RESTORE)
    assert "missing" in str(info.value)


def test_a_batch_id_of_type_string_is_corrupt(store):
    committed(store)
    set_attribute(store, "HEAD", "committed_batch_id", {"S": "1"})
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.head()
    assert_names(info.value, store, "HEAD", "committed_batch_id", RESTORE)
    assert "expected a DynamoDB number (N), found a DynamoDB string (S) '1'" in str(info.value)


def test_a_writer_of_type_number_is_corrupt(store):
    committed(store)
    set_attribute(store, "HEAD", "committed_owner", {"N": "5"})
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.head()
    assert_names(info.value, store, "HEAD", "committed_owner", RESTORE)
    assert "expected a DynamoDB string (S), found a DynamoDB number (N) '5'" in str(info.value)


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("committed_batch_id", "-3", "-3 is below 0"),
        ("pending_batch_id", "-1", "-1 is below 1"),
        ("pending_batch_id", "0", "0 is below 1"),
        ("pending_heartbeat", "-5", "-5 is below 0"),
        ("pending_batch_id", "2.5", "'2.5' is not a whole number"),
        ("committed_batch_id", "1E+60", "is not a whole number of at most 38 digits"),
    ],
)
def test_a_negative_or_fractional_batch_id_is_corrupt(store, name, value, problem):
    """A negative committed batch id was read as is: the next batch would be begun as batch -2."""
    committed(store)
    set_attribute(store, "HEAD", name, {"N": value})
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.head()
    assert_names(info.value, store, "HEAD", name, RESTORE)
    assert problem in str(info.value)


def test_a_corrupt_head_stops_a_run_before_it_plans_anything(store, kinesis, unique_name):
    create_stream(kinesis, unique_name, 2)
    committed(store)
    set_attribute(store, "HEAD", "committed_batch_id", {"N": "-3"})
    settings = IncrementalSettings(stream_name=unique_name, consumer_name="lake", output_root="mem://out",
                                   cutoff=datetime.now(timezone.utc), min_call_interval=0.0)  # fmt: skip
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        prepare_incremental(kinesis, store, settings, "run-c")
    assert_names(info.value, store, "HEAD", "committed_batch_id", RESTORE)


# -- chunks ---------------------------------------------------------------------------------------


def test_a_chunk_that_is_not_json_is_corrupt(store):
    pending(store)
    sk = chunk_sk(2, "PLAN", "run-b")
    set_attribute(store, sk, "body", {"S": '{"batch_id": 2, "ranges": [oops'})
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.pending_plan()
    assert_names(info.value, store, sk, "body", DISCARD)
    assert "not JSON" in str(info.value) and "plan of pending batch 2" in str(info.value)


def test_the_chunk_that_breaks_the_json_is_the_one_named(store, monkeypatch):
    monkeypatch.setattr(store_module, "CHUNK_CHARS", 300)
    pending(store)
    sks = [i["sk"]["S"] for i in items(store) if i["sk"]["S"].startswith(chunk_sk(2, "PLAN", "run-b")[:-5])]
    assert len(sks) >= 3
    set_attribute(store, sks[2], "body", {"S": "\x00" * 300})
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.pending_plan()
    assert_names(info.value, store, sks[2], "body", DISCARD)


@pytest.mark.parametrize("how", ["deleted", "count"])
def test_a_chunk_count_that_does_not_match_is_corrupt(store, monkeypatch, how):
    monkeypatch.setattr(store_module, "CHUNK_CHARS", 100)
    committed(store)
    prefix = chunk_sk(1, "CKPT", "run-a")[:-5]
    sks = [i["sk"]["S"] for i in items(store) if i["sk"]["S"].startswith(prefix)]
    assert len(sks) >= 2
    if how == "deleted":  # a chunk deleted: the payload would be read without it
        store.client.delete_item(TableName=store.table_name, Key=store._key(sks[1]))
        named, problem = sks[0], f"says {len(sks)} chunks, but {len(sks) - 1} were found (chunk 00001 is missing)"
    else:  # a chunk that disagrees on the count
        set_attribute(store, sks[1], "chunks", {"N": str(len(sks) + 1)})
        named, problem = sks[1], f"says {len(sks) + 1} chunks, but the item with sk {sks[0]!r} says {len(sks)}"
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.committed_checkpoints()
    assert_names(info.value, store, named, "chunks", RESTORE)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("chunks", {"N": "3"}, "says 3 chunks, but 1 were found (chunk 00001 is missing)"),
        ("chunks", {"S": "1"}, "expected a DynamoDB number (N), found a DynamoDB string (S) '1'"),
        ("chunks", None, "missing"),
        ("body", {"N": "1"}, "expected a DynamoDB string (S), found a DynamoDB number (N) '1'"),
        ("body", None, "missing"),
    ],
)
def test_a_chunk_item_with_a_missing_or_mistyped_attribute_is_corrupt(store, name, value, problem):
    pending(store)
    sk = chunk_sk(2, "REPORT", "run-b")
    set_attribute(store, sk, name, value)
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.pending_report()
    assert_names(info.value, store, sk, name, DISCARD)
    assert problem in str(info.value)


def test_missing_committed_checkpoints_are_corrupt(store):
    committed(store)
    store.client.delete_item(TableName=store.table_name, Key=store._key(chunk_sk(1, "CKPT", "run-a")))
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.committed_checkpoints()
    assert_names(info.value, store, "HEAD", "committed_owner", RESTORE)
    assert "the checkpoints of committed batch 1 are missing" in str(info.value)


def test_a_missing_committed_plan_is_corrupt_when_its_commit_is_repeated(store):
    """A commit task re-run after its batch was committed reads the committed plan for its
    summary; without it, it failed with an AttributeError on ``None``."""
    from airflow_kinesis_spark.core.protocol import commit_handed

    committed(store)
    store.client.delete_item(TableName=store.table_name, Key=store._key(chunk_sk(1, "PLAN", store.head().committed_plan_owner)))
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        commit_handed(store, 1, "run-a", 60.0)
    assert_names(info.value, store, "HEAD", "committed_plan_owner", RESTORE)
    assert "the plan of committed batch 1 is missing" in str(info.value)


def test_join_chunks_names_the_item(store):
    pending(store)
    sk = chunk_sk(2, "PLAN", "run-b")
    set_attribute(store, sk, "chunks", {"S": "x"})
    found = store.client.query(**store.chunks_request(2, "PLAN", "run-b"))["Items"]
    with pytest.raises(CheckpointStoreCorruptError) as info:
        join_chunks(found, "PLAN of batch 2", table_name=store.table_name)
    assert_names(info.value, store, sk, "chunks", RESTORE)


# -- plans ----------------------------------------------------------------------------------------


def test_a_non_numeric_batch_id_in_a_plan_is_corrupt(store):
    pending(store)
    sk = chunk_sk(2, "PLAN", "run-b")
    plant(store, sk, lambda plan: plan.update(batch_id="seven"))
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.pending_plan()
    assert_names(info.value, store, sk, "batch_id", DISCARD)
    assert "expected a whole number >= 0, found a string 'seven'" in str(info.value)


@pytest.mark.parametrize("planted", [-2, 3])
def test_a_plan_of_another_batch_id_than_its_item_is_corrupt(store, planted):
    """Read as is, the job would write batch ``planted``'s output location and report."""
    pending(store)
    sk = chunk_sk(2, "PLAN", "run-b")
    plant(store, sk, lambda plan: plan.update(batch_id=planted))
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.pending_plan()
    assert_names(info.value, store, sk, "batch_id", DISCARD)


@pytest.mark.parametrize(("ranges", "found"), [({}, "an object {}"), ("abc", "a string 'abc'"), (None, "null")])
def test_a_plan_whose_ranges_are_not_a_list_is_corrupt(store, ranges, found):
    """``{}`` was read as a plan of no ranges: a batch that reads nothing and moves on."""
    pending(store)
    sk = chunk_sk(2, "PLAN", "run-b")
    plant(store, sk, lambda plan: plan.update(ranges=ranges))
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.pending_plan()
    assert_names(info.value, store, sk, "ranges", DISCARD)
    assert f"expected a JSON array, found {found}" in str(info.value)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda plan: plan["ranges"][1].pop("start"), "ranges[1].start"),
        (lambda plan: plan["ranges"][1]["start_checkpoint"].update(type="NOPE"), "ranges[1].start_checkpoint.type"),
        (lambda plan: plan["ranges"][0].update(cutoff="yesterday"), "ranges[0].cutoff"),
        (lambda plan: plan.update(cutoff=17), "cutoff"),
        (lambda plan: plan.pop("output_location"), "output_location"),
        (lambda plan: plan.update(open_shards="shardId-000000000000"), "open_shards"),
        (lambda plan: plan.update(checkpoints=[]), "checkpoints"),
        (["not", "a", "plan"], "body"),
    ],
)
def test_the_field_of_a_corrupt_plan_is_named(store, change, field):
    pending(store)
    sk = chunk_sk(2, "PLAN", "run-b")
    plant(store, sk, change)
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.pending_plan()
    assert_names(info.value, store, sk, field, DISCARD)


def test_a_corrupt_committed_plan_is_corrupt(store):
    committed(store)
    sk = chunk_sk(1, "PLAN", "run-a")
    plant(store, sk, lambda plan: plan.update(ranges={}))
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.committed_plan()
    assert_names(info.value, store, sk, "ranges", RESTORE)


# -- checkpoints and reports -----------------------------------------------------------------------


@pytest.mark.parametrize("sentinel", ["BOGUS", "LATEST", 7])
def test_a_checkpoint_with_an_unknown_sentinel_is_corrupt(store, sentinel):
    committed(store)
    sk = chunk_sk(1, "CKPT", "run-a")
    plant(store, sk, lambda checkpoints: checkpoints["shardId-000000000001"].update(type=sentinel))
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.committed_checkpoints()
    assert_names(info.value, store, sk, "checkpoints['shardId-000000000001'].type", RESTORE)
    assert f"unknown checkpoint type {sentinel!r}" in str(info.value)


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [("resume_iterator", 7, "expected a string or null, found a number 7"),
     ("resume_iterator", {"ShardIterator": "x"}, "expected a string or null"),
     ("resume_iterator_at", "soon", "expected a number or null, found a string 'soon'"),
     ("resume_iterator_at", True, "expected a number or null")],
)  # fmt: skip
def test_a_checkpoints_stored_shard_iterator_of_another_type_is_corrupt(store, name, value, problem):
    committed(store)
    sk = chunk_sk(1, "CKPT", "run-a")
    plant(store, sk, lambda checkpoints: checkpoints["shardId-000000000000"].update({name: value}))
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.committed_checkpoints()
    assert_names(info.value, store, sk, f"checkpoints['shardId-000000000000'].{name}", RESTORE)
    assert problem in str(info.value)


@pytest.mark.parametrize("number", ["12ab", "-5", "1e5", 12, ""])
def test_a_sequence_number_that_is_not_a_decimal_string_is_corrupt(store, number):
    committed(store)
    sk = chunk_sk(1, "CKPT", "run-a")
    plant(store, sk, lambda checkpoints: checkpoints["shardId-000000000000"].update(sequence_number=number))
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.committed_checkpoints()
    assert_names(info.value, store, sk, "checkpoints['shardId-000000000000'].sequence_number", RESTORE)


def test_a_checkpoints_payload_that_is_not_an_object_is_corrupt(store):
    committed(store)
    sk = chunk_sk(1, "CKPT", "run-a")
    plant(store, sk, ["shardId-000000000000"])
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.committed_checkpoints()
    assert_names(info.value, store, sk, "checkpoints", RESTORE)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda reports: reports[0]["last"].update(sequence_number="0x1f"), "reports[0].last.sequence_number"),
        (lambda reports: reports[1].update(records="many"), "reports[1].records"),
        (lambda reports: reports[1].update(records=-4), "reports[1].records"),
        (lambda reports: reports[0].pop("shard_id"), "reports[0].shard_id"),
        (lambda reports: reports[0].update(shard_end="yes"), "reports[0].shard_end"),
        (lambda reports: reports[0].update(planted=1), "reports[0].planted"),
        (lambda reports: reports[0].update(last_arrival="soon"), "reports[0].last_arrival"),
        ({"reports": []}, "body"),
    ],
)
def test_the_field_of_a_corrupt_report_is_named(store, change, field):
    pending(store)
    sk = chunk_sk(2, "REPORT", "run-b")
    plant(store, sk, change)
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.pending_report()
    assert_names(info.value, store, sk, field, DISCARD)


def test_a_corrupt_committed_report_is_corrupt(store):
    committed(store)
    sk = chunk_sk(1, "REPORT", "run-a")
    plant(store, sk, lambda reports: reports[0].update(first={"sequence_number": "x"}))
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.committed_report()
    assert_names(info.value, store, sk, "reports[0].first.sequence_number", RESTORE)


# -- windows --------------------------------------------------------------------------------------


def window_sk(kind: str) -> str:
    return f"WINDOW#w1#{kind}#run-w#00000"


def test_corrupt_window_items_are_corrupt(store):
    plan = plan_for(store, 0)
    store.write_window("w1", "PLAN", "run-w", plan.to_dict())
    store.write_window("w1", "REPORT", "run-w", [r.to_dict() for r in reports_for(plan, checkpoints_after(plan, 3))])
    assert store.window_plan("w1", "run-w") == plan
    assert len(store.window_report("w1", "run-w") or []) == 2
    plant(store, window_sk("PLAN"), lambda data: data.update(ranges={"0": {}}))
    plant(store, window_sk("REPORT"), lambda data: data[1].update(stop_reason=None))
    with nothing_moves(store):
        with pytest.raises(CheckpointStoreCorruptError) as info:
            store.window_plan("w1", "run-w")
        assert_names(info.value, store, window_sk("PLAN"), "ranges", "run the window task again")
        with pytest.raises(CheckpointStoreCorruptError) as info:
            store.window_report("w1", "run-w")
        assert_names(info.value, store, window_sk("REPORT"), "reports[1].stop_reason", "run the window task again")
    set_attribute(store, window_sk("PLAN"), "body", {"S": "{"})
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        store.read_window("w1", "PLAN", "run-w")
    assert_names(info.value, store, window_sk("PLAN"), "body", "run the window task again")


# -- what runs do with it --------------------------------------------------------------------------


def test_a_corrupt_pending_plan_stops_a_run_and_discard_pending_clears_it(store, kinesis, unique_name):
    """The fix the message gives works: discard-pending does not need the plan it cannot read."""
    from airflow_kinesis_spark.core.admin import discard_pending

    create_stream(kinesis, unique_name, 2)
    pending(store, report=False)
    store.release(2, "run-b")
    plant(store, chunk_sk(2, "PLAN", "run-b"), lambda plan: plan.update(ranges={}))
    settings = IncrementalSettings(stream_name=unique_name, consumer_name="lake", output_root="mem://out",
                                   cutoff=datetime.now(timezone.utc), min_call_interval=0.0)  # fmt: skip
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError, match=DISCARD):
        prepare_incremental(kinesis, store, settings, "run-c")
    result = discard_pending(store, owner="admin", output_path="/nowhere")
    assert result["discarded_batch_id"] == 2 and result["deleted_path"] is None
    assert "could not be read" in result["discarded_output"]
    head = store.head()
    assert head.pending_batch_id is None and head.committed_batch_id == 1


def test_corrupt_committed_checkpoints_stop_a_run_before_it_plans(store, kinesis, unique_name):
    create_stream(kinesis, unique_name, 2)
    committed(store)
    plant(store, chunk_sk(1, "CKPT", "run-a"), lambda checkpoints: checkpoints["shardId-000000000000"].update(type="END"))
    settings = IncrementalSettings(stream_name=unique_name, consumer_name="lake", output_root="mem://out",
                                   cutoff=datetime.now(timezone.utc), min_call_interval=0.0)  # fmt: skip
    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError):
        prepare_incremental(kinesis, store, settings, "run-c")


def test_a_corrupt_report_is_not_committed(store):
    """The commit task claims the batch (a lease change), then refuses the report: no checkpoint
    moves and the batch stays pending with its plan and report."""
    from airflow_kinesis_spark.operators.handoff import commit_or_raise

    pending(store)
    plant(store, chunk_sk(2, "REPORT", "run-b"), lambda reports: reports[0].update(records="all of them"))
    before = store.head()
    batch_log = [i for i in items(store) if i["sk"]["S"] != "HEAD"]
    with pytest.raises(AirflowFailException, match=r"is corrupt: field 'reports\[0\]\.records'"):
        commit_or_raise(store, 2, "run-b", 60.0)
    after = store.head()
    assert (after.committed_batch_id, after.committed_owner, after.pending_batch_id, after.pending_plan_owner,
            after.pending_report_owner) == (1, "run-a", 2, "run-b", "run-b")  # fmt: skip
    assert after.committed_batch_id == before.committed_batch_id
    assert [i for i in items(store) if i["sk"]["S"] != "HEAD"] == batch_log


def test_the_ingestion_operator_fails_without_retry(store, kinesis, unique_name, aws_conn, tmp_path):
    from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
    from airflow_kinesis_spark.operators.settings import ReadOptions

    create_stream(kinesis, unique_name, 2)
    committed(store)
    set_attribute(store, "HEAD", "committed_batch_id", {"S": "1"})
    operator = KinesisToSparkOperator(task_id="ingest", stream_name=unique_name, consumer_name="lake",
                                      checkpoint_table=store.table_name, output_path=str(tmp_path / "out"),
                                      read_options=ReadOptions(min_call_interval=0.0))  # fmt: skip
    with nothing_moves(store), pytest.raises(AirflowFailException, match="field 'committed_batch_id'"):
        operator.execute({})


def test_the_checkpoint_operators_fail_without_retry(store, kinesis, unique_name, aws_conn):
    from airflow_kinesis_spark.operators.checkpoints import (
        KinesisCheckpointRewindOperator,
        KinesisDiscardPendingBatchOperator,
    )

    create_stream(kinesis, unique_name, 2)
    committed(store)
    set_attribute(store, "HEAD", "pending_batch_id", {"N": "0"})
    args = dict(stream_name=unique_name, consumer_name="lake", checkpoint_table=store.table_name)
    with nothing_moves(store):
        with pytest.raises(AirflowFailException, match="field 'pending_batch_id'"):
            KinesisDiscardPendingBatchOperator(task_id="discard", **args).execute({})
        with pytest.raises(AirflowFailException, match="field 'pending_batch_id'"):
            KinesisCheckpointRewindOperator(task_id="rewind", to="TRIM_HORIZON", **args).execute({})


def test_the_plan_task_fails_without_retry(store, kinesis, unique_name, aws_conn, tmp_path):
    from types import SimpleNamespace

    from airflow_kinesis_spark.operators.split import KinesisPlanBatchOperator

    create_stream(kinesis, unique_name, 2)
    committed(store)
    set_attribute(store, "HEAD", "committed_owner", {"N": "1"})
    task = KinesisPlanBatchOperator(task_id="plan", stream_name=unique_name, consumer_name="lake",
                                    checkpoint_table=store.table_name, output_path=str(tmp_path / "out"))  # fmt: skip
    ti = SimpleNamespace(dag_id="d", task_id="plan", run_id="manual__1", try_number=1, map_index=-1,
                         xcom_push=lambda key, value: None)  # fmt: skip
    with nothing_moves(store), pytest.raises(AirflowFailException, match="field 'committed_owner'"):
        task.execute({"ti": ti, "task_instance": ti, "run_id": "manual__1", "data_interval_end": None,
                      "dag_run": SimpleNamespace(run_type="manual")})  # fmt: skip


def test_the_async_reader_fails_alike(store, moto_endpoint):
    """``core.aio`` (the deferrable sensors' triggers) parses through the same store methods."""
    from aiobotocore.session import get_session

    from airflow_kinesis_spark.core import aio

    committed(store)
    sk = chunk_sk(1, "CKPT", "run-a")
    plant(store, sk, lambda checkpoints: checkpoints["shardId-000000000000"].update(sequence_number="x"))

    async def read() -> Any:
        async with get_session().create_client(
            "dynamodb", endpoint_url=moto_endpoint, region_name=REGION, aws_access_key_id=TEST_ACCESS_KEY,
            aws_secret_access_key=TEST_SECRET_KEY,
        ) as client:  # fmt: skip
            return await aio.committed_state(client, store)

    with nothing_moves(store), pytest.raises(CheckpointStoreCorruptError) as info:
        asyncio.run(read())
    assert_names(info.value, store, sk, "checkpoints['shardId-000000000000'].sequence_number", RESTORE)
    set_attribute(store, "HEAD", "committed_batch_id", {"N": "-1"})
    with pytest.raises(CheckpointStoreCorruptError) as info:
        asyncio.run(read())
    assert_names(info.value, store, "HEAD", "committed_batch_id", RESTORE)


def test_the_error_pickles_with_its_message_and_fields(store):
    committed(store)
    set_attribute(store, "HEAD", "committed_batch_id", {"S": "x"})
    with pytest.raises(CheckpointStoreCorruptError) as info:
        store.head()
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is CheckpointStoreCorruptError and str(copy) == str(info.value)
    assert copy.fields == info.value.fields and copy.field == "committed_batch_id"


def test_well_formed_items_still_read_back(store, monkeypatch):
    """The checks refuse nothing the provider writes: several chunks, every kind, a window plan."""
    monkeypatch.setattr(store_module, "CHUNK_CHARS", 500)
    plan = pending(store)
    head = store.head()
    assert store.pending_plan(head) == plan
    assert [r.shard_id for r in store.pending_report(head) or []] == [r.shard_id for r in plan.ranges]
    assert set(store.committed_checkpoints(head)) == {"shardId-000000000000", "shardId-000000000001"}
    assert store.committed_plan(head) is not None and store.committed_report(head) is not None
