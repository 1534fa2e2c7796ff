"""A window accepts only the arguments it uses: the incremental ones of KinesisToSparkOperator
(where a batch starts and stops, its lease and hand-over, the batch log) are refused when the
task is built, not "checked but without effect" (issue #30)."""

from __future__ import annotations

from datetime import datetime

import pytest
from airflow.sdk import DAG

from airflow_kinesis_spark.operators.window import INCREMENTAL_ONLY, KinesisWindowToSparkOperator
from tests.unit.operators.signatures import mro_parameters

VALUES = {"cutoff": "2026-01-01T00:00:00Z", "initial_position": "LATEST", "initial_timestamp": "2026-01-01T00:00:00Z",
          "max_records_per_shard": 10, "max_bytes_per_shard": 1024, "lease_seconds": 30.0, "keep_batches": 5,
          "deferrable": True, "poke_interval": 5.0, "job_start_timeout": 60.0}  # fmt: skip


@pytest.mark.parametrize("name", INCREMENTAL_ONLY)
def test_a_window_refuses_each_incremental_argument(name):
    # Before: accepted and ignored (deferrable=True failed only when the task ran).
    with DAG("w", schedule=None, start_date=datetime(2026, 1, 1)):
        with pytest.raises(TypeError, match=rf"KinesisWindowToSparkOperator does not take {name}: a window reads"):
            KinesisWindowToSparkOperator(task_id="w", stream_name="s", output_path="/lake/w", **{name: VALUES[name]})


def test_default_args_of_incremental_tasks_do_not_break_a_window_of_the_same_dag():
    """A DAG's default_args fill only what a task takes: a window beside incremental tasks is built."""
    with DAG("w", schedule=None, start_date=datetime(2026, 1, 1), default_args={"lease_seconds": 30.0, "deferrable": True}):
        window = KinesisWindowToSparkOperator(task_id="w", stream_name="s", output_path="/lake/w")
    assert window.stream_name == "s"


def test_every_refused_argument_is_one_the_incremental_operator_takes():
    from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator

    # KinesisToSparkOperator's own __init__ adds only the deferral arguments; the others come from
    # its bases (operators.base.KinesisIncrementalBaseOperator), so look through its MRO.
    taken = mro_parameters(KinesisToSparkOperator, provider_only=True)
    assert set(INCREMENTAL_ONLY) <= taken
    assert not set(INCREMENTAL_ONLY) & mro_parameters(KinesisWindowToSparkOperator, provider_only=True)
    assert sorted(VALUES) == sorted(INCREMENTAL_ONLY)
