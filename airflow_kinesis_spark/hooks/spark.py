"""Where the batch's Spark job runs: one interface, one implementation per way of running Spark.

Each runner is a :class:`~airflow_kinesis_spark.core.protocol.BatchJob`: "run this planned batch
and return its per-shard reports". It owns everything about its way of running Spark —
packaging the Airflow-free code for the executors, the job's environment and credentials, the
processes it starts, how to kill them, and cleaning up — so the protocol and the operators
never see any of it.

* :class:`SparkSubmitJob` — ``spark-submit`` through the apache-spark provider's hook
  (:class:`~airflow_kinesis_spark.hooks.spark_submit.BatchSparkSubmitHook`, connection type
  ``spark``; ``local[*]`` when the connection does not exist).
* :class:`SparkConnectJob` — the job in this process against a running Spark Connect server
  (connection type ``spark_connect``): no JVM start per batch.

:func:`spark_job_for` picks one from the connection's type. A third runner only has to implement
``run(plan, records_expected=...)`` and ``kill()``.

pyspark and the apache-spark provider are imported when a runner runs, not when this module
is imported, so a worker that only plans and commits needs neither.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import uuid
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import airflow_kinesis_spark
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.core.ranges import ShardReport
from airflow_kinesis_spark.core.reader import ReadOptions
from airflow_kinesis_spark.exceptions import EndpointUnreachableError

if TYPE_CHECKING:
    from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook

log = logging.getLogger(__name__)

__all__ = [
    "SparkJobSettings",
    "SparkSubmitJob",
    "SparkConnectJob",
    "spark_job_for",
    "spark_script_path",
    "CONNECT_ENV_VARS",
    "CONNECT_READY_TIMEOUT",
]

SPARK_SCRIPT = "kinesis_batch.py"
#: Environment variables by which PySpark marks a process as a Spark Connect client.
CONNECT_ENV_VARS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
#: Seconds a Spark Connect server has to accept the gRPC channel (PySpark's own retries take minutes).
CONNECT_READY_TIMEOUT = 10.0
#: Namespace of the Spark Connect session ids derived from a consumer (uuid5).
CONNECT_SESSION_NAMESPACE = uuid.UUID("6d2f3c1e-8a4b-4f0e-9c57-1b2a3d4e5f60")
#: Session conf holding the digest of the artifacts a reused Spark Connect session already has.
ARTIFACTS_CONF = "spark.airflow_kinesis_spark.artifacts_sha256"


def spark_script_path() -> str:
    """Path of the PySpark job: inside the installed wheel, or ``spark_scripts/`` of a checkout.

    :raises FileNotFoundError: the script is not shipped with the package.
    """
    package = Path(airflow_kinesis_spark.__file__).resolve().parent
    for candidate in (package / "spark_scripts" / SPARK_SCRIPT, package.parent / "spark_scripts" / SPARK_SCRIPT):
        if candidate.is_file():
            return str(candidate)
    raise FileNotFoundError(f"{SPARK_SCRIPT} is not shipped with airflow_kinesis_spark at {package}")


def core_zip(directory: str) -> str:
    """Zip the Airflow-free part of ``airflow_kinesis_spark`` (core, transforms, exceptions) for
    Spark's executors into ``directory``; returns the zip's path."""
    package = Path(airflow_kinesis_spark.__file__).resolve().parent
    target = Path(directory) / "airflow_kinesis_spark_core.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in [
            package / "__init__.py",
            package / "exceptions.py",
            *sorted((package / "core").glob("*.py")),
            *sorted((package / "transforms").glob("*.py")),
        ]:
            zf.write(path, f"airflow_kinesis_spark/{path.relative_to(package)}")
    return str(target)


def _die_with_parent() -> None:
    """In the spark-submit child: get SIGKILL when this worker process dies (Linux PR_SET_PDEATHSIG).

    A worker killed hard (OOM killer, ``kill -9``) would otherwise leave a local or client-mode
    Spark job running, which could write the batch's output after a retry started writing it.
    """
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG


@dataclass
class SparkJobSettings:
    """What every runner needs besides the plan.

    :param kinesis_hook: gives the job's AWS environment (region, endpoint, credentials).
    :param transform: optional ``package.module:function`` applied before the write.
    :param read_options: the readers' settings.
    :param spark_conf: extra Spark conf (spark-submit ``--conf``).
    :param py_files: extra ``--py-files`` / Connect artifacts (comma-separated).
    """

    spark_conn_id: str
    kinesis_hook: KinesisStreamHook
    read_options: ReadOptions = field(default_factory=ReadOptions)
    transform: str | None = None
    spark_conf: dict[str, Any] = field(default_factory=dict)
    py_files: str | None = None
    reuse_connect_session: bool = True


def describe(plan: BatchPlan) -> str:
    """``batch N`` or ``window [start, end)``, for messages."""
    if plan.mode == "window":
        return f"window [{format_timestamp(plan.window_start)}, {format_timestamp(plan.cutoff)})"  # type: ignore[arg-type]
    return f"batch {plan.batch_id}"


def after_failure(plan: BatchPlan) -> str:
    """What a failed job leaves behind, for messages."""
    if plan.mode == "window":
        return "A re-run reads the same window and overwrites its output."
    return "No checkpoint moved; the plan stays pending and the next attempt re-uses it."


def _log_result(plan: BatchPlan, result: dict[str, Any]) -> list[ShardReport]:
    log.info("Spark job of %s: %d records read in %.1fs, %.1fs in all",
             describe(plan), result["records"], result["read_seconds"], result["total_seconds"])  # fmt: skip
    return [ShardReport.from_dict(r) for r in result["reports"]]


class SparkSubmitJob:
    """Run the batch with ``spark-submit`` (the apache-spark provider's hook, connection ``spark``).

    The plan goes to the job in a file of a private temporary directory, the report comes back
    the same way; the Airflow-free code ships as ``--py-files``. Credentials reach the job
    through spark-submit's environment, never its command line: on YARN and Kubernetes, where
    the provider turns the environment into ``--conf`` options, none are passed and the
    cluster's own role is used. The spark-submit process dies with this worker
    (``PR_SET_PDEATHSIG``), and :meth:`kill` stops it through the hook's ``on_kill``.
    """

    def __init__(self, settings: SparkJobSettings) -> None:
        self.settings = settings
        self._hook: Any = None

    def run(self, plan: BatchPlan, *, records_expected: bool) -> list[ShardReport]:
        """:raises RuntimeError: the job failed or ended without a report."""
        with tempfile.TemporaryDirectory(prefix=f"kinesis-batch-{plan.batch_id}-") as tmp:
            plan_file = os.path.join(tmp, "plan.json")
            report_file = os.path.join(tmp, "report.json")
            with open(plan_file, "w", encoding="utf-8") as fh:
                json.dump(plan.to_dict(), fh)
            self._hook = self._build_hook(plan, plan_file, report_file, core_zip(tmp), records_expected)
            log.info("Submitting the Spark job of %s (%d shard ranges)", describe(plan), len(plan.ranges))
            try:
                self._hook.submit(application=spark_script_path(), preexec_fn=_die_with_parent)
            except Exception as err:
                raise RuntimeError(
                    f"The Spark job of {describe(plan)} failed: {err} (spark connection "
                    f"{self.settings.spark_conn_id!r}). {after_failure(plan)}"
                ) from err
            finally:
                self._hook = None
            if not os.path.exists(report_file):
                raise RuntimeError(f"The Spark job of {describe(plan)} ended without a report. {after_failure(plan)}")
            with open(report_file, encoding="utf-8") as fh:
                return _log_result(plan, json.load(fh))

    def kill(self) -> None:
        hook = self._hook
        if hook is not None:
            hook.on_kill()

    def _build_hook(self, plan: BatchPlan, plan_file: str, report_file: str, core: str, records_expected: bool) -> Any:
        s = self.settings
        args = ["--plan-file", plan_file, "--report-file", report_file, *s.read_options.job_args(records_expected)]
        if s.transform:
            args += ["--transform", s.transform]
        py_files = ",".join(p for p in (core, s.py_files) if p)
        name = f"kinesis-batch-{plan.stream_name}-{plan.consumer_name}-{plan.batch_id}"
        from airflow_kinesis_spark.hooks.spark_submit import BatchSparkSubmitHook

        def build(env: dict[str, str] | None) -> Any:
            return BatchSparkSubmitHook(conf=dict(s.spark_conf), conn_id=s.spark_conn_id, py_files=py_files,
                              application_args=args, env_vars=env, name=name)  # fmt: skip

        # On YARN and Kubernetes the provider turns env_vars into --conf options on the command
        # line; credentials must not go there, so the cluster's own role is used instead.
        on_command_line = build(None).env_goes_on_command_line
        if on_command_line:
            log.info("Spark master is YARN/Kubernetes: the job uses the cluster's AWS credentials")
        env = s.kinesis_hook.spark_environment(include_credentials=not on_command_line)
        env.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", sys.executable))
        venv_bin = Path(sys.executable).parent
        if not on_command_line and not shutil.which("spark-submit") and (venv_bin / "spark-submit").exists():
            # pyspark installs spark-submit next to this interpreter, which may not be on PATH
            # (a virtualenv that was not activated).
            log.info("spark-submit is not on PATH; using the one installed with pyspark in %s", venv_bin)
            env["PATH"] = os.pathsep.join(p for p in (str(venv_bin), os.environ.get("PATH", "")) if p)
        return build(env)


def _files_digest(paths: Sequence[str]) -> str:
    """SHA-256 over the names and contents of ``paths``."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(os.path.basename(path).encode() + b"\0")
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def with_session_id(url: str, session_id: str) -> str:
    """``url`` (``sc://host:port/;param=value...``) with its ``session_id`` parameter set."""
    base, _, params = url.partition("/;")
    base = base.rstrip("/")
    kept = [p for p in params.split(";") if p and not p.startswith("session_id=")]
    return f"{base}/;" + ";".join([*kept, f"session_id={session_id}"])


def check_spark_connect(url: str, conn_id: str) -> None:
    """Fail fast when the Spark Connect server of ``url`` does not accept a gRPC channel
    within :data:`CONNECT_READY_TIMEOUT` seconds.

    :raises EndpointUnreachableError: naming the connection and ``sc://host:port`` (never the token).
    """
    import grpc
    from pyspark.sql.connect.client import DefaultChannelBuilder

    builder = DefaultChannelBuilder(url)
    channel = builder.toChannel()
    try:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_READY_TIMEOUT)
    except grpc.FutureTimeoutError:
        endpoint = f"sc://{builder.endpoint}"
        raise EndpointUnreachableError(
            f"Cannot reach the Spark Connect server of spark_connect connection {conn_id!r} at {endpoint} "
            f"within {CONNECT_READY_TIMEOUT:g} s. Check the connection's host, port and use_ssl, and that the "
            "server runs and this machine can reach it.",
            service="Spark Connect", endpoint=endpoint, source=f"spark_connect connection {conn_id!r}",
        ) from None  # fmt: skip
    finally:
        channel.close()


def _load_job_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("airflow_kinesis_spark_batch_job", spark_script_path())
    job = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(job)  # type: ignore[union-attr]
    return job


class SparkConnectJob:
    """Run the batch in this process against a running Spark Connect server (no JVM start).

    The job is the same code spark-submit runs (``spark_scripts/kinesis_batch.py``); the
    Airflow-free part of the package goes to the server as a session artifact. Credentials
    travel inside the read function to the server's Python workers, never in the plan, the URL
    or a log line. PySpark marks the whole process as a Connect client in ``os.environ``; that
    is undone after the run, so a later spark-submit from this process is not affected.

    With ``reuse_connect_session`` the session id is derived from the stream and the consumer,
    and the session is not released when the run ends: the next batch of this consumer finds its
    artifacts and warm Python workers on the server (the artifacts' digest is kept in the
    session's conf). A session the server no longer accepts (expired, released, or holding other
    artifacts) is left to the server and this run uses a new one, released at its end.
    """

    def __init__(self, settings: SparkJobSettings, session_scope: str = "KinesisToSparkOperator") -> None:
        self.settings = settings
        self.session_scope = session_scope
        self._spark: Any = None

    def run(self, plan: BatchPlan, *, records_expected: bool) -> list[ShardReport]:
        """:raises RuntimeError: the job failed; :raises EndpointUnreachableError: no server."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
        from pyspark.sql import SparkSession

        from airflow_kinesis_spark.core.transform import resolve_transform

        s = self.settings
        job = _load_job_module()
        transform = resolve_transform(s.transform) if s.transform else None
        url = SparkConnectHook(conn_id=s.spark_conn_id).get_connection_url()
        log.info("Running the Spark job of %s over Spark Connect (%d shard ranges)", describe(plan), len(plan.ranges))
        check_spark_connect(url, s.spark_conn_id)
        saved = {k: os.environ.get(k) for k in CONNECT_ENV_VARS}
        try:
            with tempfile.TemporaryDirectory(prefix=f"kinesis-batch-{plan.batch_id}-") as tmp:
                artifacts = [core_zip(tmp), *filter(None, (s.py_files or "").split(","))]
                self._spark = self._session(SparkSession, url, plan, artifacts)
                result = job.run(self._spark, plan.to_dict(), transform, s.kinesis_hook.spark_environment(),
                                 s.read_options.job_options(records_expected))  # fmt: skip
        except Exception as err:
            raise RuntimeError(
                f"The Spark job of {describe(plan)} failed over Spark Connect: {err}. {after_failure(plan)}"
            ) from err
        finally:
            if self._spark is not None:
                self._spark.stop()
                self._spark = None
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return _log_result(plan, result)

    def kill(self) -> None:
        spark = self._spark
        if spark is not None:
            try:
                spark.interruptAll()
            except Exception as err:  # noqa: BLE001 - the session may be gone already
                log.warning("Could not interrupt the Spark Connect job: %s", err)

    def _session(self, session_cls: Any, url: str, plan: BatchPlan, artifacts: list[str]) -> Any:
        if self.settings.reuse_connect_session:
            session_id = str(uuid.uuid5(CONNECT_SESSION_NAMESPACE, f"{self.session_scope}/{plan.stream_name}/{plan.consumer_name}"))
            spark = None
            try:
                spark = session_cls.builder.remote(with_session_id(url, session_id)).getOrCreate()
                spark.release_session_on_close = False
                digest = _files_digest(artifacts)
                if spark.conf.get(ARTIFACTS_CONF, None) != digest:  # not uploaded to this session yet
                    for artifact in artifacts:
                        spark.addArtifacts(artifact, pyfile=True)
                    spark.conf.set(ARTIFACTS_CONF, digest)
                return spark
            except Exception as err:  # noqa: BLE001 - any refusal: fall back to a new session
                log.info("Spark Connect session %s not reusable (%s); starting a new one", session_id, err)
                if spark is not None:
                    # Close this client only: the server session may serve another run of the
                    # consumer (a window re-run) right now, so it is not released.
                    spark.release_session_on_close = False
                    spark.stop()
        spark = session_cls.builder.remote(url).getOrCreate()
        for artifact in artifacts:
            spark.addArtifacts(artifact, pyfile=True)
        return spark


def spark_job_for(settings: SparkJobSettings, session_scope: str = "KinesisToSparkOperator") -> SparkSubmitJob | SparkConnectJob:
    """The runner for the ``spark_conn_id`` connection: :class:`SparkConnectJob` for a connection
    of type ``spark_connect``, else :class:`SparkSubmitJob` (also when the connection does not
    exist: ``local[*]``)."""
    from airflow.sdk import BaseHook

    try:
        conn_type = BaseHook.get_connection(settings.spark_conn_id).conn_type
    except Exception:  # noqa: BLE001 - any lookup failure means "no such connection"
        conn_type = None
    if conn_type == "spark_connect":
        return SparkConnectJob(settings, session_scope)
    return SparkSubmitJob(settings)
