"""Crash points: kill -9 the operator's process (and the Spark job it started), or only the Spark
driver, at each step of a batch; a re-run must leave every record committed exactly once.

Kills land exactly: the proxy in front of moto holds the request of the step (or lets it apply
and holds its answer: the ambiguous commit), or the harness watches the step's visible effect.

Every point runs with ``consumer_type="polling"`` and ``"efo"`` (the job subscribes through a local
SubscribeToShard server behind the proxy; a kill mid-read leaves its subscriptions open there, and
the re-run waits out ``ResourceInUseException``). ``EFO_CRASH_POINTS`` selects the EFO points:
``all`` (the default) or a comma-separated list of point names; the others are skipped.
"""

from __future__ import annotations

import os
import time

import pytest

from demo.producer import put_aggregated, put_plain
from tests.conftest import create_stream
from tests.reliability.harness import SLOW_WRITE, Consumer, fault_stack, kill_group, kill_spark_driver, reading, wait_until

pytestmark = [pytest.mark.reliability, pytest.mark.spark, pytest.mark.slow]

LEASE = 2.0


#: With EFO, seconds between two SubscribeToShard events relayed to the job while a kill mid-read
#: is pending (the local server pushes a shard's 200 records in one event: the read would be over
#: before the harness sees it).
EFO_EVENT_DELAY = 0.5


@pytest.fixture
def consumer_type() -> str:
    return "polling"


@pytest.fixture
def setup(moto_endpoint, kinesis, dynamodb, unique_name, tmp_path, consumer_type):
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"10.2.{i % 9}.1", f"plain {i}".encode()) for i in range(200)])
    produced += put_aggregated(kinesis, unique_name, [(f"10.2.{i % 4}.2", f"agg {i}".encode()) for i in range(200)])
    (tmp_path / "logs").mkdir()
    with fault_stack(moto_endpoint, consumer_type) as proxy:
        yield Consumer(unique_name, "lake", f"{unique_name}_t", tmp_path / "out", proxy, dynamodb, tmp_path / "logs",
                       consumer_type=consumer_type), produced  # fmt: skip


POINTS = [
    "after_plan_persisted",
    "mid_read",
    "spark_driver_mid_read",
    "mid_write",
    "after_write_before_report",
    "after_report_before_commit",
    "commit_ambiguous",
]
EFO_POINTS = POINTS if os.environ.get("EFO_CRASH_POINTS", "all") == "all" else os.environ["EFO_CRASH_POINTS"].split(",")
assert set(EFO_POINTS) <= set(POINTS), f"EFO_CRASH_POINTS: unknown points {set(EFO_POINTS) - set(POINTS)}"


def cases() -> list:
    skip = pytest.mark.skip(reason="EFO_CRASH_POINTS leaves this point out")
    return [pytest.param(point, consumer_type, id=f"{point}-{consumer_type}",
                         marks=[skip] if consumer_type == "efo" and point not in EFO_POINTS else [])
            for consumer_type in ("polling", "efo") for point in POINTS]  # fmt: skip


@pytest.mark.parametrize(("point", "consumer_type"), cases())
def test_kill_at(point, consumer_type, setup):
    consumer, produced = setup
    proxy = consumer.proxy
    efo = consumer_type == "efo"
    if efo and point in ("mid_read", "spark_driver_mid_read"):
        proxy.event_delay = EFO_EVENT_DELAY
    extra: tuple[str, ...] = ()
    if point == "mid_write":
        extra = ("--transform", "slow_write:slow", "--py-files", str(SLOW_WRITE))
    holds = {
        "after_write_before_report": ("PutItem", "#REPORT#", "before"),
        "after_report_before_commit": ("PutItem", "#CKPT#", "before"),
        "commit_ambiguous": ("UpdateItem", "SET committed_batch_id", "after"),
    }
    proxy.hold = holds.get(point)
    proc = consumer.start(*extra)
    if point == "after_plan_persisted":
        reached = wait_until(lambda: consumer.store.head().pending_batch_id == 1, 120, proc)
    elif point in ("mid_read", "spark_driver_mid_read"):
        reached = wait_until(reading(consumer, 1 if efo else 3), 180, proc)
    elif point == "mid_write":
        # The job writes to its staging directory ({output}/_staging/batch_id=1-{writer digest},
        # core.job.staging_location) and publishes it once written and still holding the lease.
        reached = wait_until(lambda: any((consumer.output / "_staging").glob("batch_id=1-*/_temporary")), 180, proc)
    else:
        reached = proxy.held.wait(180)
    assert reached, f"{point} never reached:\n{consumer.last_log()[-3000:]}"
    if point == "spark_driver_mid_read":
        assert kill_spark_driver(proc), "no Spark driver JVM found"
        assert proc.wait(timeout=120) == 1  # the operator fails; nothing committed
        assert "The Spark job of batch 1 failed" in consumer.last_log()
    else:
        kill_group(proc)
    proxy.hold = None
    proxy.event_delay = 0.0

    head = consumer.store.head()
    consumer.observe()
    if point == "commit_ambiguous":
        assert head.committed_batch_id == 1 and head.pending_batch_id is None  # the commit applied
    else:
        assert head.committed_batch_id == 0 and head.pending_batch_id == 1  # ATOM: nothing committed
        assert consumer.rows() == []

    time.sleep(LEASE + 0.2)  # the killed run's lease expires
    summary = consumer.run(*extra)  # the task's retry: the same arguments (a pending plan records the transform)
    if point == "commit_ambiguous":
        assert summary["status"] == "no_new_records"
    else:
        assert summary["reused_plan"] is True and summary["batch_id"] == 1
        if point == "after_report_before_commit":  # the output was written and recorded: no second job
            assert "committing without re-running Spark" in consumer.last_log()
            assert "Submitting the Spark job" not in consumer.last_log()
    if efo:  # the batch was read with enhanced fan-out
        assert proxy.operations["SubscribeToShardEvent"] > 0, dict(proxy.operations)
    verdict = consumer.check(produced)
    assert verdict.records_out == len(produced) == 400


def test_killing_only_the_worker_process_takes_its_spark_job_down(setup):
    """kill -9 of the operator's process alone (a worker lost to the OOM killer): its spark-submit
    must not run on as a zombie writing the batch's output. Two things end it: the broken pipe of
    its output, and PR_SET_PDEATHSIG set on it (this test passes with either alone)."""
    import os
    import signal

    import psutil

    consumer, produced = setup
    proc = consumer.start()
    assert wait_until(reading(consumer), 180, proc), consumer.last_log()[-3000:]
    jvms = [c for c in psutil.Process(proc.pid).children(recursive=True) if "java" in c.name()]
    assert jvms, "no Spark JVM under the operator process"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    gone, alive = psutil.wait_procs(jvms, timeout=30)
    assert not alive, f"Spark JVMs outlived their worker: {[p.pid for p in alive]}"
    time.sleep(LEASE + 0.2)
    consumer.run()
    assert consumer.check(produced).records_out == 400
