"""The batch operators take their settings as objects (``operators.settings``: OutputSettings,
RecordSettings, ReadOptions, SparkSettings) instead of about 40 flat arguments: the former flat
arguments are refused naming the new spelling, a settings argument of another type is refused,
the objects' templated fields are rendered on a copy (never on the object the DAG file built and
other tasks share), and no operator's signature keeps an old name."""

from __future__ import annotations

import re

from datetime import datetime
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG, BaseOperator

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import OutputSettings, ReadOptions, RecordSettings, SparkSettings
from airflow_kinesis_spark.operators.split import KinesisCommitBatchOperator, KinesisPlanBatchOperator, kinesis_batch_task_group
from airflow_kinesis_spark.operators.tables import KinesisTableCompactionOperator
from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator
from tests.unit.operators.signatures import mro_parameters

#: The former flat arguments and where each went (the API change's table, written out here so a
#: wrong entry of ``settings.MOVED_ARGUMENTS`` fails).
MOVED = {
    "output_format": "output_settings=OutputSettings(format=...)",
    "table": "output_settings=OutputSettings(table=...)",
    "catalog_conn_id": "output_settings=OutputSettings(catalog_conn_id=...)",
    "catalog_properties": "output_settings=OutputSettings(catalog_properties=...)",
    "partition_by": "output_settings=OutputSettings(partition_by=...)",
    "max_records_per_file": "output_settings=OutputSettings(max_records_per_file=...)",
    "target_file_size": "output_settings=OutputSettings(target_file_size=...)",
    "storage_options": "output_settings=OutputSettings(storage_options=...)",
    "shared_output": "output_settings=OutputSettings(shared_output=...)",
    "schema_evolution": "output_settings=OutputSettings(schema_evolution=...)",
    "record_format": "record_settings=RecordSettings(format=...)",
    "record_schema": "record_settings=RecordSettings(schema=...)",
    "record_message": "record_settings=RecordSettings(message=...)",
    "schema_registry": "record_settings=RecordSettings(registry=...)",
    "keep_raw_data": "record_settings=RecordSettings(keep_raw_data=...)",
    "max_dead_letter_fraction": "record_settings=RecordSettings(max_dead_letter_fraction=...)",
    "get_records_limit": "read_options=ReadOptions(limit=...)",
    "min_call_interval": "read_options=ReadOptions(min_call_interval=...)",
    "read_bytes_per_second": "read_options=ReadOptions(read_bytes_per_second=...)",
    "read_tasks": "read_options=ReadOptions(read_tasks=...)",
    "spark_conn_id": "spark_settings=SparkSettings(conn_id=...)",
    "spark_conf": "spark_settings=SparkSettings(conf=...)",
    "spark_py_files": "spark_settings=SparkSettings(py_files=...)",
    "spark_connect_reuse_session": "spark_settings=SparkSettings(connect_reuse_session=...)",
    "job_credentials": "spark_settings=SparkSettings(job_credentials=...)",
}
#: A value of each, as a DAG file written for the flat arguments gave it.
OLD_VALUES = {
    "output_format": "iceberg", "table": "lake.orders", "catalog_conn_id": "iceberg_catalog",
    "catalog_properties": {"type": "glue"}, "partition_by": ["day(approximate_arrival_timestamp)"],
    "max_records_per_file": 1000, "target_file_size": 128 * 1024 * 1024, "storage_options": {"AWS_S3_LOCKING_PROVIDER": "dynamodb"},
    "shared_output": True, "schema_evolution": "add_columns", "record_format": "json", "record_schema": "id bigint",
    "record_message": "shop.v1.Order", "schema_registry": {"registry_name": "r", "schema_name": "s"}, "keep_raw_data": True,
    "max_dead_letter_fraction": 0.1, "get_records_limit": 500, "min_call_interval": 0.5, "read_bytes_per_second": 1024,
    "read_tasks": 4, "spark_conn_id": "spark_prod", "spark_conf": {"spark.executor.memory": "2g"}, "spark_py_files": "deps.zip",
    "spark_connect_reuse_session": True, "job_credentials": "connection",
}  # fmt: skip
#: The old names of the arguments that moved into the settings the commit task takes (its output and records).
COMMIT_MOVED = [name for name, new in MOVED.items() if new.startswith(("output_settings", "record_settings"))]

OPERATORS = [KinesisToSparkOperator, KinesisWindowToSparkOperator, KinesisPlanBatchOperator, KinesisCommitBatchOperator,
             KinesisTableCompactionOperator]  # fmt: skip
CONTEXT = {"ds": "2026-01-01", "ds_nodash": "20260101", "data_interval_start": datetime(2026, 1, 1),
           "data_interval_end": datetime(2026, 1, 2)}  # fmt: skip


def a_dag(dag_id: str = "d", **kwargs) -> DAG:
    return DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1), **kwargs)


@pytest.fixture
def incremental(tmp_path) -> dict:
    return {"stream_name": "clicks", "consumer_name": "lake", "checkpoint_table": "checkpoints",
            "output_path": str(tmp_path / "lake")}  # fmt: skip


@pytest.fixture
def builders(incremental, tmp_path) -> dict:
    """Build each operator (or the task group) inside a DAG with the given extra arguments."""
    window = {"stream_name": "clicks", "output_path": str(tmp_path / "window")}

    def job(arguments):
        return BaseOperator(task_id="job")

    return {
        "KinesisToSparkOperator": lambda **kw: KinesisToSparkOperator(task_id="ingest", **incremental, **kw),
        "KinesisWindowToSparkOperator": lambda **kw: KinesisWindowToSparkOperator(task_id="window", **window, **kw),
        "KinesisPlanBatchOperator": lambda **kw: KinesisPlanBatchOperator(task_id="plan", **incremental, **kw),
        "KinesisCommitBatchOperator": lambda **kw: KinesisCommitBatchOperator(task_id="commit", plan_task_id="plan",
                                                                              **incremental, **kw),  # fmt: skip
        "KinesisTableCompactionOperator": lambda **kw: KinesisTableCompactionOperator(
            task_id="compact", output_path=incremental["output_path"], **{"output_settings": OutputSettings(format="delta"), **kw}),
        "kinesis_batch_task_group": lambda **kw: kinesis_batch_task_group("batch", job=job, **incremental, **kw),
    }  # fmt: skip


def refusal(name: str, old: str) -> str:
    """How ``name`` names ``old`` when refusing it: where it went, or that ``name`` does not take
    that settings object at all."""
    argument = MOVED[old].split("=", 1)[0]
    return f"{old} -> {MOVED[old]}" if argument in TAKES[name] else f"{old}: {argument} is not an argument of {name}"


def kept_as_given(value, given) -> bool:
    """The frozen settings (``RecordSettings``, ``ReadOptions``) are kept as given; the mutable
    ones (``OutputSettings``, ``SparkSettings``, rendered in place by Airflow) as an equal copy."""
    if isinstance(given, (OutputSettings, SparkSettings)):
        return value == given and value is not given
    return value is given


def build(builders, name: str, **kwargs):
    with a_dag():
        return builders[name](**kwargs)


# -- the former flat arguments are refused, naming the new spelling ------------------------------


def test_the_table_of_moved_arguments_is_the_packages():
    from airflow_kinesis_spark.operators.settings import MOVED_ARGUMENTS

    assert MOVED_ARGUMENTS == MOVED
    assert sorted(OLD_VALUES) == sorted(MOVED)


@pytest.mark.parametrize("name", ["KinesisToSparkOperator", "KinesisWindowToSparkOperator", "kinesis_batch_task_group"])
@pytest.mark.parametrize("old", sorted(MOVED))
def test_each_old_flat_argument_is_refused_naming_the_new_spelling(builders, name, old):
    expected = (f"{name} takes its settings as objects now (from airflow_kinesis_spark.operators.settings): "
                f"{refusal(name, old)}")  # fmt: skip
    with pytest.raises(TypeError) as raised:
        build(builders, name, **{old: OLD_VALUES[old]})
    assert str(raised.value) == expected


@pytest.mark.parametrize("old", COMMIT_MOVED)
def test_the_commit_task_refuses_the_old_output_and_record_arguments(builders, old):
    with pytest.raises(TypeError) as raised:
        build(builders, "KinesisCommitBatchOperator", **{old: OLD_VALUES[old]})
    assert str(raised.value) == ("KinesisCommitBatchOperator takes its settings as objects now "
                                 f"(from airflow_kinesis_spark.operators.settings): {old} -> {MOVED[old]}")  # fmt: skip


@pytest.mark.parametrize("name", ["KinesisPlanBatchOperator", "KinesisTableCompactionOperator"])
@pytest.mark.parametrize("old", ["output_format", "table", "record_format", "get_records_limit"])
def test_the_other_operators_refuse_them_too(builders, name, old):
    with pytest.raises(TypeError, match=rf"^{name} takes its settings as objects now .*: {re.escape(refusal(name, old))}$"):
        build(builders, name, **{old: OLD_VALUES[old]})


def test_several_old_arguments_of_one_object_are_named_together(builders):
    """output_format, table and catalog_properties go into ONE OutputSettings: all three are named."""
    with pytest.raises(TypeError) as raised:
        build(builders, "KinesisToSparkOperator", output_format="iceberg", table="lake.orders", catalog_properties={"type": "glue"},
              spark_conn_id="spark_prod")  # fmt: skip
    message = str(raised.value)
    for old in ("output_format", "table", "catalog_properties", "spark_conn_id"):
        assert f"{old} -> {MOVED[old]}" in message


def test_the_task_groups_commit_kwargs_are_refused_by_the_commit_task(builders):
    with pytest.raises(TypeError, match=r"^KinesisCommitBatchOperator takes its settings as objects now .*: "
                                        r"output_format -> output_settings=OutputSettings\(format=\.\.\.\)"):  # fmt: skip
        build(builders, "kinesis_batch_task_group", commit_kwargs={"output_format": "delta"})


def test_the_old_arguments_refused_by_a_mapped_task_too(incremental):
    """``partial()`` takes only the parameters of the operator's signature: a former flat argument is
    not one (Airflow's own TypeError), so no DAG file keeps one unnoticed."""
    with a_dag(), pytest.raises(TypeError, match="spark_conn_id"):
        KinesisToSparkOperator.partial(task_id="m", spark_conn_id="spark_prod", **incremental)


# -- a settings argument of another type --------------------------------------------------------

WRONG_TYPES = [
    ("output_settings", {"format": "delta"}, "OutputSettings"),
    ("output_settings", "delta", "OutputSettings"),
    ("record_settings", {"format": "json"}, "RecordSettings"),
    ("read_options", {"limit": 500}, "ReadOptions"),
    ("read_options", 500, "ReadOptions"),
    ("spark_settings", "spark_prod", "SparkSettings"),
    ("spark_settings", {"conn_id": "spark_prod"}, "SparkSettings"),
    ("output_settings", SparkSettings(), "OutputSettings"),  # another settings object
    ("spark_settings", OutputSettings(), "SparkSettings"),
]
TAKES = {
    "KinesisToSparkOperator": {"output_settings", "record_settings", "read_options", "spark_settings"},
    "KinesisWindowToSparkOperator": {"output_settings", "record_settings", "read_options", "spark_settings"},
    "KinesisPlanBatchOperator": {"output_settings", "record_settings", "read_options"},
    "KinesisCommitBatchOperator": {"output_settings", "record_settings"},
    "KinesisTableCompactionOperator": {"output_settings"},
    "kinesis_batch_task_group": {"output_settings", "record_settings", "read_options"},
}


@pytest.mark.parametrize(("name", "argument", "value", "cls"), [
    (name, argument, value, cls) for name, takes in TAKES.items() for argument, value, cls in WRONG_TYPES if argument in takes
], ids=lambda v: v if isinstance(v, str) else type(v).__name__)  # fmt: skip
def test_a_settings_argument_of_another_type_is_refused(builders, name, argument, value, cls):
    with pytest.raises(TypeError, match=rf"{argument} must be an instance of {cls} \(airflow_kinesis_spark.operators.settings\); "
                                        rf"got {type(value).__name__}"):  # fmt: skip
        build(builders, name, **{argument: value})


@pytest.mark.parametrize("name", list(TAKES))
def test_each_takes_its_settings_objects_and_keeps_them(builders, name):
    given = {"output_settings": OutputSettings(format="delta", table=None, shared_output=True),
             "record_settings": RecordSettings(format="json", schema="id bigint"),
             "read_options": ReadOptions(limit=500, read_tasks=4),
             "spark_settings": SparkSettings(conn_id="spark_prod", py_files="deps.zip")}  # fmt: skip
    built = build(builders, name, **{k: v for k, v in given.items() if k in TAKES[name]})
    if name == "kinesis_batch_task_group":  # both tasks get the output and record settings; the plan its read options
        plan, commit = built.children["batch.plan"], built.children["batch.commit"]
        kept = {"output_settings": [plan, commit], "record_settings": [plan, commit], "read_options": [plan]}
    else:
        kept = {argument: [built] for argument in TAKES[name]}
    for argument, tasks in kept.items():
        for task in tasks:
            assert kept_as_given(getattr(task, argument), given[argument]), (task.task_id, argument)


def test_the_defaults_are_the_settings_objects_defaults(builders):
    task = build(builders, "KinesisToSparkOperator")
    assert task.output_settings == OutputSettings()
    assert (task.output_settings.format, task.output_settings.table, task.output_settings.shared_output) == ("parquet", None, False)
    assert task.record_settings == RecordSettings() and task.record_settings.format == "raw"
    assert task.read_options == ReadOptions() and task.read_options.limit == 10_000
    assert task.spark_settings == SparkSettings()
    assert (task.spark_settings.conn_id, task.spark_settings.job_credentials) == ("spark_default", "scoped")


@pytest.mark.parametrize("name", list(TAKES)[:-1])
def test_no_operator_keeps_an_old_attribute(builders, name):
    task = build(builders, name)
    assert [old for old in MOVED if hasattr(task, old)] == []


# -- the plan task refuses the job task's settings ----------------------------------------------


def test_the_plan_task_refuses_spark_settings(builders):
    with pytest.raises(TypeError, match=r"^KinesisPlanBatchOperator does not take spark_settings: Spark runs in the job task"):
        build(builders, "KinesisPlanBatchOperator", spark_settings=SparkSettings(conn_id="spark_prod"))


def test_the_task_group_gives_spark_settings_to_no_task(builders):
    with pytest.raises(TypeError, match=r"^KinesisPlanBatchOperator does not take spark_settings: Spark runs in the job task"):
        build(builders, "kinesis_batch_task_group", spark_settings=SparkSettings(conn_id="spark_prod"))


# -- no old name in any signature ---------------------------------------------------------------


@pytest.mark.parametrize("cls", OPERATORS, ids=lambda c: c.__name__)
def test_no_signature_has_an_old_name(cls):
    taken = mro_parameters(cls)
    assert sorted(taken & set(MOVED)) == []
    assert {"output_settings"} <= taken


def test_the_task_groups_signature_has_no_old_name():
    import inspect

    assert sorted(set(inspect.signature(kinesis_batch_task_group).parameters) & set(MOVED)) == []


@pytest.mark.parametrize(("cls", "takes"), [
    (KinesisToSparkOperator, {"output_settings", "record_settings", "read_options", "spark_settings"}),
    (KinesisWindowToSparkOperator, {"output_settings", "record_settings", "read_options", "spark_settings"}),
    (KinesisPlanBatchOperator, {"output_settings", "record_settings", "read_options"}),
    (KinesisCommitBatchOperator, {"output_settings", "record_settings"}),
    (KinesisTableCompactionOperator, {"output_settings"}),
], ids=lambda v: v.__name__ if isinstance(v, type) else "")  # fmt: skip
def test_each_signature_names_exactly_the_settings_objects_its_operator_takes(cls, takes):
    settings = {"output_settings", "record_settings", "read_options", "spark_settings"}
    assert mro_parameters(cls, provider_only=True) & settings == takes


# -- the templated fields inside the settings objects -------------------------------------------


def templated_output() -> OutputSettings:
    return OutputSettings(format="{{ 'iceberg' }}", table="lake.orders_{{ ds_nodash }}", catalog_conn_id="catalog_{{ ds_nodash }}",
                          schema_evolution="{{ 'add_columns' }}", partition_by=["{{ ds }}"],
                          storage_options={"note": "{{ ds }}"})  # fmt: skip


def test_the_output_and_spark_settings_are_template_fields():
    for cls in (KinesisToSparkOperator, KinesisWindowToSparkOperator):
        assert {"output_settings", "spark_settings"} <= set(cls.template_fields)
    for cls in (KinesisPlanBatchOperator, KinesisCommitBatchOperator, KinesisTableCompactionOperator):
        assert "output_settings" in cls.template_fields
    assert tuple(OutputSettings.template_fields) == ("format", "table", "catalog_conn_id", "schema_evolution")
    assert tuple(SparkSettings.template_fields) == ("conf",)


def test_render_template_fields_renders_the_settings_objects_fields(incremental):
    with a_dag():
        spark = SparkSettings(conf={"spark.app.name": "ingest-{{ ds }}"}, py_files="{{ ds }}.zip")
        task = KinesisToSparkOperator(task_id="ingest", output_settings=templated_output(), spark_settings=spark, **incremental)
    task.render_template_fields(context=dict(CONTEXT))
    output, spark = task.output_settings, task.spark_settings
    assert (output.format, output.table, output.catalog_conn_id, output.schema_evolution) == (
        "iceberg", "lake.orders_20260101", "catalog_20260101", "add_columns")
    # only the objects' template_fields are rendered
    assert output.partition_by == ["{{ ds }}"] and output.storage_options == {"note": "{{ ds }}"}
    assert spark.conf == {"spark.app.name": "ingest-2026-01-01"}
    assert spark.py_files == "{{ ds }}.zip"


def test_rendering_one_operator_leaves_the_settings_it_shares_with_another_as_built(incremental, tmp_path):
    output = templated_output()
    spark = SparkSettings(conf={"spark.app.name": "ingest-{{ ds }}"})
    with a_dag():
        first = KinesisToSparkOperator(task_id="first", output_settings=output, spark_settings=spark, **incremental)
        second = KinesisWindowToSparkOperator(task_id="second", stream_name="clicks", output_path=str(tmp_path / "w"),
                                              output_settings=output, spark_settings=spark)  # fmt: skip
        compact = KinesisTableCompactionOperator(task_id="compact", output_path=incremental["output_path"], output_settings=output)
    first.render_template_fields(context=dict(CONTEXT))
    assert first.output_settings.table == "lake.orders_20260101"
    assert first.output_settings is not output and first.spark_settings is not spark
    assert output == templated_output()  # the object the DAG file built: not rendered
    assert spark.conf == {"spark.app.name": "ingest-{{ ds }}"}
    assert kept_as_given(second.output_settings, output) and kept_as_given(second.spark_settings, spark)
    assert kept_as_given(compact.output_settings, output)
    # the others render their own copies, from their own context
    second.render_template_fields(context={**CONTEXT, "ds": "2026-02-02", "ds_nodash": "20260202"})
    compact.render_template_fields(context={**CONTEXT, "ds": "2026-03-03", "ds_nodash": "20260303"})
    assert second.output_settings.table == "lake.orders_20260202"
    assert second.spark_settings.conf == {"spark.app.name": "ingest-2026-02-02"}
    assert compact.output_settings.table == "lake.orders_20260303"
    assert first.output_settings.table == "lake.orders_20260101"
    assert output == templated_output()


def test_a_task_run_renders_a_copy_the_dags_task_does_not_see(incremental):
    """As the task runner does: a copy of the DAG's task (``prepare_for_execution``), then rendered."""
    with a_dag():
        task = KinesisToSparkOperator(task_id="ingest", output_settings=templated_output(), **incremental)
    running = task.prepare_for_execution()
    running.render_template_fields(context=dict(CONTEXT))
    assert running.output_settings.table == "lake.orders_20260101"
    assert task.output_settings == templated_output()


def test_the_task_groups_plan_and_commit_render_their_own_copies(incremental):
    output = templated_output()
    with a_dag():
        group = kinesis_batch_task_group("batch", job=lambda arguments: BaseOperator(task_id="job"), output_settings=output,
                                         **incremental)  # fmt: skip
    plan, commit = group.children["batch.plan"], group.children["batch.commit"]
    plan.render_template_fields(context=dict(CONTEXT))
    assert plan.output_settings.table == "lake.orders_20260101"
    assert kept_as_given(commit.output_settings, output) and output == templated_output()
    commit.render_template_fields(context=dict(CONTEXT))
    assert commit.output_settings.table == "lake.orders_20260101"
    assert output == templated_output()


def test_rendering_a_mapped_task_leaves_the_shared_settings_as_built(incremental):
    """A mapped task renders through ``MappedOperator.render_template_fields``, which renders the
    unmapped task's fields itself (``_do_render_template_fields``): the object the DAG file built
    (held by ``partial`` and by every other task given it) must not be rendered there either."""
    output = templated_output()
    kwargs = {k: v for k, v in incremental.items() if k != "stream_name"}
    with a_dag() as dag:
        mapped = KinesisToSparkOperator.partial(task_id="m", output_settings=output, **kwargs).expand(stream_name=["a", "b"])
        other = KinesisCommitBatchOperator(task_id="commit", plan_task_id="plan", output_settings=output, **incremental)
    context = {**CONTEXT, "ti": SimpleNamespace(map_index=1, run_id="r", task_id="m", dag_id="d"), "dag": dag,
               "dag_run": SimpleNamespace(conf={}), "params": {}}  # fmt: skip
    mapped.render_template_fields(context)
    assert context["task"].stream_name == "b"
    assert context["task"].output_settings.table == "lake.orders_20260101"
    assert output == templated_output()
    assert other.output_settings == templated_output()


# -- Airflow's ways of giving arguments reach the settings objects ------------------------------


def test_default_args_fill_the_settings_objects(incremental):
    """A DAG's ``default_args`` fill the parameters of each class's ``__init__`` that Airflow wraps
    (``BaseOperatorMeta``), as they filled the flat arguments before."""
    given = {"output_settings": OutputSettings(format="delta"), "record_settings": RecordSettings(format="json", schema="id bigint"),
             "read_options": ReadOptions(limit=500), "spark_settings": SparkSettings(conn_id="spark_prod")}  # fmt: skip
    with a_dag(default_args=given):
        task = KinesisToSparkOperator(task_id="ingest", **incremental)
        window = KinesisWindowToSparkOperator(task_id="window", stream_name="clicks", output_path=incremental["output_path"])
        plan = KinesisPlanBatchOperator(task_id="plan", **incremental)  # takes no spark_settings: not given it
    for built in (task, window):
        for name, value in given.items():
            assert kept_as_given(getattr(built, name), value), name
    assert kept_as_given(plan.output_settings, given["output_settings"]) and plan.read_options is given["read_options"]
    assert not hasattr(plan, "spark_settings")


def test_a_mapped_task_takes_settings_objects_in_partial(incremental):
    spark = SparkSettings(conn_id="spark_prod")
    read = ReadOptions(limit=500)
    kwargs = {k: v for k, v in incremental.items() if k != "stream_name"}
    with a_dag():
        partial = KinesisToSparkOperator.partial(task_id="m", spark_settings=spark, read_options=read,
                                                 output_settings=OutputSettings(format="delta"), **kwargs)  # fmt: skip
        mapped = partial.expand(stream_name=["a", "b"])
    task = mapped.unmap({"stream_name": "a"})
    assert kept_as_given(task.spark_settings, spark) and task.read_options is read and task.output_settings.format == "delta"


# -- where each object is checked ----------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"limit": 0}, r"^ReadOptions.limit must be 1..10,000 \(GetRecords Limit\); got 0$"),
    ({"limit": 10_001}, r"^ReadOptions.limit must be 1..10,000 \(GetRecords Limit\); got 10001$"),
    ({"limit": True}, r"^ReadOptions.limit must be 1..10,000"),
    ({"min_call_interval": -1}, r"^ReadOptions.min_call_interval must be >= 0 seconds; got -1$"),
    ({"read_bytes_per_second": 0}, r"^ReadOptions.read_bytes_per_second must be > 0 "),
    ({"read_tasks": 0}, r"^ReadOptions.read_tasks must be a positive integer or None; got 0$"),
])  # fmt: skip
def test_read_options_are_checked_when_built_in_the_dag_file(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReadOptions(**kwargs)


def test_record_settings_are_checked_when_built_in_the_dag_file():
    with pytest.raises(ValueError, match=r"^RecordSettings.format must be one of raw, json, avro, protobuf; got 'xml'$"):
        RecordSettings(format="xml")
    with pytest.raises(ValueError, match=r"^RecordSettings\(format='json'\) needs a schema"):
        RecordSettings(format="json")


def test_output_settings_are_checked_when_the_task_validates(incremental):
    with a_dag():
        task = KinesisToSparkOperator(task_id="ingest", output_settings=OutputSettings(format="orc"), **incremental)  # built
    with pytest.raises(ValueError, match=r"OutputSettings.format must be one of .*; got 'orc'"):
        task.validate()
    with a_dag():
        task = KinesisToSparkOperator(task_id="ingest", output_settings=OutputSettings(format="iceberg"), **incremental)
    with pytest.raises(ValueError, match=r"^an 'iceberg' output needs a table: "):  # the sinks' message: no argument's name
        task.validate()


def test_a_rendered_format_is_checked(incremental):
    with a_dag():
        task = KinesisToSparkOperator(task_id="ingest", output_settings=OutputSettings(format="{{ 'delta' }}"), **incremental)
    task.render_template_fields(context=dict(CONTEXT))
    task.validate()
    assert task.output_settings.format == "delta"


@pytest.mark.parametrize("cls", [KinesisToSparkOperator, KinesisWindowToSparkOperator])
def test_spark_settings_are_checked_when_the_task_validates(incremental, cls):
    kwargs = incremental if cls is KinesisToSparkOperator else {"stream_name": "clicks", "output_path": incremental["output_path"]}
    with a_dag():
        task = cls(task_id="t", spark_settings=SparkSettings(job_credentials="instance_profile"), **kwargs)
    with pytest.raises(ValueError, match=r"^SparkSettings.job_credentials must be one of scoped, connection, none; "):
        task.validate()


def test_the_settings_repr_hides_secret_values():
    output = OutputSettings(format="iceberg", table="t", catalog_properties={"type": "rest", "token": "tkn-123", "uri": "https://c"},
                            storage_options={"AWS_SECRET_ACCESS_KEY": "sak-456", "AWS_REGION": "eu-west-1"})  # fmt: skip
    spark = SparkSettings(conf={"spark.hadoop.fs.s3a.secret.key": "sk-789", "spark.executor.memory": "2g"})
    shown = repr(output) + repr(spark)
    assert not any(secret in shown for secret in ("tkn-123", "sak-456", "sk-789"))
    assert all(kept in shown for kept in ("https://c", "eu-west-1", "2g"))
