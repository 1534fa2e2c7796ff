"""The job's per-range reports: collected from its report rows, and read back as an observed metric.

Every planned shard range ends its read with one report row (JSON, the ``_report`` column of
:func:`~airflow_kinesis_spark.job.read.read_batch`). :func:`collect_reports` makes them the
batch's report, one per range in the plan's order; a range without one (a transform that did
not consume all of its input) or two that disagree (a retried task that read something else)
fail the job. In one pass (:func:`~airflow_kinesis_spark.job.batch.run_one_pass`) the rows come
back as an observed metric of the write (``DataFrame.observe``: :func:`_observed`,
:func:`_observed_reports`), which needs a classic session or a Spark Connect client from 4.0 on
(:func:`observation_supported`).

pyspark is imported inside the functions that use it. No Airflow import.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["READ_FIELDS", "ObservedMetricsLostError", "collect_reports", "observation_supported"]


#: What two reads of one range must agree on (timings and call counts may differ).
READ_FIELDS = ("first", "last", "records", "quarantined", "dead_letters", "stop_reason")


def _range_key(item: dict[str, Any]) -> tuple[str, int]:
    return item["shard_id"], int(item.get("slice_index") or 0)


def _same_read(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in READ_FIELDS)


def collect_reports(plan: dict[str, Any], rows: list[str]) -> list[dict[str, Any]]:
    """One report per planned range, from the job's report rows (JSON), in the plan's order.

    Spark may run a read more than once (a retried task, a transform whose sort samples its
    input); a range's reports must then agree on what was read.

    :raises RuntimeError: a range without a report (the transform did not consume all of its
        input, e.g. ``limit``), or two reports of one range that disagree.
    """
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        report = json.loads(row)
        key = _range_key(report)
        seen = found.setdefault(key, report)
        if not _same_read(seen, report):
            raise RuntimeError(f"shard {key[0]} (slice {key[1]}) was read twice with different results: "
                               f"{[seen.get(k) for k in READ_FIELDS]} and {[report.get(k) for k in READ_FIELDS]}; "
                               "nothing is committed")  # fmt: skip
    missing = [key for key in map(_range_key, plan["ranges"]) if key not in found]
    if missing:
        raise RuntimeError(
            f"no read report for {len(missing)} of {len(plan['ranges'])} shard ranges ({missing[:3]}...): the job did not "
            "read them to the end. A transform must consume all of its input (no limit or sample); nothing is committed"
        )
    return [found[key] for key in map(_range_key, plan["ranges"])]


# Spark 3.5 and 4 compatibility of the one-pass job's observed metric (the only Spark API the job
# uses whose behaviour differs between the two lines):
# * classic 3.5 hands an observed metric's value back as py4j sees it, so a list (``collect_list``)
#   arrives as a Java object; 4.x converts it to Python. The metric is therefore one string, the
#   JSON array of the report rows, which every version returns as a Python ``str``.
# * a Spark Connect client before 4.0 sends the metric's plan node but cannot read the value back
#   (its ``Observation.get`` only knows classic sessions): ``job.batch.run`` then takes the cached path.


def _is_spark_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (not a classic, JVM-backed one)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def observation_supported(spark: Any) -> bool:
    """Whether an observed metric of a write can be read back on ``spark``: on classic sessions
    always; over Spark Connect from pyspark 4.0 on."""
    if not _is_spark_connect(spark):
        return True
    import pyspark

    return int(pyspark.__version__.split(".")[0]) >= 4


def _observed(df: Any, name: str) -> tuple[Any, Any]:
    """``df`` with its report rows observed as a metric named ``name``: one JSON array (a string)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observation = Observation(name)
    return df.observe(observation, F.to_json(F.collect_list("_report")).alias("reports")), observation


class ObservedMetricsLostError(RuntimeError):
    """A write succeeded but its observed metrics (the batch's report rows) did not come back: seen
    over Spark Connect on a busy server (SPARK-54279). The output is complete but unreported."""


def _observed_reports(observation: Any, data: Any, name: str) -> list[str]:
    """The report rows an action on ``data`` observed.

    :raises RuntimeError: the metric's plan node was optimized away (classic).
    :raises ObservedMetricsLostError: the action's metrics did not come back.
    :raises TypeError: the metric is not one JSON string.
    """
    jdf = getattr(data, "_jdf", None)
    if jdf is not None and f"CollectMetrics {name}" not in jdf.queryExecution().optimizedPlan().toString():
        # Classic Spark waits forever for a metric whose plan node the optimizer removed.
        raise RuntimeError("the transform's result does not depend on the records read; no report was observed")
    metrics = observation.get
    if "reports" not in metrics:
        # Seen over Spark Connect on a loaded machine: a write that succeeded, no metrics back. Spark
        # Connect servers up to 4.1 send a query's observed metrics only if they arrive within 100 ms
        # of its end (Observation.getRowOrEmpty; SPARK-54279 removes that wait).
        raise ObservedMetricsLostError(
            f"observed metric {name}: the report rows of the batch's ranges did not reach the driver (metrics received: "
            f"{', '.join(sorted(metrics)) or 'none'}); nothing is committed. Over Spark Connect a busy server can drop a "
            "query's observed metrics (SPARK-54279): the task's retry runs the same plan again")  # fmt: skip
    value = metrics["reports"]
    if not isinstance(value, str):
        raise TypeError(f"observed metric {name}: expected the report rows as one JSON string, got {type(value).__name__}")
    return list(json.loads(value))
