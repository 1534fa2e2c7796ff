"""The batch handed to its Spark job through the checkpoint store (``core.job``), attacked with real
spark-submit jobs (issue #14, "What it must show"):

* kill -9 of the job's driver mid-read (its Python process, which holds the lease, or its JVM):
  the re-run commits the batch exactly once and the checkpoints move once;
* kill -9 of the task after its job recorded the report, before the commit: the re-run commits
  the recorded report without running Spark again;
* a zombie driver: paused (SIGSTOP) mid-read for longer than its lease while a retry takes the
  batch over and commits it, then resumed (SIGCONT): it publishes nothing, records nothing, and
  the committed output stays exactly once.

Every state is waited for by polling the store, the proxy or the file system (never a fixed sleep),
with generous timeouts: the suite runs on a loaded two-core machine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from airflow_kinesis_spark.core.job import staging_location
from airflow_kinesis_spark.core.locations import batch_output_location
from demo.producer import put_aggregated, put_plain
from tests.conftest import create_stream
from tests.reliability.fault_proxy import FaultProxy
from tests.reliability.harness import (
    Consumer,
    kill_group,
    kill_spark_driver,
    reading,
    signal_processes,
    spark_processes,
    wait_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.spark, pytest.mark.slow]

#: GetRecords limit of the job's readers: small, so the read lasts seconds (kills land mid-read).
LIMIT = "5"
RECORDS = 1000 + 200  # plain + aggregated user records


@pytest.fixture
def setup(moto_endpoint, kinesis, dynamodb, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"10.4.{i % 13}.1", f"plain {i}".encode()) for i in range(1000)])
    produced += put_aggregated(kinesis, unique_name, [(f"10.4.{i % 5}.2", f"agg {i}".encode()) for i in range(200)])
    proxy = FaultProxy(moto_endpoint).start()
    (tmp_path / "logs").mkdir()
    consumer = Consumer(unique_name, "lake", f"{unique_name}_t", tmp_path / "out", proxy, dynamodb, tmp_path / "logs")
    yield consumer, produced
    proxy.stop()


# -- helpers -----------------------------------------------------------------------------------


def args(lease: float) -> tuple[str, ...]:
    return ("--lease", str(lease), "--limit", LIMIT)


def batch_log_owners(consumer: Consumer, batch_id: int, kind: str) -> set[str]:
    """The writers of batch ``batch_id``'s ``kind`` items (``PLAN``, ``REPORT``, ``CKPT``) in the
    batch log (keys ``BATCH#{id:020d}#{kind}#{writer}#{chunk}``, ``core.store``)."""
    prefix = f"BATCH#{batch_id:020d}#{kind}#"
    owners: set[str] = set()
    for page in consumer.dynamodb.get_paginator("query").paginate(
        TableName=consumer.table, KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
        ExpressionAttributeValues={":pk": {"S": f"{consumer.stream}|{consumer.name}"}, ":p": {"S": prefix}},
        ConsistentRead=True,
    ):  # fmt: skip
        owners.update(item["sk"]["S"][len(prefix) :].rsplit("#", 1)[0] for item in page.get("Items", []))
    return owners


def listing(path: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and directory under ``path`` (itself included): inode, size, mtime (ns). A
    publish replaces the directory (a new inode) and Spark names its files after its write job.
    The ``_SUCCESS`` marker the checkpoint commit adds (sinks.parquet) is not the job's output: it
    is left out, and so is the directory's own mtime, which adding it changes."""
    out = {".": (path.stat().st_ino, 0, 0)}
    for item in sorted(path.rglob("*")):
        if item.name == "_SUCCESS":
            continue
        st = item.stat()
        out[str(item.relative_to(path))] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def lease_expired(consumer: Consumer, lease: float) -> bool:
    head = consumer.store.head()
    return (time.time() * 1000 - (head.pending_heartbeat or 0)) / 1000 > lease + 0.5


def driver_of(consumer: Consumer, proc, timeout: float = 180) -> str:
    """The writer id of the job's driver once it claimed the batch (``{owner}/driver-{random}``)."""
    assert wait_until(lambda: "/driver-" in (consumer.store.head().pending_owner or ""), timeout, proc), (
        f"no driver claimed the batch:\n{consumer.last_log()[-3000:]}"
    )
    return consumer.store.head().pending_owner  # type: ignore[return-value]


def summary_owner(consumer: Consumer) -> str:
    """The lease owner of the last committed batch (its commit writer is ``{owner}/commit-{random}``)."""
    return (consumer.store.head().committed_owner or "").split("/")[0]


def run_log(consumer: Consumer, run: int) -> str:
    return (consumer.log_dir / f"run{run:03d}.log").read_text()


def assert_gone(processes: list[psutil.Process], what: str, timeout: float = 120) -> None:
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    assert not alive, f"{what} outlived their job: {[(p.pid, p.name()) for p in alive]}"


def assert_committed_once(consumer: Consumer, produced, summary: dict, *, report_owner: str) -> None:
    """EXACT, MONO; batch 1 committed once, from one report (``report_owner``'s) and one set of
    checkpoints; a further run finds nothing new (the checkpoints do not move again)."""
    assert summary["status"] == "committed" and summary["batch_id"] == 1 and summary["reused_plan"] is True, summary
    assert summary["records"] == len(produced) == RECORDS
    verdict = consumer.check(produced)
    assert verdict.ok, verdict
    head = consumer.store.head()
    assert head.committed_batch_id == 1 and head.pending_batch_id is None
    assert head.committed_report_owner == report_owner
    assert batch_log_owners(consumer, 1, "REPORT") == {report_owner}  # no other writer recorded a report
    assert batch_log_owners(consumer, 1, "CKPT") == {head.committed_owner}  # one commit wrote checkpoints
    checkpoints = {k: str(v) for k, v in consumer.store.committed_checkpoints(head).items()}
    assert checkpoints == {k: v["checkpoint"] for k, v in summary["shards"].items()}
    again = consumer.run(*args(2.0))
    assert again["status"] == "no_new_records", again
    after = consumer.store.head()
    assert (after.committed_batch_id, after.committed_owner, after.pending_batch_id) == (1, head.committed_owner, None)
    assert consumer.check(produced).ok


# -- 1. the driver killed mid-read ------------------------------------------------------------


@pytest.mark.parametrize("target", ["driver", "jvm"])
def test_driver_killed_mid_read_then_rerun_commits_exactly_once(target, setup):
    """kill -9 of the job's Python driver (it claimed the batch and holds its lease) or of its JVM,
    while the executors read: the task fails and frees the batch; the re-run takes it over at once
    (no wait for the lease), re-runs the job from the same plan and commits it once."""
    consumer, produced = setup
    lease = 3.0
    proc = consumer.start(*args(lease))
    writer = driver_of(consumer, proc)
    owner = writer.split("/")[0]
    assert wait_until(reading(consumer, calls=5), 180, proc), f"the job never read:\n{consumer.last_log()[-3000:]}"
    spark = spark_processes(proc)
    assert spark["jvm"] and spark["driver"], spark
    assert kill_spark_driver(proc, target), f"no Spark {target} found"
    assert proc.wait(timeout=300) == 1, consumer.last_log()[-3000:]
    assert "The Spark job of batch 1 failed" in consumer.last_log()
    # Nothing of the killed job lives on to heartbeat, publish or record (its JVM, its driver, its workers).
    assert_gone([p for group in spark.values() for p in group], f"the Spark processes (after killing the {target})")

    head = consumer.store.head()
    consumer.observe()
    assert (head.committed_batch_id, head.pending_batch_id, head.pending_report_owner) == (0, 1, None)  # ATOM
    assert head.pending_owner == writer  # the killed driver was the last holder ...
    assert not (consumer.output / "batch_id=1").exists() and consumer.rows() == []  # ... and published nothing
    assert batch_log_owners(consumer, 1, "REPORT") == set()

    # The failed task released the batch (its job's processes ended): the re-run takes it at once.
    summary = consumer.run(*args(lease))
    log = consumer.last_log()
    assert f"took over pending batch 1 from {writer}" in log, log[-3000:]
    rerun_driver = consumer.store.head().committed_report_owner or ""
    assert rerun_driver.startswith(summary_owner(consumer) + "/driver-") and not rerun_driver.startswith(owner + "/")
    assert_committed_once(consumer, produced, summary, report_owner=rerun_driver)


# -- 2. the task killed after the report, before the commit -------------------------------------


@pytest.mark.parametrize(
    "point",
    [
        # the driver's report applied; the task (and with it the driver) dies before any answer
        "report_applied",
        # the driver finished and released the batch; the task dies as its commit claims the batch
        "commit_claim",
    ],
)
def test_task_killed_after_the_report_rerun_commits_without_spark(point, setup):
    """kill -9 of the task (the operator's process group, its job included) once the job published
    its output and recorded its report, before the commit: the re-run commits the recorded report
    as it is (no second Spark job, the published files untouched), exactly once."""
    consumer, produced = setup
    proxy = consumer.proxy
    lease = 3.0
    proxy.hold = {
        "report_applied": ("UpdateItem", "SET pending_report_owner", "after"),
        "commit_claim": ("UpdateItem", "/commit-", "before"),
    }[point]
    proc = consumer.start(*args(lease))
    assert wait_until(proxy.held.is_set, 300, proc), f"{point} never reached:\n{consumer.last_log()[-3000:]}"
    kill_group(proc)  # kill -9 of the task's process group (the operator, spark-submit, the driver)
    proxy.hold = None

    head = consumer.store.head()
    consumer.observe()
    driver = head.pending_report_owner or ""
    assert "/driver-" in driver, head  # the report is recorded, by the job's driver ...
    assert (head.committed_batch_id, head.pending_batch_id) == (0, 1) and consumer.rows() == []  # ... uncommitted (ATOM)
    published = listing(consumer.output / "batch_id=1")  # the driver published before it recorded

    assert wait_until(lambda: lease_expired(consumer, lease), 120), "the killed run's lease never expired"
    summary = consumer.run(*args(lease))
    log = consumer.last_log()
    assert "committing without re-running Spark" in log, log[-3000:]
    assert "Submitting the Spark job" not in log and "Spark-Submit cmd" not in log
    assert listing(consumer.output / "batch_id=1") == published  # the output was not written again
    assert summary_owner(consumer) != driver.split("/")[0]  # committed by the re-run ...
    assert_committed_once(consumer, produced, summary, report_owner=driver)  # ... from the killed task's report


# -- 3. a zombie driver ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "paused",
    [
        # only the driver's Python process (lease thread, publish, report): its JVM goes on and
        # writes every task's output to the zombie's staging directory (the write job's own
        # commit then waits on the paused driver: Spark updates its accumulators there)
        "driver",
        # the whole Spark application (JVM, Python driver, Python workers), as in a stalled VM
        "application",
    ],
)
def test_zombie_driver_resumed_after_a_takeover_writes_nothing(paused, setup):
    """SIGSTOP of the job's driver mid-read for longer than its lease; a retry (another task
    process, as after Airflow gave up on the first) takes the batch over, runs its own job and
    commits; SIGCONT: the zombie finds itself fenced, publishes nothing, records nothing and
    removes its staging directory; the head and the committed files stay the retry's."""
    consumer, produced = setup
    lease = 5.0
    zombie = consumer.start(*args(lease))
    zombie_run = consumer.runs
    writer = driver_of(consumer, zombie)
    owner = writer.split("/")[0]
    assert wait_until(reading(consumer, calls=5), 180, zombie), f"the job never read:\n{consumer.last_log()[-3000:]}"

    stopped: list[psutil.Process] = []
    for _ in range(5):  # the JVM first (no new tasks, no new workers), then what it started
        spark = spark_processes(zombie)
        group = spark["driver"] if paused == "driver" else spark["jvm"] + spark["driver"] + spark["workers"]
        new = [p for p in group if p.pid not in {s.pid for s in stopped}]
        if not new:
            break
        signal_processes(new, signal.SIGSTOP)
        stopped += new
    assert [p for p in stopped if p in spark_processes(zombie)["driver"]], "the Python driver was not paused"
    try:
        head = consumer.store.head()
        assert head.pending_owner == writer and head.pending_report_owner is None, head  # paused mid-job
        staging = Path(staging_location(batch_output_location(str(consumer.output), 1), writer))
        if paused == "driver":  # its JVM writes the staged output the zombie would publish: every task committed
            found = re.compile(r"batch 1: \d+ shard ranges read by (\d+) Spark tasks").search
            assert wait_until(lambda: found(consumer.last_log()), 120), consumer.last_log()[-3000:]
            tasks = int(found(consumer.last_log()).group(1))  # type: ignore[union-attr]
            assert wait_until(lambda: len(list(staging.glob("_temporary/0/task_*"))) >= tasks, 300, zombie), (
                consumer.last_log()[-3000:]
            )
        assert wait_until(lambda: lease_expired(consumer, lease), 120), "the paused driver's lease never expired"

        # The retry: takes the batch over from the zombie, runs its own job, commits.
        summary = consumer.run(*args(lease), timeout=600)
        head = consumer.store.head()
        retry = summary_owner(consumer)
        assert retry != owner and f"took over pending batch 1 from {writer}" in consumer.last_log()
        retry_driver = head.committed_report_owner or ""
        assert retry_driver.startswith(retry + "/driver-"), head
        assert f"published {consumer.output / 'batch_id=1'}" in consumer.last_log()  # (what the zombie must not log)
        assert consumer.check(produced).ok
        committed = listing(consumer.output / "batch_id=1")
        assert zombie.poll() is None  # the zombie's task still waits on its paused job
    finally:
        signal_processes(stopped, signal.SIGCONT)

    # The zombie wakes up: it finds the batch taken over and stops without publishing or recording.
    assert zombie.wait(timeout=600) == 1, run_log(consumer, zombie_run)[-3000:]
    assert_gone(stopped, "the zombie's Spark processes")
    text = run_log(consumer, zombie_run)
    assert "CheckpointConflictError" in text and "The Spark job of batch 1 failed" in text, text[-3000:]
    assert f"published {consumer.output / 'batch_id=1'}" not in text  # kinesis_batch.publish logs every publish
    assert json.loads(text.strip().splitlines()[-1])["error"]
    after = consumer.store.head()
    assert after == head  # the head: the retry's commit, untouched
    assert after.committed_report_owner == retry_driver and not after.committed_report_owner.startswith(owner + "/")
    assert batch_log_owners(consumer, 1, "REPORT") == {retry_driver}  # no report of the zombie
    assert listing(consumer.output / "batch_id=1") == committed  # no file of the zombie published
    assert not staging.exists(), sorted(os.listdir(staging))  # its staged output discarded
    assert_committed_once(consumer, produced, summary, report_owner=retry_driver)
