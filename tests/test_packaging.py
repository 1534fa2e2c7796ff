"""The distribution: a base install plans and commits without Spark; extras add spark-submit or Spark Connect.

The wheel is built from this checkout (hatchling, through ``uv build``) and its metadata read as
an installer reads it. The slow tests resolve and install it into fresh virtual environments with
uv, as a user's ``pip install`` would.
"""

from __future__ import annotations

import email.parser
import json
import re
import subprocess
import sys
import zipfile
from email.message import Message
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).parent / "uv"  # installed into the venv by `make venv`
#: What runs Spark: a worker that only plans, probes and commits needs none of these.
SPARK_DISTRIBUTIONS = {"pyspark", "pyspark-client", "apache-airflow-providers-apache-spark"}
#: Modules that need an extra by design (imported only by the runner that uses them).
EXTRA_ONLY_MODULES = {"airflow_kinesis_spark.hooks.spark_submit": "spark"}


def _run(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    assert UV.exists(), f"uv not found next to {sys.executable}: run 'make venv'"
    out = tmp_path_factory.mktemp("dist")
    _run([str(UV), "build", "--wheel", "--quiet", "--out-dir", str(out), str(ROOT)])
    [built] = out.glob("airflow_kinesis_spark-*.whl")
    return built


@pytest.fixture(scope="module")
def metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as zf:
        [name] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(zf.read(name).decode("utf-8"))


def requirements(metadata: Message, extra: str | None = None) -> dict[str, Requirement]:
    """The requirements an install adds: without extras (``extra=None``), or what ``extra`` adds to those."""

    def applies(req: Requirement, value: str) -> bool:
        return req.marker is None or req.marker.evaluate({"extra": value})

    found = {}
    for line in metadata.get_all("Requires-Dist") or []:
        req = Requirement(line)
        base = applies(req, "")
        if (extra is None and base) or (extra is not None and not base and applies(req, extra)):
            found[canonicalize_name(req.name)] = req
    return found


def test_base_install_requires_no_spark(metadata):
    base = requirements(metadata)
    assert {"apache-airflow", "apache-airflow-providers-amazon", "boto3", "aws-kinesis-agg"} <= set(base)
    assert not SPARK_DISTRIBUTIONS & set(base), f"the base install pulls {SPARK_DISTRIBUTIONS & set(base)}"


def test_extras_are_declared(metadata):
    assert {"spark", "connect", "openlineage", "docs", "test"} <= set(metadata.get_all("Provides-Extra") or [])


def test_spark_extra_brings_pyspark_3_5_or_4_and_the_provider_without_an_exact_pin(metadata):
    spark = requirements(metadata, "spark")
    assert {"pyspark", "apache-airflow-providers-apache-spark", "pyarrow"} <= set(spark)
    pyspark = spark["pyspark"].specifier
    assert not any(s.operator in ("==", "===") for s in pyspark), f"pyspark is pinned exactly: {pyspark}"
    for version in ("3.5.2", "3.5.9", "4.0.0", "4.1.1"):
        assert pyspark.contains(version), f"the spark extra refuses pyspark {version}: {pyspark}"
    assert not pyspark.contains("3.4.4")
    # the provider's 5.x line (pyspark itself, not pyspark-client) is what a Spark 3.5 worker uses
    assert spark["apache-airflow-providers-apache-spark"].specifier.contains("5.6.0")


def test_connect_extra_brings_the_spark_connect_client_and_not_a_full_pyspark(metadata):
    connect = requirements(metadata, "connect")
    assert {"pyspark-client", "apache-airflow-providers-apache-spark"} <= set(connect)
    assert "pyspark" not in connect
    client = connect["pyspark-client"].specifier
    assert not any(s.operator in ("==", "===") for s in client) and client.contains("4.1.1")


def test_wheel_ships_the_spark_job(wheel):
    with zipfile.ZipFile(wheel) as zf:
        assert "airflow_kinesis_spark/spark_scripts/kinesis_batch.py" in zf.namelist()
        assert "airflow_kinesis_spark/spark_scripts/kinesis-batch-log4j2.properties" in zf.namelist()  # its logging


def _locked(lock: Path) -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)", lock.read_text(), re.M)
    return {canonicalize_name(name): version for name, version in pins}


def test_dev_locks_keep_pyspark_and_pyspark_client_at_one_version():
    """Both distributions ship the same ``pyspark`` package: at two versions they overwrite each other."""
    dev = _locked(ROOT / "requirements.lock")
    assert dev["pyspark"] == dev["pyspark-client"], dev
    assert dev["pyspark"].startswith("4.")
    spark35 = _locked(ROOT / "requirements-spark35.lock")
    assert spark35["pyspark"].startswith("3.5.") and "pyspark-client" not in spark35, spark35


def _venv(path: Path) -> Path:
    _run([str(UV), "venv", "--quiet", "--python", sys.executable, str(path)])
    return path / "bin" / "python"


def _dry_run(python: Path, *requirements: str, constraints: Path | None = None) -> dict[str, str]:
    """What ``uv pip install`` would install into the environment of ``python``: name -> version."""
    cmd = [str(UV), "pip", "install", "--dry-run", "--python", str(python), *requirements]
    if constraints is not None:
        cmd += ["--constraint", str(constraints)]
    proc = _run(cmd)
    lines = re.findall(r"^\s*\+\s*([A-Za-z0-9._-]+)(?:==(\S+)| @ )", proc.stdout + proc.stderr, re.M)
    assert lines, proc.stdout + proc.stderr
    return {canonicalize_name(name): version for name, version in lines}


@pytest.mark.slow
def test_base_install_has_no_spark_and_imports_every_module(wheel, tmp_path):
    """A real install of the wheel without extras (versions from the dev lock): no pyspark, no
    pyspark-client, no apache-spark provider, and every module but the extras' imports."""
    python = _venv(tmp_path / "base")
    _run([str(UV), "pip", "install", "--quiet", "--python", str(python), str(wheel), "--constraint", str(ROOT / "requirements.lock")])
    listed = _run([str(UV), "pip", "list", "--format", "json", "--python", str(python)]).stdout
    installed = {canonicalize_name(p["name"]) for p in json.loads(listed)}
    assert "apache-airflow" in installed and "airflow-kinesis-spark" in installed
    assert not SPARK_DISTRIBUTIONS & installed, f"a base install has {SPARK_DISTRIBUTIONS & installed}"
    script = (
        "import importlib, json, pkgutil, airflow_kinesis_spark\n"
        "errors = {}\n"
        "for m in pkgutil.walk_packages(airflow_kinesis_spark.__path__, 'airflow_kinesis_spark.'):\n"
        "    try:\n"
        "        importlib.import_module(m.name)\n"
        "    except Exception as e:\n"
        "        errors[m.name] = f'{type(e).__name__}: {e}'\n"
        "print(json.dumps(errors))\n"
    )
    proc = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PATH": str(python.parent), "AIRFLOW_HOME": str(tmp_path / "airflow")})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    unexpected = {m: e for m, e in errors.items() if m not in EXTRA_ONLY_MODULES}
    assert not unexpected, f"modules a base install cannot import (they import Spark at import time?): {unexpected}"
    cli = subprocess.run([str(python.parent / "kinesis-spark"), "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PATH": str(python.parent), "AIRFLOW_HOME": str(tmp_path / "airflow")})  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-3000:]


@pytest.mark.slow
def test_extras_resolve_to_one_pyspark(wheel, tmp_path):
    """``[spark]`` and ``[connect]`` resolve (dev lock versions) with pyspark and pyspark-client at
    one version; the Spark 3.5 recipe of docs/installation.md resolves without pyspark-client."""
    python = _venv(tmp_path / "resolve")
    lock = ROOT / "requirements.lock"
    spark = _dry_run(python, f"airflow-kinesis-spark[spark] @ {wheel.as_uri()}", constraints=lock)
    assert spark["pyspark"].startswith("4.") and spark.get("pyspark-client") == spark["pyspark"], spark
    connect = _dry_run(python, f"airflow-kinesis-spark[connect] @ {wheel.as_uri()}", constraints=lock)
    assert "pyspark-client" in connect and "pyspark" not in connect, connect
    base = _dry_run(python, str(wheel), constraints=lock)
    assert not SPARK_DISTRIBUTIONS & set(base), base
    spark35 = _dry_run(python, f"airflow-kinesis-spark[spark] @ {wheel.as_uri()}", "pyspark==3.5.*",
                       "apache-airflow-providers-apache-spark<6")  # fmt: skip
    assert spark35["pyspark"].startswith("3.5.") and "pyspark-client" not in spark35, spark35
    assert spark35["apache-airflow-providers-apache-spark"].startswith("5."), spark35
