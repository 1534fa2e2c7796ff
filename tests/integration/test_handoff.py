"""The job contract without a JVM: a planned batch handed to its job through the checkpoint store.

``FileJob`` is a fake *handed* job, the part of spark_scripts/kinesis_batch.py that runs in the
Spark driver: it is given only the :class:`JobArguments`, builds its own checkpoint store from
them and runs :func:`core.job.run_handed_batch` with plain-Python callables. ``write`` reads the
plan's ranges with the real reader (``tests.helpers.read_plan``) and writes JSON lines under the
staging location on the local file system; ``publish`` moves the staging directory to the plan's
output location; ``discard`` removes it. Everything else (the planner, the store on moto's
DynamoDB, the claim, the lease, the fencing, the commit) is the real code.

A paused driver (a GC pause, a frozen VM, a network partition) is a store whose calls hang
(:func:`store_paused_at`) and a ``write`` that waits on an event.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_kinesis_spark.core.job import (
    STAGING_DIR,
    handed_batch_state,
    JobArguments,
    job_arguments_from,
    run_handed_batch,
    staging_location,
    writer_id,
)
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.probes import probe_ranges
from airflow_kinesis_spark.core.protocol import IncrementalSettings, commit_handed, prepare_incremental, run_incremental
from airflow_kinesis_spark.core.head import Head
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.exceptions import (
    BatchLeaseHeldError,
    CheckpointConflictError,
    ReportNotRecordedError,
    ReportValidationError,
)
from demo.producer import put_aggregated, put_plain
from tests.conftest import create_stream
from tests.helpers import read_plan
from tests.integration.test_protocol import ReaderJob

pytestmark = pytest.mark.integration

#: A short lease, for the tests that wait for one to expire (seconds).
SHORT_LEASE = 1.5
#: A lease no test outlives (seconds).
LONG_LEASE = 60.0
#: The most any test waits for a thread or an event (seconds); never reached when the code works.
WAIT = 30.0


# -- the fake driver ---------------------------------------------------------------------------


class FileJob:
    """A handed job without Spark (a :class:`~airflow_kinesis_spark.core.interfaces.BatchJob`).

    :param store_class: the store the driver builds from its arguments (a paused one, see
        :func:`store_paused_at`).
    :param during_write: called after the files are written, before ``write`` returns (a pause).
    :param drop_range: report one range less than planned (a broken job).
    :param publish_fails: ``publish`` removes the target, then fails (a rename that failed).
    """

    def __init__(
        self, kinesis: Any, dynamodb: Any, *, store_class: type[DynamoDBCheckpointStore] = DynamoDBCheckpointStore,
        during_write: Callable[[BatchPlan, str], None] | None = None, drop_range: bool = False, publish_fails: bool = False,
    ) -> None:  # fmt: skip
        self.kinesis = kinesis
        self.dynamodb = dynamodb
        self.store_class = store_class
        self.during_write = during_write
        self.drop_range = drop_range
        self.publish_fails = publish_fails
        self.outcomes: list[dict[str, Any]] = []  # what run_handed_batch returned
        self.results: list[dict[str, Any]] = []  # what write returned
        self.written: list[str] = []  # staging locations written
        self.published: list[tuple[str | None, str]] = []
        self.discarded: list[str] = []
        self.cancelled = threading.Event()
        self.killed = threading.Event()

    def run_handed(self, arguments: JobArguments, *, output_location: str | None = None) -> None:
        # The driver knows its arguments only: its store is built from them, as spark_scripts' store_for does.
        store = self.store_class(self.dynamodb, arguments.checkpoint_table, arguments.stream_name, arguments.consumer_name)
        outcome = run_handed_batch(
            store, arguments, write=self.write, publish=self.publish, discard=self.discard, cancel=self.cancelled.set
        )
        self.outcomes.append(outcome)

    def write(self, plan: BatchPlan, location: str) -> dict[str, Any]:
        rows, reports = read_plan(self.kinesis, plan)
        if self.drop_range:
            reports = reports[1:]
        os.makedirs(location)
        with open(os.path.join(location, "part-00000.jsonl"), "w", encoding="utf-8") as fh:
            for shard_id, sequence_number, sub, data in rows:
                fh.write(json.dumps({"shard_id": shard_id, "sequence_number": sequence_number, "sub_sequence_number": sub,
                                     "data": base64.b64encode(data).decode()}) + "\n")  # fmt: skip
        Path(location, "_STAGED_AS").write_text(os.path.basename(location), encoding="utf-8")  # who wrote what is published
        self.written.append(location)
        if self.during_write is not None:
            self.during_write(plan, location)
        result = {"records": sum(r.records for r in reports), "quarantine_location": None,
                  "reports": [r.to_dict() for r in reports]}  # fmt: skip
        self.results.append(result)
        return result

    def publish(self, staging: str | None, target: str) -> None:
        self.published.append((staging, target))
        if os.path.exists(target):
            shutil.rmtree(target)
        if self.publish_fails:
            raise OSError(f"could not move {staging} to {target} (injected)")
        if staging is None:
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(staging, target)
        _remove_if_empty(os.path.dirname(staging))

    def discard(self, staging: str) -> None:
        self.discarded.append(staging)
        shutil.rmtree(staging, ignore_errors=True)
        _remove_if_empty(os.path.dirname(staging))

    def kill(self) -> None:
        self.killed.set()


def _remove_if_empty(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass  # absent, or another writer's staging directory is in it


def store_paused_at(method: str, reached: threading.Event, resume: threading.Event) -> type[DynamoDBCheckpointStore]:
    """A store whose ``method`` hangs until ``resume`` is set, as if the driver's process were
    paused there; ``reached`` is set when a call arrives."""

    def paused(self: DynamoDBCheckpointStore, *args: Any, **kwargs: Any) -> Any:
        reached.set()
        if not resume.wait(WAIT):
            raise TimeoutError(f"{method} was never resumed")
        return getattr(DynamoDBCheckpointStore, method)(self, *args, **kwargs)

    return type(f"PausedAt_{method}", (DynamoDBCheckpointStore,), {method: paused})


def pause_in_write(wrote: threading.Event, resume: threading.Event) -> Callable[[BatchPlan, str], None]:
    """A ``during_write`` that stalls the job (its output written) until ``resume`` is set."""

    def during_write(plan: BatchPlan, location: str) -> None:
        wrote.set()
        if not resume.wait(WAIT):
            raise TimeoutError("the write was never resumed")

    return during_write


class Background(threading.Thread):
    """``fn(*args)`` in a thread (another driver process); keeps its error."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.args = fn, args
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.fn(*self.args)
        except BaseException as err:  # noqa: BLE001 - the test looks at it
            self.error = err

    def finish(self) -> BaseException | None:
        self.join(WAIT)
        assert not self.is_alive(), "the driver thread did not end"
        return self.error


# -- helpers -----------------------------------------------------------------------------------


@pytest.fixture
def store(dynamodb, unique_name) -> DynamoDBCheckpointStore:
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "lake")
    store.ensure_table()
    return store


def settings(stream: str, root: Path, **kwargs: Any) -> IncrementalSettings:
    values = {"stream_name": stream, "consumer_name": "lake", "output_root": str(root), "cutoff": datetime.now(timezone.utc),
              "min_call_interval": 0.0, **kwargs}  # fmt: skip
    return IncrementalSettings(**values)


def read_rows(location: str) -> list[tuple]:
    """The rows ``(shard_id, sequence_number, sub_sequence_number, data)`` FileJob wrote at ``location``."""
    rows = []
    for path in sorted(Path(location).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            d = json.loads(line)
            rows.append((d["shard_id"], d["sequence_number"], d["sub_sequence_number"], base64.b64decode(d["data"])))
    return rows


def staged_as(location: str) -> str:
    return Path(location, "_STAGED_AS").read_text(encoding="utf-8")


def row_keys(rows: list[tuple]) -> list[tuple]:
    return sorted(r[:3] for r in rows)


def produced_keys(produced: list) -> list[tuple]:
    return sorted(p.key for p in produced)


def handed(kinesis, store, stream: str, root: Path, owner: str = "run-1", lease_seconds: float = LONG_LEASE) -> tuple[BatchPlan, JobArguments]:
    """Plan, probe and persist a batch as ``owner`` (the plan task), and its job's arguments."""
    prepared = prepare_incremental(kinesis, store, settings(stream, root), owner)
    assert prepared.summary is None and prepared.plan is not None
    return prepared.plan, prepared.job_arguments(store, owner, lease_seconds)


def wait_until_lease_expired(store: DynamoDBCheckpointStore, lease_seconds: float) -> None:
    """Sleep until the pending batch's holder missed its lease (heartbeats are epoch ms from this clock)."""
    heartbeat = store.head().pending_heartbeat
    assert heartbeat
    time.sleep(max(0.0, heartbeat / 1000 + lease_seconds + 0.2 - time.time()))


# -- the hand-off through run_incremental -------------------------------------------------------


def test_a_handed_batch_is_committed_exactly_once_from_its_jobs_output(kinesis, dynamodb, store, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 2)
    records = [(f"k{i}", f"a{i}".encode()) for i in range(30)]
    aggregated = [(f"k{i}", f"b{i}".encode()) for i in range(20)]
    produced = put_plain(kinesis, unique_name, records) + put_aggregated(kinesis, unique_name, aggregated, per_aggregate=5)
    root = tmp_path / "out"
    job = FileJob(kinesis, dynamodb)

    summary = run_incremental(kinesis, store, job, settings(unique_name, root), "run-1")

    plan = store.committed_plan()
    assert plan is not None and plan.output_location == f"{root}/batch_id=1"
    assert summary["status"] == "committed" and summary["batch_id"] == 1 and summary["records"] == 50
    assert summary["output_path"] == plan.output_location and summary["reused_plan"] is False
    assert row_keys(read_rows(plan.output_location)) == produced_keys(produced)  # EXACT
    assert os.listdir(root) == ["batch_id=1"]  # no _staging leftovers
    (outcome,) = job.outcomes
    writer = outcome["writer"]
    assert outcome["status"] == "reported" and writer.startswith("run-1/driver-")
    assert job.published == [(staging_location(plan.output_location, writer), plan.output_location)]
    assert staged_as(plan.output_location) == os.path.basename(job.written[0]) and not job.discarded
    assert not job.cancelled.is_set()
    head = store.head()
    assert head.committed_batch_id == 1 and head.pending_batch_id is None and head.committed_report_owner == writer
    committed_report = store.committed_report()
    assert committed_report is not None and [r.to_dict() for r in committed_report] == job.results[0]["reports"]
    checkpoints = store.committed_checkpoints()
    assert {k: v["checkpoint"] for k, v in summary["shards"].items()} == {k: str(v) for k, v in checkpoints.items()}

    # The same summary whatever the job writes to (files here, memory there): a twin stream run by ReaderJob.
    twin = unique_name + "-twin"
    create_stream(kinesis, twin, 2)
    put_plain(kinesis, twin, records)
    put_aggregated(kinesis, twin, aggregated, per_aggregate=5)
    twin_store = DynamoDBCheckpointStore(dynamodb, store.table_name, twin, "lake")
    twin_store.ensure_table()
    in_memory = run_incremental(kinesis, twin_store, ReaderJob(kinesis, dynamodb), settings(twin, tmp_path / "twin"), "run-1")
    assert set(summary) == set(in_memory)
    positional = {"first", "last", "checkpoint"}  # sequence numbers: each stream has its own
    for key in set(summary) - {"stream_name", "output_path", "cutoff", "shards"}:
        assert summary[key] == in_memory[key], key
    assert {k: {f: v for f, v in s.items() if f not in positional} for k, s in summary["shards"].items()} == {
        k: {f: v for f, v in s.items() if f not in positional} for k, s in in_memory["shards"].items()
    }
    assert all(set(s) == set(in_memory["shards"][k]) for k, s in summary["shards"].items())


def test_a_report_that_does_not_match_the_plan_is_never_recorded_nor_published(kinesis, dynamodb, store, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(10)])
    root = tmp_path / "out"
    broken = FileJob(kinesis, dynamodb, drop_range=True)
    with pytest.raises(ReportValidationError):
        run_incremental(kinesis, store, broken, settings(unique_name, root, lease_seconds=LONG_LEASE), "run-1")
    assert len(broken.written) == 1 and broken.discarded == broken.written and not broken.published
    assert not root.exists() or os.listdir(root) == []  # nothing published, staging removed
    head = store.head()
    assert head.committed_batch_id == 0 and head.pending_batch_id == 1 and head.pending_report_owner is None
    assert head.pending_heartbeat == 0  # released: the retry need not wait for the lease

    retry = run_incremental(kinesis, store, FileJob(kinesis, dynamodb), settings(unique_name, root, lease_seconds=LONG_LEASE), "run-2")
    assert retry["status"] == "committed" and retry["reused_plan"] and retry["records"] == 10
    assert row_keys(read_rows(f"{root}/batch_id=1")) == produced_keys(produced)


class DiesHoldingTheLease(FileJob):
    """A driver that claims the batch and is killed (``kill -9``: no release); its spark-submit then fails."""

    def run_handed(self, arguments: JobArguments, *, output_location: str | None = None) -> None:
        store = self.store_class(self.dynamodb, arguments.checkpoint_table, arguments.stream_name, arguments.consumer_name)
        self.writer = writer_id(arguments.lease_owner, "driver")
        store.claim(arguments.batch_id, arguments.lease_owner, self.writer, arguments.lease_seconds)
        raise RuntimeError("the Spark driver was killed (injected)")


def test_release_handed_lets_a_retry_take_the_batch_at_once_after_a_failed_job(kinesis, dynamodb, store, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    produced = put_plain(kinesis, unique_name, [("k", b"a"), ("k", b"b")])
    root = tmp_path / "out"
    dead = DiesHoldingTheLease(kinesis, dynamodb)
    with pytest.raises(RuntimeError, match="injected"):
        run_incremental(kinesis, store, dead, settings(unique_name, root, lease_seconds=LONG_LEASE), "run-1")
    head = store.head()
    assert head.pending_owner == dead.writer and head.pending_heartbeat == 0  # released by the run that handed it over

    retry = run_incremental(kinesis, store, FileJob(kinesis, dynamodb), settings(unique_name, root, lease_seconds=LONG_LEASE), "run-2")
    assert retry["status"] == "committed" and retry["reused_plan"] and retry["records"] == 2
    assert row_keys(read_rows(f"{root}/batch_id=1")) == produced_keys(produced)


def test_release_handed_frees_a_dead_drivers_lease_and_only_its_own(kinesis, dynamodb, store, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    plan, args = handed(kinesis, store, unique_name, tmp_path / "out")
    dead = writer_id("run-1", "driver")
    store.claim(plan.batch_id, "run-1", dead, LONG_LEASE)  # then killed, holding its lease

    retry = FileJob(kinesis, dynamodb)
    with pytest.raises(BatchLeaseHeldError, match=dead):
        retry.run_handed(args)
    assert not retry.written
    store.release_handed(plan.batch_id, "run-1")
    assert store.head().pending_heartbeat == 0
    retry.run_handed(args)
    assert retry.outcomes[0]["status"] == "reported"

    # Once another run took the batch over, run-1's release is a no-op.
    store.take_over(plan.batch_id, "run-2", lease_seconds=LONG_LEASE)
    before = store.head()
    store.release_handed(plan.batch_id, "run-1")
    assert store.head() == before and before.pending_owner == "run-2" and before.pending_heartbeat


# -- the driver's side: run_handed_batch --------------------------------------------------------


def test_a_zombie_driver_publishes_and_records_nothing(kinesis, dynamodb, store, unique_name, tmp_path):
    """Driver A stalls (its lease thread too) past its lease while its job runs; a retry B with the
    same arguments claims the batch and finishes; then A resumes."""
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"z{i}".encode()) for i in range(20)])
    root = tmp_path / "out"
    plan, args = handed(kinesis, store, unique_name, root, lease_seconds=SHORT_LEASE)
    wrote, resume_write, renewing, resume_process = (threading.Event() for _ in range(4))
    zombie = FileJob(kinesis, dynamodb, store_class=store_paused_at("heartbeat", renewing, resume_process),
                     during_write=pause_in_write(wrote, resume_write))  # fmt: skip
    driver_a = Background(zombie.run_handed, args)
    driver_a.start()
    try:
        assert wrote.wait(WAIT) and renewing.wait(WAIT)  # A wrote its staging output; its lease thread hangs
        a_writer = store.head().pending_owner
        assert a_writer and a_writer.startswith("run-1/driver-")
        wait_until_lease_expired(store, SHORT_LEASE)

        retry = FileJob(kinesis, dynamodb)
        retry.run_handed(args)
        (b,) = retry.outcomes
        assert b["status"] == "reported" and b["writer"] != a_writer
        assert store.head().pending_report_owner == b["writer"]

        resume_process.set()  # A's process resumes: its lease thread finds the batch taken over...
        assert zombie.cancelled.wait(WAIT)  # ...and cancels its Spark jobs
    finally:
        resume_process.set()
        resume_write.set()  # A's write returns (the job ended before the cancel reached it)
    error = driver_a.finish()
    assert isinstance(error, CheckpointConflictError), error
    assert not zombie.outcomes and not zombie.published  # A published nothing...
    assert zombie.discarded == zombie.written  # ...and removed its staging output
    head = store.head()
    assert head.pending_report_owner == b["writer"] and head.pending_owner == b["writer"]  # ...and recorded nothing
    assert staged_as(plan.output_location) == os.path.basename(retry.written[0])  # the output is B's
    assert os.listdir(root) == ["batch_id=1"]

    summary = commit_handed(store, plan.batch_id, "run-1", SHORT_LEASE)
    assert summary["status"] == "committed" and summary["records"] == 20
    assert store.head().committed_report_owner == b["writer"]
    assert row_keys(read_rows(plan.output_location)) == produced_keys(produced)  # EXACT


def test_a_driver_paused_before_its_claim_never_reruns_a_reported_batch(kinesis, dynamodb, store, unique_name, tmp_path):
    """Driver A reads the head (no report yet) and stalls before it claims; a retry B claims, writes,
    publishes, records its report and releases the lease; then A resumes and claims.

    Defect: the claim succeeded (B had released its lease), so A ran the batch again over B's
    recorded report; a publish of A's that failed after removing the target then left B's report
    to be committed with no output (ATOM, EXACT).
    """
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"p{i}".encode()) for i in range(12)])
    root = tmp_path / "out"
    plan, args = handed(kinesis, store, unique_name, root)
    claiming, resume = threading.Event(), threading.Event()
    zombie = FileJob(kinesis, dynamodb, store_class=store_paused_at("claim", claiming, resume), publish_fails=True)
    driver_a = Background(zombie.run_handed, args)
    driver_a.start()
    try:
        assert claiming.wait(WAIT)  # A saw no report and is about to claim
        retry = FileJob(kinesis, dynamodb)
        retry.run_handed(args)
        assert retry.outcomes[0]["status"] == "reported"
    finally:
        resume.set()
    error = driver_a.finish()
    assert isinstance(error, CheckpointConflictError), error
    assert not zombie.written and not zombie.published and not zombie.outcomes
    assert store.head().pending_report_owner == retry.outcomes[0]["writer"]
    assert staged_as(plan.output_location) == os.path.basename(retry.written[0])

    summary = commit_handed(store, plan.batch_id, "run-1", LONG_LEASE)
    assert summary["status"] == "committed" and summary["records"] == 12
    assert row_keys(read_rows(plan.output_location)) == produced_keys(produced)  # EXACT


def test_stale_job_arguments_are_refused_and_write_nothing(kinesis, dynamodb, store, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    root = tmp_path / "out"
    plan, args = handed(kinesis, store, unique_name, root)
    store.take_over(plan.batch_id, "run-2", lease_seconds=0)  # run-1 was given up; its retry took the batch over
    stale = FileJob(kinesis, dynamodb)
    with pytest.raises(CheckpointConflictError, match="held by run-2"):
        stale.run_handed(args)
    assert not stale.written and not stale.published and not root.exists()
    head = store.head()
    assert head.pending_owner == "run-2" and head.pending_report_owner is None

    # Nor may they run a batch that was discarded (the next plan will have the same batch id).
    store.discard_pending(plan.batch_id, "run-2")
    with pytest.raises(CheckpointConflictError, match="is not pending"):
        stale.run_handed(args)
    assert not stale.written and not root.exists()


def test_a_live_driver_blocks_a_second_driver_of_its_batch(kinesis, dynamodb, store, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a"), ("k", b"b")])
    root = tmp_path / "out"
    plan, args = handed(kinesis, store, unique_name, root, lease_seconds=SHORT_LEASE)
    wrote, resume = threading.Event(), threading.Event()
    first = FileJob(kinesis, dynamodb, during_write=pause_in_write(wrote, resume))
    driver_a = Background(first.run_handed, args)
    driver_a.start()
    try:
        assert wrote.wait(WAIT)
        holder = store.head().pending_owner
        time.sleep(SHORT_LEASE + 0.5)  # longer than the lease: A renews it while its job runs
        second = FileJob(kinesis, dynamodb)
        with pytest.raises(BatchLeaseHeldError, match=f"being run by {holder}"):
            second.run_handed(args)
        assert not second.written and not second.published and store.head().pending_owner == holder
    finally:
        resume.set()
    assert driver_a.finish() is None
    assert first.outcomes[0]["status"] == "reported" and not first.cancelled.is_set()
    assert commit_handed(store, plan.batch_id, "run-1", SHORT_LEASE)["records"] == 2


# -- the commit's side: commit_handed -----------------------------------------------------------


def test_commit_handed_needs_the_report_and_is_idempotent(kinesis, dynamodb, store, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"c{i}".encode()) for i in range(8)])
    root = tmp_path / "out"
    plan, args = handed(kinesis, store, unique_name, root)

    with pytest.raises(ReportNotRecordedError, match=r"no job holds it \(holder run-1\)") as no_job:
        commit_handed(store, plan.batch_id, "run-1", LONG_LEASE)
    assert no_job.value.job_running is False

    wrote, resume = threading.Event(), threading.Event()
    job = FileJob(kinesis, dynamodb, during_write=pause_in_write(wrote, resume))
    driver = Background(job.run_handed, args)
    driver.start()
    try:
        assert wrote.wait(WAIT)
        with pytest.raises(ReportNotRecordedError, match=r"its job is running \(writer run-1/driver-") as running:
            commit_handed(store, plan.batch_id, "run-1", LONG_LEASE)
        assert running.value.job_running is True
    finally:
        resume.set()
    assert driver.finish() is None
    assert store.head().committed_batch_id == 0  # nothing committed by the refused commits

    summary = commit_handed(store, plan.batch_id, "run-1", LONG_LEASE)
    assert summary["status"] == "committed" and summary["batch_id"] == 1 and summary["records"] == 8
    assert store.head().committed_owner.startswith("run-1/commit-")
    again = commit_handed(store, plan.batch_id, "run-1", LONG_LEASE)  # a retried commit task
    assert again["status"] == "committed"
    assert {k: v for k, v in again.items() if k != "reused_plan"} == {k: v for k, v in summary.items() if k != "reused_plan"}

    late = FileJob(kinesis, dynamodb)  # the job runs again (a retried spark-submit) after the commit
    late.run_handed(args)
    assert late.outcomes[0]["status"] == "already_committed" and not late.written and not late.published
    assert row_keys(read_rows(plan.output_location)) == produced_keys(produced)
    assert os.listdir(root) == ["batch_id=1"]


def test_the_commit_claims_a_reported_batch_before_its_driver_released_the_lease(kinesis, dynamodb, store, unique_name, tmp_path):
    """Between a driver's record_report and its release, the batch is done: the commit (a
    deferred task the trigger woke on "reported") claims it at once instead of failing with
    BatchLeaseHeldError; a second driver still cannot re-run it."""
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [(f"k{i}", f"r{i}".encode()) for i in range(5)])
    plan, args = handed(kinesis, store, unique_name, tmp_path / "out")
    driver = "run-1/driver-live"
    store.claim(plan.batch_id, "run-1", driver, LONG_LEASE, before_report=True)
    reports = probe_ranges(kinesis, unique_name, plan.ranges, min_call_interval=0)
    store.record_report(plan.batch_id, driver, reports)  # recorded, lease still live (no release yet)
    with pytest.raises((BatchLeaseHeldError, CheckpointConflictError)):  # a driver never re-runs a reported batch
        store.claim(plan.batch_id, "run-1", "run-1/driver-second", LONG_LEASE, before_report=True)
    summary = commit_handed(store, plan.batch_id, "run-1", LONG_LEASE)
    assert summary["status"] == "committed" and summary["records"] == sum(r.records for r in reports)


# -- unit level: the arguments and the staging location ------------------------------------------

VALID = {"checkpoint_table": "kinesis_checkpoints", "stream_name": "orders", "consumer_name": "lake", "batch_id": 42,
         "lease_owner": "orders_dag.load.manual__2024-05-01T12:00:00+00:00.try1.0a1b2c3d", "lease_seconds": 120.0}  # fmt: skip


@pytest.mark.parametrize("lease_seconds", [120.0, 1.5, 0.2, 86400, 100 / 3])
@pytest.mark.parametrize("extra", [{}, {"records_expected": True, "region_name": "eu-west-1"}], ids=["defaults", "all"])
def test_job_arguments_round_trip_through_the_command_line(lease_seconds, extra):
    arguments = JobArguments(**{**VALID, "lease_seconds": lease_seconds, **extra})
    argv = arguments.to_args()
    assert job_arguments_from(argv) == arguments
    assert job_arguments_from(["--transform", "pkg.mod:fn", *argv, "--max-records-per-shard", "5"]) == arguments  # others ignored


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"batch_id": 0}, "batch_id"),
        ({"batch_id": True}, "batch_id"),
        ({"lease_owner": "run#1"}, "lease_owner"),
        ({"lease_owner": ""}, "lease_owner"),
        ({"checkpoint_table": "t!"}, "checkpoint table"),
        ({"checkpoint_table": "ab"}, "checkpoint table"),
        ({"stream_name": "a b"}, "stream name"),
        ({"consumer_name": "a/b"}, "consumer_name"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"lease_seconds": -1.0}, "lease_seconds"),
        ({"lease_seconds": math.nan}, "lease_seconds"),
        ({"lease_seconds": math.inf}, "lease_seconds"),
    ],
)
def test_invalid_job_arguments_are_refused_naming_the_argument(change, argument):
    with pytest.raises(ValueError, match=argument):
        JobArguments(**{**VALID, **change})


@pytest.mark.parametrize(
    ("option", "value", "argument"),
    [("--batch-id", "0", "batch_id"), ("--lease-owner", "run#1", "lease_owner"), ("--checkpoint-table", "t!", "checkpoint table"),
     ("--lease-seconds", "nan", "lease_seconds")],
)  # fmt: skip
def test_invalid_command_line_arguments_are_refused_naming_the_argument(option, value, argument):
    argv = JobArguments(**VALID).to_args()
    argv[argv.index(option) + 1] = value
    with pytest.raises(ValueError, match=argument):
        job_arguments_from(argv)


@pytest.mark.parametrize(
    "output", ["s3://lake/orders/lake/batch_id=7", "/data/out/batch_id=7", "/data/out/batch_id=7/", "file:///data/out/batch_id=7"]
)
def test_staging_is_under_the_outputs_parent_one_directory_per_writer(output):
    parent = output.rstrip("/").rpartition("/")[0]
    first, second = writer_id("run-1", "driver"), writer_id("run-1", "driver")
    assert first != second and first.startswith("run-1/driver-") and len(first) == len("run-1/driver-") + 12
    staged = staging_location(output, first)
    assert staged.startswith(f"{parent}/{STAGING_DIR}/batch_id=7-")
    assert "/" not in staged[len(f"{parent}/{STAGING_DIR}/") :]  # one directory, whatever the writer id holds
    assert staged == staging_location(output, first) != staging_location(output, second)


# -- what a deferred task waits on (core.job.handed_batch_state) --------------------------------

def _state(head: Head, **kwargs: Any) -> str | None:
    args = {"now_ms": 1_000_000, "handed_at_ms": 990_000, "job_start_timeout": 60.0, **kwargs}
    state = handed_batch_state(head, 3, "run-1", 30.0, **args)
    return None if state is None else state["status"]


def test_the_report_trigger_decides_from_the_head_alone():
    pending = {"committed_batch_id": 2, "pending_batch_id": 3}
    assert _state(Head(**pending, pending_owner="run-1", pending_heartbeat=990_000)) is None  # handed, not claimed yet
    assert _state(Head(**pending, pending_owner="run-1"), now_ms=990_000 + 61_000) == "no_report"  # no job claimed it in time
    assert _state(Head(**pending, pending_owner="run-1/driver-a", pending_heartbeat=995_000)) is None  # running
    assert _state(Head(**pending, pending_owner="run-1/driver-a", pending_heartbeat=960_000)) == "no_report"  # lease expired
    assert _state(Head(**pending, pending_owner="run-1/driver-a", pending_heartbeat=0)) == "no_report"  # released: failed
    assert _state(Head(**pending, pending_owner="run-1/driver-a", pending_report_owner="run-1/driver-a")) == "reported"
    assert _state(Head(**pending, pending_owner="run-2", pending_heartbeat=999_000)) == "taken_over"
    assert _state(Head(committed_batch_id=3)) == "committed"
    assert _state(Head(committed_batch_id=2)) == "not_pending"  # discarded


@pytest.mark.parametrize("heartbeat", [0, None])
def test_a_released_lease_is_reported_as_released_not_as_an_age(heartbeat):
    # release() / release_handed() set pending_heartbeat to 0: there is no lease age to give
    head = Head(committed_batch_id=2, pending_batch_id=3, pending_owner="run-1/driver-a", pending_heartbeat=heartbeat)
    state = handed_batch_state(head, 3, "run-1", 30.0, now_ms=1_795_773_070_000, handed_at_ms=990_000, job_start_timeout=60.0)
    assert state is not None and state["status"] == "no_report"
    assert "released its lease" in state["message"] and "run-1/driver-a" in state["message"]
    assert " s ago" not in state["message"] and "1795773" not in state["message"]
