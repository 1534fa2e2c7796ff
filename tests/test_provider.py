"""The package registers as an Airflow provider."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from airflow_kinesis_spark.get_provider_info import get_provider_info


def test_provider_info_names_importable_modules():
    import importlib

    info = get_provider_info()
    assert info["package-name"] == "airflow-kinesis-spark"
    for section in ("operators", "hooks", "sensors", "triggers"):
        for entry in info[section]:
            for module in entry["python-modules"]:
                importlib.import_module(module)


def test_airflow_providers_list_shows_the_provider(tmp_path):
    airflow = Path(sys.executable).parent / "airflow"
    proc = subprocess.run(
        [str(airflow), "providers", "list"], capture_output=True, text=True, timeout=300,
        env={"AIRFLOW_HOME": str(tmp_path), "PATH": str(Path(sys.executable).parent)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "airflow-kinesis-spark" in proc.stdout
