"""BatchSparkSubmitHook against the oldest and the installed apache-spark provider.

The hook uses the provider's public API only (constructor arguments, ``submit``, ``on_kill``,
``BaseHook.get_connection``); this runs the same probe (``provider_probe.py``: a fake
spark-submit, no JVM) with the installed provider and with the oldest the ``spark`` extra of
pyproject.toml allows (its lower bound), in a scratch environment: this project's virtualenv
with the provider's package swapped for that version's wheel (symbolic links to everything
else). The wheel is fetched once with pip into ``.cache/providers``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROBE = Path(__file__).with_name("provider_probe.py")
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
PROVIDER = "apache-airflow-providers-apache-spark"


def oldest_supported() -> str:
    """The lower bound of the provider in pyproject.toml's ``spark`` extra (the lowest of its requirements)."""
    text = (ROOT / "pyproject.toml").read_text()
    bounds = re.findall(rf'"{PROVIDER}>=([0-9.]+)"', text)
    assert bounds, f"no lower bound of {PROVIDER} in pyproject.toml"
    return min(bounds, key=lambda v: tuple(int(p) for p in v.split(".")))


def link_all_but(source: Path, target: Path, skip: set[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.name not in skip:
            (target / entry.name).symlink_to(entry)


@pytest.fixture(scope="module")
def oldest_python(tmp_path_factory) -> str:
    version = oldest_supported()
    cache = ROOT / ".cache" / "providers"
    wheels = list(cache.glob(f"apache_airflow_providers_apache_spark-{version}*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(cache),
                        f"{PROVIDER}=={version}"], check=True)  # fmt: skip
        wheels = list(cache.glob(f"apache_airflow_providers_apache_spark-{version}*.whl"))
    env_dir = tmp_path_factory.mktemp("oldest-provider")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    site = env_dir / "lib" / SITE.parent.name / "site-packages"
    for entry in site.iterdir():
        entry.unlink() if entry.is_file() or entry.is_symlink() else None
    installed = {p.name for p in SITE.glob("apache_airflow_providers_apache_spark-*.dist-info")}
    link_all_but(SITE, site, {"airflow", *installed})
    link_all_but(SITE / "airflow", site / "airflow", {"providers"})
    link_all_but(SITE / "airflow" / "providers", site / "airflow" / "providers", {"apache"})
    link_all_but(SITE / "airflow" / "providers" / "apache", site / "airflow" / "providers" / "apache", {"spark"})
    with zipfile.ZipFile(wheels[0]) as wheel:
        members = [m for m in wheel.namelist() if m.startswith("airflow/providers/apache/spark/") or ".dist-info/" in m]
        wheel.extractall(site, members)
    return str(env_dir / "bin" / "python")


def probe(python: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    done = subprocess.run([python, str(PROBE)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("line", ["oldest", "installed"])
def test_the_hook_runs_on_the_oldest_and_the_installed_provider(line, request):
    python = request.getfixturevalue("oldest_python") if line == "oldest" else sys.executable
    result = probe(python)
    if line == "oldest":
        assert result["provider"] == oldest_supported() or result["provider"].startswith(oldest_supported() + ".")
    # a missing connection runs local[*]; the command line is the provider's, from the constructor's arguments
    assert result["args"] == ["--master", "local[*]", "--conf", "spark.ui.enabled=false", "--py-files", "core.zip",
                              "--name", "job", "app.py", "--batch-id", "7"], result  # fmt: skip
    assert result["raised"] == "AirflowException"  # the provider's error for a failed spark-submit
    assert result["job_env"] and result["airflow_env"] == []  # env_vars reach the job; AIRFLOW_* do not (die_with_parent)
    assert result["cause"] == "java.io.IOException: Mkdirs failed to create file:/readonly/lake/_staging/batch_id=1-ab12"
    assert result["killed"]  # on_kill kills the process the hook started, which is spark-submit itself
    assert result["yarn"] == ["yarn", "cluster", True]
