"""Example: a DAG that runs on fresh data, scheduled on the output asset of kinesis_microbatch.

``KinesisToSparkOperator`` declares its output root as an Airflow Asset (``file:///...`` for a
local path, ``s3://...`` for ``s3a://``) and every successful run emits an asset event whose
``extra`` is the batch summary: ``batch_id``, ``records``, ``shards`` (shard id -> records),
``output_path`` (the batch's directory), ``status``, ``cutoff``. This DAG runs after the events
(one run may consume several, e.g. after a pause) and reads them from ``triggering_asset_events``.

A run of kinesis_microbatch without new records emits an event too, with ``records`` 0 and no
``output_path`` (Airflow emits an event for every declared outlet of a successful task); the
task below skips such events. To get events only for batches with records, give the operator
``output_asset=False, outlets=[AssetAlias(...)]`` (see docs/operators.md).

KINESIS_OUTPUT_PATH (default /tmp/kinesis_spark_output) must be the one kinesis_microbatch writes to.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from typing import Any

from airflow.sdk import dag, task

from airflow_kinesis_spark.lineage import asset_for_output

OUTPUT = os.environ.get("KINESIS_OUTPUT_PATH", "/tmp/kinesis_spark_output")

log = logging.getLogger(__name__)


# [START howto_asset_downstream]
fresh_data = asset_for_output(OUTPUT)  # the asset KinesisToSparkOperator(output_path=OUTPUT) emits


@dag(
    dag_id="kinesis_asset_downstream",
    schedule=[fresh_data],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["kinesis", "spark", "example"],
)
def kinesis_asset_downstream():
    @task
    def new_batches(triggering_asset_events: Any = None) -> dict[str, Any]:
        """The batches this run follows: their ids, records and directories (from the events' extra)."""
        batches = []
        for event in (triggering_asset_events or {}).get(fresh_data, []):
            extra = event.extra or {}
            if not extra.get("records"):
                continue  # a run without new records: nothing to do
            log.info("batch %s: %d records in %s (per shard: %s)", extra.get("batch_id"), extra["records"],
                     extra.get("output_path"), extra.get("shards"))  # fmt: skip
            batches.append({key: extra.get(key) for key in ("batch_id", "records", "output_path", "shards")})
        return {"asset": fresh_data.uri, "batches": batches, "records": sum(b["records"] for b in batches)}

    new_batches()


# [END howto_asset_downstream]

kinesis_asset_downstream()
