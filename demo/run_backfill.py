"""Backfill by arrival time, end to end on the local stack (``make demo-backfill``).

1. moto in server mode on 127.0.0.1, a 2-shard stream.
2. Access-log lines are produced (plain and KPL-aggregated) over several consecutive windows of
   arrival time (``--windows`` x ``--window-seconds``, real time: the emulators stamp arrivals).
3. The example DAG ``kinesis_backfill`` reads each window with ``airflow dags test`` (window in
   the run's conf); one window is read again and must give identical rows.
4. An incremental ingestion of the same stream (``kinesis_microbatch``, another consumer) must
   hold exactly the union of the windows.

The last line printed is one JSON object: windows, records_in, records_out, duplicates, missing,
rerun_identical, union_equals_incremental, and more.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import shutil
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pyarrow.parquet as pq

from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.core.window import window_label
from demo.producer import Produced, put_aggregated, put_plain, verify
from demo.stack import ACCESS_KEY, REGION, ROOT, SECRET_KEY, airflow, airflow_env, moto_server

STREAM = "apache-access-log"


def say(message: str) -> None:
    print(f"[backfill] {message}", flush=True)


def read_rows(path: Path) -> list[tuple]:
    if not path.exists():
        return []
    table = pq.read_table(path, columns=["shard_id", "sequence_number", "sub_sequence_number", "partition_key", "data"])
    return list(zip(*table.to_pydict().values(), strict=True))


def digest_rows(path: Path) -> str:
    """A digest of every column of every row, order-independent: what "identical" means."""
    table = pq.read_table(path)
    rows = sorted(json.dumps(row, default=lambda v: v.hex() if isinstance(v, bytes) else str(v), sort_keys=True)
                  for row in table.to_pylist())  # fmt: skip
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def produce(kinesis, lines: list[tuple[str, bytes]], windows: list[tuple[datetime, datetime]], per_window: int) -> list[Produced]:
    """Put ``per_window`` lines spread over each window (plain and aggregated alternately)."""
    produced: list[Produced] = []
    cursor = 0
    for index, (start, end) in enumerate(windows):
        while datetime.now(timezone.utc) < start + timedelta(milliseconds=200):
            time.sleep(0.02)
        steps = 5
        for step in range(steps):
            chunk = lines[cursor : cursor + per_window // steps]
            cursor += len(chunk)
            half = len(chunk) // 2
            produced += put_plain(kinesis, STREAM, chunk[:half])
            produced += put_aggregated(kinesis, STREAM, chunk[half:])
            target = start + (end - start) * (step + 1) / (steps + 1)
            while datetime.now(timezone.utc) < target:
                time.sleep(0.02)
        say(f"window {index + 1}: produced up to {len(produced)} user records")
    return produced


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=str(ROOT / "demo_output" / "backfill"))
    parser.add_argument("--windows", type=int, default=4, help="consecutive windows (at least 3)")
    parser.add_argument("--window-seconds", type=int, default=30, help="length of each window, seconds")
    parser.add_argument("--lines-per-window", type=int, default=500)
    args = parser.parse_args(argv)
    if args.windows < 3:
        parser.error("--windows must be at least 3")

    started = time.monotonic()
    work = Path(args.work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "airflow_home").mkdir(parents=True)
    windows_out, incremental_out = work / "windows", work / "incremental"
    log_file = work / "airflow.log"
    with gzip.open(ROOT / "data" / "apache_access_log.gz", "rt", encoding="utf-8") as fh:
        lines = [(line.split(" ", 1)[0], line.rstrip("\n").encode()) for line in fh if line.strip()]

    with moto_server() as endpoint:
        kw = dict(endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        kinesis = boto3.client("kinesis", **kw)
        env = airflow_env(work / "airflow_home", endpoint, {
            "KINESIS_STREAM": STREAM, "KINESIS_BACKFILL_OUTPUT_PATH": str(windows_out),
            "KINESIS_WINDOW_SECONDS": str(args.window_seconds), "KINESIS_CONSUMER": "incremental-check",
            "KINESIS_CHECKPOINT_TABLE": "backfill_demo_checkpoints", "KINESIS_OUTPUT_PATH": str(incremental_out),
        })  # fmt: skip
        say("airflow db migrate (SQLite)")
        airflow(["db", "migrate"], env, log_file)
        kinesis.create_stream(StreamName=STREAM, ShardCount=2)
        kinesis.get_waiter("stream_exists").wait(StreamName=STREAM, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})

        first = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=2)
        length = timedelta(seconds=args.window_seconds)
        windows = [(first + length * i, first + length * (i + 1)) for i in range(args.windows)]
        say(f"producing over {args.windows} windows of {args.window_seconds}s from {format_timestamp(first)}")
        produced = produce(kinesis, lines, windows, args.lines_per_window)
        while datetime.now(timezone.utc) < windows[-1][1] + timedelta(milliseconds=200):
            time.sleep(0.05)

        def run_window(start: datetime, end: datetime) -> Path:
            conf = json.dumps({"window_start": format_timestamp(start), "window_end": format_timestamp(end)})
            airflow(["dags", "test", "kinesis_backfill", "-c", conf], env, log_file)
            return windows_out / f"window={window_label(start, end)}"

        paths = []
        for index, (start, end) in enumerate(windows):
            say(f"window {index + 1}: airflow dags test kinesis_backfill [{format_timestamp(start)}, {format_timestamp(end)})")
            paths.append(run_window(start, end))
        rerun_index = 1
        before = digest_rows(paths[rerun_index])
        say(f"window {rerun_index + 1} again (a cleared task instance / a backfill re-run)")
        run_window(*windows[rerun_index])
        rerun_identical = digest_rows(paths[rerun_index]) == before

        say("incremental ingestion of the same stream: airflow dags test kinesis_microbatch")
        airflow(["dags", "test", "kinesis_microbatch"], env, log_file)

    window_rows = [row for path in paths for row in read_rows(path)]
    verdict = verify(produced, window_rows)
    incremental_rows = [row for path in sorted(incremental_out.glob("batch_id=*")) for row in read_rows(path)]
    keys = lambda rows: sorted((r[0], r[1], -1 if r[2] is None else r[2]) for r in rows)  # noqa: E731
    union_equals_incremental = keys(window_rows) == keys(incremental_rows)
    per_window = [len(read_rows(p)) for p in paths]
    say(f"rows per window: {per_window}; window directories: {[p.name for p in paths]}")
    say(f"user records produced {verdict.records_in}, in the windows {verdict.records_out} (rows {verdict.rows}), "
        f"duplicates {verdict.duplicates}, missing {verdict.missing}, unexpected {verdict.unexpected}")  # fmt: skip
    say(f"re-run of window {rerun_index + 1} identical: {rerun_identical}; union of windows == incremental "
        f"ingestion ({len(incremental_rows)} rows): {union_equals_incremental}; Airflow log: {log_file}")  # fmt: skip
    result = {
        "windows": len(windows),
        "window_seconds": args.window_seconds,
        "records_in": verdict.records_in,
        "records_out": verdict.records_out,
        "duplicates": verdict.duplicates,
        "missing": verdict.missing,
        "unexpected": verdict.unexpected,
        "rows_per_window": per_window,
        "rerun_identical": rerun_identical,
        "union_equals_incremental": union_equals_incremental,
        "output_path": str(windows_out),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result), flush=True)
    ok = verdict.ok and rerun_identical and union_equals_incremental and all(per_window)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
