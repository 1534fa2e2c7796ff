"""Typed records end to end on a local stack (``make demo-typed``).

1. moto in server mode on 127.0.0.1 (Kinesis, DynamoDB, Glue Schema Registry) behind a small
   proxy that can hold DynamoDB requests; a Spark Connect server (so each batch is warm); three
   2-shard streams: ``orders-json``, ``orders-avro``, ``clicks-proto``.
2. Version 1 of the registry schemas ``orders-json`` (JSON Schema) and ``orders-avro`` (Avro) in
   the registry ``demo-registry`` (``demo.typed_producer``).
3. Part 1 of the records (``demo.typed_producer.produce_typed``): per stream a few hundred good
   records (registry wire format for JSON and Avro, every second one zlib-compressed; plain
   protobuf ``demo.Click`` messages) and, at random places among them, broken ones of each
   breakage: a malformed payload, bad compression, an unknown schema version, a field of the
   wrong type (JSON), a truncated payload (Avro, protobuf).
4. The example DAG ``kinesis_typed`` (``airflow dags test``): ``ingest_orders_json`` into the
   Iceberg table ``lake.orders_json``, ``ingest_orders_avro`` into a Delta table,
   ``ingest_clicks`` into the Iceberg table ``lake.clicks`` (SQL catalog on SQLite under
   ``demo_output/``).
5. Version 2 of both registry schemas (``coupon`` added to the JSON orders, ``channel`` to the
   Avro ones), mid-stream; part 2 of the records, the orders written with version 2.
6. Run 2 is **killed** (kill -9 of the whole process group) between the Iceberg table commit of
   ``ingest_orders_json`` and its checkpoint commit: the proxy holds the consumer's checkpoint
   write, the demo waits until the new snapshot is in the catalog, then kills. Run 3 rolls
   forward: it finds the batch in the table (nothing added again) and commits only the
   checkpoints.
7. ``kinesis_typed_window`` twice over part 1's arrival window of ``orders-json``: the second run
   replaces the window's rows with identical rows.
8. Read back with pyiceberg and deltalake, with the dead letters of each table (the Parquet files
   under ``_quarantine`` in its batch folders), and checked against what was produced: a row per
   good record and every field's value, a dead letter per broken record with its error kind,
   the columns schema evolution added (filled for version-2 records, null before).

The last line printed is one JSON object: records_in, broken_in, typed_rows, dead_letters,
duplicates, missing, value_mismatches, evolved_columns, window_identical, batches, ok, and more.
The exit code is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.run_tables import CheckpointHold, killed_run
from demo.stack import ACCESS_KEY, REGION, ROOT, SECRET_KEY, airflow, airflow_env, moto_server, spark_connect_server
from demo.typed_producer import Produced, produce_typed, register_schemas, register_second_versions

TABLE = "kinesis_spark_checkpoints"
REGISTRY = "demo-registry"
SHARDS = 2
#: The batches' lease in the demo (seconds): a killed run's batch may be taken over this long after
#: its last heartbeat (the example DAG's default is 120 s, below its 3-minute retry_delay).
LEASE = 3.0
#: Broken records are a sizeable share of each batch here (about 5 %); the DAG's default is 0.01.
MAX_DEAD_LETTER_FRACTION = 0.2
#: First good id of part 2 (part 1's ids start at 0).
PART2_START = 100_000
#: The consumer whose run 2 is killed between its table commit and its checkpoint commit.
KILLED = "orders-json-iceberg"


@dataclass(frozen=True)
class Target:
    """One stream of the DAG and where its task writes."""

    kind: str  # demo.typed_producer kind: json, avro, protobuf
    stream: str
    consumer: str
    output_format: str  # iceberg or delta
    location: str  # Iceberg: the table's name; Delta: the table's folder under the work dir
    output_dir: str  # the task's output_path under the work dir
    id_column: str
    #: The column a registry version 2 adds (None: no second version).
    added: str | None


TARGETS = (
    Target("json", "orders-json", "orders-json-iceberg", "iceberg", "lake.orders_json", "iceberg/orders_json", "order_id", "coupon"),
    Target("avro", "orders-avro", "orders-avro-delta", "delta", "delta/orders_avro", "delta/orders_avro", "order_id", "channel"),
    Target("protobuf", "clicks-proto", "clicks-iceberg", "iceberg", "lake.clicks", "iceberg/clicks", "id", None),
)
WINDOW_TABLE = "lake.orders_json_window"
WINDOW_DIR = "iceberg/orders_json_window"
#: Metadata columns every typed row has (``data`` only with keep_raw_data).
METADATA = ("stream_name", "shard_id", "sequence_number", "sub_sequence_number", "partition_key", "explicit_hash_key",
            "approximate_arrival_timestamp")  # fmt: skip
_BATCH_FOLDER = re.compile(r"^batch_id=\d+(-[0-9a-f]{12})?$")


def say(message: str) -> None:
    print(f"[typed] {message}", flush=True)


# -- reading the tables ------------------------------------------------------------------------


def read_table(work: Path, target_format: str, location: str) -> pa.Table:
    """The table's rows (pyiceberg for Iceberg, deltalake for Delta)."""
    if target_format == "iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog("default", uri=f"sqlite:///{work / 'catalog.db'}").load_table(location).scan().to_arrow()
    from deltalake import DeltaTable

    return pa.table(DeltaTable(str(work / location)).to_pyarrow_table())


def table_columns(work: Path, target_format: str, location: str) -> list[str]:
    """The table's column names as its metadata holds them ([] before it exists)."""
    if target_format == "iceberg":
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = SqlCatalog("default", uri=f"sqlite:///{work / 'catalog.db'}").load_table(location)
        except NoSuchTableError:
            return []
        return [f.name for f in table.schema().fields]
    from deltalake import DeltaTable

    if not (work / location / "_delta_log").exists():
        return []
    return [f.name for f in DeltaTable(str(work / location)).schema().fields]


def commits_by_batch(work: Path, target: Target) -> list[str]:
    """The batch ids the table's snapshots (Iceberg) or versions (Delta) record, oldest first."""
    if target.output_format == "iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        table = SqlCatalog("default", uri=f"sqlite:///{work / 'catalog.db'}").load_table(target.location)
        ids = [s.summary.additional_properties.get("kinesis-spark.batch-id") for s in table.metadata.snapshots]
    else:
        from deltalake import DeltaTable

        ids = [c.get("kinesis-spark.batch-id") for c in reversed(DeltaTable(str(work / target.location)).history())]
    return [i for i in ids if i]


def iceberg_snapshots(work: Path, name: str) -> int:
    """Snapshots of Iceberg table ``name`` (0 before it exists)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return len(SqlCatalog("default", uri=f"sqlite:///{work / 'catalog.db'}").load_table(name).metadata.snapshots)
    except NoSuchTableError:
        return 0


def dead_letters(output_dir: Path) -> pa.Table | None:
    """The dead letters under ``output_dir``: every Parquet file in a ``_quarantine`` folder of a
    batch folder (``batch_id=N-<plan id>``)."""
    files = sorted(p for p in output_dir.glob("**/_quarantine/*.parquet") if _BATCH_FOLDER.match(p.parent.parent.name))
    tables = [pq.read_table(p) for p in files]
    return pa.concat_tables(tables) if tables else None


def window_dead_letters(work: Path, name: str) -> pa.Table | None:
    """The dead letters of the window run whose rows Iceberg table ``name`` holds now: a window
    run writes under ``{output_path}/window=<label>/run=<id>``, its dead letters in that folder's
    ``_quarantine`` (an earlier run's folder stays until the provider removes it)."""
    from pyiceberg.catalog.sql import SqlCatalog

    table = SqlCatalog("default", uri=f"sqlite:///{work / 'catalog.db'}").load_table(name)
    runs = set()
    for task in table.scan().plan_files():
        path = task.file.file_path.removeprefix("file://")
        runs.update(str(Path(*Path(path).parts[: i + 1])) for i, part in enumerate(Path(path).parts) if part.startswith("run="))
    files = sorted(p for run in runs for p in Path(run).glob("_quarantine/*.parquet"))
    tables = [pq.read_table(p) for p in files]
    return pa.concat_tables(tables) if tables else None


def task_summaries(airflow_home: Path, dag_id: str) -> list[tuple[str, dict[str, Any]]]:
    """``(task id, XCom summary)`` of every task run of ``dag_id`` that returned one, oldest first
    (read from the Airflow database: ``airflow dags test`` stores them there)."""
    import sqlite3

    out = []
    with sqlite3.connect(airflow_home / "airflow.db") as db:
        query = "SELECT task_id, value FROM xcom WHERE dag_id = ? AND key = 'return_value' ORDER BY timestamp"
        for task_id, value in db.execute(query, (dag_id,)):
            while isinstance(value, (str, bytes)):
                value = json.loads(value)
            if isinstance(value, dict):
                out.append((task_id, value))
    return out


# -- checking ----------------------------------------------------------------------------------


def normalized(value: Any) -> Any:
    """A value as compared: datetimes aware in UTC (naive ones taken as UTC), containers
    recursively."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalized(v) for v in value]
    return value


def expected_value(kind: str, value: dict[str, Any]) -> dict[str, Any]:
    """What a produced value reads back as: the JSON orders' RFC 3339 ``placed_at`` as a datetime."""
    if kind == "json" and isinstance(value.get("placed_at"), str):
        return {**value, "placed_at": datetime.fromisoformat(value["placed_at"])}
    return value


@dataclass
class Check:
    """One stream's table checked against what was produced."""

    stream: str
    records_in: int = 0
    broken_in: int = 0
    rows: int = 0
    duplicates: int = 0
    missing: int = 0
    unexpected: int = 0
    value_mismatches: int = 0
    dead_letters: int = 0
    dead_letter_duplicates: int = 0
    dead_letters_missing: int = 0
    dead_letters_unexpected: int = 0
    dead_letter_kind_mismatches: int = 0
    dead_letter_data_mismatches: int = 0
    added_column: str | None = None
    added_filled: int = 0
    added_expected: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.rows == self.records_in - self.broken_in and not self.duplicates and not self.missing
                and not self.unexpected and not self.value_mismatches and self.dead_letters == self.broken_in
                and not self.dead_letter_duplicates and not self.dead_letters_missing and not self.dead_letters_unexpected
                and not self.dead_letter_kind_mismatches and not self.dead_letter_data_mismatches
                and self.added_filled == self.added_expected)  # fmt: skip

    def example(self, text: str) -> None:
        if len(self.examples) < 8:
            self.examples.append(text)


def check(target: Target, parts: list[Produced], rows: pa.Table, quarantine: pa.Table | None) -> Check:
    """Rows and dead letters of ``target`` against the produced ``parts``."""
    result = Check(stream=target.stream, added_column=target.added)
    good: dict[int, tuple[dict[str, Any], tuple[str, str], int]] = {}  # id -> (value, position, version)
    broken = {}
    for part in parts:
        for record_id, value in part.good.items():
            good[record_id] = (expected_value(target.kind, value), part.good_positions[record_id], part.version)
        for b in part.broken:
            broken[(b.shard_id, b.sequence_number)] = b
    result.records_in = len(good) + len(broken)
    result.broken_in = len(broken)
    fields = sorted({name for value, _, _ in good.values() for name in value})
    result.added_expected = sum(1 for _, _, version in good.values() if version == 2) if target.added else 0

    records = rows.to_pylist()
    result.rows = len(records)
    positions = Counter((r["shard_id"], r["sequence_number"], r["sub_sequence_number"] or 0) for r in records)
    result.duplicates = sum(n - 1 for n in positions.values())
    seen: set[int] = set()
    for row in records:
        record_id = row.get(target.id_column)
        if record_id not in good:
            result.unexpected += 1
            result.example(f"{target.stream}: a row of no good record: {row.get('shard_id')} {row.get('sequence_number')} id {record_id}")
            continue
        if record_id in seen:
            continue  # counted as a duplicate
        seen.add(record_id)
        value, (shard_id, sequence_number), version = good[record_id]
        wrong = [name for name in fields if normalized(row.get(name)) != normalized(value.get(name))]
        if target.added and version == 1 and target.added in row and row[target.added] is not None:
            wrong.append(target.added)
        if (row["shard_id"], row["sequence_number"], row["partition_key"]) != (shard_id, sequence_number, str(record_id)):
            wrong.append("position")
        if row.get("stream_name") != target.stream:
            wrong.append("stream_name")
        if wrong:
            result.value_mismatches += 1
            result.example(f"{target.stream} id {record_id}: {', '.join(wrong)}: read "
                           f"{ {n: row.get(n) for n in wrong if n != 'position'} }, produced { {n: value.get(n) for n in wrong if n != 'position'} }")  # fmt: skip
        if target.added and version == 2 and row.get(target.added) is not None:
            result.added_filled += 1
    result.missing = len(set(good) - seen)

    letters = quarantine.to_pylist() if quarantine is not None else []
    result.dead_letters = len(letters)
    found = Counter((d["shard_id"], d["sequence_number"]) for d in letters)
    result.dead_letter_duplicates = sum(n - 1 for n in found.values())
    result.dead_letters_missing = len(set(broken) - set(found))
    result.dead_letters_unexpected = len(set(found) - set(broken))
    for letter in letters:
        b = broken.get((letter["shard_id"], letter["sequence_number"]))
        if b is None:
            result.example(f"{target.stream}: a dead letter of no broken record: {letter['shard_id']} {letter['sequence_number']} "
                           f"{letter.get('error_kind')}: {letter.get('reason')}")  # fmt: skip
            continue
        if letter.get("error_kind") != b.kind:
            result.dead_letter_kind_mismatches += 1
            result.example(f"{target.stream}: broken record {b.partition_key} ({b.kind}, {b.detail}) is a dead letter of kind "
                           f"{letter.get('error_kind')}: {letter.get('reason')}")  # fmt: skip
        if letter.get("data") != b.data or letter.get("partition_key") != b.partition_key:
            result.dead_letter_data_mismatches += 1
            result.example(f"{target.stream}: dead letter {b.partition_key}: data or partition key differs from what was put")
    for key in set(broken) - set(found):
        b = broken[key]
        result.example(f"{target.stream}: broken record {b.partition_key} ({b.kind}, {b.detail}) at {key} is not a dead letter")
    return result


def comparable_rows(table: pa.Table) -> list[tuple]:
    """A table's rows as sorted tuples of normalized values, for comparing two reads."""
    names = sorted(table.column_names)
    rows = [tuple(json.dumps(normalized(r[n]), default=str, sort_keys=True) for n in names) for r in table.to_pylist()]
    return [tuple(names)] + sorted(rows)


# -- the runs ----------------------------------------------------------------------------------


def produce_part(kinesis: Any, schemas: Any, part: int, count: int, broken: int, version: int) -> dict[str, Produced]:
    """One part of every stream; the JSON stream's first."""
    produced = {}
    for n, target in enumerate(TARGETS):
        produced[target.kind] = produce_typed(
            kinesis, target.stream, kind=target.kind, count=count, broken=broken, schemas=schemas, seed=100 * part + n,
            start_id=0 if part == 1 else PART2_START, version=1 if target.kind == "protobuf" else version,
        )  # fmt: skip
    return produced


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=str(ROOT / "demo_output" / "typed"), help="tables, logs and Airflow's home")
    parser.add_argument("--count", type=int, default=200, help="good records per stream and part (default 200)")
    parser.add_argument("--broken", type=int, default=8, help="broken records per stream and part (default 8)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    work = Path(args.work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "airflow_home").mkdir(parents=True)
    log_file = work / "airflow.log"

    with moto_server() as endpoint, CheckpointHold(endpoint) as hold, spark_connect_server(cores=2) as (host, port):
        say(f"moto server on {endpoint} (the DAGs' connection goes through a proxy at {hold.endpoint}); Spark Connect on {host}:{port}")
        kw = dict(endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        kinesis = boto3.client("kinesis", **kw)
        glue = boto3.client("glue", **kw)
        env = airflow_env(work / "airflow_home", hold.endpoint, {
            "KINESIS_CHECKPOINT_TABLE": TABLE, "KINESIS_TABLES_ROOT": str(work), "KINESIS_SCHEMA_REGISTRY": REGISTRY,
            "KINESIS_MAX_DEAD_LETTER_FRACTION": str(MAX_DEAD_LETTER_FRACTION),
            "KINESIS_SPARK_CONN_ID": "spark_connect_demo", "KINESIS_LEASE_SECONDS": str(LEASE),
            "AIRFLOW_CONN_SPARK_CONNECT_DEMO": json.dumps({"conn_type": "spark_connect", "host": host, "port": port}),
        })  # fmt: skip
        for name in ("KINESIS_ORDERS_JSON_STREAM", "KINESIS_ORDERS_AVRO_STREAM", "KINESIS_CLICKS_STREAM", "KINESIS_CLICK_DESCRIPTOR"):
            env.pop(name, None)  # the DAG's defaults: the streams above, its own descriptor of demo.Click
        say("airflow db migrate (SQLite)")
        airflow(["db", "migrate"], env, log_file)
        for target in TARGETS:
            kinesis.create_stream(StreamName=target.stream, ShardCount=SHARDS)
        for target in TARGETS:
            kinesis.get_waiter("stream_exists").wait(StreamName=target.stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
        schemas = register_schemas(glue, REGISTRY)
        say(f"registry {REGISTRY}: orders-json v1 {schemas.json.version_id(1)}, orders-avro v1 {schemas.avro.version_id(1)}")

        window_start = datetime.now(UTC) - timedelta(milliseconds=5)
        part1 = produce_part(kinesis, schemas, 1, args.count, args.broken, version=1)
        window_end = datetime.now(UTC)  # after part 1 of orders-json (and of the other streams)
        time.sleep(0.05)
        say(f"part 1: per stream {args.count} good records and {args.broken} broken ones "
            f"({', '.join(sorted({b.kind for p in part1.values() for b in p.broken}))})")  # fmt: skip
        say("run 1: airflow dags test kinesis_typed")
        airflow(["dags", "test", "kinesis_typed"], env, log_file)
        columns_before = {t.stream: table_columns(work, t.output_format, t.location) for t in TARGETS}
        say(f"columns after run 1: { {s: [c for c in cols if c not in METADATA] for s, cols in columns_before.items()} }")

        schemas = register_second_versions(glue, schemas)
        say(f"registry {REGISTRY}: orders-json v2 {schemas.json.version_id(2)} (adds coupon), "
            f"orders-avro v2 {schemas.avro.version_id(2)} (adds channel)")  # fmt: skip
        part2 = produce_part(kinesis, schemas, 2, args.count, args.broken, version=2)
        time.sleep(0.05)
        say(f"part 2: per stream {args.count} good records (orders of version 2) and {args.broken} broken ones; "
            f"run 2, killed between the {KILLED} table commit and its checkpoint commit")  # fmt: skip
        json_table = next(t for t in TARGETS if t.consumer == KILLED).location
        snapshots_before = iceberg_snapshots(work, json_table)
        killed_run(env, hold, KILLED, lambda: iceberg_snapshots(work, json_table) == snapshots_before + 1, log_file, "kinesis_typed")
        # what the kill left: the batch's snapshot in the table, the batch still pending in the store
        killed_target = next(t for t in TARGETS if t.consumer == KILLED)
        left = DynamoDBCheckpointStore(boto3.client("dynamodb", **kw), TABLE, killed_target.stream, KILLED).head()
        killed = int(iceberg_snapshots(work, json_table) == snapshots_before + 1 and left.pending_batch_id is not None
                     and left.pending_batch_id > left.committed_batch_id)  # fmt: skip

        say("run 3: airflow dags test kinesis_typed (rolls the killed batch forward)")
        airflow(["dags", "test", "kinesis_typed"], env, log_file)
        snapshots_after_roll_forward = iceberg_snapshots(work, json_table)

        window_env = {**env, "KINESIS_WINDOW_START": window_start.isoformat(), "KINESIS_WINDOW_END": window_end.isoformat()}
        window_reads = []
        for run in (1, 2):
            say(f"window run {run}: airflow dags test kinesis_typed_window [{window_start.isoformat()}, {window_end.isoformat()})")
            airflow(["dags", "test", "kinesis_typed_window"], window_env, log_file)
            window_reads.append((read_table(work, "iceberg", WINDOW_TABLE), window_dead_letters(work, WINDOW_TABLE)))

        dynamodb = boto3.client("dynamodb", **kw)
        batches = {t.consumer: DynamoDBCheckpointStore(dynamodb, TABLE, t.stream, t.consumer).head().committed_batch_id for t in TARGETS}

    summaries = task_summaries(work / "airflow_home", "kinesis_typed")
    summary_dead_letters = sum(v.get("dead_letters") or 0 for _, v in summaries if v.get("status") == "committed")
    quarantine_paths_ok = all(Path(v["quarantine_path"]).is_dir() for _, v in summaries if v.get("dead_letters"))
    checks = []
    evolved: dict[str, list[str]] = {}
    one_commit_per_batch = True
    for target in TARGETS:
        rows = read_table(work, target.output_format, target.location)
        columns_after = table_columns(work, target.output_format, target.location)
        evolved[target.stream] = [c for c in columns_after if c not in columns_before[target.stream]]
        result = check(target, [part1[target.kind], part2[target.kind]], rows, dead_letters(work / target.output_dir))
        checks.append(result)
        ids = commits_by_batch(work, target)
        one_commit_per_batch &= sorted(ids) == sorted(set(ids)) and all(int(b) <= batches[target.consumer] for b in ids)
        say(f"{target.stream} ({target.output_format} {target.location}): {result.rows} rows of {result.records_in - result.broken_in} "
            f"good records, {result.dead_letters} dead letters of {result.broken_in} broken records, {result.duplicates} duplicates, "
            f"{result.missing} missing, {result.value_mismatches} value mismatches; columns added by schema evolution: "
            f"{evolved[target.stream]}; batches committed {ids}")  # fmt: skip
        for line in result.examples:
            say(f"  {line}")

    # the window: part 1 of orders-json, read twice
    window_target = Target("json", "orders-json", "orders-json-backfill", "iceberg", WINDOW_TABLE, WINDOW_DIR, "order_id", "coupon")
    window_checks = [check(window_target, [part1["json"]], rows, letters) for rows, letters in window_reads]
    window_identical = comparable_rows(window_reads[0][0]) == comparable_rows(window_reads[1][0]) and (
        comparable_rows(window_reads[0][1]) if window_reads[0][1] is not None else None) == (
        comparable_rows(window_reads[1][1]) if window_reads[1][1] is not None else None)  # fmt: skip
    window_ok = all(c.ok for c in window_checks)
    say(f"window re-run identical: {window_identical}; {window_checks[-1].rows} rows of {window_checks[-1].records_in - window_checks[-1].broken_in} "
        f"good part-1 orders, {window_checks[-1].dead_letters} dead letters of {window_checks[-1].broken_in} broken ones")  # fmt: skip
    for line in window_checks[-1].examples:
        say(f"  window: {line}")

    expected_evolution = {t.stream: [t.added] if t.added else [] for t in TARGETS}
    evolution_ok = evolved == expected_evolution and all(c.added_filled == c.added_expected for c in checks)
    roll_forward_ok = snapshots_after_roll_forward == snapshots_before + 1  # the killed batch's snapshot, nothing added again
    result = {
        "records_in": sum(c.records_in for c in checks),
        "broken_in": sum(c.broken_in for c in checks),
        "typed_rows": sum(c.rows for c in checks),
        "dead_letters": sum(c.dead_letters for c in checks),
        "duplicates": sum(c.duplicates + c.dead_letter_duplicates for c in checks),
        "missing": sum(c.missing + c.dead_letters_missing for c in checks),
        "unexpected": sum(c.unexpected + c.dead_letters_unexpected for c in checks),
        "value_mismatches": sum(c.value_mismatches for c in checks),
        "dead_letter_kind_mismatches": sum(c.dead_letter_kind_mismatches + c.dead_letter_data_mismatches for c in checks),
        "evolved_columns": sorted(c for cols in evolved.values() for c in cols),
        "evolved_filled": sum(c.added_filled for c in checks),
        "summary_dead_letters": summary_dead_letters,
        "window_identical": window_identical,
        "window_rows": window_checks[-1].rows,
        "window_dead_letters": window_checks[-1].dead_letters,
        "batches": sum(batches.values()),
        "batches_by_consumer": batches,
        "killed_between_table_and_checkpoint_commit": killed,
        "one_commit_per_batch": one_commit_per_batch,
        "streams": {c.stream: {"records_in": c.records_in, "broken_in": c.broken_in, "rows": c.rows, "dead_letters": c.dead_letters}
                    for c in checks},  # fmt: skip
        "ok": False,
        "seconds": 0.0,
    }
    summaries_ok = summary_dead_letters == result["broken_in"] and quarantine_paths_ok
    say(f"the tasks' XCom summaries count {summary_dead_letters} dead letters; their quarantine_path folders exist: {quarantine_paths_ok}")
    result["ok"] = bool(all(c.ok for c in checks) and window_identical and window_ok and evolution_ok and roll_forward_ok and killed
                        and one_commit_per_batch and summaries_ok)  # fmt: skip
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
