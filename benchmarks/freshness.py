"""Freshness of the event-driven DAG: a record's arrival to its committed output (issue 17, item 7).

    python -m benchmarks.freshness [--batches 30] [--shards 2] [--rate 4] [--poll 5]

Everything runs on this machine, as an operator runs Airflow: moto in server mode (Kinesis,
DynamoDB), a PostgreSQL metadata database and Airflow's API server, scheduler (LocalExecutor),
DAG processor and triggerer as separate processes (``demo.deployment``, the deployment the
deployment tests use), a warm Spark Connect server (``local[2]``) as ``spark_default``, and the
example DAG ``dags/kinesis_event_driven.py`` as shipped, configured through its environment
variables for low latency: any waiting record is due (no count or age threshold) and the
backlog trigger polls every ``--poll`` seconds.

A producer thread puts a steady trickle of records (``--rate`` records a second, one
``PutRecord`` each, random partition keys over ``--shards`` shards). The benchmark polls the
consumer's head in the checkpoint store every 0.2 s and stops once ``--batches`` batches with
records committed after the warm-up batches (the first runs start the Spark Connect session and
its Python workers; they are reported apart).

**Freshness of a record** = the commit time of the batch that holds it (``committed_at``, which
the protocol writes into the head in the same conditional update that advances the
checkpoints: the moment the output becomes committed) minus the record's
``ApproximateArrivalTimestamp`` (set by moto when the record is put). Both are read from the
same clock: every process runs on this machine (wall clock, UTC, millisecond precision).
``p50_s`` and ``p95_s`` are over every record of the measured batches.

**Stages** (per batch, medians): from the oldest record's arrival to the trigger's measurement
(``measured_at`` of its event), to the asset event (``asset_event.timestamp``), to the run
(``dag_run.queued_at``), to the task's start (``task_instance.start_date``), to the plan
(``created_at`` of the stored plan: the batch's cutoff), to the commit (``committed_at``), to
the task's end (``task_instance.end_date``).

The last line printed is the JSON result (:func:`run_freshness`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["run_freshness", "freshness_section", "freshness_targets", "TARGET_P50_S", "TARGET_P95_S"]

#: The issue's targets (seconds).
TARGET_P50_S = 15.0
TARGET_P95_S = 30.0
#: Seconds the Spark Connect server has to start listening.
CONNECT_START_TIMEOUT = 300.0
DAG_ID = "kinesis_event_driven"
TASK_ID = "ingest_backlog"
CONSUMER = "freshness"


def _percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, linear between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _utc(value: Any) -> datetime | None:
    """A timestamp from the metadata database or the store, as aware UTC (``None`` stays ``None``)."""
    from airflow_kinesis_spark.core.positions import parse_timestamp

    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    return parse_timestamp(str(value))


class _Producer(threading.Thread):
    """Puts ``rate`` records a second (one ``PutRecord`` each, random partition keys) until stopped."""

    def __init__(self, kinesis: Any, stream: str, lines: list[bytes], rate: float) -> None:
        super().__init__(daemon=True)
        self.kinesis, self.stream, self.lines, self.rate = kinesis, stream, lines, rate
        self.produced: list[Any] = []
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        from demo.producer import put_plain

        interval = 1.0 / self.rate
        next_put = time.monotonic()
        i = 0
        while not self._halt.is_set():
            line = self.lines[i % len(self.lines)] + f" #{i}".encode()
            try:
                self.produced += put_plain(self.kinesis, self.stream, [(f"pk-{random.getrandbits(32)}", line)])
            except Exception:  # noqa: BLE001 - counted; a trickle goes on
                self.errors += 1
            i += 1
            next_put += interval
            self._halt.wait(max(0.0, next_put - time.monotonic()))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


@contextmanager
def _stack(work: Path, settings: dict[str, str]) -> Iterator[tuple[Any, str]]:
    """moto, PostgreSQL, a warm Spark Connect server and the Airflow deployment running the
    event-driven DAG; yields (deployment, moto endpoint).

    The deployment runs a snapshot of the package and the DAG file taken now (``work/src``,
    first on ``PYTHONPATH``): files edited in the checkout while it runs do not reach it (an
    edited ``core`` would also change the job's artifact, and the consumer's Spark Connect
    session could not be reused).
    """
    from demo.deployment import airflow_deployment, postgres_server
    from demo.stack import ROOT, moto_server, spark_connect_server

    snapshot = work / "src"
    for name in ("airflow_kinesis_spark", "spark_scripts"):
        shutil.copytree(ROOT / name, snapshot / name, ignore=shutil.ignore_patterns("__pycache__"))
    with ExitStack() as stack:
        moto = stack.enter_context(moto_server())
        # A JVM start takes minutes on a loaded machine (2 cores shared): more than the default 120 s.
        connect = stack.enter_context(spark_connect_server(cores=2, timeout=CONNECT_START_TIMEOUT))
        (work / "logs").mkdir(parents=True, exist_ok=True)
        pg = stack.enter_context(postgres_server(work / "logs"))
        dags = work / "dags"
        dags.mkdir(parents=True, exist_ok=True)
        (dags / "kinesis_event_driven.py").write_text((ROOT / "dags" / "kinesis_event_driven.py").read_text())
        env = {
            **settings,
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": connect[0], "port": connect[1]}),
            # A new DAG's asset watcher is registered when its file is next parsed.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
            "PYTHONPATH": os.pathsep.join([str(snapshot), str(ROOT)]),
        }
        deployment = stack.enter_context(airflow_deployment(work, moto, pg, dags, env))
        yield deployment, moto


def _client(service: str, endpoint: str) -> Any:
    import boto3

    from demo.stack import ACCESS_KEY, REGION, SECRET_KEY

    return boto3.client(service, endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY)  # fmt: skip


def _runs(deployment: Any) -> dict[int, dict[str, Any]]:
    """Per committed batch id: its run's and task's times and the earliest asset event it consumed."""
    rows = deployment.query(
        "SELECT dr.id, dr.queued_at, dr.start_date, ti.start_date, ti.end_date, x.value FROM dag_run dr "
        "JOIN task_instance ti ON ti.dag_id = dr.dag_id AND ti.run_id = dr.run_id AND ti.task_id = %s "
        "LEFT JOIN xcom x ON x.dag_run_id = dr.id AND x.task_id = %s AND x.key = 'return_value' "
        "WHERE dr.dag_id = %s ORDER BY dr.id",
        (TASK_ID, TASK_ID, DAG_ID),
    )
    events = deployment.query(
        "SELECT dae.dag_run_id, e.timestamp, e.extra FROM dagrun_asset_event dae JOIN asset_event e ON e.id = dae.event_id "
        "ORDER BY e.timestamp"
    )
    first_event: dict[int, tuple[Any, Any]] = {}
    for run_pk, timestamp, extra in events:
        first_event.setdefault(run_pk, (timestamp, extra))
    by_batch: dict[int, dict[str, Any]] = {}
    for run_pk, queued, started, ti_start, ti_end, value in rows:
        while isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, dict) or not value.get("records"):
            continue
        timestamp, extra = first_event.get(run_pk, (None, None))
        while isinstance(extra, str):
            extra = json.loads(extra)
        payload = (extra or {}).get("payload") or {}
        by_batch[int(value["batch_id"])] = {
            "measured_at": _utc(payload.get("measured_at")) if payload.get("measured_at") else None,
            "event_at": _utc(timestamp), "run_queued_at": _utc(queued), "run_started_at": _utc(started),
            "task_started_at": _utc(ti_start), "task_ended_at": _utc(ti_end), "records": int(value["records"]),
        }  # fmt: skip
    return by_batch


#: The operator's log line when the Spark job starts (after planning and the job's credentials).
_JOB_START = re.compile(r"Running the Spark job of batch (\d+)")


def _job_starts(deployment: Any) -> dict[int, datetime]:
    """Per batch id, when its task logged the start of the Spark job (task logs: JSON lines)."""
    starts: dict[int, datetime] = {}
    for path in deployment.task_logs(DAG_ID):
        for line in path.read_text(errors="replace").splitlines():
            match = _JOB_START.search(line)
            if match is None:
                continue
            try:
                starts[int(match.group(1))] = _utc(json.loads(line)["timestamp"])  # type: ignore[assignment]
            except (ValueError, KeyError, TypeError):
                continue
    return starts


def run_freshness(
    batches: int = 30,
    *,
    shards: int = 4,
    records_per_second: float = 4.0,
    poll_seconds: float = 5.0,
    warmup_batches: int = 2,
    timeout: float | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Run the event-driven DAG on a real deployment under a steady trickle; measure freshness.

    :param batches: batches with records to measure (after the warm-up).
    :param shards: shards of the stream.
    :param records_per_second: the trickle's rate (records a second, over all shards).
    :param poll_seconds: the backlog trigger's ``poke_interval`` (seconds, at least 5).
    :param warmup_batches: batches with records before the measured ones (reported apart).
    :param timeout: seconds for the whole measurement once the DAG is unpaused (default 60 per batch + 300).
    :param log: a callable taking one message (progress), default ``print``.
    :returns: ``p50_s``, ``p95_s`` (seconds, over every record of the measured batches),
        ``batches``, ``records``, the settings, per-stage medians (``stages_s``), per-batch rows
        (``per_batch``), the warm-up batches, and the exactly-once check (``duplicates``).
    :raises RuntimeError: the deployment did not start, or ``batches`` were not committed in time.
    """
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
    from benchmarks.workload import access_log_lines
    from demo.producer import KEY_COLUMNS, committed_rows, verify
    from demo.stack import ROOT

    say = log or (lambda msg: print(f"[freshness {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True))
    timeout = timeout if timeout is not None else 60.0 * (batches + warmup_batches) + 300.0
    work = Path(tempfile.mkdtemp(prefix="kinesis-freshness-"))
    stream = f"freshness{random.getrandbits(24):06x}"
    table = f"{stream}_checkpoints"
    output = work / "output"
    settings = {
        "KINESIS_STREAM": stream,
        "KINESIS_CHECKPOINT_TABLE": table,
        "KINESIS_EVENT_DRIVEN_CONSUMER": CONSUMER,
        "KINESIS_EVENT_DRIVEN_OUTPUT_PATH": str(output),
        # Low latency: any waiting record is due; poll at the given interval.
        "KINESIS_BACKLOG_MIN_RECORDS": "",
        "KINESIS_BACKLOG_MIN_AGE_SECONDS": "",
        "KINESIS_BACKLOG_POLL_SECONDS": f"{poll_seconds:g}",
    }
    lines = access_log_lines(ROOT / "data" / "apache_access_log.gz")
    say(f"starting moto, Spark Connect, PostgreSQL and Airflow in {work}")
    started = time.monotonic()
    with _stack(work, settings) as (deployment, moto):
        say(f"deployment healthy after {time.monotonic() - started:.0f} s")
        kinesis = _client("kinesis", moto)
        kinesis.create_stream(StreamName=stream, ShardCount=shards)
        kinesis.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2})
        dynamodb = _client("dynamodb", moto)
        store = DynamoDBCheckpointStore(dynamodb, table, stream, CONSUMER)
        deadline = time.monotonic() + 180
        while not deployment.query("SELECT dag_id FROM dag WHERE dag_id = %s AND NOT is_stale", (DAG_ID,)):
            deployment.check_running()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{DAG_ID} was not parsed within 180 s:\n{deployment.diagnostics()}")
            time.sleep(1)
        deployment.cli("dags", "unpause", DAG_ID)
        producer = _Producer(kinesis, stream, lines, records_per_second)
        producer.start()
        say(f"unpaused {DAG_ID}; putting {records_per_second:g} records/s on {shards} shards")
        commits: dict[int, dict[str, Any]] = {}
        last_seen = 0
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    item = dynamodb.get_item(**store.head_request()).get("Item") or {}
                except dynamodb.exceptions.ResourceNotFoundException:  # the first run creates the table
                    item = {}
                batch_id = int(item.get("committed_batch_id", {}).get("N", 0))
                if batch_id != last_seen:
                    observed = datetime.now(timezone.utc)
                    plan = store.committed_plan()
                    commits[batch_id] = {"committed_at": _utc(item["committed_at"]["S"]), "observed_at": observed,
                                         "plan_created_at": plan.created_at if plan else None}  # fmt: skip
                    last_seen = batch_id
                    with_records = len(_runs(deployment))
                    say(f"batch {batch_id} committed ({with_records} with records so far)")
                    if with_records >= batches + warmup_batches:
                        break
                deployment.check_running()
                failed = deployment.query("SELECT run_id, state FROM task_instance WHERE dag_id = %s AND state = ANY(%s)",
                                          (DAG_ID, ["failed", "up_for_retry"]))  # fmt: skip
                if failed:
                    raise RuntimeError(f"a task failed: {failed}\n{deployment.diagnostics()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{len(_runs(deployment))} batches with records in {timeout:.0f} s\n{deployment.diagnostics()}")
                time.sleep(0.2)
        finally:
            producer.stop()
        runs = _runs(deployment)
        job_starts = _job_starts(deployment)
        head = store.head().committed_batch_id
        checkpoints = store.committed_checkpoints()
        columns = (*KEY_COLUMNS, "approximate_arrival_timestamp")
        rows = committed_rows(output, head, columns, with_batch_id=True)
    shutil.rmtree(work, ignore_errors=True)  # kept when the run failed, for its logs
    # Exactly once: every record put at or before the committed checkpoints is in the output, once.
    committed_seq = {shard: int(c.position.sequence_number) for shard, c in checkpoints.items() if c.position is not None}
    due = [p for p in producer.produced if int(p.sequence_number) <= committed_seq.get(p.shard_id, -1)]
    verdict = verify(due, [row[1:6] for row in rows])
    arrivals: dict[int, list[datetime]] = {}
    for row in rows:
        arrivals.setdefault(row[0], []).append(_utc(row[6]))  # type: ignore[arg-type]
    ordered = sorted(b for b in runs if b in arrivals and b in commits)
    warmup, measured = ordered[:warmup_batches], ordered[warmup_batches:]
    per_batch = []
    freshness: list[float] = []
    for batch_id in ordered:
        run, commit = runs[batch_id], commits[batch_id]
        committed_at = commit["committed_at"]
        ages = [(committed_at - a).total_seconds() for a in arrivals[batch_id]]
        oldest = min(arrivals[batch_id])
        points = [("arrival", oldest), ("trigger", run["measured_at"]), ("event", run["event_at"]), ("run", run["run_queued_at"]),
                  ("task", run["task_started_at"]), ("plan", _utc(commit["plan_created_at"])), ("job", job_starts.get(batch_id)), ("commit", committed_at),
                  ("task_end", run["task_ended_at"])]  # fmt: skip
        points = [(name, at) for name, at in points if at is not None]  # a stage not seen joins the next
        stages = {f"{a}_to_{b}": round((tb - ta).total_seconds(), 3) for (a, ta), (b, tb) in zip(points, points[1:])}
        row = {"batch_id": batch_id, "records": len(ages), "max_s": round(max(ages), 3), "median_s": round(statistics.median(ages), 3),
               "stages_s": stages, "commit_observed_after_s": round((commit["observed_at"] - committed_at).total_seconds(), 3)}  # fmt: skip
        per_batch.append(row)
        if batch_id in measured:
            freshness += ages
    if len(measured) < batches:
        raise RuntimeError(f"only {len(measured)} measured batches with records (of {batches})")
    measured_rows = [r for r in per_batch if r["batch_id"] in measured]
    stage_names = list(dict.fromkeys(name for r in measured_rows for name in r["stages_s"]))  # in order, once each
    stages = {name: round(statistics.median(r["stages_s"][name] for r in measured_rows if name in r["stages_s"]), 3)
              for name in stage_names}  # fmt: skip
    commit_times = [commits[b]["committed_at"] for b in measured]
    intervals = [(b - a).total_seconds() for a, b in zip(commit_times, commit_times[1:])]
    return {
        "p50_s": round(_percentile(freshness, 0.5), 2),
        "p95_s": round(_percentile(freshness, 0.95), 2),
        "max_s": round(max(freshness), 2),
        "batches": len(measured),
        "records": len(freshness),
        "records_per_second": records_per_second,
        "shards": shards,
        "poll_seconds": poll_seconds,
        "warmup_batches": len(warmup),
        "warmup_max_s": [r["max_s"] for r in per_batch if r["batch_id"] in warmup],
        "commit_interval_median_s": round(statistics.median(intervals), 2) if intervals else None,
        "stages_s": stages,
        "airflow": "demo.deployment's settings (LocalExecutor, parallelism 4), Airflow's defaults otherwise",
        "records_put": len(producer.produced),
        "put_errors": producer.errors,
        "records_committed_checked": verdict.records_in,
        "duplicates": verdict.duplicates,
        "missing": verdict.missing,
        "unexpected": verdict.unexpected,
        "batches_without_records": sum(1 for b in commits if b not in runs),
        "clock": "ApproximateArrivalTimestamp (moto) and committed_at (the protocol's commit): one machine's wall clock, UTC, ms",
        "per_batch": per_batch,
    }


def freshness_targets(result: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The issue's freshness targets as (target, measured, met), like ``benchmarks.report.targets``."""
    return [
        (f"freshness p50 <= {TARGET_P50_S:g} s (event-driven DAG)", f"{result['p50_s']:.1f} s", result["p50_s"] <= TARGET_P50_S),
        (f"freshness p95 <= {TARGET_P95_S:g} s (event-driven DAG)", f"{result['p95_s']:.1f} s", result["p95_s"] <= TARGET_P95_S),
    ]


def freshness_section(result: dict[str, Any], heading: str = "## Freshness: the event-driven DAG") -> list[str]:
    """The markdown section of docs/benchmarks.md for one :func:`run_freshness` result (lines, as
    ``benchmarks.report.write_report`` builds its sections)."""

    def row(*cells: object) -> str:
        return "| " + " | ".join(str(c) for c in cells) + " |"

    stage_labels = {
        "arrival_to_trigger": "oldest record's arrival -> the backlog trigger measures it",
        "trigger_to_event": "trigger's measurement -> asset event (triggerer)",
        "event_to_run": "asset event -> DAG run queued (scheduler)",
        "run_to_task": "run queued -> task started (scheduler, LocalExecutor)",
        "task_to_plan": "task started -> plan stored, the batch's cutoff (task start-up, DAG parse, probes, planning)",
        "plan_to_job": "plan -> Spark job started (the job's credentials, PySpark's import)",
        "job_to_commit": "Spark job -> checkpoints committed (Spark Connect session, read, Parquet write, commit)",
        "plan_to_commit": "plan -> checkpoints committed (Spark job, Parquet write, commit)",
        "commit_to_task_end": "commit -> task ended",
    }
    s = result["stages_s"]
    return [
        heading,
        "",
        "Time from a record's arrival (`ApproximateArrivalTimestamp`) to its committed output (the `committed_at` "
        "the protocol writes into the checkpoint store's head when it advances the checkpoints), with the example "
        "DAG `kinesis_event_driven` on a real deployment: PostgreSQL, Airflow's scheduler (LocalExecutor), "
        "triggerer, DAG processor and API server as separate processes, a warm Spark Connect server (`local[2]`), "
        "moto. Both times come from this machine's wall clock. Code: `benchmarks/freshness.py`.",
        "",
        f"A steady trickle of {result['records_per_second']:g} records/s (one `PutRecord` each) on "
        f"{result['shards']} shards; the backlog trigger polls every {result['poll_seconds']:g} s and any waiting "
        f"record is due (`KINESIS_BACKLOG_MIN_RECORDS` and `KINESIS_BACKLOG_MIN_AGE_SECONDS` empty). "
        f"{result['batches']} batches ({result['records']:,} records) measured after {result['warmup_batches']} "
        f"warm-up batches (the first start the consumer's Spark Connect session; their oldest records waited "
        f"{', '.join(f'{x:.1f}' for x in result['warmup_max_s'])} s). Median time between two commits: "
        f"{result['commit_interval_median_s']} s. Exactly once: of the {result['records_committed_checked']:,} records "
        f"put at or before the committed checkpoints, {result['missing']} missing, {result['duplicates']} duplicated.",
        "",
        row("freshness", "seconds"),
        row("---", "---"),
        row("p50", f"**{result['p50_s']:.1f}**"),
        row("p95", f"**{result['p95_s']:.1f}**"),
        row("max", f"{result['max_s']:.1f}"),
        "",
        "Where the time goes, per batch (medians; the first stage is the oldest record's wait, which includes "
        "the previous batch's run when it arrived during one):",
        "",
        row("stage", "median (s)"),
        row("---", "---"),
        *[row(stage_labels.get(name, name), f"{value:.2f}") for name, value in s.items()],
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rate", type=float, default=4.0, help="records a second")
    parser.add_argument("--poll", type=float, default=5.0, help="the backlog trigger's poll interval (s)")
    parser.add_argument("--warmup", type=int, default=2, help="batches before the measured ones")
    args = parser.parse_args(argv)
    result = run_freshness(args.batches, shards=args.shards, records_per_second=args.rate, poll_seconds=args.poll,
                           warmup_batches=args.warmup)  # fmt: skip
    print("\n".join(freshness_section(result)), file=sys.stderr)
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
