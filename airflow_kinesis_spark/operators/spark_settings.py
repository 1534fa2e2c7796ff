"""The Spark settings of a task that runs the batch's job itself: where the job runs and with
which credentials (:class:`~airflow_kinesis_spark.operators.settings.SparkSettings`, the
``spark_settings`` argument), and the runner built from them.

Used by :class:`~airflow_kinesis_spark.operators.kinesis_to_spark.KinesisToSparkOperator` and
:class:`~airflow_kinesis_spark.operators.window.KinesisWindowToSparkOperator`; the split task
group's job task is the user's own operator (docs/split-tasks.md).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import Any

from airflow_kinesis_spark.core.read_options import ReadOptions
from airflow_kinesis_spark.hooks.spark import SparkJob
from airflow_kinesis_spark.hooks.spark_settings import SparkJobSettings, validate_job_credentials
from airflow_kinesis_spark.operators.settings import SparkSettings, task_copy
from airflow_kinesis_spark.settings import transform_allowed_modules

__all__ = ["SparkSettingsMixin"]


class SparkSettingsMixin:
    """``spark_settings`` (:class:`~airflow_kinesis_spark.operators.settings.SparkSettings`: the Spark
    connection, spark-submit options, Spark Connect session reuse and the job's credentials);
    ``spark_job`` builds the runner (``hooks.spark.SparkJob``) when a job is needed.

    The operator declares ``spark_settings`` itself and calls :meth:`_init_spark`.
    """

    read_options: ReadOptions
    transform: str | None
    checkpoint_table: str
    task_id: str
    kinesis_hook: Any
    checkpoint_hook: Any

    def _init_spark(self, spark_settings: SparkSettings | None) -> None:
        """Keep a copy of ``spark_settings`` (its default when ``None``): a copy, so rendering this
        task (``conf`` is templated) never writes into an object other tasks share. Called by
        the operator's own ``__init__``, which declares ``spark_settings`` (Airflow fills only
        arguments an operator's own ``__init__`` names from ``default_args`` and ``partial``).

        :raises TypeError: ``spark_settings`` is not a :class:`SparkSettings`.
        """
        self.spark_settings = task_copy("spark_settings", spark_settings, SparkSettings)

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render a copy of ``spark_settings`` (see ``OutputSettingsMixin.render_template_fields``)."""
        self.spark_settings = replace(self.spark_settings)
        super().render_template_fields(context, jinja_env)  # type: ignore[misc]

    def validate(self) -> None:
        """The operator's checks (its base's ``validate``), then :meth:`validate_spark`; called
        first in ``execute``, before any I/O.

        :raises ValueError: naming the argument, the problem and the fix.
        """
        super().validate()  # type: ignore[misc]
        self.validate_spark()

    def validate_spark(self) -> None:
        """Check the job's credentials mode, before any I/O.

        :raises ValueError: naming the setting and the allowed values.
        """
        try:
            validate_job_credentials(self.spark_settings.job_credentials)
        except ValueError as err:
            raise ValueError(f"SparkSettings.{err}") from err

    def _transform_imports_here(self) -> bool:
        """With ``spark_settings.py_files`` the transform's module need not import on the worker (the job
        checks it before reading anything)."""
        return not self.spark_settings.py_files

    @cached_property
    def spark_job(self) -> SparkJob:
        """Where the batch's Spark job runs (the runner for the ``spark_settings.conn_id`` connection,
        chosen when a job is needed)."""
        s = self.spark_settings
        settings = SparkJobSettings(
            spark_conn_id=s.conn_id, kinesis_hook=self.kinesis_hook, read_options=self.read_options,
            transform=self.transform, transform_allowed_modules=transform_allowed_modules(),
            spark_conf=dict(s.conf or {}), py_files=s.py_files, reuse_connect_session=s.connect_reuse_session,
            job_credentials=s.job_credentials, checkpoint_hook=self.checkpoint_hook if self.checkpoint_table else None,
        )  # fmt: skip
        return SparkJob(settings, session_scope=type(self).__name__)

    def on_kill(self) -> None:
        """Kill the batch's Spark job, if this task started one."""
        if "spark_job" in self.__dict__:
            self.spark_job.kill()
