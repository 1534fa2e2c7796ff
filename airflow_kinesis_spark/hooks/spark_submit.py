"""spark-submit for the batch job: the apache-spark provider's hook with a local default."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_kinesis_spark import die_with_parent

__all__ = ["BatchSparkSubmitHook", "exception_line"]

#: A line that names an exception: Python's ``package.module.SomeError: message`` (the last line of
#: a traceback) or the JVM's ``[Exception in thread "main" ]org.pkg.SomeException: message``.
_EXCEPTION = re.compile(
    r"^(?:Exception in thread \"[^\"]*\"\s+)?(?P<line>(?:[A-Za-z_$][\w$]*\.)*[A-Za-z_$][\w$]*(?:Error|Exception|Exit)(?::\s.*)?)$"
)
#: Wrappers that only carry another exception: their cause is named on a later line.
_WRAPPERS = ("py4j.protocol.Py4JJavaError", "org.apache.spark.SparkException: Job aborted", "pyspark.errors.exceptions")


def exception_line(line: str) -> str | None:
    """The exception a line of spark-submit output names (class and message), else ``None``.

    Log lines (``26/11/24 00:16:27 INFO ...``) and stack frames (``at ...``, ``File "..."``) are
    not exceptions; their text may quote one, which is then found on a line of its own.
    """
    text = line.strip().removeprefix("Caused by: ")
    if not text or text.startswith(("at ", "File ", "...")):
        return None
    match = _EXCEPTION.match(text)
    return match["line"][:500] if match else None


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

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        """The provider's log processing, watching the lines for the exception that failed the job
        (:attr:`failure_cause`)."""
        self.exception_lines: list[str] = []

        def watch(lines: Iterator[Any]) -> Iterator[Any]:
            for line in lines:
                cause = exception_line(line.decode(errors="replace") if isinstance(line, bytes) else str(line))
                if cause:
                    self.exception_lines.append(cause)
                yield line

        super()._process_spark_submit_log(watch(itr))

    @property
    def failure_cause(self) -> str | None:
        """The driver's exception (class and message) from the job's output: the last one named
        that is not a mere wrapper of another (``Py4JJavaError``, ``SparkException: Job aborted``),
        else the last one; ``None`` when the output named none."""
        lines = getattr(self, "exception_lines", [])
        own = [line for line in lines if not line.startswith(_WRAPPERS)]
        return (own or lines or [None])[-1]

    @property
    def env_goes_on_command_line(self) -> bool:
        """On YARN and Kubernetes the provider passes ``env_vars`` as ``--conf`` options."""
        return bool(self._is_yarn or self._is_kubernetes)
