"""Iceberg and Delta tables end to end on a local stack (``make demo-tables``).

1. moto in server mode on 127.0.0.1 behind a small proxy that can hold DynamoDB requests; a
   Spark Connect server (so each batch is warm); a 4-shard stream.
2. The 10,000 lines of data/apache_access_log.gz in three parts (each half plain, half
   KPL-aggregated; the four KPL records of data/kpl_vectors.json with the first).
3. The example DAG ``kinesis_tables`` (``airflow dags test``) after each part: its
   ``ingest_iceberg`` task commits each batch as an Iceberg snapshot (SQL catalog on SQLite under
   ``demo_output/``), its ``ingest_delta`` task as a Delta version.
   - Run 2 is **killed** (kill -9 of the whole process group) between the Iceberg table commit and
     the checkpoint commit: the proxy holds the consumer's checkpoint write, the demo waits until
     the new snapshot is in the catalog, then kills. Run 3 does the same to the Delta task.
   - The next run of each rolls forward: it finds its batch in the table (nothing added again)
     and commits only the checkpoints.
4. ``kinesis_tables_window`` twice over the first part's arrival window: the second run replaces
   the window's rows with identical rows.
5. Read back with pyiceberg and deltalake, checked against the producer's log.

The last line printed is one JSON object: batches, records_in, iceberg_rows, delta_rows,
duplicates, missing, snapshots, versions, and more.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.access_log import kpl_vectors, log_lines, put_lines, put_vectors
from demo.producer import Produced, verify
from demo.proxy import ForwardingProxy
from demo.stack import ACCESS_KEY, BIN, REGION, ROOT, SECRET_KEY, airflow, airflow_env, moto_server, spark_connect_server

STREAM = "apache-access-log"
TABLE = "kinesis_spark_checkpoints"
KEYS = ("shard_id", "sequence_number", "sub_sequence_number", "partition_key", "data")
#: The batches' lease in the demo (seconds): a killed run's batch may be taken over this long after
#: its last heartbeat (the example DAG's default is 120 s, below its 3-minute retry_delay).
LEASE = 3.0


def say(message: str) -> None:
    print(f"[tables] {message}", flush=True)


class CheckpointHold(ForwardingProxy):
    """Forwards everything; holds a consumer's checkpoint write (DynamoDB ``PutItem`` of its
    ``#CKPT#`` items, the first write of the checkpoint commit) while :attr:`consumer` is set."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.consumer: str | None = None
        self.held = threading.Event()
        self.release = threading.Event()

    def handle(self, handler, body: bytes, target: str) -> None:  # type: ignore[no-untyped-def]
        consumer = self.consumer
        if consumer and target.endswith("PutItem") and b"#CKPT#" in body and f"|{consumer}".encode() in body:
            self.held.set()
            self.release.wait(600)  # the process is killed meanwhile: this write never lands
            return
        self.answer(handler, *self.forward(handler, body))


def iceberg_snapshots(catalog_db: Path) -> int:
    """Snapshots of ``lake.access_log`` (0 before it exists), read through pyiceberg."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    if not catalog_db.exists():
        return 0
    try:
        return len(SqlCatalog("default", uri=f"sqlite:///{catalog_db}").load_table("lake.access_log").metadata.snapshots)
    except (NoSuchTableError, sqlite3.Error):
        return 0


def delta_versions(location: Path) -> int:
    """Versions of the Delta table (0 before it exists): its ``_delta_log`` commits."""
    return len(list((location / "_delta_log").glob("*.json"))) if location.exists() else 0


def killed_run(env: dict[str, str], hold: CheckpointHold, consumer: str, committed: Any, log_file: Path,
               dag_id: str = "kinesis_tables") -> None:  # fmt: skip
    """``airflow dags test {dag_id}`` killed (-9, whole process group) once ``consumer``'s table
    commit is visible (``committed()``) and its checkpoint commit is held (``hold``)."""
    hold.release.clear()
    hold.held.clear()
    hold.consumer = consumer
    with open(log_file, "a", encoding="utf-8") as log:
        log.write(f"$ airflow dags test {dag_id} (to be killed)\n")
        log.flush()
        proc = subprocess.Popen([str(BIN / "airflow"), "dags", "test", dag_id], env=env, stdout=log, stderr=log,
                                start_new_session=True)  # fmt: skip
    try:
        if not hold.held.wait(600):
            raise RuntimeError(f"the {consumer} task never reached its checkpoint commit (see {log_file})")
        if not committed():
            raise RuntimeError(f"the {consumer} checkpoint commit came without a table commit before it")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
    finally:
        hold.consumer = None
        hold.release.set()
    time.sleep(LEASE + 0.5)  # the killed run's lease expires: the next run takes its batch over
    say(f"killed `airflow dags test {dag_id}` (-9) after the {consumer} table commit, before its checkpoint commit")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=str(ROOT / "demo_output" / "tables"), help="tables, logs and Airflow's home")
    parser.add_argument("--lines", type=int, default=None, help="only the first N log lines (default: all 10,000)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    work = Path(args.work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "airflow_home").mkdir(parents=True)
    log_file = work / "airflow.log"
    catalog_db = work / "catalog.db"
    delta_table = work / "delta" / "access_log"

    with moto_server() as endpoint, CheckpointHold(endpoint) as hold, spark_connect_server(cores=2) as (host, port):
        say(f"moto server on {endpoint} (the DAGs' connection goes through a proxy at {hold.endpoint}); Spark Connect on {host}:{port}")
        kw = dict(endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        kinesis = boto3.client("kinesis", **kw)
        env = airflow_env(work / "airflow_home", hold.endpoint, {
            "KINESIS_STREAM": STREAM, "KINESIS_CHECKPOINT_TABLE": TABLE, "KINESIS_TABLES_ROOT": str(work),
            "KINESIS_SPARK_CONN_ID": "spark_connect_demo", "KINESIS_LEASE_SECONDS": str(LEASE),
            "AIRFLOW_CONN_SPARK_CONNECT_DEMO": json.dumps({"conn_type": "spark_connect", "host": host, "port": port}),
        })  # fmt: skip
        say("airflow db migrate (SQLite)")
        airflow(["db", "migrate"], env, log_file)
        kinesis.create_stream(StreamName=STREAM, ShardCount=4)
        kinesis.get_waiter("stream_exists").wait(StreamName=STREAM, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})

        lines = log_lines()[: args.lines]
        parts = [lines[i::3] for i in range(3)]
        vectors = kpl_vectors()
        window_start = datetime.now(timezone.utc) - timedelta(milliseconds=5)
        produced: list[Produced] = put_lines(kinesis, STREAM, parts[0]) + put_vectors(kinesis, STREAM, vectors)
        time.sleep(0.05)
        window_end = datetime.now(timezone.utc)
        window_records = len(produced)
        say(f"part 1: {len(parts[0])} log lines and {len(vectors)} KPL records: {len(produced)} user records")
        say("run 1: airflow dags test kinesis_tables")
        airflow(["dags", "test", "kinesis_tables"], env, log_file)

        produced += put_lines(kinesis, STREAM, parts[1])
        time.sleep(0.05)
        say(f"part 2: {len(parts[1])} lines; run 2, killed between the Iceberg table commit and the checkpoint commit")
        snapshots_before = iceberg_snapshots(catalog_db)
        killed_run(env, hold, "iceberg-lake", lambda: iceberg_snapshots(catalog_db) == snapshots_before + 1, log_file)

        produced += put_lines(kinesis, STREAM, parts[2])
        time.sleep(0.05)
        say(f"part 3: {len(parts[2])} lines; run 3, killed between the Delta table commit and the checkpoint commit "
            "(the Iceberg task, if it runs first, rolls its batch 2 forward)")  # fmt: skip
        versions_before = delta_versions(delta_table)
        killed_run(env, hold, "delta-lake", lambda: delta_versions(delta_table) == versions_before + 1, log_file)

        for run in (4, 5):  # the killed batches roll forward, then part 3 is read
            say(f"run {run}: airflow dags test kinesis_tables")
            airflow(["dags", "test", "kinesis_tables"], env, log_file)

        window_env = {**env, "KINESIS_WINDOW_START": window_start.isoformat(), "KINESIS_WINDOW_END": window_end.isoformat()}
        window_rows = []
        for run in (1, 2):
            say(f"window run {run}: airflow dags test kinesis_tables_window [{window_start.isoformat()}, {window_end.isoformat()})")
            airflow(["dags", "test", "kinesis_tables_window"], window_env, log_file)
            window_rows.append(read_tables(work, "access_log_window"))

        dynamodb = boto3.client("dynamodb", **kw)
        heads = {c: DynamoDBCheckpointStore(dynamodb, TABLE, STREAM, c).head() for c in ("iceberg-lake", "delta-lake")}

    iceberg_rows, delta_rows = read_tables(work, "access_log")
    iceberg = verify(produced, iceberg_rows[0])
    delta = verify(produced, delta_rows[0])
    snapshots, versions = iceberg_rows[1], delta_rows[1]
    batches = {c: h.committed_batch_id for c, h in heads.items()}
    window_identical = window_rows[0][0][0] == window_rows[1][0][0] and window_rows[0][1][0] == window_rows[1][1][0]
    window_ok = [len(window_rows[1][0][0]), len(window_rows[1][1][0])] == [window_records, window_records]
    say(f"committed batches: {batches}; Iceberg snapshots by batch id: {snapshots}; Delta versions by batch id: {versions}")
    say(f"Iceberg: {iceberg.records_out} rows, {iceberg.duplicates} duplicates, {iceberg.missing} missing; "
        f"Delta: {delta.records_out} rows, {delta.duplicates} duplicates, {delta.missing} missing")  # fmt: skip
    say(f"window re-run identical: {window_identical} ({len(window_rows[1][0][0])} Iceberg rows, {len(window_rows[1][1][0])} Delta rows)")
    one_per_batch = sorted(snapshots) == sorted(set(snapshots)) and sorted(versions) == sorted(set(versions))
    result = {
        "batches": max(batches.values()),
        "records_in": len(produced),
        "iceberg_rows": iceberg.records_out,
        "delta_rows": delta.records_out,
        "duplicates": iceberg.duplicates + delta.duplicates,
        "missing": iceberg.missing + delta.missing,
        "snapshots": len(snapshots),
        "versions": len(versions),
        "one_snapshot_or_version_per_batch": one_per_batch,
        "killed_between_table_and_checkpoint_commit": 2,
        "window_identical": window_identical,
        "window_rows": len(window_rows[1][0][0]),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result), flush=True)
    in_order = all(int(b) <= batches[c] for c, ids in (("iceberg-lake", snapshots), ("delta-lake", versions)) for b in ids)
    ok = iceberg.ok and delta.ok and one_per_batch and in_order and window_identical and window_ok
    return 0 if ok else 1


def read_tables(work: Path, name: str) -> tuple[tuple[list[tuple], list[str]], tuple[list[tuple], list[str]]]:
    """``((iceberg rows, batch ids of its snapshots), (delta rows, batch ids of its versions))`` of
    table ``name``, read with pyiceberg and deltalake."""
    from deltalake import DeltaTable
    from pyiceberg.catalog.sql import SqlCatalog

    table = SqlCatalog("default", uri=f"sqlite:///{work / 'catalog.db'}").load_table(f"lake.{name}")
    ice = table.scan().to_arrow()
    ice_batches = [s.summary.additional_properties.get("kinesis-spark.batch-id") for s in table.metadata.snapshots]
    delta_table = DeltaTable(str(work / "delta" / name))
    delta = pa.table(delta_table.to_pyarrow_table())
    delta_batches = [c.get("kinesis-spark.batch-id") for c in reversed(delta_table.history())]  # oldest first

    def rows(t: pa.Table) -> list[tuple]:
        return sorted(zip(*(t.column(c).to_pylist() for c in KEYS), strict=True), key=lambda r: (r[0], r[1], r[2] or 0))

    return (rows(ice), [b for b in ice_batches if b]), (rows(delta), [b for b in delta_batches if b])


if __name__ == "__main__":
    sys.exit(main())
