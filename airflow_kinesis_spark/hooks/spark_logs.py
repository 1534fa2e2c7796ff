"""How the Spark job logs: its log4j 2 configuration (:data:`LOG4J_CONFIG`, shipped next to the
script) and the Java options that give it to the driver and the executors at their start
(:func:`with_log_config`): Spark, Hadoop and Parquet at ``WARN``, or at ``spark.log.level``.

The spark-submit runner (``hooks.spark``) calls :func:`with_log_config` and the CLI's ``package``
command ships :data:`LOG4J_CONFIG`; this module imports neither. No Airflow import.
"""

from __future__ import annotations

import os
from typing import Any

from airflow_kinesis_spark.hooks.spark_package import _shipped_file

__all__ = ["LOG4J_CONFIG", "LOG_LEVEL_CONF", "LOG_LEVELS", "log4j_config_path", "with_log_config"]

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
        raise ValueError(f"SparkSettings.conf {LOG_LEVEL_CONF!r} must be one of {', '.join(LOG_LEVELS)}; got {conf[LOG_LEVEL_CONF]!r}")
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
