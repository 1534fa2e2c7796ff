"""What the Spark job is made of: the PySpark script and the files shipped with it, and the zip of
the Airflow-free code that goes to Spark's executors.

* :func:`spark_script_path`: the job (``spark_scripts/kinesis_batch.py``), inside the installed
  wheel or in a checkout; the other files of ``spark_scripts/`` are found the same way (the log
  configuration: ``hooks.spark_logs``).
* :func:`core_zip`: ``airflow_kinesis_spark``'s core, transforms, exceptions, the job (``job/``)
  and the sink's write side (``sinks/spark_write.py``), zipped for spark-submit's ``--py-files``
  or a Spark Connect session's artifacts.

The runners (``hooks.spark``, ``hooks.spark_connect``), the log configuration
(``hooks.spark_logs``) and the CLI's ``package`` command use these; this module imports none of
them. No Airflow import.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import airflow_kinesis_spark

__all__ = ["SPARK_SCRIPT", "spark_script_path", "core_zip"]

SPARK_SCRIPT = "kinesis_batch.py"


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


def core_zip(directory: str) -> str:
    """Zip the Airflow-free part of ``airflow_kinesis_spark`` (core, transforms, exceptions, the
    job, the sinks package's ``__init__`` and its write side ``sinks/spark_write.py``) for Spark's
    driver and executors into ``directory``; returns the zip's path."""
    package = Path(airflow_kinesis_spark.__file__).resolve().parent
    target = Path(directory) / "airflow_kinesis_spark_core.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in [
            package / "__init__.py",
            package / "exceptions.py",
            *sorted((package / "core").glob("*.py")),
            *sorted((package / "transforms").glob("*.py")),
            *sorted((package / "job").glob("*.py")),
            package / "sinks" / "__init__.py",  # imported with sinks.spark_write; its own imports are lazy
            package / "sinks" / "spark_write.py",
        ]:
            zf.write(path, f"airflow_kinesis_spark/{path.relative_to(package)}")
    return str(target)
