"""The batch protocol without a JVM: moto over HTTP and a job that reads with the real reader.

``ReaderJob`` is a fake *job* (the part that runs in Spark): handed its batch through the
checkpoint store like every job, it reads every planned range with ``core.reader`` against moto
and keeps the rows it "wrote" per output location, overwriting as a re-run of Spark's writer
would. Everything else — the planner, the store on DynamoDB, the probes, the hand-over, the
lease, the commit — is the real code. Spark's own part is tested in tests/spark and
end to end in tests/integration/test_operator*.py.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone

import pytest

from airflow_kinesis_spark.core.planner import BatchPlan, plan_incremental
from airflow_kinesis_spark.core.positions import Checkpoint, ExtendedSequenceNumber
from airflow_kinesis_spark.core.protocol import IncrementalSettings, run_incremental
from airflow_kinesis_spark.core.window_run import WindowSettings, run_window
from airflow_kinesis_spark.core.ranges import ShardReport
from airflow_kinesis_spark.core.probes import probe_ranges
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.exceptions import (
    BatchLeaseHeldError,
    CheckpointConflictError,
    DataLossError,
    PendingPlanMismatchError,
    ReportValidationError,
)
from demo.producer import put_aggregated, put_plain
from tests.conftest import create_stream
from tests.helpers import InProcessJob, read_plan

pytestmark = pytest.mark.integration


class ReaderJob(InProcessJob):
    """A job without Spark (``tests.helpers.InProcessJob``): reads each range with the real
    reader and keeps the rows per location.

    :param fail_times: fail that many writes (a Spark job that failed).
    :param during: called with the plan while the job writes (e.g. another run of the consumer).
    """

    def __init__(self, kinesis, dynamodb, fail_times: int = 0, during=None) -> None:
        super().__init__(dynamodb)
        self.kinesis = kinesis
        self.fail_times = fail_times
        self.during = during

    def reports(self, plan: BatchPlan) -> tuple[list[tuple], list[ShardReport]]:
        """The rows and reports of ``plan``'s ranges (a subclass may change them)."""
        return read_plan(self.kinesis, plan)

    def write_reports(self, plan: BatchPlan, location: str) -> list[ShardReport]:
        if self.during is not None:
            self.during(plan)
        if self.fail_times:
            self.fail_times -= 1
            raise RuntimeError("the Spark job failed (injected)")
        rows, reports = self.reports(plan)
        self.output[location] = rows  # overwrite, as Spark's writer in mode overwrite
        return reports

    def all_rows(self, committed_through: int, root: str) -> list[tuple]:
        return [row for b in range(1, committed_through + 1) for row in self.output.get(f"{root}/batch_id={b}", [])]


def settings(stream: str, **kwargs) -> IncrementalSettings:
    values = {"stream_name": stream, "consumer_name": "lake", "output_root": "mem://out",
              "cutoff": datetime.now(timezone.utc), "min_call_interval": 0.0, **kwargs}  # fmt: skip
    return IncrementalSettings(**values)


@pytest.fixture
def store(dynamodb, unique_name):
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "lake")
    store.ensure_table()
    return store


@pytest.fixture
def window_store(dynamodb, unique_name):
    """The checkpoint store through which a window (consumer ``window``) is handed to its job."""
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_windows", unique_name, "window")
    store.ensure_table()
    return store


def produced_keys(produced) -> list[tuple]:
    return sorted(p.key for p in produced)


def row_keys(rows) -> list[tuple]:
    return sorted(r[:3] for r in rows)


def test_batches_are_exactly_once_and_an_idle_run_starts_no_job(kinesis, store, unique_name):
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"a{i}".encode()) for i in range(30)])
    job = ReaderJob(kinesis, store.client)
    first = run_incremental(kinesis, store, job, settings(unique_name), "run-1")
    assert first["status"] == "committed" and first["batch_id"] == 1 and first["records"] == 30
    produced += put_aggregated(kinesis, unique_name, [(f"k{i}", f"b{i}".encode()) for i in range(40)], per_aggregate=10)
    second = run_incremental(kinesis, store, job, settings(unique_name), "run-2")
    assert second["batch_id"] == 2 and second["records"] == 40
    idle = run_incremental(kinesis, store, job, settings(unique_name), "run-3")
    assert idle["status"] == "no_new_records" and len(job.runs) == 2  # probes only, no job
    rows = job.all_rows(store.head().committed_batch_id, "mem://out")
    assert row_keys(rows) == produced_keys(produced)  # EXACT: each record once


def test_a_failed_job_leaves_its_plan_pending_and_the_retry_reuses_it(kinesis, store, unique_name):
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"a{i}".encode()) for i in range(20)])
    job = ReaderJob(kinesis, store.client, fail_times=1)
    with pytest.raises(RuntimeError, match="injected"):
        run_incremental(kinesis, store, job, settings(unique_name), "run-1")
    head = store.head()
    assert head.pending_batch_id == 1 and head.committed_batch_id == 0 and head.pending_heartbeat == 0  # lease released
    put_plain(kinesis, unique_name, [("late", b"late")])  # after the plan's cutoff: not in batch 1
    retry = run_incremental(kinesis, store, job, settings(unique_name, cutoff=datetime.now(timezone.utc)), "run-2")
    assert retry["reused_plan"] is True and retry["batch_id"] == 1 and retry["records"] == 20
    assert job.runs[0].to_dict() == job.runs[1].to_dict()  # the very same plan
    assert row_keys(job.all_rows(1, "mem://out")) == produced_keys(produced)


def test_a_recorded_report_is_committed_without_running_the_job_again(kinesis, store, unique_name, monkeypatch):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a"), ("k", b"b")])
    job = ReaderJob(kinesis, store.client)
    real_commit = DynamoDBCheckpointStore.commit

    def crash(*args, **kwargs):
        raise ConnectionError("worker died between the report and the commit (injected)")

    monkeypatch.setattr(DynamoDBCheckpointStore, "commit", crash)
    with pytest.raises(ConnectionError):
        run_incremental(kinesis, store, job, settings(unique_name, lease_seconds=0.2), "run-1")
    monkeypatch.setattr(DynamoDBCheckpointStore, "commit", real_commit)
    time.sleep(0.3)  # the dead worker's lease expires
    summary = run_incremental(kinesis, store, job, settings(unique_name, lease_seconds=0.2), "run-2")
    assert summary["status"] == "committed" and summary["records"] == 2 and summary["reused_plan"]
    assert len(job.runs) == 1 and store.head().committed_batch_id == 1


def test_a_second_run_cannot_take_a_batch_whose_lease_is_alive(kinesis, store, unique_name):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    seen: list[Exception] = []

    def another_run(plan):
        try:
            run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name), "run-2")
        except BatchLeaseHeldError as err:
            seen.append(err)

    summary = run_incremental(kinesis, store, ReaderJob(kinesis, store.client, during=another_run), settings(unique_name), "run-1")
    assert summary["status"] == "committed" and summary["batch_id"] == 1
    assert len(seen) == 1 and "run-1" in str(seen[0])


def test_a_writer_that_lost_its_batch_commits_nothing(kinesis, store, unique_name):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])

    def taken_over(plan):  # another writer takes the batch over while this one's job runs
        store.take_over(plan.batch_id, "run-2", lease_seconds=0)

    job = ReaderJob(kinesis, store.client, during=taken_over)
    with pytest.raises(CheckpointConflictError):
        run_incremental(kinesis, store, job, settings(unique_name), "run-1")
    assert store.head().committed_batch_id == 0 and store.head().pending_owner == "run-2"


def test_new_shards_are_recorded_without_a_job(kinesis, store, unique_name):
    create_stream(kinesis, unique_name, 3)
    job = ReaderJob(kinesis, store.client)
    summary = run_incremental(kinesis, store, job, settings(unique_name), "run-1")
    assert summary["status"] == "committed_without_records" and summary["batch_id"] == 1 and not job.runs
    assert len(store.committed_checkpoints()) == 3


def test_a_report_that_does_not_match_the_plan_commits_nothing(kinesis, store, unique_name):
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(10)])

    class DropsAShard(ReaderJob):
        def reports(self, plan):
            rows, reports = super().reports(plan)
            return rows, reports[1:]

    with pytest.raises(ReportValidationError):
        run_incremental(kinesis, store, DropsAShard(kinesis, store.client), settings(unique_name), "run-1")
    assert store.head().committed_batch_id == 0 and store.head().pending_batch_id == 1


def _stale_pending_batch(kinesis, store, stream: str) -> BatchPlan:
    """Batch 1 committed a checkpoint at sequence number 0 three days ago; batch 2 was planned
    from it then and left pending by a run that died. The stream's oldest record is past it."""
    (shard,) = list_shards(kinesis, stream)
    long_ago = datetime.now(timezone.utc) - timedelta(days=3)
    stale = Checkpoint(position=ExtendedSequenceNumber("0"), clear_until=long_ago)
    first = plan_incremental(batch_id=1, stream_name=stream, consumer_name="lake", shards=[shard], checkpoints={},
                             cutoff=long_ago, now=long_ago, output_location="mem://out/batch_id=1")  # fmt: skip
    store.begin(first, "long-ago")
    store.commit(first, {shard.shard_id: stale}, "long-ago")
    pending = plan_incremental(batch_id=2, stream_name=stream, consumer_name="lake", shards=[shard],
                               checkpoints={shard.shard_id: stale}, cutoff=long_ago, now=long_ago,
                               output_location="mem://out/batch_id=2")  # fmt: skip
    store.begin(pending, "died")
    store.release(2, "died")
    return pending


def test_a_pending_plan_behind_the_trim_horizon_is_loud(kinesis, store, unique_name):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a"), ("k", b"b")])
    _stale_pending_batch(kinesis, store, unique_name)
    job = ReaderJob(kinesis, store.client)
    with pytest.raises(DataLossError, match=r"Pending batch 2 .* behind the trim horizon.*oldest record kept 1.*allow_data_loss=True"):
        run_incremental(kinesis, store, job, settings(unique_name), "run-1")
    assert not job.runs and store.head().pending_batch_id == 2 and store.head().committed_batch_id == 1  # nothing read or moved

    summary = run_incremental(kinesis, store, job, settings(unique_name, allow_data_loss=True), "run-2")
    assert summary["status"] == "committed" and summary["batch_id"] == 2 and summary["records"] == 2
    assert list(summary["trim_gaps"]) == ["shardId-000000000000"] and not summary["reused_plan"]
    assert job.runs[0].ranges[0].start.iterator_type == "TRIM_HORIZON"


def test_many_shards_are_probed_without_overflowing_the_connection_pool(kinesis, unique_name, caplog):
    """botocore pools 10 connections; more probe threads than that open and discard connections."""
    create_stream(kinesis, unique_name, 64)
    put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(200)])
    now = datetime.now(timezone.utc)
    plan = plan_incremental(batch_id=1, stream_name=unique_name, consumer_name="lake", shards=list_shards(kinesis, unique_name),
                            checkpoints={}, cutoff=now, now=now, output_location="mem://x")  # fmt: skip
    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    probes = probe_ranges(kinesis, unique_name, plan.ranges, min_call_interval=0)
    assert len(probes) == 64 and sum(p.records for p in probes) > 0
    assert [p.shard_id for p in probes] == [r.shard_id for r in plan.ranges]
    assert "Connection pool is full" not in caplog.text


# -- window ------------------------------------------------------------------------------------


@pytest.mark.parametrize("time_slices", [4, None], ids=["time_slices=4", "derived"])
def test_an_empty_window_with_several_slices_has_no_records_and_no_job(kinesis, window_store, unique_name, time_slices):
    """Defect: the probe dropped the range's slice index, so every quiet hour of a backfill failed
    ("missing [(shard, 1), (shard, 2), (shard, 3)] ... repeated [(shard, 0)]")."""
    create_stream(kinesis, unique_name, 2)
    end = datetime.now(timezone.utc) - timedelta(minutes=1)
    put_plain(kinesis, unique_name, [("k", b"after the window")])
    job = ReaderJob(kinesis, window_store.client)
    window = WindowSettings(stream_name=unique_name, consumer_name="window", output_root="mem://w", start=end - timedelta(hours=1),
                            end=end, time_slices=time_slices, parallelism=8, min_call_interval=0.0)  # fmt: skip
    summary = run_window(kinesis, job, window, store=window_store, owner="window-run")
    assert summary["status"] == "no_records" and summary["records"] == 0 and summary["output_path"] is None
    assert summary["time_slices"] == 4 and not job.runs and not job.output


def test_a_window_reads_what_arrived_in_it_once_per_slice(kinesis, window_store, unique_name):
    create_stream(kinesis, unique_name, 2)
    start = datetime.now(timezone.utc) - timedelta(seconds=1)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"w{i}".encode()) for i in range(25)])
    end = datetime.now(timezone.utc) + timedelta(milliseconds=5)
    while datetime.now(timezone.utc) <= end:
        pass
    job = ReaderJob(kinesis, window_store.client)
    window = WindowSettings(stream_name=unique_name, consumer_name="window", output_root="mem://w", start=start, end=end,
                            time_slices=3, min_call_interval=0.0)  # fmt: skip
    summary = run_window(kinesis, job, window, store=window_store, owner="window-run")
    assert summary["status"] == "written" and summary["records"] == 25
    assert {s["slices"] for s in summary["shards"].values()} == {3}
    (rows,) = job.output.values()
    assert row_keys(rows) == produced_keys(produced)


def test_window_arguments_are_checked_before_any_call(kinesis, window_store, unique_name):
    job = ReaderJob(kinesis, window_store.client)
    now = datetime.now(timezone.utc)
    backwards = WindowSettings(stream_name=unique_name, consumer_name="window", output_root="mem://w", start=now - timedelta(minutes=1),
                               end=now - timedelta(minutes=2))  # fmt: skip
    with pytest.raises(ValueError, match="is not before its end"):
        run_window(kinesis, job, backwards, store=window_store, owner="window-run")  # the stream does not even exist: no call was made
    future = WindowSettings(stream_name=unique_name, consumer_name="window", output_root="mem://w", start=now, end=now + timedelta(hours=1))
    with pytest.raises(ValueError, match="is in the future"):
        run_window(kinesis, job, future, store=window_store, owner="window-run")


def test_a_window_before_the_trim_horizon_is_loud(kinesis, window_store, unique_name):
    create_stream(kinesis, unique_name, 1)  # retention 24 hours
    end = datetime.now(timezone.utc) - timedelta(hours=23)
    job = ReaderJob(kinesis, window_store.client)
    window = WindowSettings(stream_name=unique_name, consumer_name="window", output_root="mem://w", start=end - timedelta(hours=2),
                            end=end, time_slices=1, min_call_interval=0.0)  # fmt: skip
    with pytest.raises(DataLossError, match="before the trim horizon.*allow_data_loss=True"):
        run_window(kinesis, job, window, store=window_store, owner="window-run")
    allowed = run_window(kinesis, job, WindowSettings(**{**window.__dict__, "allow_data_loss": True}), store=window_store,
                         owner="window-run")  # fmt: skip
    assert allowed["status"] == "no_records" and "trim horizon" in allowed["trim_gap"] and not job.runs


# -- stored state is checked, never trusted blindly ----------------------------------------------


def _plant(kinesis, store, stream: str, **changes) -> BatchPlan:
    """A pending plan written straight into the checkpoint table by someone else, as an attacker
    with write access to the table (or a hand edit) would leave it."""
    from dataclasses import replace

    now = datetime.now(timezone.utc)
    plan = plan_incremental(batch_id=1, stream_name=stream, consumer_name="lake", shards=list_shards(kinesis, stream),
                            checkpoints={}, cutoff=now, now=now, output_location="mem://out/batch_id=1")  # fmt: skip
    plan = replace(plan, **{"checkpoint_table": store.table_name, **changes})
    store.begin(plan, "planted")
    store.release(plan.batch_id, "planted")
    return plan


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stream_name": "another-stream"}, r"stream: the plan has 'another-stream'"),
        ({"output_location": "/home/victim"}, r"output location: the plan has '/home/victim', this task has 'mem://out/batch_id=1'"),
        ({"consumer_name": "other"}, r"consumer: the plan has 'other'"),
        ({"checkpoint_table": "other_table"}, r"checkpoint table: the plan has 'other_table'"),
    ],
    ids=["stream", "output", "consumer", "table"],
)
def test_a_planted_pending_plan_fails_the_run_with_nothing_read_or_written(kinesis, store, unique_name, change, message):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    _plant(kinesis, store, unique_name, **change)
    job = ReaderJob(kinesis, store.client)
    before = store.head()
    with pytest.raises(PendingPlanMismatchError, match=message):
        run_incremental(kinesis, store, job, settings(unique_name), "run-1")
    assert not job.runs and not job.output and store.head() == before  # nothing read, written or moved


def test_a_planted_start_position_fails_the_run(kinesis, store, unique_name):
    from dataclasses import replace

    from airflow_kinesis_spark.core.ranges import StartPosition

    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a"), ("k", b"b")])
    (shard,) = list_shards(kinesis, unique_name)
    now = datetime.now(timezone.utc)
    honest = plan_incremental(batch_id=1, stream_name=unique_name, consumer_name="lake", shards=[shard], checkpoints={},
                              cutoff=now, now=now, output_location="mem://out/batch_id=1")  # fmt: skip
    skipping = replace(honest.ranges[0], start=StartPosition("AFTER_SEQUENCE_NUMBER", sequence_number="1"))
    _plant(kinesis, store, unique_name, ranges=(skipping,))
    job = ReaderJob(kinesis, store.client)
    with pytest.raises(PendingPlanMismatchError, match=r"shard shardId-000000000000: the range starts at AFTER_SEQUENCE_NUMBER 1"):
        run_incremental(kinesis, store, job, settings(unique_name), "run-1")
    assert not job.runs


def test_an_honest_pending_plan_is_reused(kinesis, store, unique_name):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    _plant(kinesis, store, unique_name)
    summary = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name), "run-1")
    assert summary["reused_plan"] and summary["status"] == "committed" and summary["records"] == 1


def test_a_run_reads_the_head_item_once(kinesis, dynamodb, store, unique_name):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name), "run-1")
    reads: list[str] = []
    dynamodb.meta.events.register("before-parameter-build.dynamodb.GetItem", lambda params, **_: reads.append(params["Key"]["sk"]["S"]))
    idle = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name), "run-2")
    assert idle["status"] == "no_new_records" and reads == ["HEAD"]


def test_an_idle_run_after_a_commit_without_records_reads_only_the_checkpoints(kinesis, dynamodb, store, unique_name, tmp_path):
    """After a batch committed without records (a new shard's start recorded, an idle refresh),
    the Parquet sink's repair has nothing to write (such a batch has no committed record), so an
    idle run's one ``Query`` is the committed checkpoints': not the committed plan and report too."""
    from airflow_kinesis_spark.sinks.parquet import ParquetSink

    create_stream(kinesis, unique_name, 4)
    out = str(tmp_path / "out")
    first = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name, sink=ParquetSink(out), output_root=out), "run-1")
    assert first["status"] == "committed_without_records"
    queried: list[str] = []
    dynamodb.meta.events.register("before-parameter-build.dynamodb.Query",
                                  lambda params, **_: queried.append(params["ExpressionAttributeValues"][":prefix"]["S"]))  # fmt: skip
    idle = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name, sink=ParquetSink(out), output_root=out), "run-2")
    assert idle["status"] == "no_new_records"
    assert [q.split("#")[2] for q in queried] == ["CKPT"], queried


def test_a_run_without_new_records_derives_no_output_spec_and_registers_no_stream_consumer(kinesis, store, unique_name, tmp_path):
    """The output spec (with a target file size: a catalog call) and the stream consumer (efo:
    DescribeStreamConsumer, or registering it) are resolved only for a plan that is persisted."""
    from airflow_kinesis_spark.core.protocol import prepare_incremental
    from airflow_kinesis_spark.sinks.parquet import ParquetSink

    class CountingSink(ParquetSink):  # the Parquet sink, counting how often a plan's output spec is derived
        derived = 0

        def planned_output_spec(self):
            CountingSink.derived += 1
            return super().planned_output_spec()

    create_stream(kinesis, unique_name, 1)
    arn = kinesis.describe_stream_summary(StreamName=unique_name)["StreamDescriptionSummary"]["StreamARN"]
    def s():  # the task's settings, its cutoff now
        return settings(unique_name, sink=CountingSink(str(tmp_path / "out")), output_root=str(tmp_path / "out"), consumer_type="efo")

    first = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), s(), "run-1")  # the new shard's start is recorded
    assert first["status"] == "committed_without_records" and CountingSink.derived == 1
    assert store.committed_plan(store.head()).consumer_arn  # a persisted plan names its stream consumer
    # by its ARN: moto 5.2.5 ignores a deregistration by stream ARN and consumer name
    kinesis.deregister_stream_consumer(ConsumerARN=store.committed_plan(store.head()).consumer_arn)
    assert kinesis.list_stream_consumers(StreamARN=arn)["Consumers"] == []
    idle = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), s(), "run-2")
    assert idle["status"] == "no_new_records" and CountingSink.derived == 1
    assert kinesis.list_stream_consumers(StreamARN=arn)["Consumers"] == []  # not registered again by an idle run
    put_plain(kinesis, unique_name, [("k", b"one")])
    time.sleep(0.01)  # a cutoff in a later millisecond than the record's arrival
    prepared = prepare_incremental(kinesis, store, s(), "run-3")
    assert prepared.plan is not None and prepared.plan.consumer_arn and CountingSink.derived == 2
