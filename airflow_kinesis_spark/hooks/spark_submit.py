"""spark-submit for the batch job: the apache-spark provider's hook through its public API, with a local default.

What this module uses of the apache-spark provider's ``SparkSubmitHook`` is its public surface
only: the constructor's arguments (``conf``, ``conn_id``, ``files``, ``py_files``, ``name``,
``application_args``, ``env_vars``, ``spark_binary``), ``submit`` and ``on_kill``, and
``get_connection``, the public class method of Airflow's ``BaseHook`` that the provider calls to
read its connection. Nothing reads or sets the hook's private attributes or overrides its
private methods; tests run it against the oldest (5.0.0) and the installed provider line
(``tests/unit/hooks/test_spark_submit_provider.py``).

Three small pieces are owned here because the provider has no public API for them:

* :func:`spark_connection` — the master and deploy mode of a ``spark`` connection, read from the
  connection as the provider documents its fields (apache-spark provider docs, "Apache Spark
  Connection": host and port give the master; extras ``deploy-mode``, ``spark-binary``). The
  runner needs them before it builds the hook (local Spark UI and scratch settings, the log
  configuration, whether ``env_vars`` end up on the command line, detached submission).
* The spark-submit *wrapper* (:func:`write_wrapper`), passed as the hook's ``spark_binary``
  (documented: "the command to use for spark submit"): it runs the real spark-submit through
  :mod:`airflow_kinesis_spark.die_with_parent` (the job dies with the worker; none of the worker's
  ``AIRFLOW_*`` variables) and keeps a copy of its output in a file, from which
  :attr:`BatchSparkSubmitHook.failure_cause` names the exception that failed the job.
* :func:`local_submit_command` — the spark-submit command of a *local* master, for a job
  started detached from this worker (``SparkSubmitJob.submit_detached``), which cannot go
  through the hook's ``submit`` (that waits for the job).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

log = logging.getLogger(__name__)

__all__ = [
    "BatchSparkSubmitHook",
    "SparkConnection",
    "spark_connection",
    "write_wrapper",
    "local_submit_command",
    "exception_line",
    "LOCAL_MASTER",
]

#: The master when the ``spark`` connection does not exist (the provider would use YARN).
LOCAL_MASTER = "local[*]"
#: The spark-submit commands a connection's ``spark-binary`` extra may name (the provider's
#: connection form accepts these: apache-spark provider docs, "Apache Spark Connection").
ALLOWED_SPARK_BINARIES = ("spark-submit", "spark2-submit", "spark3-submit")

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


def failure_cause(lines: Sequence[str]) -> str | None:
    """The driver's exception (class and message) named in ``lines`` of spark-submit output: the
    last one that is not a mere wrapper of another (``Py4JJavaError``, ``SparkException: Job
    aborted``), else the last one; ``None`` when they name none."""
    named = [cause for cause in map(exception_line, lines) if cause]
    own = [cause for cause in named if not cause.startswith(_WRAPPERS)]
    return (own or named or [None])[-1]


@dataclass(frozen=True)
class SparkConnection:
    """What the runner needs to know of a ``spark`` connection before it builds the hook.

    :param conn_id: the connection id.
    :param master: the Spark master URL (``local[*]``, ``yarn``, ``spark://host:7077``, ``k8s://https://host``).
    :param deploy_mode: the ``deploy-mode`` extra (``client``, ``cluster``) or ``None``.
    :param spark_binary: the spark-submit command (``spark-binary`` extra; default ``spark-submit``).
    :param found: whether the connection exists (else: :data:`LOCAL_MASTER`).
    """

    conn_id: str
    master: str
    deploy_mode: str | None = None
    spark_binary: str = "spark-submit"
    found: bool = True

    @property
    def is_local(self) -> bool:
        return self.master.startswith("local")

    @property
    def is_yarn(self) -> bool:
        return "yarn" in self.master

    @property
    def is_kubernetes(self) -> bool:
        return "k8s" in self.master

    @property
    def cluster_deploy_mode(self) -> bool:
        return self.deploy_mode == "cluster"

    @property
    def env_goes_on_command_line(self) -> bool:
        """On YARN and Kubernetes the provider passes ``env_vars`` as ``--conf`` options
        (``spark.yarn.appMasterEnv.*``, ``spark.kubernetes.driverEnv.*``: the provider's
        ``env_vars`` documentation, "supports yarn and k8s mode too")."""
        return self.is_yarn or self.is_kubernetes


def _local_connection(conn_id: str) -> Any:
    from airflow.sdk import Connection

    return Connection(conn_id=conn_id, conn_type="spark", host=LOCAL_MASTER)


def spark_connection(conn_id: str) -> SparkConnection:
    """The ``spark`` connection ``conn_id`` as the provider reads it: master from host (a full
    URL such as ``k8s://https://host`` or ``local[*]``, else ``{conn_type}://{host}``) and port;
    ``deploy-mode`` and ``spark-binary`` from the extras. A connection that does not exist is
    :data:`LOCAL_MASTER` (:class:`BatchSparkSubmitHook` runs it so).

    :raises ValueError: the ``spark-binary`` extra names a command not in
        :data:`ALLOWED_SPARK_BINARIES` (the provider refuses it too).
    """
    try:
        conn = SparkSubmitHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - any lookup failure means "no such connection"
        return SparkConnection(conn_id, LOCAL_MASTER, found=False)
    host, port = conn.host or "", conn.port
    if conn.conn_type == "spark" and host and ("://" in host or not port):
        master = host  # a full master URL in the host field (the provider's connection form)
    else:  # a connection made from a URI (spark://host:7077): the scheme is its type
        master = f"{conn.conn_type}://{host}"
    master = f"{master}:{port}" if port else master
    extra = conn.extra_dejson
    binary = str(extra.get("spark-binary") or "spark-submit")
    if binary not in ALLOWED_SPARK_BINARIES:
        raise ValueError(f"The spark-binary extra of connection {conn_id!r} can be one of {list(ALLOWED_SPARK_BINARIES)}; "
                         f"it was {binary!r}")  # fmt: skip
    return SparkConnection(conn_id, master, extra.get("deploy-mode"), binary)


def write_wrapper(directory: str, spark_binary: str, output_file: str, parent_pid: int | None = None) -> str:
    """Write an executable ``spark-submit`` wrapper into ``directory`` and return its path.

    The wrapper (POSIX ``sh``) runs ``spark_binary`` with its own arguments through
    :mod:`airflow_kinesis_spark.die_with_parent` (``exec``: the process the hook started *is*
    spark-submit, so ``on_kill`` still kills it; it gets ``SIGKILL`` when ``parent_pid``, default
    this process, dies; none of the ``AIRFLOW_*`` variables), and copies its output (stdout and
    stderr) to ``output_file`` through ``tee`` on a FIFO: the hook reads the same output as
    without the wrapper.
    """
    script = "\n".join([
        "#!/bin/sh",
        "# spark-submit through airflow_kinesis_spark.die_with_parent, its output copied (airflow_kinesis_spark.hooks.spark_submit)",
        f"fifo={shlex.quote(directory)}/spark-submit-{uuid.uuid4().hex[:8]}-$$.fifo",
        'rm -f "$fifo" && mkfifo -m 600 "$fifo" || exit 1',
        f'tee -a {shlex.quote(output_file)} < "$fifo" &',
        f'exec {shlex.quote(sys.executable)} -m airflow_kinesis_spark.die_with_parent {parent_pid or os.getpid()} -- '
        f'{shlex.quote(spark_binary)} "$@" > "$fifo" 2>&1',
        "",
    ])  # fmt: skip
    path = os.path.join(directory, f"spark-submit-{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(script)
    return path


def local_submit_command(
    connection: SparkConnection, application: str, *, conf: Mapping[str, Any], files: str | None, py_files: str | None,
    name: str, application_args: Sequence[str],
) -> list[str]:  # fmt: skip
    """The spark-submit command of a job on a local master, in the order and form of spark-submit's
    documented options (``--master``, ``--conf k=v``, ``--files``, ``--py-files``, ``--name``,
    the application and its arguments; Spark docs, "Submitting Applications").

    :raises ValueError: ``connection`` is not a local master.
    """
    if not connection.is_local:
        raise ValueError(f"not a local master: {connection.master!r}")
    command = [connection.spark_binary, "--master", connection.master]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    if files:
        command += ["--files", files]
    if py_files:
        command += ["--py-files", py_files]
    command += ["--name", name, application, *application_args]
    return command


class BatchSparkSubmitHook(SparkSubmitHook):
    """:class:`SparkSubmitHook` that runs ``local[*]`` when its ``spark`` connection does not
    exist, spark-submit through a wrapper (:func:`write_wrapper`) when given a ``work_dir``,
    and names the exception that failed the job (:attr:`failure_cause`).

    The apache-spark provider falls back to YARN without a connection; a DAG author trying the
    provider on a laptop expects a local Spark: :meth:`get_connection` (``BaseHook``'s public
    class method, which the provider calls) answers a missing connection with a ``spark``
    connection to ``local[*]``. Every other behaviour (command line, masking, ``on_kill``,
    YARN/Kubernetes/standalone) is the provider's.

    :param work_dir: a private directory of this run (e.g. the batch's temporary directory) for
        the wrapper, its FIFO and the copy of the output; ``None``: spark-submit runs as the
        provider starts it (no ``die_with_parent``, no :attr:`failure_cause`).
    :param kwargs: ``SparkSubmitHook``'s arguments (``conn_id``, ``conf``, ``env_vars``, ...);
        ``spark_binary`` is the wrapped command when ``work_dir`` is given.
    """

    def __init__(self, *, work_dir: str | None = None, **kwargs: Any) -> None:
        conn_id = kwargs.get("conn_id", "spark_default")
        self.output_file: str | None = None
        if work_dir is not None:
            binary = kwargs.get("spark_binary") or spark_connection(conn_id).spark_binary
            self.output_file = os.path.join(work_dir, f"spark-submit-{uuid.uuid4().hex[:8]}.log")
            kwargs["spark_binary"] = write_wrapper(work_dir, binary, self.output_file)
        super().__init__(**kwargs)

    @classmethod
    def get_connection(cls, conn_id: str) -> Any:
        """``BaseHook.get_connection``; a connection that does not exist is a ``spark``
        connection to ``local[*]`` (logged)."""
        try:
            return super().get_connection(conn_id)
        except Exception:  # noqa: BLE001 - any lookup failure means "no such connection"
            log.info("Connection %r not found: running Spark with master %s", conn_id, LOCAL_MASTER)
            return _local_connection(conn_id)

    def output_lines(self) -> list[str]:
        """spark-submit's output so far, from the wrapper's copy (empty without ``work_dir``)."""
        if self.output_file is None or not os.path.exists(self.output_file):
            return []
        with open(self.output_file, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()

    @property
    def failure_cause(self) -> str | None:
        """The driver's exception (class and message) from the job's output (:func:`failure_cause`)."""
        return failure_cause(self.output_lines())
