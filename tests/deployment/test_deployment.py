"""The example DAGs under a real deployment: scheduler (LocalExecutor), triggerer, DAG processor and
API server as separate processes on PostgreSQL, against moto.

One scenario, shared by the tests below (run once, at the first test):

1. ``kinesis_sensors`` and ``kinesis_event_driven`` are unpaused on an empty stream: the lag
   sensor defers to the triggerer; the event-driven DAG's backlog trigger polls and does not fire.
2. Records A are put (more than the backlog threshold): the lag sensor's trigger fires and the
   sensor completes; the backlog trigger fires and the event-driven DAG ingests A.
3. Records B are put; ``kinesis_microbatch`` (20-second schedule) and ``kinesis_asset_downstream``
   are unpaused: scheduled runs ingest A (unless the sensors DAG's batch did) and B; records C
   are put, a later scheduled run ingests them; the downstream DAG runs on each batch's asset
   event.
4. The committed Parquet output of both consumers is read back and checked against the
   producer's log.

Then, on the same deployment, one deferred batch (``dag_deferred_batch.py``, fixture
``deferred``): ``KinesisToSparkOperator(deferrable=True)`` on a local master in a pool of one
slot hands its batch to a detached Spark driver and defers; while the job runs (held at a gate
until the test has looked), the pool shows the slot free and a probe task in the same pool runs
and finishes; then the job records its report, the trigger fires and the task resumes and commits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import pytest

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.deployment import AirflowDeployment
from demo.producer import Produced, committed_rows, put_aggregated, put_plain, verify
from demo.run_demo import log_lines
from tests.conftest import TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream, make_client
from tests.deployment.job_gate import GATE_ENV, reached_marker

pytestmark = [pytest.mark.deployment, pytest.mark.slow, pytest.mark.dags, pytest.mark.spark, pytest.mark.timeout(900)]

SENSORS, MICROBATCH, EVENT_DRIVEN, DOWNSTREAM = "kinesis_sensors", "kinesis_microbatch", "kinesis_event_driven", "kinesis_asset_downstream"
DAGS = [SENSORS, MICROBATCH, EVENT_DRIVEN, DOWNSTREAM]
#: The deferred batch's DAGs (tests/deployment/dag_deferred_batch.py), run after the scenario.
DEFERRED, PROBE = "kinesis_deferred_batch", "kinesis_slot_probe"
DEFERRED_TASK, PROBE_TASK = "ingest_deferred", "use_the_slot"
DEFERRED_DAGS = [DEFERRED, PROBE]
#: The task of each DAG whose XCom is a batch summary (or, downstream, the batches it followed).
SUMMARY_TASK = {MICROBATCH: "ingest_access_log", SENSORS: "ingest", EVENT_DRIVEN: "ingest_backlog", DOWNSTREAM: "new_batches",
                DEFERRED: DEFERRED_TASK, PROBE: PROBE_TASK}
LAG_SENSOR_TASK = "wait_for_backlog"
FAILED_STATES = ["failed", "up_for_retry", "upstream_failed"]
#: Polls of the backlog trigger seen without records before any are put.
QUIET_POLLS = 3
#: Records put: A (before any DAG ingests), B and C (each for one scheduled run). A passes the
#: backlog threshold (KINESIS_BACKLOG_MIN_RECORDS, 300); B and C together stay below it.
PUTS = (400, 100, 100)
T = TypeVar("T")


@dataclass
class Scenario:
    """What the scenario did and saw; each test checks one part of it."""

    settings: dict[str, str]
    dynamodb: Any
    produced: list[list[Produced]] = field(default_factory=list)  # per put: A, B, C
    put_times: list[datetime] = field(default_factory=list)
    sensor_deferred_to: str | None = None
    sensor_state: str | None = None
    sensor_log: str = ""
    sensors_run_state: str | None = None
    quiet_polls: int = 0
    event_driven_runs_before_records: int = -1
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    microbatch_events: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def committed(self, consumer: str, output: str) -> tuple[int, list[tuple]]:
        """(committed batch id, committed output rows) of a consumer."""
        store = DynamoDBCheckpointStore(self.dynamodb, self.settings["KINESIS_CHECKPOINT_TABLE"], self.settings["KINESIS_STREAM"], consumer)
        head = store.head().committed_batch_id
        return head, committed_rows(Path(output), head, with_batch_id=True)


def wait_for(deployment: AirflowDeployment, what: str, check: Callable[[], T | None], timeout: float, dags: list[str] = DAGS) -> T:
    """Poll ``check`` until it returns a truthy value; fail at once when a component exits or a
    task of ``dags`` fails."""
    deadline = time.monotonic() + timeout
    while True:
        deployment.check_running()
        failed = deployment.query(
            "SELECT dag_id, run_id, task_id, state FROM task_instance WHERE dag_id = ANY(%s) AND state = ANY(%s)", (dags, FAILED_STATES)
        )
        assert not failed, f"task instances failed while waiting for {what}: {failed}\n{deployment.diagnostics()}"
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}\n{deployment.diagnostics()}"
        time.sleep(2)


def xcom_value(value: Any) -> Any:
    """An XCom ``value`` column as Airflow 3 stores it (JSON, possibly a JSON-encoded string)."""
    while isinstance(value, str):
        value = json.loads(value)
    return value


def dag_runs(deployment: AirflowDeployment, dag_id: str) -> list[dict[str, Any]]:
    """Runs of a DAG, oldest first, with the XCom of its ``SUMMARY_TASK``."""
    rows = deployment.query(
        "SELECT dr.run_id, dr.run_type, dr.state, dr.data_interval_end, x.value FROM dag_run dr "
        "LEFT JOIN xcom x ON x.dag_run_id = dr.id AND x.task_id = %s AND x.key = 'return_value' "
        "WHERE dr.dag_id = %s ORDER BY dr.id",
        (SUMMARY_TASK[dag_id], dag_id),
    )
    return [
        {"run_id": r[0], "run_type": r[1], "state": r[2], "data_interval_end": r[3], "summary": xcom_value(r[4]) if r[4] is not None else None}
        for r in rows
    ]


def ti_state(deployment: AirflowDeployment, dag_id: str, task_id: str) -> tuple[str | None, str | None]:
    """(state, classpath of the trigger it waits on) of the latest task instance of a task."""
    rows = deployment.query(
        "SELECT ti.state, t.classpath FROM task_instance ti LEFT JOIN trigger t ON t.id = ti.trigger_id "
        "WHERE ti.dag_id = %s AND ti.task_id = %s ORDER BY ti.start_date DESC NULLS LAST",
        (dag_id, task_id),
    )
    return rows[0] if rows else (None, None)


def microbatch_asset_events(deployment: AirflowDeployment) -> list[dict[str, Any]]:
    """Asset events of kinesis_microbatch's runs, with the downstream run that consumed each (if any)."""
    rows = deployment.query(
        "SELECT e.id, e.source_run_id, e.extra, dr.run_id, dr.state FROM asset_event e "
        "LEFT JOIN dagrun_asset_event dae ON dae.event_id = e.id "
        "LEFT JOIN dag_run dr ON dr.id = dae.dag_run_id AND dr.dag_id = %s "
        "WHERE e.source_dag_id = %s ORDER BY e.id",
        (DOWNSTREAM, MICROBATCH),
    )
    return [{"id": r[0], "source_run_id": r[1], "extra": xcom_value(r[2]) or {}, "downstream_run_id": r[3], "downstream_state": r[4]} for r in rows]


def put_lines(kinesis, stream: str, lines: list[tuple[str, bytes]]) -> list[Produced]:
    """Half plain, half KPL-aggregated, as the demo does."""
    half = len(lines) // 2
    return put_plain(kinesis, stream, lines[:half]) + put_aggregated(kinesis, stream, lines[half:])


@pytest.fixture(scope="module")
def scenario(deployment: AirflowDeployment, deployment_settings, moto_endpoint) -> Scenario:
    started = time.monotonic()
    seen = Scenario(settings=deployment_settings, dynamodb=make_client("dynamodb", moto_endpoint))
    stream = deployment_settings["KINESIS_STREAM"]
    kinesis = make_client("kinesis", moto_endpoint)
    create_stream(kinesis, stream, 3)
    lines = log_lines()
    offsets = [sum(PUTS[:i]) for i in range(len(PUTS) + 1)]
    batches = [lines[offsets[i] : offsets[i + 1]] for i in range(len(PUTS))]

    def mark(name: str) -> None:
        seen.seconds[name] = round(time.monotonic() - started, 1)

    def put(batch: list[tuple[str, bytes]]) -> None:
        seen.produced.append(put_lines(kinesis, stream, batch))
        time.sleep(0.05)  # arrival timestamps have millisecond precision: cut off strictly after the puts
        seen.put_times.append(datetime.now(timezone.utc))

    def parsed() -> bool:
        rows = deployment.query("SELECT dag_id FROM dag WHERE dag_id = ANY(%s) AND NOT is_stale", (DAGS,))
        return len(rows) == len(DAGS)

    wait_for(deployment, "the DAG processor to parse the example DAGs", parsed, 180)
    mark("dags_parsed")

    # 1. No records: the lag sensor defers to the triggerer; the backlog trigger polls, quietly.
    deployment.cli("dags", "unpause", SENSORS)
    deployment.cli("dags", "unpause", EVENT_DRIVEN)

    def deferred() -> str | None:
        state, classpath = ti_state(deployment, SENSORS, LAG_SENSOR_TASK)
        return classpath if state == "deferred" else None

    seen.sensor_deferred_to = wait_for(deployment, f"{LAG_SENSOR_TASK} to defer", deferred, 180)
    mark("sensor_deferred")
    quiet = f"backlog of {stream}/{deployment_settings['KINESIS_EVENT_DRIVEN_CONSUMER']} after batch"

    def quiet_polls() -> int | None:
        polls = sum(1 for line in (deployment.log_dir / "triggerer.log").read_text(errors="replace").splitlines() if quiet in line and "not due" in line)
        return polls if polls >= QUIET_POLLS else None

    seen.quiet_polls = wait_for(deployment, f"{QUIET_POLLS} polls of the backlog trigger", quiet_polls, 180)
    seen.event_driven_runs_before_records = len(dag_runs(deployment, EVENT_DRIVEN))
    mark("backlog_trigger_quiet")

    # 2. Records A: the sensor completes; the backlog trigger fires and the event-driven DAG ingests.
    put(batches[0])

    def sensed_and_ingested() -> bool:
        sensor = ti_state(deployment, SENSORS, LAG_SENSOR_TASK)[0]
        sensors_ingest = ti_state(deployment, SENSORS, SUMMARY_TASK[SENSORS])[0]
        return sensor == "success" and sensors_ingest == "success"

    wait_for(deployment, f"{LAG_SENSOR_TASK} and the ingestion after it to succeed", sensed_and_ingested, 300)
    seen.sensor_state = ti_state(deployment, SENSORS, LAG_SENSOR_TASK)[0]
    seen.sensor_log = "\n".join(p.read_text(errors="replace") for p in deployment.task_logs(SENSORS) if f"task_id={LAG_SENSOR_TASK}" in str(p))
    mark("sensor_done")

    # 3. Scheduled micro-batches (after the sensors DAG's ingest: they share its consumer's lease).
    def wait_for_a_run_after_the_last_put() -> None:
        put_time, index = seen.put_times[-1], len(seen.put_times)

        def covered() -> bool:
            runs = dag_runs(deployment, MICROBATCH)
            return any(r["run_type"] == "scheduled" and r["state"] == "success" and r["data_interval_end"] >= put_time for r in runs)

        wait_for(deployment, f"a scheduled {MICROBATCH} run cut off after put {index}", covered, 300)
        mark(f"microbatch_after_put_{index}")

    put(batches[1])
    deployment.cli("dags", "unpause", DOWNSTREAM)
    deployment.cli("dags", "unpause", MICROBATCH)
    wait_for_a_run_after_the_last_put()
    put(batches[2])
    wait_for_a_run_after_the_last_put()

    def event_driven_ingested() -> bool:
        return any(r["state"] == "success" and (r["summary"] or {}).get("records") for r in dag_runs(deployment, EVENT_DRIVEN))

    wait_for(deployment, f"{EVENT_DRIVEN} to ingest", event_driven_ingested, 300)
    mark("event_driven_ingested")

    # 4. The sensors DAG run ends (its resharding watch times out and is skipped: no resharding);
    #    the downstream DAG has run on every batch event so far.
    def sensors_run_done() -> str | None:
        rows = deployment.query("SELECT state FROM dag_run WHERE dag_id = %s ORDER BY id", (SENSORS,))
        return rows[0][0] if rows and rows[0][0] in ("success", "failed") else None

    seen.sensors_run_state = wait_for(deployment, f"the {SENSORS} run to end", sensors_run_done, 300)
    mark("sensors_run_done")
    last_event = microbatch_asset_events(deployment)[-1]["id"]

    def consumed() -> list[dict[str, Any]] | None:
        events = [e for e in microbatch_asset_events(deployment) if e["id"] <= last_event]
        return events if all(e["downstream_state"] == "success" for e in events) else None

    seen.microbatch_events = wait_for(deployment, f"{DOWNSTREAM} to run on every batch event", consumed, 180)
    mark("downstream_done")
    seen.runs = {dag_id: dag_runs(deployment, dag_id) for dag_id in DAGS}
    print(f"deployment scenario timings (s): {json.dumps(seen.seconds)}")
    return seen


def test_scheduled_runs_ingest_the_records_put_before_their_cutoff(scenario: Scenario):
    runs = [r for r in scenario.runs[MICROBATCH] if r["run_type"] == "scheduled" and r["state"] == "success"]
    ingesting = {r["summary"]["batch_id"]: r for r in runs if r["summary"] and r["summary"]["records"] > 0}
    _, rows = scenario.committed(scenario.settings["KINESIS_CONSUMER"], scenario.settings["KINESIS_OUTPUT_PATH"])
    batch_of = {(shard, seq, sub): batch_id for batch_id, shard, seq, sub, *_ in rows}
    # B went to scheduled runs; C, put after a run that covered B had succeeded, to later ones
    b_batches = {batch_of[p.key] for p in scenario.produced[1]}
    c_batches = {batch_of[p.key] for p in scenario.produced[2]}
    assert b_batches | c_batches <= set(ingesting), (b_batches, c_batches, scenario.runs[MICROBATCH])
    assert max(b_batches) < min(c_batches)
    assert len(ingesting) >= 2
    sensors_batch = sum((r["summary"] or {}).get("records", 0) for r in scenario.runs[SENSORS])
    assert sensors_batch + sum(r["summary"]["records"] for r in ingesting.values()) == sum(len(p) for p in scenario.produced)


def test_deferrable_sensor_waits_in_the_triggerer_and_completes(scenario: Scenario):
    assert scenario.sensor_deferred_to is not None and scenario.sensor_deferred_to.endswith("KinesisShardLagTrigger")
    assert scenario.sensor_state == "success"
    assert "ready (from the trigger)" in scenario.sensor_log
    assert scenario.sensors_run_state == "success"


def test_committed_output_holds_exactly_the_produced_records(scenario: Scenario):
    produced = [p for put in scenario.produced for p in put]
    head, rows = scenario.committed(scenario.settings["KINESIS_CONSUMER"], scenario.settings["KINESIS_OUTPUT_PATH"])
    verdict = verify(produced, [row[1:] for row in rows])
    assert verdict.records_in == len(produced) > 0
    assert verdict.ok, verdict
    assert verdict.records_out == verdict.records_in and verdict.duplicates == 0 and verdict.missing == 0
    assert head >= 2


def test_event_driven_dag_waits_for_the_backlog_then_ingests_it(scenario: Scenario):
    assert scenario.quiet_polls >= QUIET_POLLS and scenario.event_driven_runs_before_records == 0
    runs = [r for r in scenario.runs[EVENT_DRIVEN] if r["state"] == "success" and (r["summary"] or {}).get("records")]
    assert runs and runs[0]["run_type"] == "asset_triggered", scenario.runs[EVENT_DRIVEN]
    first = runs[0]["summary"]
    settings = scenario.settings
    _, rows = scenario.committed(settings["KINESIS_EVENT_DRIVEN_CONSUMER"], settings["KINESIS_EVENT_DRIVEN_OUTPUT_PATH"])
    # The first run ingested the records A, whose count passed the threshold, and whatever was put
    # before its cutoff (B, when the run planned after B was put: it depends on how fast the
    # scheduler starts it); never a record twice or one nobody put. What is left stays below the
    # threshold, so there is no second batch with records.
    first_rows = [row[1:] for row in rows if row[0] == first["batch_id"]]
    verdict = verify([p for put in scenario.produced for p in put], first_rows)
    assert verdict.duplicates == verdict.unexpected == verdict.data_mismatches == 0, verdict
    assert {p.key for p in scenario.produced[0]} <= {tuple(row[:3]) for row in first_rows}
    assert first["records"] == len(first_rows) >= int(settings["KINESIS_BACKLOG_MIN_RECORDS"])
    assert not runs[1:], "what is left after the first batch is below the threshold: no second batch with records"


def test_downstream_dag_runs_on_every_batch_asset_event(scenario: Scenario):
    events = scenario.microbatch_events
    with_records = {e["extra"]["batch_id"] for e in events if e["extra"].get("records")}
    assert len(with_records) >= 2, events
    assert all(e["downstream_state"] == "success" for e in events), events
    followed = {r["run_id"]: r["summary"] for r in scenario.runs[DOWNSTREAM]}
    seen_batches = {b["batch_id"] for e in events for b in followed[e["downstream_run_id"]]["batches"]}
    assert seen_batches == with_records


# -- The deferred batch (dag_deferred_batch.py), after the scenario above ------------------------

#: Records put on the deferred batch's own stream (half plain, half KPL-aggregated), on 2 shards.
DEFERRED_PUT = 200
REPORT_TRIGGER = "airflow_kinesis_spark.triggers.kinesis.KinesisBatchReportTrigger"


@dataclass
class DeferredScenario:
    """What the deferred batch did and what the deployment showed meanwhile."""

    settings: dict[str, str]
    produced: list[Produced] = field(default_factory=list)
    deferred_to: str | None = None
    #: The process that ran the task until it deferred (``task_instance.pid``).
    task_pid: int | None = None
    #: The Spark driver's process (written by the job at the gate).
    driver_pid: int | None = None
    #: The checkpoint store's head while the job waits at its gate.
    head_at_gate: Any = None
    #: The Spark driver's environment (``/proc/{pid}/environ``) while it waits at its gate.
    driver_env: dict[str, str] = field(default_factory=dict)
    #: ``GET /api/v2/pools/{pool}`` while the batch is deferred, before the probe.
    pool_while_deferred: dict[str, Any] = field(default_factory=dict)
    #: The probe's task instance once it succeeded (state, pool, start and end).
    probe: dict[str, Any] = field(default_factory=dict)
    #: Taken right after the probe succeeded, the gate still closed.
    after_probe: dict[str, Any] = field(default_factory=dict)
    #: The batch's task instance at the end.
    ti: dict[str, Any] = field(default_factory=dict)
    run_state: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    committed_batch_id: int = 0
    rows: list[tuple] = field(default_factory=list)
    asset_events: list[dict[str, Any]] = field(default_factory=list)
    #: The task's log (both executions) and the trigger's (its own file, and the triggerer's log).
    task_log: str = ""
    trigger_log: str = ""
    seconds: dict[str, float] = field(default_factory=dict)


def task_instance(deployment: AirflowDeployment, dag_id: str, task_id: str) -> dict[str, Any]:
    """The latest task instance of a task ({} when there is none)."""
    rows = deployment.query(
        "SELECT state, pool, try_number, pid, start_date, end_date, next_method FROM task_instance "
        "WHERE dag_id = %s AND task_id = %s ORDER BY start_date DESC NULLS LAST",
        (dag_id, task_id),
    )
    keys = ("state", "pool", "try_number", "pid", "start_date", "end_date", "next_method")
    return dict(zip(keys, rows[0], strict=True)) if rows else {}


def process_alive(pid: int | None) -> bool:
    import psutil

    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def process_environment(pid: int) -> dict[str, str]:
    """A process's environment as it started (Linux ``/proc/{pid}/environ``)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.decode(errors="replace").partition("=")[::2] for entry in raw.split(b"\0") if entry)


@pytest.fixture(scope="module")
def deferred(deployment: AirflowDeployment, deployment_settings, moto_endpoint) -> Iterator[DeferredScenario]:
    """One ``KinesisToSparkOperator(deferrable=True)`` batch on a local master, in a pool of one slot:

    1. Records are put on the batch's own stream; the pool gets one slot; the batch is triggered.
    2. The task hands the batch to a detached spark-submit and defers; the job reads and waits at
       its gate (``job_gate``) holding the batch's lease. Meanwhile the pool's slots are read
       through the API, and the probe DAG, whose task needs the pool's only slot, runs.
    3. The gate opens: the job writes and records its report, the trigger fires, the task resumes
       and commits.

    Its tests come last in this module, so it runs after the scenario above (on the same
    deployment), but it does not depend on it.
    """
    started = time.monotonic()
    settings = deployment_settings
    seen = DeferredScenario(settings=settings)
    gate = Path(settings[GATE_ENV])
    stream, pool = settings["KINESIS_DEFERRED_STREAM"], settings["KINESIS_DEFERRED_POOL"]
    dynamodb = make_client("dynamodb", moto_endpoint)
    store = DynamoDBCheckpointStore(dynamodb, settings["KINESIS_CHECKPOINT_TABLE"], stream, settings["KINESIS_DEFERRED_CONSUMER"])

    def mark(name: str) -> None:
        seen.seconds[name] = round(time.monotonic() - started, 1)

    def wait(what: str, check: Callable[[], T | None], timeout: float = 300) -> T:
        return wait_for(deployment, what, check, timeout, dags=DEFERRED_DAGS)

    try:
        wait("the DAG processor to parse the deferred batch's DAGs",
             lambda: len(deployment.query("SELECT dag_id FROM dag WHERE dag_id = ANY(%s) AND NOT is_stale", (DEFERRED_DAGS,))) == 2)
        kinesis = make_client("kinesis", moto_endpoint)
        create_stream(kinesis, stream, 2)
        seen.produced = put_lines(kinesis, stream, log_lines()[:DEFERRED_PUT])
        time.sleep(0.05)  # arrival timestamps have millisecond precision: plan strictly after the puts
        deployment.cli("pools", "set", pool, "1", "one slot: the deferred batch and the probe")
        deployment.cli("dags", "trigger", DEFERRED)  # its DAGs are not paused at creation
        mark("triggered")

        def deferred_state() -> str | None:
            state, classpath = ti_state(deployment, DEFERRED, DEFERRED_TASK)
            return classpath if state == "deferred" else None

        seen.deferred_to = wait(f"{DEFERRED_TASK} to defer", deferred_state)
        seen.task_pid = task_instance(deployment, DEFERRED, DEFERRED_TASK)["pid"]
        mark("deferred")
        marker = reached_marker(gate)
        seen.driver_pid = int(wait("the deferred batch's Spark job to reach its gate", lambda: marker.exists() and marker.read_text()))
        seen.head_at_gate = store.head()
        seen.driver_env = process_environment(seen.driver_pid)
        mark("job_at_gate")
        seen.pool_while_deferred = deployment.api(f"pools/{pool}")

        deployment.cli("dags", "trigger", PROBE)

        def probed() -> dict[str, Any] | None:
            probe = task_instance(deployment, PROBE, PROBE_TASK)
            return probe if probe.get("state") == "success" else None

        seen.probe = wait(f"{PROBE_TASK} to run in the pool's slot", probed)
        seen.after_probe = {
            "batch_state": ti_state(deployment, DEFERRED, DEFERRED_TASK)[0],
            "head": store.head(),
            "gate_open": gate.exists(),
            "driver_alive": process_alive(seen.driver_pid),
            "task_process_alive": process_alive(seen.task_pid),
        }
        mark("probe_done")

        gate.touch()

        def batch_done() -> str | None:
            rows = deployment.query("SELECT state FROM dag_run WHERE dag_id = %s ORDER BY id", (DEFERRED,))
            return rows[-1][0] if rows and rows[-1][0] in ("success", "failed") else None

        seen.run_state = wait(f"the {DEFERRED} run to end", batch_done)
        mark("committed")
        seen.ti = task_instance(deployment, DEFERRED, DEFERRED_TASK)
        seen.summary = dag_runs(deployment, DEFERRED)[-1]["summary"] or {}
        seen.committed_batch_id = store.head().committed_batch_id
        seen.rows = committed_rows(Path(settings["KINESIS_DEFERRED_OUTPUT_PATH"]), seen.committed_batch_id)
        seen.asset_events = [
            {"source_run_id": r[0], "extra": xcom_value(r[1]) or {}}
            for r in deployment.query("SELECT source_run_id, extra FROM asset_event WHERE source_dag_id = %s ORDER BY id", (DEFERRED,))
        ]
        logs = sorted(p for p in (deployment.home / "logs").glob(f"dag_id={DEFERRED}/**/*") if p.is_file())
        seen.task_log = "\n".join(p.read_text(errors="replace") for p in logs if ".trigger" not in p.name)
        seen.trigger_log = "\n".join(p.read_text(errors="replace") for p in logs if ".trigger" in p.name)
        seen.trigger_log += (deployment.log_dir / "triggerer.log").read_text(errors="replace")
        print(f"deferred batch timings (s): {json.dumps(seen.seconds)}")
        yield seen
    finally:
        gate.touch()  # never leave a job waiting at its gate


def test_deferred_batch_waits_in_the_triggerer_while_its_job_runs_outside_the_worker(deferred: DeferredScenario):
    assert deferred.deferred_to == REPORT_TRIGGER
    batch_id = deferred.summary["batch_id"]
    head = deferred.head_at_gate
    # The job claimed the handed batch under a writer id of its own and holds its lease; no report yet.
    assert head.pending_batch_id == batch_id and head.committed_batch_id == batch_id - 1, head
    assert "/driver-" in (head.pending_owner or "") and not head.pending_report_owner, head
    # The task's process exited when it deferred; the driver, a process of its own, went on.
    assert deferred.task_pid is not None and deferred.driver_pid is not None
    assert not deferred.after_probe["task_process_alive"] and deferred.after_probe["driver_alive"], deferred.after_probe
    assert "handed to its Spark job (local driver, process" in deferred.task_log
    # The detached driver got none of the worker's Airflow variables (connections with their
    # secrets, configuration), and temporary credentials instead of the connection's keys.
    env = deferred.driver_env
    assert env and not [k for k in env if k.startswith(("AIRFLOW_", "_AIRFLOW"))], sorted(env)
    assert not [k for k, v in env.items() if TEST_SECRET_KEY in v], "the connection's secret reached the Spark driver"
    assert env.get("AWS_SESSION_TOKEN") and env.get("AWS_ACCESS_KEY_ID") not in (None, TEST_ACCESS_KEY)


def test_deferred_batch_frees_its_worker_slot(deferred: DeferredScenario):
    pool = deferred.pool_while_deferred
    assert pool["slots"] == 1 and pool["include_deferred"] is False, pool
    assert pool["deferred_slots"] == 1, pool
    assert pool["running_slots"] == pool["queued_slots"] == pool["occupied_slots"] == 0 and pool["open_slots"] == 1, pool
    # The probe needs the pool's only slot: it ran and finished while the batch stayed deferred,
    # its job still at the gate (no report recorded).
    assert deferred.probe["state"] == "success" and deferred.probe["pool"] == deferred.settings["KINESIS_DEFERRED_POOL"]
    after = deferred.after_probe
    assert after["batch_state"] == "deferred" and not after["gate_open"], after
    assert after["head"].pending_batch_id == deferred.summary["batch_id"] and not after["head"].pending_report_owner, after


def test_deferred_batch_resumes_and_commits_its_records_exactly_once(deferred: DeferredScenario):
    assert deferred.run_state == "success" and deferred.ti["state"] == "success", deferred.ti
    assert deferred.ti["pool"] == deferred.settings["KINESIS_DEFERRED_POOL"] and deferred.ti["try_number"] == 1, deferred.ti
    summary = deferred.summary
    assert summary["status"] == "committed" and summary["batch_id"] == deferred.committed_batch_id
    assert summary["records"] == len(deferred.rows) == len(deferred.produced) == DEFERRED_PUT
    verdict = verify(deferred.produced, deferred.rows)
    assert verdict.ok, verdict
    assert verdict.records_out == verdict.records_in and verdict.duplicates == 0 and verdict.missing == 0
    batch_id = summary["batch_id"]
    # The trigger fired on the recorded report; the task ran again (same try) and committed.
    assert f"batch {batch_id}: report recorded by" in deferred.trigger_log
    log = deferred.task_log
    assert 0 <= log.find("deferring until its report is recorded") < log.find(f"Batch {batch_id} committed: {DEFERRED_PUT} records"), log[-3000:]
    assert [e["extra"].get("batch_id") for e in deferred.asset_events] == [batch_id], deferred.asset_events
    assert deferred.asset_events[0]["extra"]["records"] == DEFERRED_PUT


def test_deferred_batch_summary_has_the_blocking_paths_shape(deferred: DeferredScenario, scenario: Scenario):
    blocking = next(r["summary"] for r in scenario.runs[MICROBATCH] if r["summary"] and r["summary"]["records"] > 0)
    summary = deferred.summary
    assert set(summary) == set(blocking), (sorted(set(summary) ^ set(blocking)))
    assert summary["stream_name"] == deferred.settings["KINESIS_DEFERRED_STREAM"]
    assert summary["consumer_name"] == deferred.settings["KINESIS_DEFERRED_CONSUMER"]
    assert summary["reused_plan"] is False and summary["bytes"] > 0
    assert summary["output_path"].endswith(f"batch_id={summary['batch_id']}")
    shards, blocking_shards = summary["shards"], blocking["shards"]
    assert len(shards) == 2 and sum(s["records"] for s in shards.values()) == summary["records"]
    assert {key for s in shards.values() for key in s} == {key for s in blocking_shards.values() for key in s}
