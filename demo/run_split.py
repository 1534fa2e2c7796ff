"""Split tasks end to end on a local stack (``make demo-split``): plan, SparkSubmitOperator, commit.

1. ``kinesis-spark package`` writes the job script and the package zip (as for a cluster).
2. moto in server mode on 127.0.0.1 (no AWS account), a 4-shard stream.
3. The 10,000 lines of data/apache_access_log.gz, one record per line, partition key = client
   IP, in ``--rounds`` parts (each half plain, half KPL-aggregated; the four Kinesis records of
   data/kpl_vectors.json with the first part). After each part, the example DAG
   ``kinesis_split`` runs with ``airflow dags test``: its plan task hands the batch over through
   the checkpoint store, its SparkSubmitOperator runs kinesis_batch.py in a directory of its own,
   its commit task commits. One more run with nothing new: the job task is skipped.
4. The committed Parquet output is read back and checked against the producer's log; Airflow's
   metadata database says how each task ended.

The last line printed is one JSON object: batches, records_in, records_out, duplicates, missing,
runner, and more.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import boto3

from airflow_kinesis_spark.core.job import job_arguments_from
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.access_log import ROW_COLUMNS, kpl_vectors, log_lines, put_lines, put_vectors, report_verdict, vector_matches
from demo.producer import Produced, committed_rows, verify
from demo.stack import ACCESS_KEY, BIN, REGION, ROOT, SECRET_KEY, airflow, airflow_env, moto_server

STREAM = "apache-access-log"
CONSUMER = "parquet-lake-split"
TABLE = "kinesis_spark_checkpoints"
DAG_ID = "kinesis_split"
PLAN_TASK, JOB_TASK, COMMIT_TASK = "split.plan", "split.job", "split.commit"


def say(message: str) -> None:
    print(f"[split] {message}", flush=True)


def _json(value: object) -> object:
    return json.loads(value if isinstance(value, str) else bytes(value))  # type: ignore[arg-type]


def airflow_records(db_path: Path) -> dict[str, object]:
    """What Airflow's metadata database holds about the DAG's runs: run states, each task's
    states, the plan tasks' job arguments and the commit tasks' summaries, in run order."""
    with sqlite3.connect(db_path) as db:
        runs = db.execute("SELECT run_id, state FROM dag_run WHERE dag_id = ? ORDER BY id", (DAG_ID,)).fetchall()
        order = {run_id: i for i, (run_id, _) in enumerate(runs)}
        states: dict[str, list[str]] = {}
        for task_id, run_id, state in db.execute("SELECT task_id, run_id, state FROM task_instance WHERE dag_id = ?", (DAG_ID,)):
            states.setdefault(task_id, [""] * len(runs))[order[run_id]] = state
        xcom = {(task_id, run_id, key): _json(value) for task_id, run_id, key, value in db.execute(
            "SELECT task_id, run_id, key, value FROM xcom WHERE dag_id = ?", (DAG_ID,))}  # fmt: skip
    return {
        "run_states": [state for _, state in runs],
        "task_states": states,
        "job_arguments": [xcom.get((PLAN_TASK, run_id, "job_arguments")) for run_id, _ in runs],
        "summaries": [xcom.get((COMMIT_TASK, run_id, "return_value")) for run_id, _ in runs],
    }


def names_a_file(arguments: list[str]) -> bool:
    """Whether any job argument is a file or directory on this machine, or a file option. The
    value of ``--output-root`` is left out: it is the output the DAG author named, where the job
    writes, not something handed from the plan task to the job."""
    values = [a for i, a in enumerate(arguments) if i == 0 or arguments[i - 1] != "--output-root"]
    return any(a.startswith(("--plan-file", "--report-file")) or (a.startswith("/") and Path(a).exists()) for a in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=str(ROOT / "demo_output" / "split"), help="where output, logs and Airflow's home go")
    parser.add_argument("--rounds", type=int, default=3, help="parts of the log produced, each followed by a DAG run (at least 2)")
    parser.add_argument("--lines", type=int, default=0, help="log lines to produce (0: all 10,000)")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")

    started = time.monotonic()
    work = Path(args.work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "airflow_home").mkdir(parents=True)
    output, package, job_root = work / "parquet", work / "job_package", work / "jobs"
    log_file = work / "airflow.log"

    say(f"kinesis-spark package {package}")
    subprocess.run([str(BIN / "kinesis-spark"), "package", str(package)], check=True, capture_output=True, text=True)

    with moto_server() as endpoint:
        say(f"moto server on {endpoint}")
        kw = dict(endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        kinesis = boto3.client("kinesis", **kw)
        dynamodb = boto3.client("dynamodb", **kw)
        env = airflow_env(
            work / "airflow_home",
            endpoint,
            {"KINESIS_STREAM": STREAM, "KINESIS_SPLIT_CONSUMER": CONSUMER, "KINESIS_CHECKPOINT_TABLE": TABLE,
             "KINESIS_SPLIT_OUTPUT_PATH": str(output), "KINESIS_SPARK_JOB_PACKAGE": str(package),
             "KINESIS_SPARK_JOB_ROOT": str(job_root),
             # The job's own AWS environment (on a cluster: its role and region). The plan and commit
             # tasks use the aws_default connection; spark-submit inherits the worker's environment.
             "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION,
             "AWS_ENDPOINT_URL": endpoint, "SPARK_LOCAL_IP": "127.0.0.1"},
        )  # fmt: skip
        say("airflow db migrate (SQLite)")
        airflow(["db", "migrate"], env, log_file)

        kinesis.create_stream(StreamName=STREAM, ShardCount=4)
        kinesis.get_waiter("stream_exists").wait(StreamName=STREAM, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
        lines = log_lines()
        if args.lines:
            lines = lines[: args.lines]
        vectors = kpl_vectors()
        size = -(-len(lines) // args.rounds)
        produced: list[Produced] = []
        for round_index in range(args.rounds):
            part = lines[round_index * size : (round_index + 1) * size]
            half = len(part) // 2
            produced += put_lines(kinesis, STREAM, part)
            if round_index == 0:
                produced += put_vectors(kinesis, STREAM, vectors)
            time.sleep(0.05)  # arrival timestamps have millisecond precision: cut off strictly after the puts
            say(f"round {round_index + 1}: put {len(part)} log lines ({half} plain, {len(part) - half} KPL-aggregated)"
                f"{' and the KPL vectors' if round_index == 0 else ''}; {len(produced)} user records so far; "
                f"airflow dags test {DAG_ID}")  # fmt: skip
            airflow(["dags", "test", DAG_ID], env, log_file)
        say(f"one more run with nothing new: airflow dags test {DAG_ID}")
        airflow(["dags", "test", DAG_ID], env, log_file)

        store = DynamoDBCheckpointStore(dynamodb, TABLE, STREAM, CONSUMER)
        head = store.head()
        checkpoints = store.committed_checkpoints(head)

    records = airflow_records(work / "airflow_home" / "airflow.db")
    rows = committed_rows(output, head.committed_batch_id, ROW_COLUMNS)
    verdict = verify(produced, [(r[0], r[1], r[2], r[3], r[5]) for r in rows])
    vector_ok, vector_records = vector_matches(vectors, rows)
    parsed = sum(1 for r in rows if r[6])
    job_states = records["task_states"].get(JOB_TASK, [])  # type: ignore[union-attr]
    handed = [a for a in records["job_arguments"] if a]  # type: ignore[union-attr]
    handed_batches = [job_arguments_from(a).batch_id for a in handed]
    statuses = [s.get("status") if isinstance(s, dict) else None for s in records["summaries"]]  # type: ignore[union-attr]
    per_batch = [s["records"] for s in records["summaries"] if isinstance(s, dict) and s.get("status") == "committed"]  # type: ignore[union-attr]
    job_dirs = sorted(p for p in job_root.iterdir() if p.is_dir()) if job_root.exists() else []
    staging = output / "_staging"
    staging_left = sorted(p.name for p in staging.iterdir()) if staging.exists() else []
    dirs = sorted(output.glob("batch_id=*"), key=lambda p: int(p.name.split("=")[1]))

    say(f"DAG runs: {records['run_states']}; job task: {job_states}; commit statuses: {statuses}")
    say(f"records per committed batch (commit summaries): {per_batch}")
    say(f"batches handed to the job: {handed_batches}; committed batches: {head.committed_batch_id}; "
        f"output directories: {[d.name for d in dirs]}; left under _staging: {staging_left}")  # fmt: skip
    say("checkpoints: " + ", ".join(f"{k}={v}" for k, v in sorted(checkpoints.items())))
    say(f"job directories (one per job attempt, its working directory and TMPDIR): {len(job_dirs)}; "
        f"a job argument names a file: {any(names_a_file(a) for a in handed)}")  # fmt: skip
    result = {
        "batches": head.committed_batch_id,
        **report_verdict(say, verdict, (vector_ok, vector_records), parsed, log_file),
        "runner": "SparkSubmitOperator",
        "dag_runs": len(records["run_states"]),  # type: ignore[arg-type]
        "dag_runs_succeeded": records["run_states"].count("success"),  # type: ignore[union-attr]
        "job_tasks_succeeded": job_states.count("success"),
        "job_tasks_skipped": job_states.count("skipped"),
        "commit_statuses": statuses,
        "handed_batches": handed_batches,
        "records_per_batch": per_batch,
        "job_directories": len(job_dirs),
        "job_arguments_name_files": any(names_a_file(a) for a in handed),
        "staging_left": len(staging_left),
        "kpl_vector_records_ok": vector_ok,
        "kpl_vector_records": vector_records,
        "parsed_log_lines": parsed,
        "output_path": str(output),
        "checkpoint_table": TABLE,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result), flush=True)
    ok = (
        verdict.ok
        and head.committed_batch_id == args.rounds
        and handed_batches == list(range(1, args.rounds + 1))
        and result["dag_runs_succeeded"] == args.rounds + 1
        and job_states == ["success"] * args.rounds + ["skipped"]
        and statuses == ["committed"] * args.rounds + ["no_new_records"]
        and sum(per_batch) == verdict.rows  # the commits' summaries count what the output holds
        and len(job_dirs) == args.rounds
        and not result["job_arguments_name_files"]
        and not staging_left
        and vector_ok == vector_records
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
