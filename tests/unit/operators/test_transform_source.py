"""The operators run only a transform their DAG file gives them (issue #28): not templated, not
from an XCom, not from a mapped task's run-time values, allowed by ``[kinesis_spark]
transform_allowed_modules``. Checked in ``validate()``, before any I/O."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace

import pytest

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import SparkSettings
from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator
from airflow_kinesis_spark.operators.split import KinesisPlanBatchOperator
from airflow_kinesis_spark.settings import transform_allowed_modules

SHIPPED = "airflow_kinesis_spark.transforms.apache_log:parse_combined_log"
OTHER = "airflow_kinesis_spark.core.transform:parse_allowed_modules"  # importable, callable, not a transform
OPTION_ENV = "AIRFLOW__KINESIS_SPARK__TRANSFORM_ALLOWED_MODULES"


@pytest.fixture
def settings(tmp_path) -> dict:
    return {"stream_name": "clicks", "consumer_name": "lake", "checkpoint_table": "checkpoints",
            "output_path": str(tmp_path / "lake")}  # fmt: skip


def a_dag(dag_id: str = "d"):
    from airflow.sdk import DAG

    return DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1))


def as_run(task):
    """The task as the task runner executes it: a copy of the DAG's object, rendered with a run's conf."""
    running = task.prepare_for_execution()
    running.render_template_fields({"dag_run": SimpleNamespace(conf={"transform": OTHER}), "params": {}})
    return running


@pytest.mark.parametrize("operator", [KinesisToSparkOperator, KinesisWindowToSparkOperator, KinesisPlanBatchOperator])
def test_transform_is_not_a_template_field(operator):
    assert "transform" not in operator.template_fields


def test_a_template_is_refused_with_the_reason(settings):
    with a_dag():
        task = KinesisToSparkOperator(task_id="t", transform="{{ dag_run.conf.get('transform') }}", **settings)
    running = as_run(task)
    assert running.transform == "{{ dag_run.conf.get('transform') }}"  # not rendered
    with pytest.raises(ValueError, match="is a template, but transform is not templated"):
        running.validate()


def test_the_dag_files_transform_runs(settings):
    with a_dag():
        task = KinesisToSparkOperator(task_id="t", transform=SHIPPED, **settings)
    as_run(task).validate()


def test_a_subclass_that_templates_transform_again_is_refused(settings):
    class Templating(KinesisToSparkOperator):
        template_fields = (*KinesisToSparkOperator.template_fields, "transform")

    with a_dag():
        task = Templating(task_id="t", transform="{{ dag_run.conf.get('transform') }}", **settings)
    running = as_run(task)
    assert running.transform == OTHER  # rendered from the run's conf
    with pytest.raises(ValueError, match="is not one its DAG file gives it"):
        running.validate()


def test_an_xcom_is_refused(settings):
    from airflow.sdk import task as task_decorator

    with a_dag():

        @task_decorator
        def pick() -> str:
            return OTHER

        task = KinesisToSparkOperator(task_id="t", transform=pick(), **settings)
    with pytest.raises(ValueError, match="string written in the DAG file; got a PlainXComArg"):
        as_run(task).validate()


def test_a_task_mapped_over_an_xcom_is_refused(settings):
    from airflow.sdk import task as task_decorator

    with a_dag():

        @task_decorator
        def pick() -> list[str]:
            return [OTHER]

        mapped = KinesisToSparkOperator.partial(task_id="t", **settings).expand(transform=pick())
    with pytest.raises(ValueError, match="is not one its DAG file gives it"):
        mapped.unmap({"transform": OTHER}).validate()


def test_a_task_mapped_over_literals_runs_them_only(settings):
    with a_dag():
        mapped = KinesisToSparkOperator.partial(task_id="t", **settings).expand(transform=[SHIPPED])
        listed = KinesisToSparkOperator.partial(task_id="k", **settings).expand_kwargs([{"transform": SHIPPED}])
    mapped.unmap({"transform": SHIPPED}).validate()
    listed.unmap({"transform": SHIPPED}).validate()
    with pytest.raises(ValueError, match="is not one its DAG file gives it"):
        mapped.unmap({"transform": OTHER}).validate()


def test_the_allow_list_option(settings, monkeypatch):
    monkeypatch.setenv(OPTION_ENV, "my_company.kinesis, team_b")
    assert transform_allowed_modules() == ("my_company.kinesis", "team_b")
    with a_dag():
        other = KinesisToSparkOperator(task_id="other", transform=OTHER, spark_settings=SparkSettings(py_files="deps.zip"), **settings)
        shipped = KinesisToSparkOperator(task_id="shipped", transform=SHIPPED, **settings)
    with pytest.raises(ValueError, match=r"not under a prefix of \[kinesis_spark\] transform_allowed_modules"):
        as_run(other).validate()
    as_run(shipped).validate()  # the provider's own transforms are always allowed
    monkeypatch.setenv(OPTION_ENV, "")
    assert transform_allowed_modules() == ()
    as_run(other).validate()
    monkeypatch.setenv(OPTION_ENV, "shutil")
    with pytest.raises(ValueError, match="standard library"):
        transform_allowed_modules()


def test_a_standard_library_function_is_refused_in_the_dag_file_too(settings):
    with a_dag():
        task = KinesisToSparkOperator(task_id="t", transform="shutil:rmtree", spark_settings=SparkSettings(py_files="deps.zip"), **settings)
    with pytest.raises(ValueError, match="refused before importing it: 'shutil' is in Python's standard library"):
        as_run(task).validate()
