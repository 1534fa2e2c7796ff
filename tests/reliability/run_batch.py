"""One KinesisToSparkOperator run in its own process (as an Airflow worker runs a task).

    python -m tests.reliability.run_batch STREAM CONSUMER TABLE OUTPUT [--transform T --py-files F]

Connections come from the environment (AIRFLOW_CONN_AWS_DEFAULT; no spark connection: spark-submit
with local[*]). Prints the summary as its last line; exit code 1 on failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("stream", "consumer", "table", "output"):
        parser.add_argument(name)
    parser.add_argument("--transform")
    parser.add_argument("--py-files")
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--limit", type=int, default=25)
    args = parser.parse_args()
    try:
        summary = KinesisToSparkOperator(
            task_id="ingest", stream_name=args.stream, consumer_name=args.consumer, checkpoint_table=args.table,
            output_path=args.output, transform=args.transform, spark_py_files=args.py_files,
            lease_seconds=args.lease, get_records_limit=args.limit, min_call_interval=0.05,
            spark_conf={"spark.ui.enabled": "false"},
        ).execute({})  # fmt: skip
    except Exception as err:  # noqa: BLE001 - reported to the harness
        traceback.print_exc()
        print(json.dumps({"error": f"{type(err).__name__}: {err}"}), flush=True)
        return 1
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
