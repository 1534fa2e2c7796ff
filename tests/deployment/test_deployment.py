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
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import pytest

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.deployment import AirflowDeployment
from demo.producer import Produced, committed_rows, put_aggregated, put_plain, verify
from demo.run_demo import log_lines
from tests.conftest import create_stream, make_client

pytestmark = [pytest.mark.deployment, pytest.mark.slow, pytest.mark.dags, pytest.mark.spark, pytest.mark.timeout(900)]

SENSORS, MICROBATCH, EVENT_DRIVEN, DOWNSTREAM = "kinesis_sensors", "kinesis_microbatch", "kinesis_event_driven", "kinesis_asset_downstream"
DAGS = [SENSORS, MICROBATCH, EVENT_DRIVEN, DOWNSTREAM]
#: The task of each DAG whose XCom is a batch summary (or, downstream, the batches it followed).
SUMMARY_TASK = {MICROBATCH: "ingest_access_log", SENSORS: "ingest", EVENT_DRIVEN: "ingest_backlog", DOWNSTREAM: "new_batches"}
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


def wait_for(deployment: AirflowDeployment, what: str, check: Callable[[], T | None], timeout: float) -> T:
    """Poll ``check`` until it returns a truthy value; fail at once when a component exits or a task fails."""
    deadline = time.monotonic() + timeout
    while True:
        deployment.check_running()
        failed = deployment.query(
            "SELECT dag_id, run_id, task_id, state FROM task_instance WHERE dag_id = ANY(%s) AND state = ANY(%s)", (DAGS, FAILED_STATES)
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
