"""The provider's settings are read when a task runs, from one module, and each option it reads
is declared in the provider's metadata (``airflow config list`` shows it)."""

from __future__ import annotations

import ast
from datetime import datetime
from pathlib import Path

import pytest
from airflow.sdk import DAG

import airflow_kinesis_spark.settings as settings_module
from airflow_kinesis_spark.get_provider_info import get_provider_info
from airflow_kinesis_spark.operators.split import KinesisCommitBatchOperator, kinesis_batch_task_group
from airflow_kinesis_spark.sensors.kinesis import KinesisShardLagSensor
from airflow_kinesis_spark.settings import SECTION, deferral_requested, summary_budget_settings

CONSUMER = dict(stream_name="s", consumer_name="c", checkpoint_table="t")


def tasks_built_before_the_setting_changes():
    with DAG("settings", schedule=None, start_date=datetime(2026, 1, 1)):
        sensor = KinesisShardLagSensor(task_id="lag", **CONSUMER)
        commit = KinesisCommitBatchOperator(task_id="commit", plan_task_id="plan", **CONSUMER)
        group = kinesis_batch_task_group("group", job=lambda arguments: KinesisShardLagSensor(task_id="job", **CONSUMER),
                                         output_path="/tmp/out", **CONSUMER)  # fmt: skip
    return [sensor, commit, group.children["group.commit"]]


@pytest.mark.parametrize("value", ["True", "False"])
def test_default_deferrable_is_read_when_the_task_runs_not_when_it_is_built(monkeypatch, value):
    # Before: the sensor, the commit task and the task group took the setting's value when their
    # module was imported (False here), whatever it was when the task ran.
    monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raising=False)
    tasks = tasks_built_before_the_setting_changes()
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", value)
    assert [deferral_requested(t.deferrable) for t in tasks] == [value == "True"] * 3


def test_an_explicit_deferrable_wins_over_the_setting(monkeypatch):
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    assert deferral_requested(False) is False
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "False")
    assert deferral_requested(True) is True


def options_read() -> dict[str, str]:
    """``{option: fallback}`` of every ``conf.get*(SECTION, option, fallback=...)`` in the settings module."""
    tree = ast.parse(Path(settings_module.__file__).read_text(encoding="utf-8"))
    found = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "conf" and node.args and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "SECTION"):  # fmt: skip
            fallback = next(k.value for k in node.keywords if k.arg == "fallback")
            found[node.args[1].value] = ast.unparse(fallback)
    return found


def test_every_option_the_provider_reads_is_declared_with_its_default():
    declared = get_provider_info()["config"][SECTION]["options"]
    read = options_read()
    assert sorted(read) == sorted(declared) == ["describe_stream_summary_per_second", "shared_state_dir",
                                                "transform_allowed_modules"]  # fmt: skip
    assert declared["describe_stream_summary_per_second"]["default"] == str(int(settings_module.DEFAULT_CALLS_PER_SECOND))
    assert declared["shared_state_dir"]["default"] == declared["transform_allowed_modules"]["default"] == ""


def test_the_summary_budget_settings_come_from_the_section(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW__KINESIS_SPARK__DESCRIBE_STREAM_SUMMARY_PER_SECOND", "2.5")
    monkeypatch.setenv("AIRFLOW__KINESIS_SPARK__SHARED_STATE_DIR", str(tmp_path))
    assert summary_budget_settings() == (2.5, str(tmp_path))
    monkeypatch.delenv("AIRFLOW__KINESIS_SPARK__DESCRIBE_STREAM_SUMMARY_PER_SECOND")
    monkeypatch.delenv("AIRFLOW__KINESIS_SPARK__SHARED_STATE_DIR")
    assert summary_budget_settings() == (settings_module.DEFAULT_CALLS_PER_SECOND, None)
