"""spark-submit for the batch job: the apache-spark provider's hook with a local default."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_kinesis_spark import die_with_parent

__all__ = ["BatchSparkSubmitHook"]


class BatchSparkSubmitHook(SparkSubmitHook):
    """:class:`SparkSubmitHook` that runs ``local[*]`` when its ``spark`` connection does not exist.

    The apache-spark provider falls back to YARN without a connection; a DAG author trying the
    provider on a laptop expects a local Spark. Every other behaviour (command line, masking,
    ``on_kill``, YARN/Kubernetes/standalone) is the provider's, except that spark-submit
    runs through :mod:`airflow_kinesis_spark.die_with_parent`: it dies with the worker and does
    not inherit Airflow's environment variables.
    """

    def _resolve_connection(self) -> dict[str, Any]:
        data = super()._resolve_connection()
        try:
            self.get_connection(self._conn_id)
        except Exception:  # noqa: BLE001 - any lookup failure means "no such connection"
            self.log.info("Connection %r not found: running Spark with master local[*]", self._conn_id)
            data["master"] = "local[*]"
        return data

    def _build_spark_submit_command(self, application: str) -> list[str]:
        """The provider's command, run through :mod:`airflow_kinesis_spark.die_with_parent`: the
        job gets ``SIGKILL`` when this worker process dies (Linux), without ``preexec_fn``, and
        none of the worker's ``AIRFLOW_*`` environment variables."""
        return die_with_parent.command(super()._build_spark_submit_command(application))

    @property
    def env_goes_on_command_line(self) -> bool:
        """On YARN and Kubernetes the provider passes ``env_vars`` as ``--conf`` options."""
        return bool(self._is_yarn or self._is_kubernetes)
