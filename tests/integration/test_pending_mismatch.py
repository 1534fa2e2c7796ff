"""Issue 17, items 1 and 2: a pending batch that no longer fits its task fails naming each
difference and the fix; leases that tell when a batch may be taken over.

Protocol tests without Spark (moto over HTTP, the real reader), and the whole story over Spark
Connect: a wrong ``output_path`` -> the fixed DAG's retry names the difference ->
``kinesis-spark discard-pending`` drops only the pending batch -> the next run ingests exactly once.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta, timezone

import boto3
import pytest
from click.testing import CliRunner

from airflow_kinesis_spark.cli import main as cli
from airflow_kinesis_spark.core.positions import format_timestamp, parse_timestamp
from airflow_kinesis_spark.core.lease import DEFAULT_LEASE_SECONDS, HEARTBEATS_PER_LEASE, heartbeat_interval
from airflow_kinesis_spark.core.protocol import run_incremental
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.exceptions import BatchLeaseHeldError, PendingPlanMismatchError
from demo.producer import put_plain, verify
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream
from tests.integration.test_protocol import ReaderJob, settings

pytestmark = pytest.mark.integration

TRANSFORM = "airflow_kinesis_spark.transforms.apache_log:parse_combined_log"


@pytest.fixture
def store(dynamodb, unique_name):
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "lake")
    store.ensure_table()
    return store


def left_pending(kinesis, store, stream: str, **planned) -> None:
    """Batch 1 planned with ``planned`` settings, its job failed: pending, lease released."""
    with pytest.raises(RuntimeError, match="injected"):
        run_incremental(kinesis, store, ReaderJob(kinesis, store.client, fail_times=1), settings(stream, **planned), "run-1")
    head = store.head()
    assert head.pending_batch_id == 1 and head.committed_batch_id == 0


# -- item 1: a pending plan is compared with what the task would plan ---------------------------


@pytest.mark.parametrize(
    ("planned", "now", "difference"),
    [
        ({"output_root": "s3://wrong-lake/logs"}, {},
         "output location: the plan has 's3://wrong-lake/logs/batch_id=1', this task has 'mem://out/batch_id=1' (set by output_path)"),
        ({"transform": TRANSFORM}, {},
         f"transform: the plan has '{TRANSFORM}', this task has None (set by transform)"),
        ({}, {"transform": TRANSFORM},
         f"transform: the plan has None, this task has '{TRANSFORM}' (set by transform)"),
        ({"max_records_per_shard": 50}, {},
         "max records per shard: the plan has 50, this task has None (set by max_records_per_shard)"),
        ({}, {"max_bytes_per_shard": 1000},
         "max bytes per shard: the plan has None, this task has 1000 (set by max_bytes_per_shard)"),
        ({}, {"initial_position": "AT_TIMESTAMP", "initial_timestamp": datetime(2026, 1, 2, tzinfo=timezone.utc)},
         "initial position: the plan has 'TRIM_HORIZON', this task has 'AT_TIMESTAMP 2026-01-02T00:00:00.000Z' "
         "(set by initial_position, initial_timestamp)"),
    ],
    ids=["output_path", "transform removed", "transform added", "max_records_per_shard", "max_bytes_per_shard", "initial_position"],
)
def test_a_changed_setting_fails_the_retry_naming_the_difference_and_the_fix(kinesis, store, unique_name, planned, now, difference):
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", f"a{i}".encode()) for i in range(10)])
    left_pending(kinesis, store, unique_name, **planned)
    before = store.head()
    job = ReaderJob(kinesis, store.client)
    with pytest.raises(PendingPlanMismatchError) as info:
        run_incremental(kinesis, store, job, settings(unique_name, **now), "run-2")
    message = str(info.value)
    assert difference in message and info.value.differences == [difference]
    command = f"kinesis-spark discard-pending {unique_name} -c lake -t {store.table_name} --dry-run"
    assert f"run `{command}` to see it, then again with --yes instead of --dry-run" in message
    assert info.value.discard_command == command
    argument = difference.split("(set by ")[1].rstrip(")")
    assert f"To keep the new {argument}, drop the pending batch; the committed checkpoints stay" in message
    assert f"To finish the pending batch as planned instead, put {argument} back." in message
    assert not job.runs and store.head() == before  # nothing read, written or moved
    # put back: the pending batch finishes as planned
    summary = run_incremental(kinesis, store, job, settings(unique_name, **planned), "run-3")
    assert summary["reused_plan"] and summary["status"] == "committed" and summary["records"] == 10


def test_every_difference_is_named_at_once(kinesis, store, unique_name):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    left_pending(kinesis, store, unique_name, output_root="s3://wrong", transform=TRANSFORM, max_records_per_shard=10)
    with pytest.raises(PendingPlanMismatchError) as info:
        run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name), "run-2")
    assert [d.split(":")[0] for d in info.value.differences] == ["output location", "transform", "max records per shard"]
    assert info.value.arguments == ["max_records_per_shard", "output_path", "transform"]
    assert "put max_records_per_shard, output_path, transform back" in str(info.value)


def test_a_difference_no_argument_explains_points_at_the_table_s_writers(kinesis, store, unique_name):
    from tests.integration.test_protocol import _plant

    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    _plant(kinesis, store, unique_name, mode="window")
    with pytest.raises(PendingPlanMismatchError) as info:
        run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name), "run-1")
    assert info.value.differences == ["mode: the plan has 'window', this task has 'incremental'"]
    assert ("No argument of this task sets some of these: someone else wrote the checkpoint table. Check who can write "
            "it (docs/security.md), then drop the pending batch") in str(info.value)  # fmt: skip
    assert "To keep the new" not in str(info.value)


def test_a_plan_of_an_earlier_version_is_not_compared_on_what_it_did_not_record(kinesis, store, unique_name, monkeypatch):
    """Plans stored before the transform was recorded (no ``task_settings``) are re-used by a task with one."""
    from airflow_kinesis_spark.core import protocol

    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    monkeypatch.setattr(protocol, "_task_settings", lambda s: None)  # what an earlier version stored
    left_pending(kinesis, store, unique_name)
    monkeypatch.undo()
    assert store.pending_plan().task_settings is None
    summary = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name, transform=TRANSFORM), "run-2")
    assert summary["reused_plan"] and summary["records"] == 1


def test_later_batches_compare_caps_but_not_the_initial_position(kinesis, store, unique_name):
    """A later batch's never-seen shards may be children (they start at TRIM_HORIZON whatever the
    initial position): only a first batch shows the initial position it was planned with."""
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name), "run-1")
    put_plain(kinesis, unique_name, [("k", b"b")])
    with pytest.raises(RuntimeError, match="injected"):
        run_incremental(kinesis, store, ReaderJob(kinesis, store.client, fail_times=1), settings(unique_name), "run-2")
    latest = settings(unique_name, initial_position="LATEST")
    summary = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), latest, "run-3")
    assert summary["reused_plan"] and summary["batch_id"] == 2 and summary["records"] == 1


# -- item 2: leases that tell time -----------------------------------------------------------------


def test_the_lease_error_names_the_holder_its_last_heartbeat_and_the_seconds_left(kinesis, store, unique_name):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])

    def crashed(plan):  # the holder dies without a word: its lease stays
        raise SystemExit("killed")

    with pytest.raises(SystemExit):
        run_incremental(kinesis, store, ReaderJob(kinesis, store.client, during=crashed), settings(unique_name, lease_seconds=40), "dead-run")
    heartbeat = store.head().pending_heartbeat
    with pytest.raises(BatchLeaseHeldError) as info:
        run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name, lease_seconds=40), "retry")
    err, message = info.value, str(info.value)
    beat_at = format_timestamp(datetime.fromtimestamp(heartbeat / 1000, timezone.utc))
    assert re.fullmatch(r"dead-run/driver-[0-9a-f]{12}", err.holder) and err.heartbeat_at == beat_at and 0 <= err.heartbeat_age_seconds < 40
    assert 0 < err.seconds_left <= 40 and abs(err.seconds_left + err.heartbeat_age_seconds - 40) < 0.01
    assert parse_timestamp(err.takeover_at) == parse_timestamp(beat_at) + timedelta(seconds=40)
    assert re.search(r"is being run by dead-run/driver-[0-9a-f]{12} \(last heartbeat \d+\.\ds ago, lease 40s\): it may be taken over in "
                     rf"\d+s \(at {re.escape(err.takeover_at)}\) if that holder does not renew its lease; its last "
                     rf"heartbeat was at {re.escape(beat_at)}, and a live holder renews it every 10s\.", message), message
    assert "or one that died less than 40s ago; retry after that (a task's retry_delay longer than lease_seconds" in message


def test_a_holder_keeps_its_lease_through_two_failed_renewals(store, unique_name, monkeypatch):
    """Renewals every quarter of the lease: two failing in a row (DynamoDB throttling, a network
    blip) still leave the holder its lease; a renewal every half lease would lose it."""
    from airflow_kinesis_spark.core.planner import plan_incremental
    from tests.helpers import open_shards

    assert HEARTBEATS_PER_LEASE == 4 and heartbeat_interval(DEFAULT_LEASE_SECONDS) == DEFAULT_LEASE_SECONDS / 4
    now = datetime.now(timezone.utc)
    plan = plan_incremental(batch_id=1, stream_name=store.stream_name, consumer_name="lake", shards=open_shards(1),
                            checkpoints={}, cutoff=now, now=now, output_location="mem://out/batch_id=1")  # fmt: skip
    store.begin(plan, "holder")
    real = DynamoDBCheckpointStore.heartbeat
    calls: list[bool] = []

    def flaky(self, batch_id, owner):
        calls.append(len(calls) >= 2)
        if len(calls) <= 2:
            raise ConnectionError("renewal lost (injected)")
        real(self, batch_id, owner)

    monkeypatch.setattr(DynamoDBCheckpointStore, "heartbeat", flaky)
    lease = 2.0
    with store.hold_lease(1, "holder", lease_seconds=lease):
        time.sleep(lease + 0.2)  # past the lease since the last good heartbeat (begin)
        with pytest.raises(BatchLeaseHeldError, match="being run by holder"):
            DynamoDBCheckpointStore(store.client, store.table_name, store.stream_name, "lake").take_over(1, "rival", lease)
    assert calls[:3] == [False, False, True]


# -- the whole story, with Spark over Spark Connect and the command line -------------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_wrong_output_path_fixed_then_discard_pending_then_exactly_once(
    kinesis, dynamodb, unique_name, tmp_path, moto_endpoint, spark_connect_conn, aws_conn, monkeypatch
):
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
    from airflow_kinesis_spark.operators.settings import ReadOptions, SparkSettings

    table = f"{unique_name}_t"
    lake = tmp_path / "lake"

    def ingest(output_path: str) -> dict:
        return KinesisToSparkOperator(
            task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=table,
            output_path=output_path, spark_settings=SparkSettings(conn_id=spark_connect_conn),
            read_options=ReadOptions(min_call_interval=0.0),
        ).execute({})  # fmt: skip

    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"first {i}".encode()) for i in range(20)])
    assert ingest(str(lake))["records"] == 20  # batch 1 committed
    store = DynamoDBCheckpointStore(dynamodb, table, unique_name, "lake")
    committed = store.committed_checkpoints()
    produced += put_plain(kinesis, unique_name, [(f"k{i}", f"second {i}".encode()) for i in range(30)])

    # a DAG change gives a wrong output_path: the worker may write there (its owner record), Spark
    # cannot (no S3 connector on this Spark), so batch 2 stays pending
    boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION, aws_access_key_id=TEST_ACCESS_KEY,
                 aws_secret_access_key=TEST_SECRET_KEY).create_bucket(Bucket="no-such-lake")  # fmt: skip
    wrong = "s3://no-such-lake/logs"
    with pytest.raises(RuntimeError, match="The Spark job of batch 2 failed"):
        ingest(wrong)
    assert store.head().pending_batch_id == 2

    # the fixed DAG's retry: the pending plan is not what the task would plan, and it says how
    with pytest.raises(AirflowFailException) as info:
        ingest(str(lake))
    message = str(info.value)
    assert (f"output location: the plan has '{wrong}/batch_id=2', this task has '{lake}/batch_id=2' (set by output_path)"
            in message)  # fmt: skip
    command = f"kinesis-spark discard-pending {unique_name} -c lake -t {table} --dry-run"
    assert f"`{command}`" in message
    assert "Re-using the pending plan" not in message and store.head().pending_batch_id == 2

    # the command the error names: its dry run changes nothing, then it drops only the pending batch
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)
    runner = CliRunner()
    args = ["--endpoint-url", moto_endpoint, "--region", REGION, *command.split()[1:]]
    before = store.head()
    dry = runner.invoke(cli, [*args, "--json"])
    assert dry.exit_code == 0, dry.output
    preview = json.loads(dry.stdout)
    assert preview["dry_run"] and preview["discarded_batch_id"] == 2 and preview["deleted_path"] is None
    assert store.head() == before and store.committed_checkpoints() == committed
    args.remove("--dry-run")
    done = runner.invoke(cli, [*args, "--yes"])
    assert done.exit_code == 0, done.output
    assert "Discarded pending batch 2" in done.stdout and "The committed checkpoints (batch 1) are unchanged." in done.stdout
    head = store.head()
    assert head.pending_batch_id is None and head.committed_batch_id == 1
    assert store.committed_checkpoints() == committed

    # the next run plans batch 2 anew from the same checkpoints: every record exactly once
    final = ingest(str(lake))
    assert final["batch_id"] == 2 and final["records"] == 30 and not final["reused_plan"]
    import pyarrow.parquet as pq

    rows = []
    for batch_id in (1, 2):
        t = pq.read_table(lake / f"batch_id={batch_id}", columns=["shard_id", "sequence_number", "sub_sequence_number",
                                                                  "partition_key", "data"])  # fmt: skip
        rows.extend(zip(*t.to_pydict().values(), strict=True))
    check = verify(produced, rows)
    assert check.ok, check


@pytest.mark.parametrize("tool", ["cli", "operator"])
def test_discarding_a_live_batch_says_when_it_may_be_discarded_in_the_caller_s_terms(
    tool, kinesis, store, unique_name, moto_endpoint, aws_conn, monkeypatch
):
    from airflow_kinesis_spark.core.planner import plan_incremental
    from airflow_kinesis_spark.core.shards import list_shards
    from airflow_kinesis_spark.operators.checkpoints import KinesisDiscardPendingBatchOperator

    create_stream(kinesis, unique_name, 1)
    now = datetime.now(timezone.utc)
    plan = plan_incremental(batch_id=1, stream_name=unique_name, consumer_name="lake", shards=list_shards(kinesis, unique_name),
                            checkpoints={}, cutoff=now, now=now, output_location="/data/lake/batch_id=1")  # fmt: skip
    store.begin(plan, "live-run")
    if tool == "cli":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)
        result = CliRunner().invoke(cli, ["--endpoint-url", moto_endpoint, "--region", REGION, "discard-pending", unique_name,
                                          "-c", "lake", "-t", store.table_name, "--lease-seconds", "30", "--yes"])  # fmt: skip
        assert result.exit_code == 1
        message, flag = result.output, "--lease-seconds 30"
    else:
        with pytest.raises(BatchLeaseHeldError) as info:
            KinesisDiscardPendingBatchOperator(task_id="discard", stream_name=unique_name, consumer_name="lake",
                                               checkpoint_table=store.table_name, lease_seconds=30).execute({})  # fmt: skip
        message, flag = str(info.value), "lease_seconds 30"
        assert 0 < info.value.seconds_left <= 30 and info.value.takeover_at
    assert re.search(rf"is held by live-run \(last heartbeat \d+\.\d s ago, at [0-9T:.-]+Z; lease: {flag}\)", message), message
    assert re.search(r"If that run is dead, its batch may be discarded in \d+ s \(at [0-9T:.-]+Z\)", message), message
    assert ("lease_seconds" in message) == (tool == "operator") and store.head().pending_owner == "live-run"
