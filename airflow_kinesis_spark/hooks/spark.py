"""Where the batch's Spark job runs: one interface, one implementation per way of running Spark.

Each runner is a :class:`~airflow_kinesis_spark.core.interfaces.BatchJob`: "run this planned batch
and return its per-shard reports". It owns everything about its way of running Spark —
packaging the Airflow-free code for the executors, the job's environment and credentials, the
processes it starts, how to kill them, and cleaning up — so the protocol and the operators
never see any of it.

* :class:`SparkSubmitJob` — ``spark-submit`` through the apache-spark provider's hook
  (:class:`~airflow_kinesis_spark.hooks.spark_submit.BatchSparkSubmitHook`, connection type
  ``spark``; ``local[*]`` when the connection does not exist).
* :class:`SparkConnectJob` — the job in this process against a running Spark Connect server
  (connection type ``spark_connect``): no JVM start per batch.

:func:`spark_job_for` picks one from the connection's type; :class:`SparkJob` does so on first use. A third runner only has to implement
``run(plan, records_expected=...)`` and ``kill()``.

pyspark and the apache-spark provider are imported when a runner runs, not when this module
is imported, so a worker that only plans and commits needs neither.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import ipaddress
import json
import logging
import math
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import airflow_kinesis_spark
from airflow_kinesis_spark.core.job import JobArguments
from airflow_kinesis_spark.core.names import stream_name_of
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.core.ranges import ShardReport
from airflow_kinesis_spark.core.read_options import ReadOptions
from airflow_kinesis_spark.exceptions import EndpointUnreachableError

if TYPE_CHECKING:
    from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook

log = logging.getLogger(__name__)

__all__ = [
    "SparkJobSettings",
    "SparkSubmitJob",
    "SparkConnectJob",
    "spark_job_for",
    "SparkJob",
    "validate_job_credentials",
    "spark_script_path",
    "log4j_config_path",
    "with_log_config",
    "batch_temp_dir",
    "make_batch_temp_dir",
    "sweep_leftover_temp_dirs",
    "CONNECT_ENV_VARS",
    "CONNECT_READY_TIMEOUT",
    "UNRESPONSIVE_TIMEOUT_EXTRA",
    "DEFAULT_UNRESPONSIVE_TIMEOUT",
    "server_answers",
    "unresponsive_timeout",
]

SPARK_SCRIPT = "kinesis_batch.py"
#: The job's log4j 2 configuration, shipped next to the script: Spark, Hadoop and Parquet at WARN.
LOG4J_CONFIG = "kinesis-batch-log4j2.properties"
#: Spark conf (Spark 3.5+) whose level the shipped configuration takes, e.g. ``INFO`` to see Spark's INFO again.
LOG_LEVEL_CONF = "spark.log.level"
#: The levels ``spark.log.level`` takes (Spark's ``SparkContext.setLogLevel``).
LOG_LEVELS = ("ALL", "DEBUG", "ERROR", "FATAL", "INFO", "OFF", "TRACE", "WARN")
#: System property the shipped configuration reads its root level from (default ``warn``).
LOG_LEVEL_PROPERTY = "airflow_kinesis_spark.log.level"
#: log4j 2's system property for the root level of its default configuration (no file found).
LOG4J_DEFAULT_LEVEL_PROPERTY = "log4j2.level"
#: Name prefix of the runners' private temporary directories: ``kinesis-batch-<batch id>-<random>``.
TEMP_DIR_PREFIX = "kinesis-batch-"
#: File in each temporary directory naming the process that uses it (JSON: host, pid, start time).
TEMP_DIR_OWNER_FILE = "owner.json"
#: Seconds after which a left-over temporary directory whose owner cannot be checked (no owner
#: file, another host) is removed, and how long a failed detached job's log is kept.
TEMP_DIR_MAX_AGE = 24 * 3600.0
#: Environment variables by which PySpark marks a process as a Spark Connect client.
CONNECT_ENV_VARS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
#: Seconds a Spark Connect server has to accept the gRPC channel (PySpark's own retries take minutes).
CONNECT_READY_TIMEOUT = 10.0
#: ``spark_connect`` connection extra: seconds a running job waits for a Spark Connect server that
#: does not answer (killed, frozen, unreachable) before it is given up (:class:`SparkConnectJob`).
UNRESPONSIVE_TIMEOUT_EXTRA = "unresponsive_timeout"
#: Its default: PySpark's client would retry an unreachable server for about 10 minutes
#: (``DefaultPolicy``: "the maximum tolerated wait is guaranteed to be at least 10 minutes") and
#: wait on one that accepts connections but does not answer for ever; a server that answered no
#: call for a minute is down (a busy server answers: its gRPC threads are not Spark's).
DEFAULT_UNRESPONSIVE_TIMEOUT = 60.0
#: Seconds between two checks that the server answers while a job runs, and the longest a check
#: waits (less when ``unresponsive_timeout`` is short: a third of it).
SERVER_CHECK_INTERVAL = 5.0
#: ``spark_connect`` connection extra: a secret (string) that keys the reusable session ids
#: (``spark_connect_reuse_session=True``), shared by the workers that should reuse each other's
#: sessions. Without it, each worker keeps its own secret in :func:`worker_secret_path`.
SESSION_SECRET_EXTRA = "session_secret"
#: ``spark_connect`` connection extra that allows sending credentials to a non-loopback server
#: over plaintext gRPC (only for a network you trust: anyone on the path can read them).
ALLOW_INSECURE_EXTRA = "allow_insecure_credentials"
#: Spark conf defaults of a local master: no UI (it would listen on every interface, with links
#: that kill jobs); with ``spark.ui.enabled`` set back on, it serves the driver's host only.
LOCAL_UI_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.killEnabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}
#: What the job's AWS credentials may be: temporary and scoped to the stream (default), the
#: connection's own, or none (the cluster's own role: instance profile, IRSA, EMR execution role).
JOB_CREDENTIALS = ("scoped", "connection", "none")


def validate_job_credentials(value: str) -> str:
    """Return ``value`` if it is one of :data:`JOB_CREDENTIALS`.

    :raises ValueError: naming the allowed values.
    """
    if value not in JOB_CREDENTIALS:
        raise ValueError(f"job_credentials must be one of {', '.join(JOB_CREDENTIALS)}; got {value!r}")
    return value


def _shipped_file(name: str) -> str:
    """Path of a file of ``spark_scripts/``: inside the installed wheel, or in a checkout.

    :raises FileNotFoundError: the file is not shipped with the package.
    """
    package = Path(airflow_kinesis_spark.__file__).resolve().parent
    for candidate in (package / "spark_scripts" / name, package.parent / "spark_scripts" / name):
        if candidate.is_file():
            return str(candidate)
    raise FileNotFoundError(f"{name} is not shipped with airflow_kinesis_spark at {package}")


def spark_script_path() -> str:
    """Path of the PySpark job: inside the installed wheel, or ``spark_scripts/`` of a checkout.

    :raises FileNotFoundError: the script is not shipped with the package.
    """
    return _shipped_file(SPARK_SCRIPT)


def log4j_config_path() -> str:
    """Path of the job's log4j 2 configuration (:data:`LOG4J_CONFIG`), shipped like the script.

    :raises FileNotFoundError: the file is not shipped with the package.
    """
    return _shipped_file(LOG4J_CONFIG)


def _java_option(name: str, value: str) -> str:
    """``-Dname=value``, double-quoted when ``value`` has white space (Spark splits Java options on it)."""
    return f'-D{name}="{value}"' if any(c.isspace() for c in value) else f"-D{name}={value}"


def with_log_config(conf: dict[str, Any], *, master: str, cluster_deploy_mode: bool) -> tuple[dict[str, Any], str | None]:
    """``conf`` with the job's logging settings for the driver and executors (Spark at
    ``spark.log.level``, default ``WARN``), and the file spark-submit must ship (``--files``), or ``None``.

    Each JVM gets them in its ``spark.{driver,executor}.extraJavaOptions``, in the form that works
    at its start, when log4j 2 configures itself:

    * A JVM that starts on this machine (the JVMs of a ``local`` or ``local-cluster`` master; the
      driver in client deploy mode): ``-Dlog4j2.configurationFile`` with the path of :data:`LOG4J_CONFIG` here.
    * A JVM that YARN starts (executors; the driver in cluster deploy mode): the file's name. It
      is shipped with ``--files``, and YARN puts it in the container's working directory before
      the JVM starts.
    * A JVM that any other cluster manager starts (standalone, Kubernetes: their executors fetch
      ``--files`` only with their first task, long after log4j started, and then log Spark's INFO
      defaults): no file but ``-Dlog4j2.level`` (:data:`LOG4J_DEFAULT_LEVEL_PROPERTY`), the level
      of log4j 2's default configuration (the console, stdout), which Spark keeps. ``ERROR`` goes
      there as ``WARN``: Spark takes a default configuration at ``ERROR`` for "log4j not
      configured" and loads its own, at INFO.

    Options already in ``conf`` are kept and these are appended; a ``conf`` that names its own
    ``log4j2.configurationFile`` (or ``log4j.configurationFile``) is returned unchanged.
    ``spark.log.level`` in ``conf`` (:data:`LOG_LEVELS`) is the level from each JVM's start
    (``-Dairflow_kinesis_spark.log.level`` for the file).

    :param master: the connection's master (``local[*]``, ``yarn``, ``spark://...``, ``k8s://...``).
    :param cluster_deploy_mode: whether the driver runs on the cluster.
    :raises ValueError: ``spark.log.level`` is not one of :data:`LOG_LEVELS`.
    """
    level = str(conf.get(LOG_LEVEL_CONF) or "WARN").strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"spark_conf {LOG_LEVEL_CONF!r} must be one of {', '.join(LOG_LEVELS)}; got {conf[LOG_LEVEL_CONF]!r}")
    keys = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
    if any("log4j2.configurationFile" in str(conf.get(k) or "") or "log4j.configurationFile" in str(conf.get(k) or "") for k in keys):
        return conf, None  # the DAG author's own logging configuration
    path = log4j_config_path()
    local, yarn = master.startswith("local"), master.startswith("yarn")
    conf = dict(conf)

    def add(key: str, where: str) -> None:
        """``where``: ``path`` (this machine), ``name`` (YARN's working directory) or ``level``."""
        if where == "level":
            ours = _java_option(LOG4J_DEFAULT_LEVEL_PROPERTY, "WARN" if level == "ERROR" else level)
        else:
            ours = f"{_java_option(LOG_LEVEL_PROPERTY, level.lower())} " + _java_option(
                "log4j2.configurationFile", path if where == "path" else os.path.basename(path))
        conf[key] = " ".join(p for p in (str(conf.get(key) or "").strip(), ours) if p)

    add(keys[0], "path" if local or not cluster_deploy_mode else "name" if yarn else "level")
    if local and not master.startswith("local-cluster"):
        return conf, None  # the executors run in the driver's JVM
    add(keys[1], "path" if local else "name" if yarn else "level")
    return conf, path if yarn else None


# -- private temporary directories ------------------------------------------------------------


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, ``/proc/PID/stat`` field 22), or
    ``None`` where ``/proc`` does not say (not Linux, or no such process): with the pid, it names
    one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _write_owner(directory: str, pid: int, **about: Any) -> None:
    """Name process ``pid`` of this host as the user of ``directory`` (:data:`TEMP_DIR_OWNER_FILE`),
    keeping what the file says of the batch (``consumer``, ``batch_id``) unless ``about`` sets it."""
    target = os.path.join(directory, TEMP_DIR_OWNER_FILE)
    try:
        with open(target, encoding="utf-8") as fh:
            kept = {k: v for k, v in json.load(fh).items() if k in ("consumer", "batch_id")}
    except (OSError, ValueError, AttributeError):
        kept = {}
    owner = {**kept, **about, "host": socket.gethostname(), "pid": pid, "started": _process_start(pid)}
    with open(target + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(owner, fh)
    os.replace(target + ".tmp", target)


def _owner_alive(directory: str) -> bool | None:
    """Whether the process named in ``directory``'s owner file still runs: ``True``/``False``, or
    ``None`` when that cannot be told (no readable owner file, or a process of another host)."""
    try:
        with open(os.path.join(directory, TEMP_DIR_OWNER_FILE), encoding="utf-8") as fh:
            owner = json.load(fh)
        pid, host, started = int(owner["pid"]), owner["host"], owner.get("started")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user has the pid: it runs
    if started is not None and _process_start(pid) not in (None, started):
        return False  # the pid now names another process
    return True


def _committed_past(directory: str, committed: Mapping[str, int] | None) -> bool:
    """Whether ``directory``'s owner file names a (stream/consumer, batch id) that ``committed``
    (``"stream/consumer"`` -> its committed batch id) has committed, or passed."""
    if not committed:
        return False
    try:
        with open(os.path.join(directory, TEMP_DIR_OWNER_FILE), encoding="utf-8") as fh:
            owner = json.load(fh)
        return int(owner["batch_id"]) <= committed[owner["consumer"]]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def sweep_leftover_temp_dirs(
    temp_dir: str | None = None, *, max_age: float = TEMP_DIR_MAX_AGE, committed: Mapping[str, int] | None = None
) -> list[str]:
    """Remove the runners' temporary directories that runs killed with ``SIGKILL`` left behind.

    Only directories of ``temp_dir`` (default: :func:`tempfile.gettempdir`) named
    ``kinesis-batch-*`` (:data:`TEMP_DIR_PREFIX`), owned by this user, are looked at; one is removed when

    * its owner file names a process of this host that no longer runs (``os.kill(pid, 0)``, and
      the process's start time where ``/proc`` gives it, so a reused pid does not count), unless it
      holds a failed detached job's ``spark-submit.log`` younger than ``max_age``; or
    * its owner cannot be checked (no owner file: directories of earlier versions; another host
      sharing the directory) and nothing in it changed for ``max_age`` seconds.

    A failed detached job's directory also goes, whatever its age, once its consumer has
    committed its batch or a later one (``committed``: ``"stream/consumer"`` -> committed batch
    id, as the commit that just succeeded knows it): a later commit is proof nothing can still use it.

    A directory whose owner runs is never removed. Errors are logged, never raised.

    :returns: the paths removed.
    """
    base = temp_dir or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(TEMP_DIR_PREFIX)]
    except OSError as err:
        log.warning("Could not list %s for left-over temporary directories: %s", base, err)
        return removed
    now = time.time()
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            alive = _owner_alive(entry.path)
            if alive:
                continue
            age = now - max(entry.stat(follow_symlinks=False).st_mtime, _newest_mtime(entry.path))
            keep_log = alive is False and os.path.exists(os.path.join(entry.path, "spark-submit.log")) \
                and not _committed_past(entry.path, committed)  # fmt: skip
            if (alive is None or keep_log) and age < max_age:
                continue
            shutil.rmtree(entry.path)
            removed.append(entry.path)
        except FileNotFoundError:
            continue  # removed meanwhile (its run ended, or another sweep)
        except OSError as err:
            log.warning("Could not remove left-over temporary directory %s: %s", entry.path, err)
    if removed:
        log.info("Removed %d temporary directories that killed runs left behind: %s", len(removed), ", ".join(removed))
    return removed


def _newest_mtime(directory: str) -> float:
    """The newest modification time of ``directory``'s direct entries (0 when it is empty)."""
    newest = 0.0
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except FileNotFoundError:
                continue
    return newest


def consumer_key(stream_name: str, consumer_name: str) -> str:
    """``"{stream}/{consumer}"``: how a temporary directory names its batch's consumer."""
    return f"{stream_name_of(stream_name)}/{consumer_name}"


def make_batch_temp_dir(batch_id: int | str, pid: int | None = None, *, consumer: str | None = None) -> str:
    """A new private temporary directory ``kinesis-batch-<batch_id>-*`` owned by process ``pid``
    (default: this one). The caller removes it; what killed runs left behind is removed when the
    next run starts (:class:`SparkJob`, :func:`sweep_leftover_temp_dirs`).

    :param consumer: ``"stream/consumer"`` of the batch: recorded, so a later commit of the
        consumer removes a failed job's directory (:func:`sweep_leftover_temp_dirs`).
    """
    directory = tempfile.mkdtemp(prefix=f"{TEMP_DIR_PREFIX}{batch_id}-")
    about = {"consumer": consumer, "batch_id": batch_id} if consumer else {}
    _write_owner(directory, os.getpid() if pid is None else pid, **about)
    return directory


@contextmanager
def batch_temp_dir(batch_id: int | str) -> Iterator[str]:
    """:func:`make_batch_temp_dir`, removed when the block ends, whether it succeeded or failed
    (a run killed with ``SIGKILL`` leaves it to the next run's sweep)."""
    directory = make_batch_temp_dir(batch_id)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


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


@dataclass
class SparkJobSettings:
    """What every runner needs besides the plan.

    :param kinesis_hook: gives the job's AWS environment (region, endpoint, credentials).
    :param transform: optional ``package.module:function`` applied before the write.
    :param read_options: the readers' settings.
    :param spark_conf: extra Spark conf (spark-submit ``--conf``).
    :param py_files: extra ``--py-files`` / Connect artifacts (comma-separated).
    :param transform_allowed_modules: the module prefixes ``transform`` may come from (the
        provider's ``[kinesis_spark] transform_allowed_modules``; ``()``: any module outside the
        standard library). The job checks the module that defines the function against them too.
    :param reuse_connect_session: over Spark Connect, keep one server session per consumer across
        batches (its id keyed by this worker's secret, see :func:`connect_session_id`) instead of
        a session of the batch's own, released when it ends. Off by default: a kept session can
        be joined between batches by any client that can reach the server (see
        :class:`SparkConnectJob`).
    :param job_credentials: what AWS credentials the job gets (:data:`JOB_CREDENTIALS`):
        ``scoped`` (default: temporary, limited to reading the stream), ``connection`` (the
        connection's own) or ``none`` (the cluster's own role).
    :param checkpoint_hook: the checkpoint store's hook (``DynamoDBCheckpointHook``): its
        DynamoDB endpoint goes to a job that takes its batch from the store.
    """

    spark_conn_id: str
    kinesis_hook: KinesisStreamHook
    read_options: ReadOptions = field(default_factory=ReadOptions)
    transform: str | None = None
    spark_conf: dict[str, Any] = field(default_factory=dict)
    py_files: str | None = None
    transform_allowed_modules: tuple[str, ...] = ()
    reuse_connect_session: bool = False
    job_credentials: str = "scoped"
    checkpoint_hook: Any = None

    def __post_init__(self) -> None:
        validate_job_credentials(self.job_credentials)

    def aws_environment(
        self, stream_name: str, *, output_location: str | None = None, checkpoint_table: str | None = None,
        store_key: str | None = None, cluster_role: bool = False,
    ) -> dict[str, str]:  # fmt: skip
        """The job's AWS environment: region, endpoints (Kinesis; DynamoDB from ``checkpoint_hook``)
        and, unless the job uses its cluster's own role (``job_credentials='none'``, or
        ``cluster_role``), credentials: scoped to reading ``stream_name``, writing
        ``output_location`` and, with ``checkpoint_table``, the consumer's items (``store_key``) of
        the checkpoint table (``'scoped'``, :meth:`KinesisStreamHook.job_credentials`), or the
        connection's own (``'connection'``)."""
        hook = self.kinesis_hook
        if cluster_role or self.job_credentials == "none":
            env = hook.spark_environment(None)
        elif self.job_credentials == "connection":
            env = hook.spark_environment(hook.connection_credentials())
        else:
            env = hook.spark_environment(hook.job_credentials(
                stream_name, output_location=output_location, checkpoint_table=checkpoint_table, store_key=store_key,
            ))  # fmt: skip
        if checkpoint_table and self.checkpoint_hook is not None:
            endpoint = self.checkpoint_hook.conn_config.get_service_endpoint_url("dynamodb")
            if endpoint:
                env["AWS_ENDPOINT_URL_DYNAMODB"] = endpoint
        return env


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
    # DEBUG: the task log's lines of the batch come from its summary (core.summaries.log_outcome)
    log.debug("Spark job of %s: %d records read in %.1fs, %.1fs in all",
             describe(plan), result["records"], result["read_seconds"], result["total_seconds"])  # fmt: skip
    return [ShardReport.from_dict(r) for r in result["reports"]]


class SparkSubmitJob:
    """Run the batch with ``spark-submit`` (the apache-spark provider's hook, connection ``spark``).

    An incremental batch is handed over in the checkpoint store (:meth:`run_handed`,
    ``core.job``): the job gets only its arguments, claims the batch, reads the plan and records
    its report there, so the driver may run anywhere spark-submit puts it (``local[*]``, client or
    cluster deploy mode). A window (no checkpoint store) passes its plan in a file of a private
    temporary directory and its report comes back the same way (:meth:`run`). The Airflow-free
    code ships as ``--py-files``. Credentials reach the job through spark-submit's environment,
    never its command line: on YARN and Kubernetes, where the provider turns the environment into
    ``--conf`` options, none are passed and the cluster's own role is used. The spark-submit
    process dies with this worker (:mod:`airflow_kinesis_spark.die_with_parent`), and :meth:`kill`
    stops it through the hook's ``on_kill``. On a local master the Spark UI is off and its kill
    links disabled (set ``spark.ui.enabled`` in ``spark_conf`` to turn it back on; it then binds to
    the driver's host). Spark logs warnings and errors only: the job's log4j 2 configuration
    (:data:`LOG4J_CONFIG`, :func:`with_log_config`) goes with it; ``spark.log.level`` in
    ``spark_conf`` (e.g. ``INFO``) sets its level. The job's files are in a private temporary
    directory, removed when the run ends, and by the next run if this one was killed
    (:func:`batch_temp_dir`, :class:`SparkJob`); on a local master Spark's own scratch space is there too.
    """

    takes_batch_from_store = True

    def __init__(self, settings: SparkJobSettings) -> None:
        self.settings = settings
        self._hook: Any = None

    def run_handed(self, arguments: JobArguments, *, output_location: str | None = None) -> None:
        """Run the job of the batch handed over in the store; its report is recorded there.

        :param output_location: the batch's output (scoped credentials may write only there and
            to its staging directories).
        :raises RuntimeError: the job failed (its exit code and the hook's error).
        """
        plan_label = f"batch {arguments.batch_id}"
        with batch_temp_dir(arguments.batch_id) as tmp:
            args = [*arguments.to_args(), *self.settings.read_options.job_args(False)]
            self._submit(plan_label, args, core_zip(tmp), arguments.stream_name, arguments.consumer_name, arguments.batch_id,
                         output_location=output_location, checkpoint_table=arguments.checkpoint_table)  # fmt: skip

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
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from airflow_kinesis_spark.die_with_parent import SCRUBBED_ENV_PREFIXES

        self.check_detachable()
        tmp = make_batch_temp_dir(arguments.batch_id, consumer=consumer_key(arguments.stream_name, arguments.consumer_name))
        args = [*arguments.to_args(), *self.settings.read_options.job_args(False)]
        try:
            hook = self._build_hook(args, core_zip(tmp), arguments.stream_name, arguments.consumer_name, arguments.batch_id,
                                    output_location, arguments.checkpoint_table)  # fmt: skip
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        master = str(hook._connection.get("master") or "")
        if master.startswith("local"):
            command = SparkSubmitHook._build_spark_submit_command(hook, spark_script_path())  # without die_with_parent
            env = {k: v for k, v in {**os.environ, **(hook._env or {})}.items() if not k.startswith(SCRUBBED_ENV_PREFIXES)}
            env["TMPDIR"] = tmp
            log_path = os.path.join(tmp, "spark-submit.log")
            # airflow_kinesis_spark.detached removes the directory when the job succeeds (keeps its log otherwise).
            command = [sys.executable, "-m", "airflow_kinesis_spark.detached", tmp, "--", *command]
            with open(log_path, "wb") as out:
                process = subprocess.Popen(command, env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            _write_owner(tmp, process.pid)  # the detached job uses the directory from now on
            return f"local driver, process {process.pid}, log {log_path} (removed with its directory if the job succeeds)"
        # check_detachable() above: YARN or Kubernetes in cluster deploy mode
        key = f"spark.{'yarn' if hook._is_yarn else 'kubernetes'}.submission.waitAppCompletion"
        hook._conf = {**(hook._conf or {}), key: "false"}
        try:
            hook.submit(application=spark_script_path())
        except Exception as err:
            raise RuntimeError(f"Submitting the Spark job of batch {arguments.batch_id} failed: {err} "
                               f"(spark connection {self.settings.spark_conn_id!r})") from err  # fmt: skip
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # spark-submit returned: the cluster has its files
        return f"{master}, cluster deploy mode"

    def check_detachable(self) -> None:
        """Check that :meth:`submit_detached` can start the job away from this worker.

        :raises ValueError: the connection's master and deploy mode would run the driver here.
        """
        from airflow_kinesis_spark.hooks.spark_submit import BatchSparkSubmitHook

        hook = BatchSparkSubmitHook(conn_id=self.settings.spark_conn_id)
        master = str(hook._connection.get("master") or "")
        deploy_mode = hook._connection.get("deploy_mode")
        if master.startswith("local") or (deploy_mode == "cluster" and (hook._is_yarn or hook._is_kubernetes)):
            return
        raise ValueError(
            f"deferrable=True needs a Spark driver that does not run in this worker, but spark connection "
            f"{self.settings.spark_conn_id!r} has master {master!r} and deploy mode {deploy_mode!r}. Use cluster deploy "
            "mode on YARN or Kubernetes (connection extra 'deploy-mode': 'cluster'), a local master for development, "
            "or deferrable=False."
        )

    def run(self, plan: BatchPlan, *, records_expected: bool) -> list[ShardReport]:
        """Run the job of ``plan`` from a plan file (window mode).

        :raises RuntimeError: the job failed or ended without a report.
        """
        with batch_temp_dir(plan.batch_id) as tmp:
            plan_file = os.path.join(tmp, "plan.json")
            report_file = os.path.join(tmp, "report.json")
            with open(plan_file, "w", encoding="utf-8") as fh:
                json.dump(plan.to_dict(), fh)
            args = ["--plan-file", plan_file, "--report-file", report_file, *self.settings.read_options.job_args(records_expected)]
            self._submit(describe(plan), args, core_zip(tmp), plan.stream_name, plan.consumer_name, plan.batch_id,
                         output_location=plan.output_location, after=after_failure(plan))  # fmt: skip
            if not os.path.exists(report_file):
                raise RuntimeError(f"The Spark job of {describe(plan)} ended without a report. {after_failure(plan)}")
            with open(report_file, encoding="utf-8") as fh:
                return _log_result(plan, json.load(fh))

    def kill(self) -> None:
        hook = self._hook
        if hook is not None:
            hook.on_kill()

    def _submit(
        self, label: str, args: list[str], core: str, stream_name: str, consumer_name: str, batch_id: int, *,
        output_location: str | None, checkpoint_table: str | None = None,
        after: str = "No checkpoint moved; the plan stays pending and the next attempt re-uses it.",
    ) -> None:  # fmt: skip
        self._hook = self._build_hook(args, core, stream_name, consumer_name, batch_id, output_location, checkpoint_table)
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

    def _build_hook(
        self, args: list[str], core: str, stream_name: str, consumer_name: str, batch_id: int,
        output_location: str | None, checkpoint_table: str | None,
    ) -> Any:  # fmt: skip
        s = self.settings
        args = list(args)
        if s.transform:
            args += ["--transform", s.transform]
            if s.transform_allowed_modules:  # the job checks the module defining the function too
                args += ["--transform-allowed-modules", ",".join(s.transform_allowed_modules)]
        py_files = ",".join(p for p in (core, s.py_files) if p)
        name = f"kinesis-batch-{stream_name}-{consumer_name}-{batch_id}"
        from airflow_kinesis_spark.hooks.spark_submit import BatchSparkSubmitHook

        conf = dict(s.spark_conf)
        files: str | None = None

        def build(env: dict[str, str] | None) -> Any:
            return BatchSparkSubmitHook(conf=conf, conn_id=s.spark_conn_id, py_files=py_files, files=files,
                                        application_args=args, env_vars=env, name=name)  # fmt: skip

        probe = build(None)
        local = str(probe._connection.get("master") or "").startswith("local")
        if local:
            conf = {**LOCAL_UI_CONF, **conf}  # the DAG author's spark_conf wins
        conf, files = with_log_config(conf, master=str(probe._connection.get("master") or ""),
                                      cluster_deploy_mode=probe._connection.get("deploy_mode") == "cluster")
        # On YARN and Kubernetes the provider turns env_vars into --conf options on the command
        # line; credentials must not go there, so the cluster's own role is used instead.
        on_command_line = probe.env_goes_on_command_line
        if on_command_line:
            log.info("Spark master is YARN/Kubernetes: the job uses the cluster's AWS credentials")
        env = s.aws_environment(stream_name, output_location=output_location, checkpoint_table=checkpoint_table,
                                store_key=f"{stream_name_of(stream_name)}|{consumer_name}", cluster_role=on_command_line)  # fmt: skip
        if local:
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
        return build(env)


def artifacts_digest(paths: Sequence[str]) -> str:
    """SHA-256 (hex) over the names and contents of ``paths``: what a reusable Spark Connect
    session's artifacts are (:func:`connect_session_id`)."""
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
    builder = _channel_builder(url)
    channel = builder.toChannel()
    try:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_READY_TIMEOUT)
    except grpc.FutureTimeoutError:
        endpoint = f"sc://{builder.endpoint}"
        raise EndpointUnreachableError(
            f"Cannot reach the Spark Connect server of spark_connect connection {conn_id!r} at {endpoint} "
            f"within {CONNECT_READY_TIMEOUT:g} s. Check the connection's host, port and use_ssl, and that the "
            "server runs and this machine can reach it. With a token (the connection's password) PySpark opens a "
            "TLS channel to any host but one named 'localhost'.",
            service="Spark Connect", endpoint=endpoint, source=f"spark_connect connection {conn_id!r}",
        ) from None  # fmt: skip
    finally:
        channel.close()


def server_answers(url: str, timeout: float) -> bool:
    """Whether the Spark Connect server of ``url`` answers a gRPC call within ``timeout`` seconds.

    The call is the standard health check (``grpc.health.v1.Health/Check``) on a new channel: any
    answer counts, ``UNIMPLEMENTED`` included (the server's gRPC layer is alive; it answers while
    its Spark jobs run); ``DEADLINE_EXCEEDED`` (a frozen server, or one whose host is gone) and
    ``UNAVAILABLE`` (nothing listens: a killed server) do not. No session is touched.
    """
    import grpc

    channel = _channel_builder(url).toChannel()
    try:
        channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=timeout)
        return True
    except grpc.RpcError as err:
        return err.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
    finally:
        channel.close()


def unresponsive_timeout(extra: dict[str, Any], conn_id: str) -> float:
    """The connection's ``unresponsive_timeout`` extra (seconds; default :data:`DEFAULT_UNRESPONSIVE_TIMEOUT`).

    :raises ValueError: not a number of seconds > 0 (naming the connection).
    """
    value = extra.get(UNRESPONSIVE_TIMEOUT_EXTRA)
    if value is None or value == "":
        return DEFAULT_UNRESPONSIVE_TIMEOUT
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"spark_connect connection {conn_id!r}: extra {UNRESPONSIVE_TIMEOUT_EXTRA!r} must be a number of "
                         f"seconds > 0; got {value!r}")  # fmt: skip
    return seconds


def _channel_builder(url: str) -> Any:
    """PySpark's parser of ``sc://`` URLs (``DefaultChannelBuilder``; ``ChannelBuilder`` before Spark 4)."""
    try:
        from pyspark.sql.connect.client import DefaultChannelBuilder as builder_class
    except ImportError:
        from pyspark.sql.connect.client import ChannelBuilder as builder_class
    return builder_class(url)


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_connect_transport(url: str, conn_id: str, *, allow_insecure: bool = False) -> None:
    """Refuse to send credentials to a Spark Connect server over plaintext gRPC off this machine.

    Allowed: TLS (``use_ssl`` or a token in the connection, PySpark then uses a secure channel),
    a loopback server (``127.0.0.0/8``, ``::1``, ``localhost``), or the connection's extra
    ``allow_insecure_credentials: true``.

    :raises ValueError: naming the connection, the server (never the token) and the fix.
    """
    builder = _channel_builder(url)
    if builder.secure or _is_loopback(builder.host) or allow_insecure:
        return
    raise ValueError(
        f"Refusing to send AWS credentials to the Spark Connect server sc://{builder.endpoint} of connection "
        f"{conn_id!r} over plaintext gRPC: anyone on the network path could read them. Set the connection's extra "
        "'use_ssl': true (the server or a proxy in front of it must speak TLS), or run the job with "
        "job_credentials='none' (the server's own role). Only on a network you trust: extra "
        f"'{ALLOW_INSECURE_EXTRA}': true."
    )


def worker_secret_path() -> Path:
    """Where this worker keeps the secret that keys its reusable Spark Connect session ids:
    ``$AIRFLOW_KINESIS_SPARK_STATE_DIR/connect_session.key``, default under ``~/.cache``."""
    base = os.environ.get("AIRFLOW_KINESIS_SPARK_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "airflow_kinesis_spark")
    return Path(base) / "connect_session.key"


def session_secret(configured: str | None = None) -> bytes:
    """The secret that keys reusable session ids: the connection's ``session_secret`` extra, else
    this worker's own, made on first use (32 random bytes, file mode 0600)."""
    if configured:
        return str(configured).encode()
    path = worker_secret_path()
    try:
        return path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        secret = secrets.token_bytes(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # made concurrently by another task on this worker
            return path.read_bytes()
        with os.fdopen(fd, "wb") as fh:
            fh.write(secret)
        return secret


def connect_session_id(secret: bytes, scope: str, stream_name: str, consumer_name: str, artifacts: str = "") -> str:
    """The reusable Spark Connect session id of a consumer (``spark_connect_reuse_session=True``):
    a UUID from HMAC-SHA256 keyed by ``secret`` over scope, stream, consumer and the digest of the
    artifacts the session holds (:func:`artifacts_digest`). Without the secret it cannot be
    derived, so no other client can create the session before the consumer does (the server
    accepts any id a client names) and plant code in it. It does not keep the session from being
    joined: the server shows the ids of its sessions, with their user ids, in its event log and
    its UI's Connect tab. Another package version (an upgrade) gets another session: a session's
    artifacts cannot be replaced under the same name (``ARTIFACT_ALREADY_EXISTS``), and the old
    session ends with the server's idle timeout."""
    digest = hmac.new(secret, f"{scope}/{stream_name}/{consumer_name}/{artifacts}".encode(), hashlib.sha256).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


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

    Credentials go to the server only over TLS (or to a loopback server), see
    :func:`check_connect_transport`; the connection's token (its password) and ``use_ssl`` reach
    PySpark in the URL (``sc://host:port/;token=...;use_ssl=true``), for a server that checks a
    token (Spark 4's ``spark.connect.authenticate.token``, a managed service's session token, an
    authenticating proxy).

    Each batch runs in a session of its own: a random id, nothing set in its conf that tells it
    from another client's session, released when the run ends (``SparkSession.stop()``, which
    sends ``ReleaseSession``; the server then refuses the id, ``SESSION_CLOSED``). So no client
    of the server can join a batch's session after the batch, or plant code in its Python
    workers for the next batch. A client that learns the session's id and user id while the
    batch runs (the server's event log and UI show both) can join it then: the server binds a
    session to the ids a client names, not to whom it authenticated (see docs/security.md).

    With ``reuse_connect_session`` (opt-in) the session is kept for the consumer's next batch
    instead, under an id keyed by a secret (:func:`connect_session_id`): no other client can
    create it first, but any client that reads its id from the server can join it between
    batches, and what it plants in the session's warm Python workers runs in the next batches.
    The artifacts are added again each batch (the server keeps an identical file it already has),
    so no state about the session is kept in its conf. A session the server no longer accepts
    (expired, released) is left to the server and this run uses a new one, released at its end.

    A server that stops answering while the job runs (killed, frozen, unreachable) is given up
    after the connection's extra ``unresponsive_timeout`` seconds without an answer (default
    :data:`DEFAULT_UNRESPONSIVE_TIMEOUT`), with :class:`TimeoutError`; see :meth:`run`.
    """

    takes_batch_from_store = False

    def __init__(self, settings: SparkJobSettings, session_scope: str = "KinesisToSparkOperator") -> None:
        self.settings = settings
        self.session_scope = session_scope
        self._spark: Any = None
        self._secret = b""
        #: The gRPC channels of this run's sessions (:meth:`_connect`), closed when the run is given up.
        self._channels: list[Any] = []
        self._abandoned = False

    def run(self, plan: BatchPlan, *, records_expected: bool) -> list[ShardReport]:
        """Run the batch's job over Spark Connect and return its reports.

        The job runs in a thread of this process while this one checks that the server answers
        (:func:`server_answers`, every :data:`SERVER_CHECK_INTERVAL` seconds). A server that
        answered nothing for the connection's ``unresponsive_timeout`` seconds (default
        :data:`DEFAULT_UNRESPONSIVE_TIMEOUT`) is given up: an ERROR line names it
        (``sc://host:port``, never a token), the client is closed and :class:`TimeoutError` is
        raised, so the protocol releases the batch's lease and a retry may take it over at once.

        :raises RuntimeError: the job failed; :raises EndpointUnreachableError: no server at the start.
        :raises TimeoutError: the server stopped answering while the job ran.
        :raises ValueError: the connection's ``unresponsive_timeout`` is not a number of seconds > 0.
        """
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        from airflow_kinesis_spark.core.transform import resolve_transform

        s = self.settings
        job = _load_job_module()
        transform = resolve_transform(s.transform, s.transform_allowed_modules) if s.transform else None
        connect_hook = SparkConnectHook(conn_id=s.spark_conn_id)
        url = connect_hook.get_connection_url()
        extra = connect_hook.get_connection(s.spark_conn_id).extra_dejson
        timeout = unresponsive_timeout(extra, s.spark_conn_id)
        if s.job_credentials != "none":  # before any credential is even made
            check_connect_transport(url, s.spark_conn_id, allow_insecure=bool(extra.get(ALLOW_INSECURE_EXTRA)))
        aws_env = s.aws_environment(plan.stream_name, output_location=plan.output_location)
        if s.reuse_connect_session:
            self._secret = session_secret(extra.get(SESSION_SECRET_EXTRA))
        log.info("Running the Spark job of %s over Spark Connect (%d shard ranges)", describe(plan), len(plan.ranges))
        check_spark_connect(url, s.spark_conn_id)
        saved = {k: os.environ.get(k) for k in CONNECT_ENV_VARS}
        abandoned = False
        self._channels, self._abandoned = [], False

        def work() -> dict[str, Any]:
            with batch_temp_dir(plan.batch_id) as tmp:
                artifacts = [core_zip(tmp), *filter(None, (s.py_files or "").split(","))]
                spark = self._session(url, plan, artifacts)
                return job.run(spark, plan.to_dict(), transform, aws_env,  # type: ignore[no-any-return]
                               s.read_options.job_options(records_expected))  # fmt: skip

        try:
            result = _while_server_answers(work, url, timeout, what=f"the Spark job of {describe(plan)}")
        except _ServerUnresponsive as gone:
            abandoned = True
            endpoint = f"sc://{_channel_builder(url).endpoint}"
            log.error("The Spark Connect server %s (spark_connect connection %r) answered nothing for %.0f s "
                      "(unresponsive_timeout %g s): giving up the Spark job of %s", endpoint, s.spark_conn_id,
                      gone.silent, timeout, describe(plan))  # fmt: skip
            raise TimeoutError(
                f"The Spark Connect server {endpoint} of spark_connect connection {s.spark_conn_id!r} answered nothing "
                f"for {gone.silent:.0f} s while it ran the Spark job of {describe(plan)} (the connection's extra "
                f"{UNRESPONSIVE_TIMEOUT_EXTRA!r} is {timeout:g} s): it was killed, froze or cannot be reached; the job "
                f"was given up. {after_failure(plan)}"
            ) from None
        except Exception as err:
            raise RuntimeError(
                f"The Spark job of {describe(plan)} failed over Spark Connect: {err}. {after_failure(plan)}"
            ) from err
        finally:
            if abandoned:
                self._abandon()
            elif self._spark is not None:
                self._spark.stop()
            self._spark = None
            self._channels = []
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

    def _abandon(self) -> None:
        """Close the client of a server that stopped answering, without asking the server
        anything: its gRPC channels first (every call on them ends at once, the job's and
        PySpark's pending release calls, which would retry an unreachable server for minutes or
        wait on a frozen one for ever, keeping this process from exiting), then the session,
        not released (in a daemon thread, waited for 5 s at most), so this process may start new
        sessions."""
        self._abandoned = True  # the job's thread, if it goes on, makes no new session
        for channel in self._channels:
            try:
                channel.close()
            except Exception as err:  # noqa: BLE001 - closing is best effort
                log.debug("closing a gRPC channel of an abandoned Spark Connect session: %s", err)
        spark = self._spark
        if spark is not None:
            spark.release_session_on_close = False
            closing = threading.Thread(target=spark.stop, name="spark-connect-close", daemon=True)
            closing.start()
            closing.join(5)

    def _connect(self, url: str) -> Any:
        """The Spark Connect session of ``url`` (as ``SparkSession.builder.remote(url).getOrCreate()``),
        made through a channel builder that keeps the gRPC channels it makes (PySpark's hook for
        customising them, ``SparkSession.builder.channelBuilder``), for :meth:`_abandon`."""
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

        if self._abandoned:
            raise RuntimeError("this run gave its Spark Connect server up")
        channels = self._channels

        class KeepingChannelBuilder(type(_channel_builder(url))):  # type: ignore[misc]
            def toChannel(self) -> Any:  # noqa: N802 - PySpark's name
                channel = super().toChannel()
                channels.append(channel)
                return channel

        # What pyspark.sql.SparkSession.builder.remote(...).getOrCreate() sets before it makes a
        # Connect session: PySpark's functions then build Connect columns (restored after the run).
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        self._spark = RemoteSparkSession.builder.channelBuilder(KeepingChannelBuilder(url)).getOrCreate()
        return self._spark

    def _session(self, url: str, plan: BatchPlan, artifacts: list[str]) -> Any:
        if self.settings.reuse_connect_session:
            digest = artifacts_digest(artifacts)
            session_id = connect_session_id(self._secret, self.session_scope, plan.stream_name, plan.consumer_name, digest)
            spark = None
            try:
                spark = self._connect(with_session_id(url, session_id))
                spark.release_session_on_close = False
                # Added each batch, whether the session has them or not: the server keeps a file it
                # already has with the same contents (the id is keyed by their digest, so it has no
                # other), and nothing in the session's conf marks it as this provider's.
                for artifact in artifacts:
                    spark.addArtifacts(artifact, pyfile=True)
                return spark
            except Exception as err:  # noqa: BLE001 - any refusal: fall back to a new session
                log.info("The consumer's Spark Connect session is not reusable (%s); starting a new one", err)
                if spark is not None:
                    # Close this client only: the server session may serve another run of the
                    # consumer (a window re-run) right now, so it is not released.
                    spark.release_session_on_close = False
                    spark.stop()
        # The batch's own session: a random id, released at the end of the run (stop() in run()).
        spark = self._connect(with_session_id(url, str(uuid.uuid4())))
        spark.release_session_on_close = True
        for artifact in artifacts:
            spark.addArtifacts(artifact, pyfile=True)
        return spark


class _ServerUnresponsive(Exception):
    """The Spark Connect server answered nothing for ``silent`` seconds (:func:`_while_server_answers`)."""

    def __init__(self, silent: float) -> None:
        super().__init__(f"no answer for {silent:.0f} s")
        self.silent = silent


def _while_server_answers(work: Callable[[], Any], url: str, timeout: float, *, what: str) -> Any:
    """``work()`` in a thread, while this one checks that the Spark Connect server of ``url``
    answers (:func:`server_answers`); returns its result or raises its exception.

    A check every :data:`SERVER_CHECK_INTERVAL` seconds (or a third of ``timeout``), each
    waiting as long at most. The first check without an answer logs a WARNING, an answer again
    an INFO line. When no check was answered for ``timeout`` seconds, :class:`_ServerUnresponsive`
    is raised and the thread is left behind (a daemon: PySpark's client may retry for minutes;
    closing the client ends its calls).
    """
    interval = min(SERVER_CHECK_INTERVAL, timeout / 3)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = work()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = err

    thread = threading.Thread(target=target, name="spark-connect-job", daemon=True)
    thread.start()
    endpoint = f"sc://{_channel_builder(url).endpoint}"
    answered = time.monotonic()
    silent_since: float | None = None
    while True:
        thread.join(interval)
        if not thread.is_alive():
            break
        if server_answers(url, interval):
            if silent_since is not None:
                log.info("The Spark Connect server %s answers again", endpoint)
                silent_since = None
            answered = time.monotonic()
            continue
        silent = time.monotonic() - answered
        if silent >= timeout:
            raise _ServerUnresponsive(silent)
        if silent_since is None:
            silent_since = answered
            log.warning("The Spark Connect server %s has not answered for %.0f s while it runs %s; it is given up "
                        "after %g s without an answer (unresponsive_timeout)", endpoint, silent, what, timeout)  # fmt: skip
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


class SparkJob:
    """The batch's Spark job on the ``spark_conn_id`` connection: the runner
    (:func:`spark_job_for`) is chosen when the job first runs, so a run that needs no job (no new
    records) never looks the Spark connection up.

    Made once per run (the operators' ``spark_job``), it first removes the temporary directories
    that killed runs left behind (:func:`sweep_leftover_temp_dirs`): every run, also one that
    finds no new records and starts no job."""

    def __init__(self, settings: SparkJobSettings, session_scope: str = "KinesisToSparkOperator") -> None:
        self.settings = settings
        self.session_scope = session_scope
        self.runner: SparkSubmitJob | SparkConnectJob | None = None
        sweep_leftover_temp_dirs()

    def _runner(self) -> SparkSubmitJob | SparkConnectJob:
        if self.runner is None:
            self.runner = spark_job_for(self.settings, self.session_scope)
        return self.runner

    @property
    def takes_batch_from_store(self) -> bool:
        """Whether the runner takes its batch from the store (spark-submit) or runs it in this
        process (Spark Connect); looks the connection up."""
        return self._runner().takes_batch_from_store

    def run(self, plan: BatchPlan, *, records_expected: bool) -> list[ShardReport]:
        return self._runner().run(plan, records_expected=records_expected)

    def check_detachable(self) -> None:
        """:meth:`SparkSubmitJob.check_detachable`.

        :raises ValueError: the connection is a Spark Connect one (its job runs in this process),
            or its driver would run in this worker.
        """
        runner = self._runner()
        if not isinstance(runner, SparkSubmitJob):
            raise ValueError(f"deferrable=True does not apply to spark_connect connection {self.settings.spark_conn_id!r}: "
                             "the job runs in this worker's process; use deferrable=False")  # fmt: skip
        runner.check_detachable()

    def submit_detached(self, arguments: JobArguments, *, output_location: str | None = None) -> str:
        """:meth:`SparkSubmitJob.submit_detached` (:raises ValueError: as :meth:`check_detachable`)."""
        self.check_detachable()
        return self.runner.submit_detached(arguments, output_location=output_location)  # type: ignore[union-attr]

    def run_handed(self, arguments: JobArguments, *, output_location: str | None = None) -> None:
        runner = self._runner()
        assert isinstance(runner, SparkSubmitJob), "only the spark-submit runner takes its batch from the store"
        runner.run_handed(arguments, output_location=output_location)

    def kill(self) -> None:
        if self.runner is not None:
            self.runner.kill()


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
