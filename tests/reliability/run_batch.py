"""One KinesisToSparkOperator run in its own process (as an Airflow worker runs a task).

    python -m tests.reliability.run_batch STREAM CONSUMER TABLE OUTPUT [--transform T --py-files F]
        [--output-format iceberg|delta --table-name NS.T --catalog-uri URI] [--spark-conn-id ID]
        [--consumer-type polling|efo] [--die-after-table-commit]

Connections come from the environment (AIRFLOW_CONN_AWS_DEFAULT; no spark connection: spark-submit
with local[*]). Prints the summary as its last line; exit code 1 on failure.

``--die-after-table-commit``: the table library's commit call (pyiceberg's
``Transaction.commit_transaction``, deltalake's ``DeltaTable.create_write_transaction``) runs,
applies, and this process is killed (SIGKILL) before the call returns: the ambiguous table
commit, as a crash inside the library would leave it. A test hook of this runner only.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import OutputSettings, ReadOptions, SparkSettings


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("stream", "consumer", "table", "output"):
        parser.add_argument(name)
    parser.add_argument("--transform")
    parser.add_argument("--py-files")
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--limit", type=int, default=25)
    parser.add_argument("--output-format", default="parquet")
    parser.add_argument("--table-name")
    parser.add_argument("--catalog-uri")
    parser.add_argument("--spark-conn-id", default="spark_default")
    parser.add_argument("--consumer-type", default="polling", choices=("polling", "efo"))
    parser.add_argument("--die-after-table-commit", action="store_true")
    args = parser.parse_args()
    iceberg = {"table": args.table_name, "catalog_properties": {"type": "sql", "uri": args.catalog_uri}}
    output = OutputSettings(format=args.output_format, **(iceberg if args.output_format == "iceberg" else {}))
    if args.die_after_table_commit:
        die_after_table_commit()
    try:
        summary = KinesisToSparkOperator(
            task_id="ingest", stream_name=args.stream, consumer_name=args.consumer, checkpoint_table=args.table,
            output_path=args.output, transform=args.transform, output_settings=output,
            lease_seconds=args.lease, read_options=ReadOptions(limit=args.limit, min_call_interval=0.05),
            spark_settings=SparkSettings(conn_id=args.spark_conn_id, conf={"spark.ui.enabled": "false"}, py_files=args.py_files),
            consumer_type=args.consumer_type,
        ).execute({})  # fmt: skip
    except Exception as err:  # noqa: BLE001 - reported to the harness
        traceback.print_exc()
        print(json.dumps({"error": f"{type(err).__name__}: {err}"}), flush=True)
        return 1
    print(json.dumps(summary), flush=True)
    return 0


def die_after_table_commit() -> None:
    """Make the table libraries' commit calls kill this process once they applied (see the module doc)."""
    import os
    import signal

    import deltalake
    import pyiceberg.table

    def dying(real):  # noqa: ANN001, ANN202
        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            real(*args, **kwargs)
            print("table commit applied; killing this process before the library call returns", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        return call

    pyiceberg.table.Transaction.commit_transaction = dying(pyiceberg.table.Transaction.commit_transaction)
    deltalake.DeltaTable.create_write_transaction = dying(deltalake.DeltaTable.create_write_transaction)


if __name__ == "__main__":
    sys.exit(main())
