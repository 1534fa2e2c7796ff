"""``kinesis-spark package``: what a job task on a cluster needs, the job's logging configuration
included (issue 17, item 4). No AWS, no Spark."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from click.testing import CliRunner

from airflow_kinesis_spark.cli import main as cli
from airflow_kinesis_spark.hooks.spark_logs import log4j_config_path
from airflow_kinesis_spark.hooks.spark_package import spark_script_path


def test_package_writes_the_job_its_code_and_its_log4j_configuration(tmp_path):
    target = tmp_path / "kinesis-spark-job"
    result = CliRunner().invoke(cli, ["package", str(target), "--json"])
    assert result.exit_code == 0, result.output
    written = json.loads(result.output)
    assert written == {"script": str(target / "kinesis_batch.py"), "py_files": str(target / "airflow_kinesis_spark_core.zip"),
                       "log4j_config": str(target / "kinesis-batch-log4j2.properties")}  # fmt: skip
    assert sorted(p.name for p in target.iterdir()) == ["airflow_kinesis_spark_core.zip", "kinesis-batch-log4j2.properties", "kinesis_batch.py"]
    assert Path(written["script"]).read_bytes() == Path(spark_script_path()).read_bytes()
    assert Path(written["log4j_config"]).read_bytes() == Path(log4j_config_path()).read_bytes()
    assert "airflow_kinesis_spark/core/reader.py" in zipfile.ZipFile(written["py_files"]).namelist()

    text = CliRunner().invoke(cli, ["package", str(target)])
    assert text.exit_code == 0 and f"log4j 2 configuration: {target / 'kinesis-batch-log4j2.properties'}" in text.output
