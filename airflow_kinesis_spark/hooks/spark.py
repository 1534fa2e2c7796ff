"""Where the batch's Spark job runs: one interface, one implementation per way of running Spark.

Each runner is a :class:`~airflow_kinesis_spark.core.interfaces.BatchJob`: "run the batch handed
over in the checkpoint store, whose driver records its per-shard report there". It owns
everything about its way of running Spark — packaging the Airflow-free code for the executors,
the job's environment and credentials, the processes it starts, how to kill them, and cleaning
up — so the protocol and the operators never see any of it.

* :class:`SparkSubmitJob` — ``spark-submit`` through the apache-spark provider's hook
  (:class:`~airflow_kinesis_spark.hooks.spark_submit.BatchSparkSubmitHook`, connection type
  ``spark``; ``local[*]`` when the connection does not exist).
* :class:`~airflow_kinesis_spark.hooks.spark_connect.SparkConnectJob` — the job's driver in this
  process against a running Spark Connect server (connection type ``spark_connect``): no JVM
  start per batch.

:func:`spark_job_for` picks one from the connection's type; :class:`SparkJob` does so on first use.
A third runner only has to implement ``run_handed(arguments, output_location=...)`` and ``kill()``.

pyspark and the apache-spark provider are imported when a runner runs, not when this module
is imported, so a worker that only plans and commits needs neither.

Around the runners, each in a module of its own (this one imports them, none imports this one):
the job's settings and messages in ``hooks.spark_settings``, the script and the code zip in
``hooks.spark_package``, the job's log configuration in ``hooks.spark_logs``, the private
temporary directories and their sweep in ``hooks.spark_temp``, and the Spark Connect runner with
its server checks and sessions in ``hooks.spark_connect``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.job import JobArguments
from airflow_kinesis_spark.core.names import stream_name_of
from airflow_kinesis_spark.hooks.spark_connect import SparkConnectJob
from airflow_kinesis_spark.hooks.spark_logs import with_log_config
from airflow_kinesis_spark.hooks.spark_package import core_zip, spark_script_path
from airflow_kinesis_spark.hooks.spark_settings import SparkJobSettings, after_failure, describe
from airflow_kinesis_spark.hooks.spark_temp import (
    _write_owner,
    batch_temp_dir,
    consumer_key,
    make_batch_temp_dir,
    sweep_leftover_temp_dirs,
)

if TYPE_CHECKING:  # the apache-spark provider is imported when a runner runs
    from airflow_kinesis_spark.hooks.spark_submit import SparkConnection

log = logging.getLogger(__name__)

__all__ = ["SparkSubmitJob", "SparkJob", "spark_job_for", "LOCAL_UI_CONF"]

#: Spark conf defaults of a local master: no UI (it would listen on every interface, with links
#: that kill jobs); with ``spark.ui.enabled`` set back on, it serves the driver's host only.
LOCAL_UI_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.killEnabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


class SparkSubmitJob:
    """Run the batch with ``spark-submit`` (the apache-spark provider's hook, connection ``spark``).

    A batch or window is handed over in the checkpoint store (:meth:`run_handed`, ``core.job``):
    the job gets only its arguments, claims the batch, reads the plan and records its report
    there, so the driver may run anywhere spark-submit puts it (``local[*]``, client or cluster
    deploy mode). No file passes between this worker and the driver. The Airflow-free code ships
    as ``--py-files``. Credentials reach the job through spark-submit's environment,
    never its command line: on YARN and Kubernetes, where the provider turns the environment into
    ``--conf`` options, none are passed and the cluster's own role is used. The provider's hook
    is used through its public API only (constructor arguments, ``submit``, ``on_kill``); the
    connection's master and deploy mode, the spark-submit wrapper and a detached local command
    are owned (:mod:`airflow_kinesis_spark.hooks.spark_submit`). The spark-submit
    process dies with this worker (:mod:`airflow_kinesis_spark.die_with_parent`, through the
    wrapper), and :meth:`kill` stops it through the hook's ``on_kill``. On a local master the Spark UI is off and its kill
    links disabled (set ``spark.ui.enabled`` in ``SparkSettings.conf`` to turn it back on; it then binds to
    the driver's host). Spark logs warnings and errors only: the job's log4j 2 configuration
    (:data:`~airflow_kinesis_spark.hooks.spark_logs.LOG4J_CONFIG`,
    :func:`~airflow_kinesis_spark.hooks.spark_logs.with_log_config`) goes with it;
    ``spark.log.level`` in ``SparkSettings.conf`` (e.g. ``INFO``) sets its level. The job's files are in a
    private temporary directory, removed when the run ends, and by the next run if this one was
    killed (:func:`~airflow_kinesis_spark.hooks.spark_temp.batch_temp_dir`, :class:`SparkJob`); on a
    local master Spark's own scratch space is there too.
    """

    def __init__(self, settings: SparkJobSettings) -> None:
        self.settings = settings
        self._hook: Any = None

    def run_handed(self, arguments: JobArguments, *, output_location: str | None = None) -> None:
        """Run the job of the batch handed over in the store; its report is recorded there.

        :param output_location: the batch's output (scoped credentials may write only there and
            to its staging directories).
        :raises RuntimeError: the job failed (its exit code and the hook's error).
        """
        with batch_temp_dir(arguments.batch_id) as tmp:
            self._submit(arguments, core_zip(tmp), output_location=output_location)

    def submit_detached(self, arguments: JobArguments, *, output_location: str | None = None) -> str:
        """Start the job of a handed batch and return without waiting for it (a deferrable
        operator then waits on the checkpoint store).

        * YARN or Kubernetes in cluster deploy mode: spark-submit with
          ``spark.{yarn,kubernetes}.submission.waitAppCompletion=false`` returns once the
          cluster accepted the application; the driver runs on the cluster.
        * A local master (development): spark-submit starts as a detached process on this
          machine (its own session and working directory, output in ``spark-submit.log`` there,
          none of this worker's ``AIRFLOW_*`` variables); it outlives this task, as a cluster's
          driver would. The directory is removed when the job succeeds
          (:mod:`airflow_kinesis_spark.detached`) and kept, with its log, when it fails.

        :returns: where the driver runs, for the log.
        :raises ValueError: any other master or deploy mode (the driver would run in this worker).
        :raises RuntimeError: spark-submit failed to submit.
        """
        from airflow_kinesis_spark.die_with_parent import SCRUBBED_ENV_PREFIXES
        from airflow_kinesis_spark.hooks.spark_submit import local_submit_command

        connection = self.check_detachable()
        tmp = make_batch_temp_dir(arguments.batch_id, consumer=consumer_key(arguments.stream_name, arguments.consumer_name))
        try:
            job = self._job(connection, arguments, core_zip(tmp), output_location)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if connection.is_local:
            # Not through the hook: its submit waits for the job. The command is ours
            # (hooks.spark_submit.local_submit_command), without die_with_parent.
            command = local_submit_command(connection, spark_script_path(), conf=job.conf, files=job.files,
                                           py_files=job.py_files, name=job.name, application_args=job.args)  # fmt: skip
            env = {k: v for k, v in {**os.environ, **job.env}.items() if not k.startswith(SCRUBBED_ENV_PREFIXES)}
            env["TMPDIR"] = tmp
            log_path = os.path.join(tmp, "spark-submit.log")
            # airflow_kinesis_spark.detached removes the directory when the job succeeds (keeps its log otherwise).
            command = [sys.executable, "-m", "airflow_kinesis_spark.detached", tmp, "--", *command]
            with open(log_path, "wb") as out:
                process = subprocess.Popen(command, env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            _write_owner(tmp, process.pid)  # the detached job uses the directory from now on
            return f"local driver, process {process.pid}, log {log_path} (removed with its directory if the job succeeds)"
        # check_detachable() above: YARN or Kubernetes in cluster deploy mode. spark-submit returns
        # once the cluster accepted the application (a conf of the hook's constructor).
        key = f"spark.{'yarn' if connection.is_yarn else 'kubernetes'}.submission.waitAppCompletion"
        hook = job.hook(extra_conf={key: "false"})
        try:
            hook.submit(application=spark_script_path())
        except Exception as err:
            raise RuntimeError(f"Submitting the Spark job of batch {arguments.batch_id} failed: {err} "
                               f"(spark connection {self.settings.spark_conn_id!r})") from err  # fmt: skip
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # spark-submit returned: the cluster has its files
        return f"{connection.master}, cluster deploy mode"

    def check_detachable(self) -> SparkConnection:
        """Check that :meth:`submit_detached` can start the job away from this worker.

        :returns: the connection's master and deploy mode.
        :raises ValueError: the connection's master and deploy mode would run the driver here.
        """
        from airflow_kinesis_spark.hooks.spark_submit import spark_connection

        connection = spark_connection(self.settings.spark_conn_id)
        if connection.is_local or (connection.cluster_deploy_mode and connection.env_goes_on_command_line):
            return connection
        raise ValueError(
            f"deferrable=True needs a Spark driver that does not run in this worker, but spark connection "
            f"{self.settings.spark_conn_id!r} has master {connection.master!r} and deploy mode {connection.deploy_mode!r}. Use "
            "cluster deploy mode on YARN or Kubernetes (connection extra 'deploy-mode': 'cluster'), a local master for "
            "development, or deferrable=False."
        )

    def kill(self) -> None:
        hook = self._hook
        if hook is not None:
            hook.on_kill()

    def _submit(self, arguments: JobArguments, core: str, *, output_location: str | None) -> None:
        from airflow_kinesis_spark.hooks.spark_submit import spark_connection

        label, after = describe(arguments), after_failure(arguments)
        job = self._job(spark_connection(self.settings.spark_conn_id), arguments, core, output_location)
        # spark-submit through die_with_parent, its output copied into the run's directory (the wrapper)
        self._hook = job.hook(work_dir=os.path.dirname(core))
        log.info("Submitting the Spark job of %s", label)
        try:
            self._hook.submit(application=spark_script_path())
        except Exception as err:
            cause = getattr(self._hook, "failure_cause", None)
            raise RuntimeError(
                f"The Spark job of {label} failed" + (f": {cause}" if cause else "") + f" (spark connection "
                f"{self.settings.spark_conn_id!r}). {after}\n{err}"
            ) from err
        finally:
            self._hook = None

    def _job(
        self, connection: SparkConnection, arguments: JobArguments, core: str, output_location: str | None
    ) -> _SubmitArguments:  # fmt: skip
        """The spark-submit arguments of the job of ``arguments``: the hook's constructor
        arguments, derived from the connection's master and deploy mode (``connection``: looked up
        once per submission, :func:`~airflow_kinesis_spark.hooks.spark_submit.spark_connection`).
        The job's command line is ``arguments`` (:meth:`JobArguments.to_args`), the readers'
        settings and the transform."""
        s = self.settings
        stream_name, consumer_name = arguments.stream_name, arguments.consumer_name
        args = [*arguments.to_args(), *s.read_options.job_args(False)]
        if s.transform:
            args += ["--transform", s.transform]
            if s.transform_allowed_modules:  # the job checks the module defining the function too
                args += ["--transform-allowed-modules", ",".join(s.transform_allowed_modules)]
        py_files = ",".join(p for p in (core, s.py_files) if p)
        name = f"kinesis-batch-{stream_name}-{consumer_name}-{arguments.batch_id}"
        conf = dict(s.spark_conf)
        if connection.is_local:
            conf = {**LOCAL_UI_CONF, **conf}  # the DAG author's SparkSettings.conf wins
        conf, files = with_log_config(conf, master=connection.master, cluster_deploy_mode=connection.cluster_deploy_mode)
        # On YARN and Kubernetes the provider turns env_vars into --conf options on the command
        # line; credentials must not go there, so the cluster's own role is used instead.
        on_command_line = connection.env_goes_on_command_line
        if on_command_line:
            log.info("Spark master is YARN/Kubernetes: the job uses the cluster's AWS credentials")
        env = s.aws_environment(stream_name, output_location=output_location, checkpoint_table=arguments.checkpoint_table,
                                store_key=f"{stream_name_of(stream_name)}|{consumer_name}", cluster_role=on_command_line)  # fmt: skip
        if connection.is_local:
            env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the driver (and a UI turned back on) listen on loopback only
            if "spark.local.dir" not in conf and not os.environ.get("SPARK_LOCAL_DIRS"):
                # Spark's scratch space (spark-*, blockmgr-*) in the run's private directory (the one
                # holding the package zip): removed with it, also after a kill (sweep_leftover_temp_dirs).
                env["SPARK_LOCAL_DIRS"] = os.path.dirname(core)
        env.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", sys.executable))
        venv_bin = Path(sys.executable).parent
        if not on_command_line and not shutil.which("spark-submit") and (venv_bin / "spark-submit").exists():
            # pyspark installs spark-submit next to this interpreter, which may not be on PATH
            # (a virtualenv that was not activated).
            log.info("spark-submit is not on PATH; using the one installed with pyspark in %s", venv_bin)
            env["PATH"] = os.pathsep.join(p for p in (str(venv_bin), os.environ.get("PATH", "")) if p)
        return _SubmitArguments(connection, conf, files, py_files, name, args, env)


@dataclass(frozen=True)
class _SubmitArguments:
    """A job's spark-submit arguments: what :class:`~airflow_kinesis_spark.hooks.spark_submit.BatchSparkSubmitHook`
    takes through its constructor (or ``local_submit_command``, for a detached local job)."""

    connection: SparkConnection
    conf: dict[str, Any]
    files: str | None
    py_files: str
    name: str
    args: list[str]
    env: dict[str, str]

    def hook(self, *, work_dir: str | None = None, extra_conf: dict[str, Any] | None = None) -> Any:
        from airflow_kinesis_spark.hooks import spark_submit

        return spark_submit.BatchSparkSubmitHook(
            conf={**self.conf, **(extra_conf or {})}, conn_id=self.connection.conn_id, py_files=self.py_files,
            files=self.files, application_args=self.args, env_vars=self.env, name=self.name, work_dir=work_dir,
            spark_binary=self.connection.spark_binary,  # known: the hook need not look the connection up for it
        )  # fmt: skip


class SparkJob:
    """The batch's Spark job on the ``spark_conn_id`` connection: the runner
    (:func:`spark_job_for`) is chosen when the job first runs, so a run that needs no job (no new
    records) never looks the Spark connection up.

    Made once per run (the operators' ``spark_job``), it first removes the temporary directories
    that killed runs left behind
    (:func:`~airflow_kinesis_spark.hooks.spark_temp.sweep_leftover_temp_dirs`): every run, also one
    that finds no new records and starts no job."""

    def __init__(self, settings: SparkJobSettings, session_scope: str = "KinesisToSparkOperator") -> None:
        self.settings = settings
        self.session_scope = session_scope
        self.runner: SparkSubmitJob | SparkConnectJob | None = None
        sweep_leftover_temp_dirs()

    def _runner(self) -> SparkSubmitJob | SparkConnectJob:
        if self.runner is None:
            self.runner = spark_job_for(self.settings, self.session_scope)
        return self.runner

    def check_detachable(self) -> None:
        """:meth:`SparkSubmitJob.check_detachable`.

        :raises ValueError: the connection is a Spark Connect one (its driver is this process),
            or its driver would run in this worker.
        """
        self._detachable()

    def _detachable(self) -> SparkSubmitJob:
        runner = self._runner()
        if not isinstance(runner, SparkSubmitJob):
            raise ValueError(f"deferrable=True does not apply to spark_connect connection {self.settings.spark_conn_id!r}: "
                             "the job runs in this worker's process; use deferrable=False")  # fmt: skip
        runner.check_detachable()
        return runner

    def submit_detached(self, arguments: JobArguments, *, output_location: str | None = None) -> str:
        """:meth:`SparkSubmitJob.submit_detached` (:raises ValueError: as :meth:`check_detachable`)."""
        return self._detachable().submit_detached(arguments, output_location=output_location)

    def run_handed(self, arguments: JobArguments, *, output_location: str | None = None) -> None:
        """The runner's ``run_handed``: the job of the batch (or window) handed over in the store."""
        self._runner().run_handed(arguments, output_location=output_location)

    def kill(self) -> None:
        if self.runner is not None:
            self.runner.kill()


def spark_job_for(settings: SparkJobSettings, session_scope: str = "KinesisToSparkOperator") -> SparkSubmitJob | SparkConnectJob:
    """The runner for the ``spark_conn_id`` connection:
    :class:`~airflow_kinesis_spark.hooks.spark_connect.SparkConnectJob` for a connection of type
    ``spark_connect``, else :class:`SparkSubmitJob` (also when the connection does not exist:
    ``local[*]``)."""
    from airflow.sdk import BaseHook

    try:
        conn_type = BaseHook.get_connection(settings.spark_conn_id).conn_type
    except Exception:  # noqa: BLE001 - any lookup failure means "no such connection"
        conn_type = None
    if conn_type == "spark_connect":
        return SparkConnectJob(settings, session_scope)
    return SparkSubmitJob(settings)

