"""The main job on real input, end to end on a local stack (``make demo``).

1. moto in server mode on 127.0.0.1 (no AWS account), a 4-shard stream.
2. The 10,000 lines of data/apache_access_log.gz, one record per line, partition key = client
   IP: half as plain puts, half KPL-aggregated with aws_kinesis_agg; then the four Kinesis
   records of data/kpl_vectors.json as they are.
3. The example DAG ``kinesis_microbatch`` with ``airflow dags test``; 500 more lines; again.
4. The committed Parquet output is read back and checked against the producer's log.

The last line printed is one JSON object: batches, records_in, records_out, duplicates, missing,
output_path, checkpoint_table, and more.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import boto3
import pyarrow.parquet as pq

from airflow_kinesis_spark.core.schema import OUTPUT_COLUMNS as SCHEMA_COLUMNS
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.access_log import ROW_COLUMNS, kpl_vectors, log_lines, put_lines, put_vectors, report_verdict, vector_matches
from demo.producer import Produced, committed_rows, verify
from demo.stack import ACCESS_KEY, REGION, ROOT, SECRET_KEY, airflow, airflow_env, moto_server

STREAM = "apache-access-log"
CONSUMER = "parquet-lake"
TABLE = "kinesis_spark_checkpoints"
DAG_ID = "kinesis_microbatch"
OUTPUT_COLUMNS = [(name, arrow) for name, _, arrow in SCHEMA_COLUMNS]


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=str(ROOT / "demo_output"), help="where output, logs and Airflow's home go")
    parser.add_argument("--extra-lines", type=int, default=500, help="lines put between the two runs")
    args = parser.parse_args(argv)

    started = time.monotonic()
    work = Path(args.work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "airflow_home").mkdir(parents=True)
    output = work / "parquet"
    log_file = work / "airflow.log"

    with moto_server() as endpoint:
        say(f"moto server on {endpoint}")
        kw = dict(endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        kinesis = boto3.client("kinesis", **kw)
        dynamodb = boto3.client("dynamodb", **kw)
        env = airflow_env(
            work / "airflow_home",
            endpoint,
            {"KINESIS_STREAM": STREAM, "KINESIS_CONSUMER": CONSUMER, "KINESIS_CHECKPOINT_TABLE": TABLE,
             "KINESIS_OUTPUT_PATH": str(output)},
        )  # fmt: skip
        say("airflow db migrate (SQLite)")
        airflow(["db", "migrate"], env, log_file)

        kinesis.create_stream(StreamName=STREAM, ShardCount=4)
        kinesis.get_waiter("stream_exists").wait(StreamName=STREAM, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
        lines = log_lines()
        half = len(lines) // 2
        produced: list[Produced] = put_lines(kinesis, STREAM, lines)
        vectors = kpl_vectors()
        produced += put_vectors(kinesis, STREAM, vectors)
        say(f"put {len(lines)} log lines ({half} plain, {len(lines) - half} KPL-aggregated) and {len(vectors)} KPL records: {len(produced)} user records")

        say(f"batch run 1: airflow dags test {DAG_ID}")
        airflow(["dags", "test", DAG_ID], env, log_file)

        extra = lines[: args.extra_lines]
        produced += put_lines(kinesis, STREAM, extra)
        say(f"put {len(extra)} more lines; total {len(produced)} user records")
        time.sleep(0.05)  # arrival timestamps have millisecond precision: cut off strictly after the puts

        say(f"batch run 2: airflow dags test {DAG_ID}")
        airflow(["dags", "test", DAG_ID], env, log_file)

        store = DynamoDBCheckpointStore(dynamodb, TABLE, STREAM, CONSUMER)
        head = store.head()
        checkpoints = store.committed_checkpoints(head)

    rows = committed_rows(output, head.committed_batch_id, ROW_COLUMNS)
    dirs = sorted(output.glob("batch_id=*"), key=lambda p: int(p.name.split("=")[1]))
    schema = pq.read_schema(next(dirs[0].glob("*.parquet"))) if dirs else None
    verdict = verify(produced, [(r[0], r[1], r[2], r[3], r[5]) for r in rows])
    schema_ok = schema is not None and [(f.name, str(f.type)) for f in schema][: len(OUTPUT_COLUMNS)] == OUTPUT_COLUMNS
    vector_ok, vector_records = vector_matches(vectors, rows)
    parsed = sum(1 for r in rows if r[6])

    say(f"committed batches: {head.committed_batch_id}; output directories: {[d.name for d in dirs]}")
    say("checkpoints: " + ", ".join(f"{k}={v}" for k, v in sorted(checkpoints.items())))
    say(f"output schema matches the documented columns: {schema_ok}")
    result = {
        "batches": head.committed_batch_id,
        **report_verdict(say, verdict, (vector_ok, vector_records), parsed, log_file),
        "kpl_vector_records_ok": vector_ok,
        "kpl_vector_records": vector_records,
        "parsed_log_lines": parsed,
        "schema_ok": schema_ok,
        "output_path": str(output),
        "checkpoint_table": TABLE,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result), flush=True)
    ok = verdict.ok and vector_ok == vector_records and schema_ok and head.committed_batch_id >= 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
